"""How accelmatrix runs inside an Airflow deployment, rather than what it runs.

``executor`` (PreloadedLocalExecutor: task processes forked with the task side imported),
``celery_config`` (the same for CeleryExecutor workers), ``preload`` (what both import
ahead), ``policy`` (the cluster policy naming each mapped task by its cell) and
``standalone`` (``make standalone``: ``airflow standalone`` that stops on SIGTERM). Airflow
finds them by the dotted paths in its configuration and entry points (docs/deploy.md); no
step of a cell imports them.
"""
