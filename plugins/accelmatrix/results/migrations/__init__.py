"""Alembic migrations of the results store (env.py, script.py.mako, versions/).

A package so setuptools ships it with accelmatrix; ``accelmatrix.results.migrate`` is the
API the store calls. New revision: ``alembic -c plugins/accelmatrix/results/alembic.ini
revision -m "what changed"`` (set ACCELMATRIX_RESULTS_URL for ``--autogenerate``).
"""
