"""The ASGI entry point the plugin hands to Airflow: builds the real app on first use.

Every Airflow component (scheduler, dag-processor, triggerer, task runners) imports the
plugins folder's plugin modules, but only the api-server serves HTTP. Importing FastAPI,
Airflow's API package and the page's modules is left to the first request, so the plugin
costs the other components nothing (only this module and the standard library).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["LazyApp", "app"]


class LazyApp:
    """An ASGI app that creates ``accelmatrix.ui.app.create_app()`` when first called."""

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    # On first request: every Airflow process loads the plugin, and the
                    # app's FastAPI routes and store are for the api-server only.
                    from accelmatrix.ui.app import create_app

                    self._app = create_app()
        return self._app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self._get()(scope, receive, send)


app = LazyApp()
