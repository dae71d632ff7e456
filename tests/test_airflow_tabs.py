"""The matrix inside Airflow's own pages (issue 40): tabs of a suite's DAG page, a DAG run and
a cell's task instance, on a real api-server with a real DAG and run in Airflow's database.

The suite's results are planted in the results store under the run id of a run triggered
over REST (no scheduler: the run stays queued, its task instances exist). The journey an
on-call engineer takes is walked in headless Chromium through Airflow's UI: from the DAG
page, the "Test matrix" tab, then the failing cell's stdout: two clicks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from test_matrix_page_server import _browser, _login, _wait

from accelmatrix import settings
from accelmatrix.results.store import ResultsStore
from accelmatrix.ui import tabs
from accelmatrix_testkit import AirflowStack
from accelmatrix_testkit.matrix_results import END, PlantedCell, plant_run, planted_docs

pytestmark = pytest.mark.integration

DAG_ID = "tabs_demo"
RUN_ID = "manual__tabs"
# A DAG shaped like a suite's: a task group per machine, mapped over its cells.
DAG_FILE = f'''
from airflow.sdk import dag, task, task_group


@dag(dag_id="{DAG_ID}", schedule=None, catchup=False)
def tabs_demo():
    @task_group(group_id="cpu")
    def cpu(i):
        @task
        def run(i):
            return i

        @task
        def evaluate(i):
            return i

        run(i) >> evaluate(i)

    cpu.expand(i=[0, 1, 2])


tabs_demo()
'''
FAILED = "c=1"
STDOUT = "step 1 loss 2.0\nTraceback: loss did not go down\n"


class Site:
    def __init__(self, stack: AirflowStack) -> None:
        self.stack = stack
        self.base = stack.base_url
        self.token = stack._login()

    def password(self) -> str:
        pw = self.stack.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(pw.read_text())["admin"]


def _plant(stack: AirflowStack) -> None:
    """Three cells on machine cpu; c=1 failed its loss check and has every evidence file."""
    saved = {k: os.environ.get(k) for k in ("ACCELMATRIX_HOME", "ACCELMATRIX_ARTIFACTS_DIR")}
    os.environ["ACCELMATRIX_HOME"] = str(stack.accel_home)
    os.environ.pop("ACCELMATRIX_ARTIFACTS_DIR", None)
    try:
        store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
        cells = [
            PlantedCell("c=0", {"c": "0"}, index=0),
            PlantedCell(
                FAILED,
                {"c": "1"},
                index=1,
                state="failed",
                failed_checks=(("final_loss", "loss <= 0.5", "2.0"),),
            ),
            PlantedCell("c=2", {"c": "2"}, index=2),
        ]
        docs = planted_docs(DAG_ID, RUN_ID, FAILED)
        cells[1].data_docs = str(docs["index"])
        plant_run(store, DAG_ID, RUN_ID, cells, logical_date=None, started_at=END)
        store.close()
        art = settings.cell_artifacts_dir(DAG_ID, RUN_ID, FAILED)
        (art / "output.log").write_text(STDOUT)
        rows = [
            {"name": "loss", "step": s, "value": v, "unit": None, "source": "log"}
            for s, v in ((1, 2.5), (2, 2.0))
        ]
        (art / "metrics.json").write_text(json.dumps(rows))
        (art / "files" / "prof").mkdir(parents=True)
        (art / "files" / "prof" / "w0.pt.trace.json").write_text('{"traceEvents": []}')
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("airflow-tabs")
    (root / "dags").mkdir()
    (root / "dags" / "tabs_demo.py").write_text(DAG_FILE)
    stack = AirflowStack(
        home=root / "airflow",
        dags_folder=root / "dags",
        components=("api-server", "dag-processor"),
        all_admins=False,
    )
    _plant(stack)
    with stack:
        stack.wait_for_dag(DAG_ID)
        stack.api(
            "POST",
            f"dags/{DAG_ID}/dagRuns",
            json={"dag_run_id": RUN_ID, "logical_date": None, "conf": {}},
        )
        yield Site(stack)


@pytest.mark.slow(50)
def test_tabs_are_registered_and_each_page_answers(site: Site) -> None:
    """Airflow lists a tab per destination, and the page each names answers for this DAG,
    run and task instance, with the content it promises; never without a login."""
    (mine,) = [p for p in site.stack.api("GET", "plugins")["plugins"] if p["name"] == "accelmatrix"]
    apps = {a["url_route"]: a for a in mine["react_apps"]}
    assert {a["destination"] for a in apps.values()} == {"nav", "dag", "dag_run", "task_instance"}
    for t in tabs.TABS:
        assert apps[t.url_route]["destination"] == t.destination
        assert apps[t.url_route]["page"] == "/accelmatrix" + t.page
        assert apps[t.url_route]["bundle_url"].startswith("accelmatrix/static/matrix-view.js")

    ids = {"dag_id": DAG_ID, "run_id": RUN_ID, "task_id": "cpu.evaluate", "map_index": 1}
    bearer = {"Authorization": f"Bearer {site.token}", "Accept": "text/html"}
    with httpx.Client(base_url=site.base, timeout=30, follow_redirects=True) as c:
        for t in tabs.TABS:
            r = c.get(f"/accelmatrix/tabs/{t.url_route}", params=ids)
            assert r.status_code == 401, (t.url_route, r.status_code)
            r = c.get(f"/accelmatrix/{tabs.page_path(t, **ids).lstrip('/')}")
            assert r.status_code == 401, (t.url_route, r.status_code)
        pages = {}
        for t in tabs.TABS:
            r = c.get(f"/accelmatrix/tabs/{t.url_route}", params=ids, headers=bearer)
            assert r.status_code == 200, (t.url_route, r.status_code, r.text[:300])
            assert r.url.path.endswith(tabs.page_path(t, **ids).split("?")[0])
            pages[t.url_route] = r.text
        assert pages["accelmatrix-suite"].count('class="cell k-') == 3
        assert f'data-cell-id="{FAILED}" data-kind="failed"' in pages["accelmatrix-suite"]
        assert 'id="history"' in pages["accelmatrix-history"]
        assert f"selected>{RUN_ID}" in pages["accelmatrix-run"]
        cell = pages["accelmatrix-cell"]
        assert f'data-cell-id="{FAILED}"' in cell and 'data-kind="failed"' in cell
        assert "final_loss: expected loss &lt;= 0.5, observed 2.0" in cell
        for kind in ("stdout", "metrics", "trace", "docs"):
            assert f'class="{kind}"' in cell, kind
        assert 'data-metric="loss"' in cell and "Traceback: loss did not go down" in cell
        # A task that is no cell's (map index -1): its run's matrix.
        r = c.get(
            "/accelmatrix/tabs/accelmatrix-cell",
            params={**ids, "task_id": "plan", "map_index": -1},
            headers=bearer,
        )
        assert r.status_code == 200 and f"selected>{RUN_ID}" in r.text
        # An index no cell has: a 404 that says so.
        r = c.get(
            "/accelmatrix/tabs/accelmatrix-cell", params={**ids, "map_index": 7}, headers=bearer
        )
        assert r.status_code == 404 and "no cell of run" in r.text
        # Every linked evidence file is served.
        import re

        for href in re.findall(r'href="([^"]+/files/[^"]+)"', cell):
            f = c.get(href.replace("&amp;", "&"), headers=bearer)
            assert f.status_code == 200, href


def _tab(driver, url_route: str, label: str):  # noqa: ANN001, ANN202
    """The tab Airflow draws for ``url_route`` (a link to .../plugin/<url_route>), by its
    label: the navigation entry has the same name, so the link's target tells them apart."""
    from selenium.webdriver.common.by import By

    tab = _wait(
        lambda: next(
            e
            for e in driver.find_elements(By.CSS_SELECTOR, f"a[href$='/plugin/{url_route}']")
            if e.is_displayed()
        )
    )
    assert label in tab.text, tab.text
    return tab


def _shadow(driver):  # noqa: ANN001, ANN202
    from selenium.webdriver.common.by import By

    host = driver.find_element(By.CSS_SELECTOR, "#accelmatrix-view[data-state=ready]")
    return host.shadow_root


@pytest.mark.slow(60)
def test_on_call_reaches_the_failing_cells_evidence_from_the_dag_page(
    site: Site, tmp_path: Path
) -> None:
    """From Airflow's DAG page: the "Test matrix" tab (click 1), the failed cell's stdout
    (click 2). The cell's evidence link opens its task instance's "Cell evidence" tab; the
    run's tab shows the run; the history tab the suite's history."""
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By

    run_q = quote(RUN_ID, safe="")
    try:
        _login(driver, site)
        driver.get(f"{site.base}/dags/{DAG_ID}")
        _tab(driver, "accelmatrix-suite", "Test matrix").click()  # click 1
        _wait(lambda: driver.current_url == f"{site.base}/dags/{DAG_ID}/plugin/accelmatrix-suite")
        page = _wait(lambda: _shadow(driver))
        cell = _wait(lambda: page.find_element(By.CSS_SELECTOR, f"td[data-cell-id='{FAILED}']"))
        assert cell.get_attribute("data-kind") == "failed"
        assert "final_loss" in cell.find_element(By.CSS_SELECTOR, ".why").text
        driver.save_screenshot(str(tmp_path / "dag-tab.png"))
        before = set(driver.window_handles)
        cell.find_element(By.CSS_SELECTOR, "a.stdout").click()  # click 2
        new = _wait(lambda: set(driver.window_handles) - before)
        driver.switch_to.window(new.pop())
        assert "loss did not go down" in _wait(
            lambda: driver.find_element(By.TAG_NAME, "body").text
        )
        driver.close()
        driver.switch_to.window(next(iter(before)))

        # The cell's evidence tab, from the matrix, inside Airflow's task instance page.
        _shadow(driver).find_element(
            By.CSS_SELECTOR, f"td[data-cell-id='{FAILED}'] a.evidence"
        ).click()
        want = (
            f"{site.base}/dags/{DAG_ID}/runs/{run_q}/tasks/cpu.run/mapped/1/plugin/accelmatrix-cell"
        )
        _wait(lambda: driver.current_url == want)
        ev = _wait(lambda: _shadow(driver).find_element(By.ID, "verdict"))
        assert ev.get_attribute("data-kind") == "failed" and "final_loss" in ev.text
        links = {
            a.get_attribute("class")
            for a in _shadow(driver).find_elements(By.CSS_SELECTOR, "#evidence a")
        }
        assert {"stdout", "metrics", "trace", "docs", "log-evaluate"} <= links
        driver.save_screenshot(str(tmp_path / "cell-tab.png"))

        # The run's tab, on Airflow's DAG run page.
        driver.get(f"{site.base}/dags/{DAG_ID}/runs/{run_q}")
        _tab(driver, "accelmatrix-run", "Test matrix").click()
        _wait(lambda: driver.current_url.endswith("/plugin/accelmatrix-run"))
        opt = _wait(lambda: _shadow(driver).find_element(By.CSS_SELECTOR, "option[selected]"))
        assert opt.get_attribute("value") == RUN_ID

        # The suite's history, a tab of the DAG page.
        driver.get(f"{site.base}/dags/{DAG_ID}")
        _tab(driver, "accelmatrix-history", "Test history").click()
        _wait(lambda: _shadow(driver).find_element(By.ID, "history"))
    finally:
        driver.quit()
