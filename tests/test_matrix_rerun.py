"""On-call acts from the matrix page, on a real Airflow (scheduler, triggerer, dag-processor,
api-server) in headless Chromium: filter to the failed cells and by axis value, then
"re-run failed cells", which clears each failed cell through Airflow's clear API as the
user who clicked and records who did it; read-only users get no button and a 403,
anonymous users a 401, a POST from another origin a 403. The page shows the run's cost and
the suite's owners."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from test_matrix_page_server import _browser, _shadow, _wait

from accelmatrix.results.store import ResultsStore
from accelmatrix_testkit import AirflowStack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
DAG_ID = "rerun_me"
GROUP = "cpu"

SUITE = """
description: three cells; b's workload and c's check fail until the marker file exists
owners: [ml-infra, oncall-team]
axes:
  x:
    a: {n: 1}
    b: {n: 2}
    c: {n: 3}
machines:
  cpu:
    backend: local
    price_key: local-accel
machine: cpu
workload:
  run: ["${python}", "SCRIPT", "${axis.x}", "MARKER"]
  timeout: 60
checks:
  - {type: log_contains, name: says ok, pattern: "ready: ok"}
"""

# b exits 3 (a workload failure: its run is cleared); c exits 0 but its check fails (a
# check failure: its run is cleared too, re-evaluating the same log would change nothing).
SCRIPT = """
import pathlib, sys
cell, marker = sys.argv[1], pathlib.Path(sys.argv[2])
if cell == "b" and not marker.exists():
    print("cell b: dependency missing", flush=True)
    sys.exit(3)
if cell == "c" and not marker.exists():
    print("cell c: not ready", flush=True)
    sys.exit(0)
print(f"cell {cell}: ready: ok", flush=True)
"""


class Site:
    def __init__(self, stack: AirflowStack) -> None:
        self.stack = stack
        self.base = stack.base_url
        self.passwords = json.loads(
            (stack.home / "simple_auth_manager_passwords.json.generated").read_text()
        )

    def password(self, user: str = "admin") -> str:
        return self.passwords[user]

    def token(self, user: str) -> str:
        r = httpx.post(
            f"{self.base}/auth/token",
            json={"username": user, "password": self.password(user)},
            timeout=30,
        )
        r.raise_for_status()
        return r.json()["access_token"]


def _login(driver, site: Site, user: str) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{site.base}/auth/login?next={quote(site.base + '/', safe='')}")
    _wait(lambda: driver.find_element(By.NAME, "username")).send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(site.password(user))
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(lambda: any(c["name"] == "_token" for c in driver.get_cookies()))


def _cells(driver) -> dict[str, str]:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    tds = _shadow(driver).find_elements(By.CSS_SELECTOR, "td.cell[data-cell-id]")
    return {td.get_attribute("data-cell-id"): td.get_attribute("data-kind") for td in tds}


@pytest.mark.slow(130)
def test_filter_and_rerun_failed_cells_from_the_matrix(tmp_path: Path) -> None:
    suites = tmp_path / "suites"
    suites.mkdir()
    script = tmp_path / "cells.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "dependency-fixed"
    (suites / f"{DAG_ID}.yaml").write_text(
        textwrap.dedent(SUITE).replace("SCRIPT", str(script)).replace("MARKER", str(marker))
    )
    home = tmp_path / "airflow"
    users = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer"}
    with AirflowStack(
        home=home,
        dags_folder=ROOT / "dags",
        suites_dir=suites,
        parallelism=8,
        all_admins=False,
        env_extra=users,
    ) as stack:
        stack.create_pool(f"accelmatrix_{GROUP}", 3, include_deferred=True)
        run_id = stack.trigger(DAG_ID)
        assert stack.wait_for_run(DAG_ID, run_id, timeout=240) == "failed"
        site = Site(stack)
        first = {
            (t["task_id"], t["rendered_map_index"]): t for t in stack.task_instances(DAG_ID, run_id)
        }
        page = f"/accelmatrix/suites/{DAG_ID}"
        rerun = f"{page}/rerun"
        form = {"run_id": run_id, "cell": ["x=b", "x=c"]}

        # Who may not: anonymous 401, a read-only user 403, another site's form 403.
        with httpx.Client(base_url=site.base, timeout=60) as c:
            same = {"Origin": site.base}
            assert c.post(rerun, data=form, headers=same).status_code == 401
            viewer = {"Authorization": f"Bearer {site.token('viewer')}", **same}
            r = c.post(rerun, data=form, headers=viewer)
            assert r.status_code == 403, r.text
            assert c.get(page, headers=viewer).status_code == 200  # may read, not edit
            admin_cookie = {"Cookie": f"_token={site.token('admin')}"}
            for bad in ({"Origin": "http://evil.example"}, {"Referer": "http://evil.example/"}, {}):
                r = c.post(rerun, data=form, headers={**admin_cookie, **bad})
                assert r.status_code == 403, (bad, r.status_code, r.text)
        # Nothing was cleared by any of them.
        now = {
            (t["task_id"], t["rendered_map_index"]): t for t in stack.task_instances(DAG_ID, run_id)
        }
        assert all(now[k]["try_number"] == first[k]["try_number"] for k in first)

        driver = _browser(tmp_path)
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        try:
            # The read-only user sees the page, the filters, and why there is no button.
            _login(driver, site, "viewer")
            driver.get(f"{site.base}/plugin/accelmatrix/suites/{DAG_ID}")
            _wait(lambda: len(_cells(driver)) == 3)
            root = _shadow(driver)
            assert not root.find_elements(By.CSS_SELECTOR, "form.rerun button")
            assert "needs edit access" in root.find_element(By.CSS_SELECTOR, "form.rerun").text

            # On-call, from Airflow's navigation entry.
            _login(driver, site, "admin")
            driver.get(f"{site.base}/")
            _wait(
                lambda: driver.find_element(By.XPATH, "//*[normalize-space()='Test matrix']")
            ).click()
            _wait(
                lambda: _shadow(driver).find_element(
                    By.CSS_SELECTOR, f"tr[data-dag-id='{DAG_ID}'] a"
                )
            ).click()
            _wait(lambda: len(_cells(driver)) == 3)
            assert _cells(driver) == {"x=a": "passed", "x=b": "failed", "x=c": "failed"}
            facts = _shadow(driver).find_element(By.ID, "run-facts").text
            assert "owners ml-infra, oncall-team" in facts and "cost $" in facts, facts

            # Failed only (a link), then one axis value (the form).
            _shadow(driver).find_element(By.CSS_SELECTOR, "a.only-failed").click()
            _wait(lambda: "failed=1" in driver.current_url)
            _wait(lambda: _cells(driver) == {"x=b": "failed", "x=c": "failed"})
            root = _shadow(driver)
            Select(root.find_element(By.CSS_SELECTOR, "select[data-axis=x]")).select_by_value("x=b")
            root.find_element(By.CSS_SELECTOR, "form.filters button").click()
            _wait(lambda: "axis=x%3Db" in driver.current_url)
            _wait(lambda: _cells(driver) == {"x=b": "failed"})
            assert "/plugin/accelmatrix/" in driver.current_url
            _shadow(driver).find_element(By.CSS_SELECTOR, "a.all-cells").click()
            _wait(lambda: len(_cells(driver)) == 3)
            driver.save_screenshot(str(tmp_path / "matrix-before-rerun.png"))

            # The dependency is fixed; re-run the failed cells with one click.
            marker.write_text("fixed\n")
            button = _shadow(driver).find_element(By.CSS_SELECTOR, "form.rerun button")
            assert button.text == "re-run 2 failed cells"
            # The cells it re-runs are named before anything is cleared.
            targets = _shadow(driver).find_element(By.ID, "rerun-targets").text
            assert targets == "x=b, x=c", targets
            button.click()
            _wait(
                lambda: (
                    driver.current_url.startswith(
                        f"{site.base}/plugin/accelmatrix/suites/{DAG_ID}?run_id="
                    )
                    and _shadow(driver).find_elements(By.CSS_SELECTOR, "p.rerun-note")
                ),
                timeout=60,
            )
            note = _shadow(driver).find_element(By.CSS_SELECTOR, "p.rerun-note").text
            assert note.startswith("re-run of 2 failed cells by admin at "), note
            assert note.endswith("x=b, x=c"), note
            # The re-run shows at once: the cleared cells in progress (or already passed
            # again), never red with the same button offered a second time.
            after_click = _cells(driver)
            assert after_click["x=a"] == "passed", after_click
            assert {after_click["x=b"], after_click["x=c"]} <= {"pending", "passed"}, after_click
            assert not _shadow(driver).find_elements(By.CSS_SELECTOR, "form.rerun button")
            driver.save_screenshot(str(tmp_path / "matrix-after-rerun.png"))
        finally:
            driver.quit()

        state = stack.wait_for_run(DAG_ID, run_id, timeout=240)
        after = {
            (t["task_id"], t["rendered_map_index"]): t for t in stack.task_instances(DAG_ID, run_id)
        }
        raced = stack.stale_success_failures()
        events = stack.api(
            "GET", "eventLogs", params={"dag_id": DAG_ID, "run_id": run_id, "limit": 100}
        )["event_logs"]
    summary = "\n".join(
        f"{k}: {v['state']} try {v['try_number']}" for k, v in sorted(after.items())
    )
    # Airflow 3.3.2's defer/resume race (tests/test_real_scheduler.py): named, never tolerated.
    summary += f"\nscheduler's stale-success failures (defer/resume race): {sorted(raced)}"
    # The failed cells' workloads ran again (run cleared, for the failed check too); the
    # passed cell was not touched.
    for cell in ("x=b", "x=c"):
        assert (
            after[(f"{GROUP}.run", cell)]["try_number"]
            == first[(f"{GROUP}.run", cell)]["try_number"] + 1
        ), summary
        assert (
            after[(f"{GROUP}.evaluate", cell)]["try_number"]
            > first[(f"{GROUP}.evaluate", cell)]["try_number"]
        ), summary
    for step in ("run", "collect", "evaluate"):
        key = (f"{GROUP}.{step}", "x=a")
        assert after[key]["try_number"] == first[key]["try_number"], summary
    assert state == "success", summary
    store = ResultsStore(f"sqlite:///{home / 'accelmatrix' / 'results.db'}")
    try:
        cells = {c.cell_id: c.state for c in store.get_cells(DAG_ID, run_id)}
    finally:
        store.close()
    assert cells == {"x=a": "passed", "x=b": "passed", "x=c": "passed"}, (cells, summary)
    # Who did it, in Airflow's audit log: its own entry of the clear and the page's.
    by_event = {e["event"]: e for e in events}
    assert by_event["post_clear_task_instances"]["owner"] == "admin"
    mine = by_event["accelmatrix.rerun_failed_cells"]
    assert mine["owner"] == "admin" and json.loads(mine["extra"])["cells"] == ["x=b", "x=c"]
