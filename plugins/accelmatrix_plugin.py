"""Airflow plugin: the accelmatrix matrix page in the Airflow UI.

Airflow loads every ``*.py`` of the plugins folder that ``.airflowignore`` does not exclude
(the ``accelmatrix/`` package is excluded: it is imported, not scanned). This file is
imported by every component, so it imports only the lazy ASGI wrapper; the page's app is
built by the api-server on its first request. The app is mounted at ``/accelmatrix`` and
shown inside the UI (an iframe) at ``/plugin/accelmatrix``, a top-level navigation entry.
Authentication: see accelmatrix/ui/app.py (plugin apps are not protected by Airflow itself).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from accelmatrix.ui.asgi import app as _matrix_app

URL_PREFIX = "/accelmatrix"


class AccelmatrixPlugin(AirflowPlugin):
    name = "accelmatrix"
    fastapi_apps = [{"app": _matrix_app, "url_prefix": URL_PREFIX, "name": "accelmatrix matrix"}]
    external_views = [
        {
            "name": "Test matrix",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "accelmatrix",
            "nav_top_level": True,
        }
    ]
