"""Triage from the history page inside a real Airflow api-server (SimpleAuthManager with a
viewer, a user and an admin): who may set a change group's state, that who and when are
stored, and that a form posted from another origin is refused."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from test_history_page import DAG, Planted, Svg, plant_backfill

from accelmatrix.contracts.change_point_records import ChangeGroup
from accelmatrix.results.store import ResultsStore
from accelmatrix_testkit import AirflowStack

pytestmark = pytest.mark.integration

USERS = {"admin": "admin", "viewer": "viewer", "editor": "user"}  # name: SimpleAuthManager role


class Site:
    def __init__(self, stack: AirflowStack, planted: Planted, other: int) -> None:
        self.stack = stack
        self.base = stack.base_url
        self.planted = planted
        self.other_suite_group = other
        pw = json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())
        self.tokens = {}
        for name in USERS:
            r = httpx.post(
                f"{self.base}/auth/token",
                json={"username": name, "password": pw[name]},
                timeout=30,
            )
            assert r.status_code < 300, r.text
            self.tokens[name] = r.json()["access_token"]

    def store(self) -> ResultsStore:
        return ResultsStore(f"sqlite:///{self.stack.accel_home / 'results.db'}")

    def group(self, gid: int) -> ChangeGroup | None:
        s = self.store()
        try:
            return s.get_change_group(gid)
        finally:
            s.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("history-page")
    (root / "dags").mkdir()
    stack = AirflowStack(
        home=root / "airflow",
        dags_folder=root / "dags",
        components=("api-server",),
        all_admins=False,
        env_extra={
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{n}:{r}" for n, r in USERS.items()
            )
        },
    )
    saved = {k: os.environ.get(k) for k in ("ACCELMATRIX_HOME", "ACCELMATRIX_ARTIFACTS_DIR")}
    os.environ["ACCELMATRIX_HOME"] = str(stack.accel_home)
    os.environ.pop("ACCELMATRIX_ARTIFACTS_DIR", None)
    try:
        store = ResultsStore(f"sqlite:///{stack.accel_home / 'results.db'}")
        planted = plant_backfill(store)
        other = plant_backfill(store, "other_suite").group
        store.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with stack:
        yield Site(stack, planted, other)


def _post(
    c: httpx.Client,
    site: Site,
    path: str,
    data: dict[str, str],
    *,
    user: str | None = "editor",
    origin: str | None = "self",
    bearer: bool = False,
    referer: str | None = None,
) -> httpx.Response:
    headers = {"Accept": "text/html"}
    if user and bearer:
        headers["Authorization"] = f"Bearer {site.tokens[user]}"
    elif user:
        headers["Cookie"] = f"_token={site.tokens[user]}"
    if origin:
        headers["Origin"] = site.base if origin == "self" else origin
    if referer:
        headers["Referer"] = referer
    return c.post(path, data=data, headers=headers)


def test_triage_permissions_who_and_when_and_origin(site: Site) -> None:
    gid = site.planted.group
    route = f"/accelmatrix/suites/{DAG}/changes/group/{gid}/triage"
    before = site.group(gid)
    assert before.state == "untriaged" and before.state_by is None
    with httpx.Client(base_url=site.base, timeout=30, follow_redirects=False) as c:
        # The page: the viewer sees the list and no form; the editor a form per entry.
        viewer = c.get(
            f"/accelmatrix/suites/{DAG}/history",
            headers={"Cookie": f"_token={site.tokens['viewer']}"},
        )
        assert viewer.status_code == 200, viewer.text[:300]
        assert f'id="group-{gid}"' in viewer.text and 'class="triage"' not in viewer.text
        editor = c.get(
            f"/accelmatrix/suites/{DAG}/history",
            headers={"Cookie": f"_token={site.tokens['editor']}"},
        )
        (form,) = Svg(editor.text).find("form", "triage")
        assert form["action"] == route and form["method"] == "post"

        # Anonymous: 401, whatever the origin; a bad token too.
        r = _post(c, site, route, {"state": "acknowledged"}, user=None)
        assert r.status_code == 401, r.text[:300]
        r = c.post(
            route,
            data={"state": "acknowledged"},
            headers={"Cookie": "_token=forged", "Origin": site.base},
        )
        assert r.status_code in (401, 403)
        # Read-only: 403, also with a same-origin form.
        r = _post(c, site, route, {"state": "acknowledged"}, user="viewer")
        assert r.status_code == 403 and "edit access" in r.text
        # Cross-origin forms with the editor's cookie: refused, nothing stored.
        for origin, referer in (
            ("http://evil.example", None),
            ("null", None),
            (None, None),  # neither Origin nor Referer
            (None, "http://evil.example/page"),
            (site.base.replace("127.0.0.1", "localhost"), None),  # same machine, other origin
        ):
            r = _post(c, site, route, {"state": "invalid"}, origin=origin, referer=referer)
            assert r.status_code == 403 and "another site" in r.text, (
                origin,
                referer,
                r.text[:200],
            )
        assert site.group(gid).state == "untriaged"

        # The editor, same origin: stored with who and when, back to the entry (303).
        t0 = datetime.now(UTC) - timedelta(seconds=5)
        r = _post(c, site, route, {"state": "acknowledged", "note": "bisecting", "runs": "10"})
        assert r.status_code == 303, r.text[:300]
        assert r.headers["location"] == f"/accelmatrix/suites/{DAG}/history?runs=10#group-{gid}"
        g = site.group(gid)
        assert (g.state, g.state_by, g.note) == ("acknowledged", "editor", "bisecting")
        assert t0 <= g.state_at <= datetime.now(UTC) + timedelta(seconds=5)
        s = site.store()
        try:
            (cp,) = s.get_change_points(DAG, group_id=gid)
        finally:
            s.close()
        assert (cp.state, cp.state_by) == ("acknowledged", "editor")  # the group's members
        # The page shows it, with who.
        page = c.get(
            r.headers["location"].split("#")[0],
            headers={"Cookie": f"_token={site.tokens['viewer']}"},
        )
        assert "acknowledged</b> by editor" in page.text and "bisecting" in page.text

        # From inside Airflow's navigation view (embed), a Referer instead of an Origin, and
        # the admin: back into the view.
        r = _post(
            c,
            site,
            route,
            {"state": "accepted", "embed": "1"},
            user="admin",
            origin=None,
            referer=f"{site.base}/plugin/accelmatrix/suites/{DAG}/history",
        )
        assert r.status_code == 303, r.text[:300]
        assert (
            r.headers["location"] == f"/plugin/accelmatrix/suites/{DAG}/history?runs=30#group-{gid}"
        )
        assert (site.group(gid).state, site.group(gid).state_by) == ("accepted", "admin")
        # A script with its own bearer token needs no Origin (no cookie to ride on).
        r = _post(c, site, route, {"state": "fixed"}, origin=None, bearer=True)
        assert r.status_code == 303 and site.group(gid).state == "fixed"
        # A viewer's bearer token is still read-only.
        r = _post(c, site, route, {"state": "invalid"}, user="viewer", origin=None, bearer=True)
        assert r.status_code == 403 and site.group(gid).state == "fixed"

        # Bad input: an unknown state, a group of another suite, an unknown id or kind.
        r = _post(c, site, route, {"state": "wontfix"})
        assert r.status_code == 400 and "wontfix" in r.text
        other = f"/accelmatrix/suites/{DAG}/changes/group/{site.other_suite_group}/triage"
        r = _post(c, site, other, {"state": "invalid"})
        assert r.status_code == 404
        assert site.group(site.other_suite_group).state == "untriaged"
        for path in (
            f"/accelmatrix/suites/{DAG}/changes/group/99999/triage",
            f"/accelmatrix/suites/{DAG}/changes/bogus/{gid}/triage",
        ):
            assert _post(c, site, path, {"state": "invalid"}).status_code == 404
        r = _post(c, site, route, {"state": "invalid", "note": "x" * 501})
        assert r.status_code == 400 and site.group(gid).state == "fixed"
        # A single change point, triaged on its own.
        cid = site.planted.change
        r = _post(
            c, site, f"/accelmatrix/suites/{DAG}/changes/change/{cid}/triage", {"state": "invalid"}
        )
        assert r.status_code == 303 and r.headers["location"].endswith(f"#change-{cid}")


def test_chromium_editor_triages_from_the_navigation_view(site: Site, tmp_path) -> None:  # noqa: ANN001
    """As a person does it: log in through Airflow's form as the editor, open the suite's
    trend from the navigation entry, follow the change mark to its group on the history
    page, set a state with the form (the page's CSP allows forms to 'self' only; Chromium
    sends the Origin) and land back on the entry, which now names the editor."""
    from test_matrix_page_server import _browser, _shadow, _wait

    pw = json.loads((site.stack.home / "simple_auth_manager_passwords.json.generated").read_text())
    driver = _browser(tmp_path)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    s = site.store()
    try:  # a fresh group for this test (the other test has triaged the planted one)
        from test_history_page import DATES

        gid = s.save_change_group(
            DAG,
            kind="infrastructure",
            direction="regression",
            logical_date=DATES[-1] + timedelta(days=30),
            summary="machine kind cpu slowed 2 cells",
            cells=["c=a", "c=b"],
            state="untriaged",
        )
        s.save_change_point(DAG, group_id=gid, id=site.planted.change)
        s.set_triage("change", site.planted.change, "untriaged", by="setup")
    finally:
        s.close()
    try:
        driver.get(f"{site.base}/auth/login?next={site.base}/")
        _wait(lambda: driver.find_element(By.NAME, "username")).send_keys("editor")
        driver.find_element(By.NAME, "password").send_keys(pw["editor"])
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        _wait(lambda: any(c["name"] == "_token" for c in driver.get_cookies()))
        run_id = site.planted.run_ids[-1]
        from urllib.parse import quote

        driver.get(f"{site.base}/plugin/accelmatrix/suites/{DAG}?run_id={quote(run_id, safe='')}")
        mark = _wait(lambda: _shadow(driver).find_element(By.CSS_SELECTOR, "g.change a.cp-group"))
        driver.save_screenshot(str(tmp_path / "trend-change.png"))
        # Follow the change's line: its group's entry on the history page, in the view.
        label = mark.find_element(By.CSS_SELECTOR, "text.cp-label")
        assert label.text.strip() == "+5.0 %"
        label.click()
        _wait(lambda: f"/plugin/accelmatrix/suites/{DAG}/history" in driver.current_url)
        assert driver.current_url.endswith(f"#group-{gid}")
        row = _wait(lambda: _shadow(driver).find_element(By.CSS_SELECTOR, f"tr#group-{gid}"))
        assert row.get_attribute("data-state") == "untriaged"
        Select(row.find_element(By.CSS_SELECTOR, "select[name=state]")).select_by_value(
            "infrastructure"
        )
        row.find_element(By.CSS_SELECTOR, "input[name=note]").send_keys("cpu pool drained")
        row.find_element(By.CSS_SELECTOR, "form.triage button").click()
        _wait(
            lambda: _shadow(driver).find_element(
                By.CSS_SELECTOR, f"tr#group-{gid}[data-state=infrastructure]"
            )
        )
        assert driver.current_url.endswith(
            f"/plugin/accelmatrix/suites/{DAG}/history?runs=30#group-{gid}"
        )
        row = _shadow(driver).find_element(By.CSS_SELECTOR, f"tr#group-{gid}")
        assert "by editor" in row.text and "cpu pool drained" in row.text
        driver.save_screenshot(str(tmp_path / "history-triaged.png"))
        g = site.group(gid)
        assert (g.state, g.state_by) == ("infrastructure", "editor")

        # The page on its own (not in the view): the same form, back to the app's page.
        driver.get(f"{site.base}/accelmatrix/suites/{DAG}/history")
        row = _wait(lambda: driver.find_element(By.CSS_SELECTOR, f"tr#group-{gid}"))
        Select(row.find_element(By.CSS_SELECTOR, "select[name=state]")).select_by_value("fixed")
        row.find_element(By.CSS_SELECTOR, "form.triage button").click()
        _wait(lambda: driver.find_element(By.CSS_SELECTOR, f"tr#group-{gid}[data-state=fixed]"))
        assert (
            driver.current_url
            == f"{site.base}/accelmatrix/suites/{DAG}/history?runs=30#group-{gid}"
        )
    finally:
        driver.quit()


def test_compare_form_goes_through_airflows_trigger_api_as_the_user(site: Site) -> None:
    """The history page's "compare two builds" form: only an editor sees and may post it,
    from this site only; the run is asked of Airflow's own REST API with the user's token
    (here the planted suite has no DAG in this api-server, so Airflow's 404 comes back as
    the refusal, naming it: nothing is started behind Airflow's back)."""
    route = f"/accelmatrix/suites/{DAG}/compare"
    page = f"/accelmatrix/suites/{DAG}/history"
    fields = {"base": "nightly-2026-03-01", "head": "nightly-2026-03-02", "pairs": "8"}
    with httpx.Client(base_url=site.base, timeout=60) as c:
        editor = c.get(page, headers={"Cookie": f"_token={site.tokens['editor']}"}).text
        viewer = c.get(page, headers={"Cookie": f"_token={site.tokens['viewer']}"}).text
        assert 'id="compare"' in editor and f'action="/accelmatrix{route[12:]}"' in editor
        assert 'id="compare"' not in viewer
        assert _post(c, site, route, fields, user="viewer").status_code == 403
        assert _post(c, site, route, fields, origin="https://evil.example").status_code == 403
        missing = _post(c, site, route, {"base": "x"})
        assert missing.status_code == 400 and "base and head" in missing.text
        r = _post(c, site, route, fields)
        assert r.status_code == 404 and "the comparison was refused" in r.text, r.text
