"""A run's evidence one click away: the run report, a cell's logs, metrics and collected
artifacts (profiler traces) are served by the plugin app under Airflow's auth and the Data
Docs sandbox, and task logs print their URLs instead of worker paths."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from accelmatrix import settings
from accelmatrix.evidence import evidence_url, files_url
from accelmatrix.reports.run_page import write_run_index
from accelmatrix.ui import files
from accelmatrix_testkit import records

RUN = "manual__2026-11-20T02:00:00+00:00"
CELL = "model=a,config=y"


def plant_evidence(dag_id: str = "demo") -> dict[str, Path]:
    """A finished run's files as the steps and the gate leave them (the gate's real report)."""
    art = settings.cell_artifacts_dir(dag_id, RUN, CELL)
    (art / "files" / "out").mkdir(parents=True)
    (art / "data_docs").mkdir()
    (art / "data_docs" / "index.html").write_text("<h1>Data Docs</h1>")
    (art / "output.log").write_text("step 19 loss 2.31\nTraceback: loss diverged\n")
    (art / "stderr.log").write_text("warning: diverging\n")
    (art / "metrics.json").write_text(json.dumps([{"metric": "loss", "value": 2.31}]))
    (art / "fetched.json").write_text("{}")  # a marker, not evidence
    trace = art / "files" / "out" / "step.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    evil = art / "files" / "out" / "page.html"  # a workload wrote HTML: never rendered
    evil.write_text("<script>alert(1)</script>")
    (art / "files" / "out" / "escape.txt").symlink_to(art.parents[2] / "results.db")
    (art.parents[2] / "results.db").write_text("not yours")
    index = write_run_index(
        art.parent,
        dag_id,
        RUN,
        [records.cell(CELL, dag_id=dag_id, run_id=RUN, cell_index=0, state="failed")],
        [records.check(CELL, False, dag_id=dag_id, run_id=RUN, check_name="final loss below 1.5")],
    )
    return {"art": art, "index": index, "trace": trace, "evil": evil}


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    return tmp_path / "artifacts"


def test_which_files_are_evidence(artifacts):
    planted = plant_evidence()
    run, cell = settings.safe_name(RUN), settings.safe_name(CELL)
    served = {
        f"{run}/index.html": files.RUN_REPORT,
        f"{run}/{cell}/data_docs/index.html": files.DOCS,
        f"{run}/{cell}/output.log": files.CELL_FILE,
        f"{run}/{cell}/stderr.log": files.CELL_FILE,
        f"{run}/{cell}/metrics.json": files.CELL_FILE,
        f"{run}/{cell}/files/out/step.pt.trace.json": files.ARTIFACT,
        f"{run}/{cell}/files/out/page.html": files.ARTIFACT,
    }
    for rel, kind in served.items():
        assert files.evidence_file("demo", rel) is not None, rel
        assert files.evidence_file("demo", rel)[1] == kind, rel
    for rel in (
        f"{run}/{cell}/fetched.json",  # a marker
        f"{run}/{cell}/files",  # a directory
        f"{run}/{cell}/files/out/escape.txt",  # a symlink out of the tree
        f"{run}/{cell}/../../results.db",
        "results.db",
        f"{run}/{cell}/data_docs/../output.log",
        f"/{run}/index.html",
        f"{run}/index.html/x",
    ):
        assert files.evidence_file("demo", rel) is None, rel
    # The report's own links name files the app serves.
    html = planted["index"].read_text()
    assert f'href="{cell}/output.log"' in html
    # A log line's URL is the route that serves the file.
    url = evidence_url("demo", planted["trace"], base="http://af:8080")
    rel = f"{run}/{cell}/files/out/step.pt.trace.json"
    assert url == files_url("demo", rel, base="http://af:8080")
    assert url.startswith("http://af:8080/accelmatrix/suites/demo/files/manual__2026")
    assert evidence_url("demo", "/etc/hosts", base="") == "/etc/hosts"  # not evidence: as is


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from accelmatrix_testkit import AirflowStack

    root = tmp_path_factory.mktemp("evidence")
    (root / "dags").mkdir()
    stack = AirflowStack(
        home=root / "airflow", dags_folder=root / "dags", components=("api-server",),
        all_admins=False,
    )  # fmt: skip
    saved = os.environ.get("ACCELMATRIX_ARTIFACTS_DIR")
    os.environ["ACCELMATRIX_ARTIFACTS_DIR"] = str(stack.accel_home / "artifacts")
    try:
        planted = plant_evidence()
    finally:
        if saved is None:
            os.environ.pop("ACCELMATRIX_ARTIFACTS_DIR")
        else:
            os.environ["ACCELMATRIX_ARTIFACTS_DIR"] = saved
    with stack:
        yield stack, planted


def _url(stack, rel: str) -> str:
    return files_url("demo", rel, base=stack.base_url)


@pytest.mark.integration
def test_evidence_is_served_under_airflow_auth_and_sandboxed(served):
    stack, _ = served
    run, cell = settings.safe_name(RUN), settings.safe_name(CELL)
    bearer = {"Authorization": f"Bearer {stack._login()}"}
    report = _url(stack, f"{run}/index.html")
    assert httpx.get(report, timeout=30).status_code == 401
    r = httpx.get(report, headers=bearer, timeout=30)
    assert r.status_code == 200 and "final loss below 1.5" in r.text
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"].startswith("sandbox")
    log = httpx.get(_url(stack, f"{run}/{cell}/output.log"), headers=bearer, timeout=30)
    assert log.status_code == 200 and "loss diverged" in log.text
    assert log.headers["content-type"].startswith("text/plain")
    trace = httpx.get(
        _url(stack, f"{run}/{cell}/files/out/step.pt.trace.json"), headers=bearer, timeout=30
    )
    assert trace.status_code == 200 and trace.json() == {"traceEvents": []}
    evil = httpx.get(_url(stack, f"{run}/{cell}/files/out/page.html"), headers=bearer, timeout=30)
    assert evil.status_code == 200
    assert not evil.headers["content-type"].startswith("text/html")  # downloaded, not rendered
    assert evil.headers["content-security-policy"].startswith("sandbox")
    for rel in (f"{run}/{cell}/fetched.json", f"{run}/{cell}/files/out/escape.txt"):
        assert httpx.get(_url(stack, rel), headers=bearer, timeout=30).status_code == 404


@pytest.mark.integration
def test_chromium_opens_the_run_report_and_a_cells_log(served, tmp_path):
    from test_matrix_page_server import _browser, _wait

    stack, _ = served
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By

    pw = json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())
    run = settings.safe_name(RUN)
    try:
        driver.get(f"{stack.base_url}/auth/login?next={quote(stack.base_url + '/', safe='')}")
        _wait(lambda: driver.find_element(By.NAME, "username")).send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(pw["admin"])
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        _wait(lambda: any(c["name"] == "_token" for c in driver.get_cookies()))
        driver.get(_url(stack, f"{run}/index.html"))
        _wait(lambda: "final loss below 1.5" in driver.find_element(By.TAG_NAME, "body").text)
        driver.find_element(By.LINK_TEXT, "log").click()
        _wait(lambda: "loss diverged" in driver.find_element(By.TAG_NAME, "body").text)
        assert driver.current_url.endswith("/output.log")
    finally:
        driver.quit()
