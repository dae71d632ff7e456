"""The matrix as a tab of Airflow's own pages: a suite's DAG page, a DAG run, a task instance.

Airflow 3.3 lets a plugin add a tab to those pages (``destination`` ``dag``, ``dag_run``,
``task_instance`` of a plugin's ``react_apps`` or ``external_views``). These are React apps,
not external views, for the reason the navigation entry is one (ui/plugin.py): Airflow shows
an external view in an iframe sandboxed without ``allow-top-navigation`` or
``allow-popups``, where links to Airflow's task logs and the Data Docs did nothing. A React
app is rendered in Airflow's own page and gets the page's ``dagId``, ``runId``, ``taskId``
and ``mapIndex`` as props; the one script (static/matrix-view.js) fetches the page the tab
names (``page`` below, with Airflow's ``{DAG_ID}``-style placeholders filled from those
props) and shows it the way the navigation entry shows its pages.

Every plugin component imports the plugin, so this module is standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

__all__ = ["TABS", "Tab", "by_route", "page_path", "react_apps"]


@dataclass(frozen=True)
class Tab:
    """One tab: where Airflow shows it and which of this app's pages it shows.

    ``page`` is a path of the plugin's app with Airflow's placeholders ({DAG_ID}, {RUN_ID},
    {TASK_ID}, {MAP_INDEX}, the names Airflow's UI fills into an external view's href);
    the view fills them from its props, URL-encoded, the way Airflow would."""

    name: str  # the tab's label
    destination: str  # "dag", "dag_run" or "task_instance"
    url_route: str  # unique among all plugins' views: the tab's URL is .../plugin/<url_route>
    page: str


TABS = (
    Tab("Test matrix", "dag", "accelmatrix-suite", "/suites/{DAG_ID}"),
    Tab("Test history", "dag", "accelmatrix-history", "/suites/{DAG_ID}/history"),
    Tab("Test matrix", "dag_run", "accelmatrix-run", "/suites/{DAG_ID}?run_id={RUN_ID}"),
    Tab(
        "Cell evidence",
        "task_instance",
        "accelmatrix-cell",
        "/suites/{DAG_ID}/cell?run_id={RUN_ID}&task_id={TASK_ID}&map_index={MAP_INDEX}",
    ),
)


def by_route(url_route: str) -> Tab | None:
    return next((t for t in TABS if t.url_route == url_route), None)


def page_path(
    tab: Tab, *, dag_id: str, run_id: str = "", task_id: str = "", map_index: Any = -1
) -> str:
    """The tab's page for one DAG, run or task instance (what the view fetches; tests use
    it to check that every tab's page answers)."""
    values = {
        "{DAG_ID}": dag_id,
        "{RUN_ID}": run_id,
        "{TASK_ID}": task_id,
        "{MAP_INDEX}": str(map_index),
    }
    out = tab.page
    for key, value in values.items():
        out = out.replace(key, quote(str(value), safe=""))
    return out


def react_apps(url_prefix: str, bundle_url: str) -> list[dict[str, Any]]:
    """The tabs as entries of the plugin's ``react_apps``. ``page`` travels as an extra
    field of the entry (Airflow's plugin models allow extra fields), so ``GET
    /api/v2/plugins`` shows which page each tab serves.

    Each tab loads the script under its own URL (``?tab=<url_route>``): Airflow's loader
    clears ``globalThis.AirflowPlugin`` before importing a bundle and reads it afterwards,
    and a module already imported under the same URL is not run again, so a tab named
    differently from the first view loaded would find nothing."""
    return [
        {
            "name": t.name,
            "bundle_url": f"{bundle_url}?tab={t.url_route}",
            "destination": t.destination,
            "url_route": t.url_route,
            "page": url_prefix + t.page,
        }
        for t in TABS
    ]
