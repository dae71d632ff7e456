"""The matrix page: a suite's latest run as a grid and its perf trends, in the Airflow UI.

``accelmatrix_plugin.py`` (the Airflow plugin, in the plugins folder) mounts ``asgi.app``;
``app`` holds the routes and the authentication, ``model`` reads the results store,
``grid``/``trend``/``render`` turn that into HTML and inline SVG. Nothing here is imported
by DAG files or tasks.
"""
