"""The accelmatrix Airflow plugin for a source checkout that runs from this plugins folder.

The plugin itself is ``accelmatrix.ui.plugin.AccelmatrixPlugin``. An installed accelmatrix
(``pip install accelmatrix``, a wheel, or ``pip install -e .`` from a current checkout)
registers it through the ``airflow.plugins`` entry point, which Airflow loads in every
component; then this file defines nothing, so the plugin is not registered twice (Airflow
would skip the second and report it as a plugin import error). Without the entry point
(the package only on PYTHONPATH, or an install older than the entry point) this file is
what registers it: Airflow takes every AirflowPlugin subclass in a plugins folder module.
Airflow loads every ``*.py`` of the plugins folder that ``.airflowignore`` does not exclude
(the ``accelmatrix/`` package is excluded: it is imported, not scanned).
"""

from __future__ import annotations

from accelmatrix.ui.plugin import installed_with_entry_point

if not installed_with_entry_point():
    from accelmatrix.ui.plugin import AccelmatrixPlugin

    __all__ = ["AccelmatrixPlugin"]
