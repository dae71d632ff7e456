"""The matrix page: a suite's latest run as a grid and its perf trends, in the Airflow UI.

``plugin.py`` (the Airflow plugin: the package's ``airflow.plugins`` entry point, or the
plugins folder's ``accelmatrix_plugin.py`` in a checkout) mounts ``asgi.app``;
``app`` holds the routes and the authentication, ``model`` reads the results store,
``grid``/``trend``/``render`` turn that into HTML and inline SVG. Nothing here is imported
by DAG files or tasks.
"""
