"""The matrix page inside a real Airflow api-server: authentication on every route, and the
page as a person sees it, in headless Chromium logged in through Airflow's login form.

Browser: Debian's ``chromium`` driven by its ``chromium-driver`` through selenium (pinned in
requirements-dev.txt). Selenium rather than ``chromium --screenshot URL``: the page needs the
login cookie, and the only way to hand that to a bare CLI run would be a token in the URL.
Selenium is told where chromedriver is, so it never tries to download a driver.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from needs import missing

from accelmatrix import settings
from accelmatrix.results.store import ResultsStore
from accelmatrix_testkit import AirflowStack
from accelmatrix_testkit.matrix_results import plant_demo

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


class Site:
    def __init__(self, stack: AirflowStack, run_ids: list[str], docs: str) -> None:
        self.stack = stack
        self.base = stack.base_url
        self.run_ids = run_ids
        self.docs = docs  # URL path of a Data Docs file
        self.token = stack._login()

    def password(self) -> str:
        pw = self.stack.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(pw.read_text())["admin"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("matrix-page")
    (root / "dags").mkdir()
    stack = AirflowStack(
        home=root / "airflow",
        dags_folder=root / "dags",
        components=("api-server",),
        all_admins=False,  # the simple auth manager's real login, no implicit admin
    )
    # Plant the results where the api-server reads them (its ACCELMATRIX_HOME).
    saved = {k: os.environ.get(k) for k in ("ACCELMATRIX_HOME", "ACCELMATRIX_ARTIFACTS_DIR")}
    os.environ["ACCELMATRIX_HOME"] = str(stack.accel_home)
    os.environ.pop("ACCELMATRIX_ARTIFACTS_DIR", None)
    try:
        store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
        run_ids = plant_demo(store)
        _plant_history_and_stopped(store)
        store.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    # The cell's folders as settings names them (a hash suffix where characters changed).
    run_dir, cell_dir = (
        quote(settings.safe_name(x), safe="") for x in (run_ids[-1], "model=a,config=x")
    )
    docs = f"/accelmatrix/suites/demo/files/{run_dir}/{cell_dir}/data_docs/index.html"
    with stack:
        yield Site(stack, run_ids, docs)


HISTORY = {  # suite "hist": verdicts over 6 nightly runs, oldest first
    "c=steady": "PPPPPP",
    "c=flaky": "PFPPFP",
    "c=new": "PPPPPF",
}


def _plant_history_and_stopped(store: ResultsStore) -> None:
    """Suite ``hist`` (a flaky and a newly failing cell) and suite ``stopped`` (a run marked
    failed: a cancelled cell, one whose workload ended just after the stop, one failed)."""
    from datetime import timedelta

    from accelmatrix_testkit.matrix_results import END, PlantedCell, plant_run

    state = {"P": "passed", "F": "failed"}
    for day in range(6):
        when = END - timedelta(days=5 - day)
        cells = [
            PlantedCell(cid, {"c": cid[2:]}, index=i, state=state[seq[day]])
            for i, (cid, seq) in enumerate(HISTORY.items())
        ]
        run_id = f"scheduled__{when:%Y-%m-%dT%H:%M:%S}+00:00"
        plant_run(store, "hist", run_id, cells, logical_date=when, started_at=when)
    cut = "run task marked failed/success or cleared from outside (REST/UI), or its run deleted"
    cells = [
        PlantedCell("m=a", {"m": "a"}, index=0, state="cancelled", message=cut),
        PlantedCell("m=b", {"m": "b"}, index=1, state="ran"),
        PlantedCell("m=c", {"m": "c"}, index=2, state="failed", failed_checks=("x",)),
    ]
    plant_run(store, "stopped", "manual__1", cells, logical_date=None, started_at=END)


def _forged_token() -> str:
    """A well-formed JWT for admin, signed with a key the api-server does not have."""
    import jwt

    now = int(time.time())
    claims = {"sub": "admin", "role": "ADMIN", "iat": now, "nbf": now, "exp": now + 600}
    claims.update({"aud": "apache-airflow", "iss": "airflow", "jti": secrets.token_hex(8)})
    return jwt.encode(claims, secrets.token_urlsafe(64), algorithm="HS512")


@pytest.mark.slow(50)
def test_every_route_requires_airflow_authentication(site: Site) -> None:
    old_run = quote(site.run_ids[0], safe="")
    routes = [
        "/accelmatrix/",
        "/accelmatrix/suites/demo",
        f"/accelmatrix/suites/demo?run_id={old_run}",
        "/accelmatrix/suites/no_such_suite",
        site.docs,
        "/accelmatrix/suites/demo/files/x/y/data_docs/%2e%2e/%2e%2e/%2e%2e/results.db",
    ]
    anonymous = {
        "no credentials": {},
        "garbage bearer": {"Authorization": "Bearer not-a-jwt"},
        "forged bearer": {"Authorization": f"Bearer {_forged_token()}"},
        "garbage cookie": {"Cookie": "_token=not-a-jwt"},
        "forged cookie": {"Cookie": f"_token={_forged_token()}"},
    }
    with httpx.Client(base_url=site.base, timeout=30) as c:
        for route in routes:
            for what, headers in anonymous.items():
                r = c.get(route, headers=headers)
                assert r.status_code in (401, 403), (route, what, r.status_code, r.text[:200])
                assert "data-cell-id" not in r.text and "Data Docs of" not in r.text

        # Inside the navigation entry's view, logging in leads back to the view.
        r = c.get(
            "/accelmatrix/suites/demo?run_id=x",
            headers={"Accept": "text/html", "X-Accelmatrix-Embed": "1"},
        )
        assert r.status_code == 401 and "Not logged in" in r.text
        back = quote(f"{site.base}/plugin/accelmatrix/suites/demo?run_id=x", safe="")
        assert f"/auth/login?next={back}" in r.text

        bearer = {"Authorization": f"Bearer {site.token}"}
        r = c.get("/accelmatrix/", headers=bearer)
        assert r.status_code == 200 and 'data-dag-id="demo"' in r.text
        r = c.get("/accelmatrix/suites/demo", headers=bearer)
        assert r.status_code == 200, r.text[:500]
        assert r.text.count('class="cell k-') == 6
        for kind in ("passed", "failed", "infra", "quarantined", "flaky", "excluded"):
            assert f'data-kind="{kind}"' in r.text
        assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none'
        assert "default-src 'none'" in r.headers["content-security-policy"]
        # The cookie the Airflow UI sets works the same way.
        cookie = {"Cookie": f"_token={site.token}"}
        r = c.get(f"/accelmatrix/suites/demo?run_id={old_run}", headers=cookie)
        assert r.status_code == 200 and "selected>" + site.run_ids[0] in r.text
        # Evidence (Data Docs, a cell's logs): served, sandboxed; nothing else is.
        r = c.get(site.docs, headers=bearer)
        assert r.status_code == 200 and "Data Docs of model=a,config=x" in r.text
        assert r.headers["content-security-policy"].startswith("sandbox")
        for bad in (
            "/accelmatrix/suites/demo/files/x/y/data_docs/%2e%2e/%2e%2e/%2e%2e/results.db",
            "/accelmatrix/suites/demo/files/%2e%2e/%2e%2e/results.db",
            "/accelmatrix/suites/demo/files/%2Fetc%2Fpasswd",
            site.docs.replace("data_docs/index.html", "fetched.json"),  # a marker
            site.docs.replace("data_docs/index.html", "files"),  # a directory
        ):
            r = c.get(bad, headers=bearer)
            assert r.status_code == 404, (bad, r.status_code)
        assert c.get("/accelmatrix/suites/no_such_suite", headers=bearer).status_code == 404
    # The plugin is registered with its navigation entry: a React app (no sandboxed iframe).
    plugins = site.stack.api("GET", "plugins")["plugins"]
    (mine,) = [p for p in plugins if p["name"] == "accelmatrix"]
    assert mine["external_views"] == []
    (view,) = [a for a in mine["react_apps"] if a["destination"] == "nav"]
    assert view["url_route"] == "accelmatrix"
    # Its script is the one public route: code only, no data.
    with httpx.Client(base_url=site.base, timeout=30) as c:
        r = c.get("/" + view["bundle_url"])
        assert r.status_code == 200 and "javascript" in r.headers["content-type"]
        assert "globalThis.AirflowPlugin" in r.text and "data-cell-id" not in r.text


def _browser(tmp_path: Path, *, offline: bool = False):  # noqa: ANN202 - a selenium driver
    from selenium import webdriver  # requirements-dev.txt
    from selenium.webdriver.chrome.service import Service

    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        missing(
            "browser",
            "headless Chromium tests need Debian's chromium and chromium-driver: "
            "apt-get install -y chromium chromium-driver",
        )
    opts = webdriver.ChromeOptions()
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,900",
    ):
        opts.add_argument(arg)
    if offline:  # an air-gapped machine: no name resolves but this one's
        opts.add_argument("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    opts.binary_location = CHROMIUM
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _wait(predicate, timeout: float = 20.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception:  # noqa: BLE001, S110 - the DOM is still loading
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the page did not get there in time")
        time.sleep(0.25)


# The colours of the page's CSS, as the browser computes them.
COLOURS = {
    "passed": "rgba(198, 246, 213, 1)",
    "failed": "rgba(254, 178, 178, 1)",
    "infra": "rgba(251, 211, 141, 1)",
    "quarantined": "rgba(214, 188, 250, 1)",
    "flaky": "rgba(250, 240, 137, 1)",
    "excluded": "rgba(226, 232, 240, 1)",
    "cancelled": "rgba(203, 213, 224, 1)",
}


@pytest.mark.slow(40)
def test_chromium_logs_in_and_sees_the_matrix(site: Site, tmp_path: Path) -> None:
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By

    try:
        # Anonymous: the page itself refuses, with a way to log in.
        driver.get(f"{site.base}/accelmatrix/suites/demo")
        assert "Not logged in" in driver.find_element(By.TAG_NAME, "h1").text
        assert not driver.find_elements(By.CSS_SELECTOR, "td.cell")

        # Airflow's own login form (simple auth manager), then the navigation entry.
        driver.get(f"{site.base}/auth/login?next={quote(site.base + '/', safe='')}")
        _wait(lambda: driver.find_element(By.NAME, "username")).send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(site.password())
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        _wait(lambda: any(c["name"] == "_token" for c in driver.get_cookies()))
        _open_from_navigation(driver, site)
        _wait(lambda: len(_shadow(driver).find_elements(By.CSS_SELECTOR, "td.cell")) == 6)
        in_ui = tmp_path / "matrix-in-airflow-ui.png"
        driver.save_screenshot(str(in_ui))

        # The page on its own, opened directly, for the DOM assertions.
        driver.set_window_size(1400, 1400)
        driver.get(f"{site.base}/accelmatrix/suites/demo")
        cells = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, "td.cell"))
        page = tmp_path / "matrix-page.png"
        driver.save_screenshot(str(page))
        seen = {}
        for td in cells:
            kind = td.get_attribute("data-kind")
            seen[td.get_attribute("data-cell-id")] = kind
            assert td.value_of_css_property("background-color") == COLOURS[kind], kind
            assert td.is_displayed()
        assert seen == {
            "model=a,config=x": "passed",
            "model=a,config=y": "failed",
            "model=a,config=z": "infra",
            "model=b,config=x": "quarantined",
            "model=b,config=y": "excluded",
            "model=b,config=z": "flaky",
        }
        log = driver.find_element(By.CSS_SELECTOR, "td[data-cell-id='model=a,config=y'] a.log")
        assert log.get_attribute("href").endswith("/tasks/cpu.evaluate/mapped/1")
        assert len(driver.find_elements(By.CSS_SELECTOR, "svg.trend")) == 2
        assert len(driver.find_elements(By.CSS_SELECTOR, "circle.violation")) == 5
        assert driver.find_element(By.CSS_SELECTOR, "g.s-regression").get_attribute(
            "data-cell-id"
        ) == ("model=a,config=y")
        # The Data Docs link opens the served file (same cookie).
        docs = driver.find_element(By.CSS_SELECTOR, "a.docs").get_attribute("href")
        driver.get(docs)
        assert "Data Docs of model=a,config=x" in driver.find_element(By.TAG_NAME, "h1").text
        for png in (in_ui, page):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    finally:
        driver.quit()


def _shadow(driver):  # noqa: ANN001, ANN202
    """The matrix page as the navigation entry's view shows it (its shadow root)."""
    from selenium.webdriver.common.by import By

    host = driver.find_element(By.CSS_SELECTOR, "#accelmatrix-view[data-state=ready]")
    return host.shadow_root


def _login(driver, site: Site) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    driver.get(f"{site.base}/auth/login?next={quote(site.base + '/', safe='')}")
    _wait(lambda: driver.find_element(By.NAME, "username")).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(site.password())
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    _wait(lambda: any(c["name"] == "_token" for c in driver.get_cookies()))


def _open_from_navigation(driver, site: Site, suite: str = "demo") -> None:  # noqa: ANN001
    """Airflow's home page, its "Test matrix" navigation entry, then the suite's link."""
    from selenium.webdriver.common.by import By

    driver.get(f"{site.base}/")
    nav = _wait(lambda: driver.find_element(By.XPATH, "//*[normalize-space()='Test matrix']"))
    nav.click()
    _wait(lambda: driver.current_url == f"{site.base}/plugin/accelmatrix")
    # Shown in Airflow's own document: no iframe, so nothing sandboxes the links.
    assert not driver.find_elements(By.TAG_NAME, "iframe")
    link = _wait(
        lambda: _shadow(driver).find_element(By.CSS_SELECTOR, f"tr[data-dag-id='{suite}'] a")
    )
    link.click()
    _wait(lambda: driver.current_url == f"{site.base}/plugin/accelmatrix/suites/{suite}")


@pytest.mark.slow(30)
def test_every_link_works_from_the_navigation_entry(site: Site, tmp_path: Path) -> None:
    """Item 1: opened from Airflow's navigation, the log, Data Docs, run and page links all
    go where they point (they did nothing in Airflow 3.3.2's sandboxed plugin iframe)."""
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    run_q = quote(site.run_ids[-1], safe="")
    try:
        _login(driver, site)
        _open_from_navigation(driver, site)
        page = _wait(lambda: _shadow(driver))
        # The failed cell's cause is on the grid, and its log link opens the evaluate task.
        cell = page.find_element(By.CSS_SELECTOR, "td[data-cell-id='model=a,config=y']")
        assert "final_loss" in cell.find_element(By.CSS_SELECTOR, ".why").text
        cell.find_element(By.CSS_SELECTOR, "a.log").click()
        want = f"{site.base}/dags/demo/runs/{run_q}/tasks/cpu.evaluate/mapped/1"
        _wait(lambda: driver.current_url == want)
        _wait(lambda: not driver.find_elements(By.ID, "accelmatrix-view"))  # Airflow's page now

        # Back to the matrix (its URL is in the browser history), then the run link.
        driver.back()
        _wait(lambda: driver.current_url == f"{site.base}/plugin/accelmatrix/suites/demo")
        _wait(lambda: _shadow(driver).find_element(By.CSS_SELECTOR, "a.run-link")).click()
        _wait(lambda: driver.current_url == f"{site.base}/dags/demo/runs/{run_q}")

        # The run picker (a form) stays inside the view.
        driver.back()
        page = _wait(lambda: _shadow(driver))
        old = site.run_ids[0]
        Select(page.find_element(By.CSS_SELECTOR, "select[name=run_id]")).select_by_value(old)
        page.find_element(By.CSS_SELECTOR, "form.picker button").click()
        _wait(lambda: driver.current_url.endswith(f"/suites/demo?run_id={quote(old, safe='')}"))
        assert "/plugin/accelmatrix/" in driver.current_url

        def selected() -> str:
            opt = _shadow(driver).find_element(By.CSS_SELECTOR, "option[selected]")
            return opt.get_attribute("value")

        _wait(lambda: selected() == old)

        # Data Docs open in a new tab (their own sandboxed origin) and render.
        driver.back()
        _wait(lambda: selected() == site.run_ids[-1])
        before = set(driver.window_handles)
        _shadow(driver).find_element(By.CSS_SELECTOR, "a.docs").click()
        new = _wait(lambda: set(driver.window_handles) - before)
        driver.switch_to.window(new.pop())
        h1 = _wait(lambda: driver.find_element(By.TAG_NAME, "h1"))
        assert "Data Docs of model=a,config=x" in h1.text
        assert "/accelmatrix/suites/demo/files/" in driver.current_url
    finally:
        driver.quit()


def test_history_and_a_cancelled_run_in_chromium(site: Site, tmp_path: Path) -> None:
    """Items 3 and 4 as a person sees them: the history view from the navigation entry
    marks the flaky and the newly failing cell and its squares open that run's cell; a run
    marked failed shows its cancelled cells grey, counted apart, none in progress."""
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By

    try:
        _login(driver, site)
        driver.get(f"{site.base}/")
        nav = _wait(lambda: driver.find_element(By.XPATH, "//*[normalize-space()='Test matrix']"))
        nav.click()
        _wait(
            lambda: _shadow(driver).find_element(
                By.CSS_SELECTOR, "tr[data-dag-id='hist'] a.history"
            )
        ).click()
        _wait(lambda: driver.current_url == f"{site.base}/plugin/accelmatrix/suites/hist/history")
        rows = _wait(lambda: _shadow(driver).find_elements(By.CSS_SELECTOR, "#history tbody tr"))
        marks = {r.get_attribute("data-cell-id"): r.get_attribute("data-marks") for r in rows}
        assert marks == {"c=new": "new", "c=flaky": "flaky", "c=steady": ""}
        flaky = _shadow(driver).find_element(By.CSS_SELECTOR, "tr[data-cell-id='c=flaky']")
        squares = flaky.find_elements(By.CSS_SELECTOR, "td.sq a")
        colours = [a.value_of_css_property("background-color") for a in squares]
        want = ["passed", "failed", "passed", "passed", "failed", "passed"]
        assert colours == [COLOURS[k] for k in want]
        assert squares[0].size["width"] >= 12 and squares[0].size["height"] >= 12
        driver.save_screenshot(str(tmp_path / "history.png"))
        squares[1].click()  # the flaky cell's first failure
        _wait(lambda: "/plugin/accelmatrix/suites/hist?run_id=" in driver.current_url)
        assert driver.current_url.endswith("#c1")
        cell = _wait(lambda: _shadow(driver).find_element(By.CSS_SELECTOR, "td#c1"))
        assert cell.get_attribute("data-cell-id") == "c=flaky"
        assert cell.get_attribute("data-kind") == "failed"

        # "Mark run as failed" as the UI sends it. The run exists only in the results store
        # here (no scheduler), so Airflow answers 404, but its audit log has already
        # committed who asked (action_logging commits before the endpoint runs): the page
        # reads that entry to say who stopped the run and when.
        with httpx.Client(base_url=site.base, timeout=30) as c:
            for body in ({"state": "failed"}, {"note": "looking into it"}):  # a note: no stop
                r = c.patch(
                    "/api/v2/dags/stopped/dagRuns/manual__1",
                    json=body,
                    headers={"Authorization": f"Bearer {site.token}"},
                )
                assert r.status_code == 404, r.text
        driver.get(f"{site.base}/plugin/accelmatrix/suites/stopped")
        page = _wait(lambda: _shadow(driver))
        cells = _wait(lambda: page.find_elements(By.CSS_SELECTOR, "td.cell"))
        kinds = {td.get_attribute("data-cell-id"): td.get_attribute("data-kind") for td in cells}
        assert kinds == {"m=a": "cancelled", "m=b": "cancelled", "m=c": "failed"}
        for td in cells:
            assert (
                td.value_of_css_property("background-color")
                == COLOURS[kinds[td.get_attribute("data-cell-id")]]
            )
        assert page.find_element(By.CSS_SELECTOR, "b[data-count=cancelled]").text == "2"
        assert page.find_element(By.CSS_SELECTOR, "b[data-count=failed]").text == "1"
        assert page.find_element(By.CSS_SELECTOR, "b[data-count=pending]").text == "0"
        a = page.find_element(By.CSS_SELECTOR, "td[data-cell-id='m=a'] .why")
        assert (
            a.text.startswith("stopped by admin at ") and "patch_dag_run (state=failed)" in a.text
        )
        b = page.find_element(By.CSS_SELECTOR, "td[data-cell-id='m=b']")
        assert b.find_element(By.CSS_SELECTOR, ".st").text == "no verdict (ran)"
        driver.save_screenshot(str(tmp_path / "stopped.png"))
    finally:
        driver.quit()


def test_data_docs_render_with_no_network(site: Site, tmp_path: Path) -> None:
    """Item 5: real Great Expectations Data Docs of a cell, served by the page and opened
    in Chromium whose resolver reaches nothing but this machine: the index shows every
    expectation, no generated page names an http(s) script or stylesheet, and the browser
    requested nothing from elsewhere."""
    from accelmatrix.contracts.check_verdicts import CellOutputs
    from accelmatrix.evaluation import evaluate_cell
    from accelmatrix.evaluation.offline_docs import external_refs
    from accelmatrix.spec.checks import parse_checks

    rel = "offline_run/model=a,config=x/data_docs"
    docs = site.stack.accel_home / "artifacts" / "demo" / rel
    art = tmp_path / "art"
    (art / "files").mkdir(parents=True)
    (art / "output.log").write_text("step 1\nFinished training run\n")
    outputs = CellOutputs(
        files_dir=art / "files",
        log_path=art / "output.log",
        status={"exit_code": 0, "timed_out": False},
        metrics=[{"name": "loss", "step": i, "value": v} for i, v in enumerate((2.0, 1.0))],
    )
    checks = [
        {"type": "exit_status", "expected": 0},
        {"type": "log_contains", "pattern": "Finished training run"},
        {"type": "metric_between", "name": "final loss below 1.5", "metric": "loss", "max": 0.5},
    ]
    report = evaluate_cell(
        parse_checks(checks),
        outputs,
        include_dir=tmp_path,
        data_docs_dir=docs,
        suite_name="demo.model=a,config=x",
    )
    assert report.data_docs_index == docs / "index.html"
    generated = list(docs.rglob("*.html"))
    assert len(generated) >= 3
    for page in generated:
        assert external_refs(page.read_text()) == [], page

    driver = _browser(tmp_path, offline=True)
    from selenium.webdriver.common.by import By

    try:
        _login(driver, site)
        driver.get(f"{site.base}/accelmatrix/suites/demo/files/{quote(rel)}/index.html")
        rows = _wait(
            lambda: driver.find_elements(
                By.CSS_SELECTOR, "#expectations tr.pass, #expectations tr.fail"
            )
        )
        assert len(rows) >= 3 and all(r.is_displayed() for r in rows)  # >= 1 per check
        assert len(driver.find_elements(By.CSS_SELECTOR, "#expectations tr.fail")) == 1
        assert "final loss below 1.5" in driver.find_element(By.ID, "expectations").text
        # GE's own validation page, linked from the index, renders its tables too.
        driver.find_element(By.CSS_SELECTOR, "a[href^='validations/']").click()
        _wait(lambda: driver.find_elements(By.TAG_NAME, "table"))
        loaded = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        assert all(u.startswith(site.base) for u in loaded), loaded
    finally:
        driver.quit()
