"""Airflow plugin: the accelmatrix matrix page in the Airflow UI.

Airflow finds it through the ``airflow.plugins`` entry point of the installed package
(pyproject.toml), so an existing Airflow deployment gets it from ``pip install accelmatrix``
with nothing in its plugins folder. A source checkout that runs from the plugins folder
without that entry point installed gets it from ``plugins/accelmatrix_plugin.py``, which
then imports this class (and only then: one plugin, never registered twice).

Every Airflow component imports plugins, so this module imports only the lazy ASGI wrapper
and the trigger guard's middleware class; the page's app is built by the api-server on its
first request. The app is mounted at ``/accelmatrix`` and shown inside the UI at
``/plugin/accelmatrix`` (a top-level navigation entry) by a small React app that renders
the app's pages in Airflow's own document, not in an iframe.
Authentication: see accelmatrix/ui/app.py (plugin apps are not protected by Airflow itself).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from accelmatrix.ui import tabs
from accelmatrix.ui.asgi import app as _matrix_app
from accelmatrix.ui.trigger_guard import TriggerGuard

URL_PREFIX = "/accelmatrix"
# The plugin's entry point, as pyproject.toml declares it.
ENTRY_POINT_GROUP = "airflow.plugins"
ENTRY_POINT = "accelmatrix.ui.plugin:AccelmatrixPlugin"


def installed_with_entry_point() -> bool:
    """Whether an installed accelmatrix declares this plugin as an ``airflow.plugins`` entry
    point, which Airflow loads in every component after the plugins folder. The plugins
    folder's shim asks this so the plugin is registered once: a second registration is
    skipped by Airflow but reported as a plugin import error.
    """
    from importlib.metadata import entry_points

    return any(ep.value == ENTRY_POINT for ep in entry_points(group=ENTRY_POINT_GROUP))


class AccelmatrixPlugin(AirflowPlugin):
    name = "accelmatrix"
    fastapi_apps = [{"app": _matrix_app, "url_prefix": URL_PREFIX, "name": "accelmatrix matrix"}]
    # A suite run its plan would refuse (a `cells` glob selecting nothing, a param out of
    # range) is refused at trigger time, with the CLI's message (ui/trigger_guard.py).
    fastapi_root_middlewares = [{"middleware": TriggerGuard, "name": "accelmatrix trigger guard"}]
    # A React app, not an external view: Airflow 3.3.2 shows external views in an iframe
    # sandboxed without allow-top-navigation or allow-popups, where the page's log, Data
    # Docs and run links did nothing. A React app is rendered in Airflow's own page; ours
    # fetches the server-rendered page (accelmatrix/ui/static/matrix-view.js). Relative
    # bundle URL: Airflow resolves it against the UI's base URL.
    react_apps = [
        {
            "name": "Test matrix",
            "bundle_url": f"{URL_PREFIX.lstrip('/')}/static/matrix-view.js",
            "destination": "nav",
            "url_route": "accelmatrix",
            "nav_top_level": True,
        },
        # The same view as tabs of each DAG, DAG run and task instance page (ui/tabs.py).
        *tabs.react_apps(URL_PREFIX, f"{URL_PREFIX.lstrip('/')}/static/matrix-view.js"),
    ]
