"""Perf history's change points against a real SQLite results store: found night by night
as the gate does, grouped by cause (build / infrastructure), retracted when a 2-night
excursion at the end goes away, triaged (states, who, when, inheritance), bounds that never
re-center across an open regression, and the CLI (its JSON and its bad-input messages)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from accelmatrix.contracts.change_point_records import ChangeGroup
from accelmatrix.contracts.run_records import MetricValue
from accelmatrix.history.bounds.bounds_job import recenter
from accelmatrix.history.change_points.tracking import update_changes
from accelmatrix.history.change_points.triage import apply_triage
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.suite_parts import HistorySpec
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix
from accelmatrix_testkit.records import verdict

ROOT = Path(__file__).resolve().parents[1]
TRACKED = {"step_time": "median"}
# The detector and grouping alone: re-tests (history.confirm) are tested in
# test_confirm_bisect.py; here a group notifies on the nightly points.
NIGHTLY_ONLY = HistorySpec(confirm={"enabled": False})


@pytest.fixture
def store(tmp_path: Path):
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    yield s
    s.close()


def nightly(store: ResultsStore, pm: PerfMatrix, nights: range) -> list[ChangeGroup]:
    """Plant night by night, running the gate's pass after each and marking the groups due
    a notification as notified (as alerts.deliver_groups does); those groups."""
    sent = []
    for n in nights:
        pm.plant(store, range(n, n + 1))
        for g in update_changes(store, pm.dag_id, NIGHTLY_ONLY, TRACKED).to_notify:
            store.save_change_group(pm.dag_id, notified_at=pm.date(n), id=g.id)
            sent.append(g)
    return sent


@pytest.mark.parametrize("seed", [0, 1])
def test_one_group_per_cause_named_by_its_cause(store: ResultsStore, seed: int) -> None:
    pm = PerfMatrix(
        seed=seed,
        causes=[
            Cause("build", 30, 0.06, model="m1"),
            Cause("infrastructure", 45, 0.08, machine="k2"),
        ],
    )
    sent = nightly(store, pm, range(pm.nights))
    # One notification per cause (bench/bench_history.py gives the rate over many seeds).
    assert len(sent) == 2, [g.summary for g in sent]
    groups = {g.kind: g for g in store.get_change_groups(pm.dag_id)}
    assert set(groups) == {"build", "infrastructure"}, [g.summary for g in groups.values()]
    build, infra = groups["build"], groups["infrastructure"]
    assert build.cells == [pm.cell("m1", k) for k in pm.machines]
    assert build.logical_date == pm.date(30)
    assert build.runtime_version == f"nightly-{pm.date(30):%Y-%m-%d}"
    assert build.prev_runtime_version == f"nightly-{pm.date(29):%Y-%m-%d}"
    assert "build nightly-" in build.summary and 0.04 < build.change_median < 0.08
    assert infra.machine == "k2" and infra.logical_date == pm.date(45)
    assert sorted(infra.cells) == sorted(pm.cell(m, "k2") for m in pm.models)
    assert "machine kind k2" in infra.summary and "stayed flat" in infra.summary
    points = store.get_change_points(pm.dag_id)
    assert all(p.group_id in (build.id, infra.id) for p in points)
    assert all(p.direction == "regression" and p.state == "untriaged" for p in points)


def test_a_two_night_excursion_at_the_end_is_retracted_when_it_returns(store: ResultsStore) -> None:
    pm = PerfMatrix(models=["m0"], machines=["k0"], nights=42, cv=0.01)
    nightly(store, pm, range(40))
    assert store.get_change_points(pm.dag_id) == []
    # Two nights 20 sigmas slow: reported at once (tail guard), not yet notified here.
    run = f"scheduled__{pm.date(40).isoformat()}"
    for n in (40, 41):
        pm.plant(store, range(n, n + 1))
        rid = f"scheduled__{pm.date(n).isoformat()}"
        store.replace_metrics(
            pm.dag_id,
            rid,
            pm.cell("m0", "k0"),
            [MetricValue(name="step_time", value=1.2, step=None)],
        )
        update_changes(store, pm.dag_id, NIGHTLY_ONLY, TRACKED)
    (cp,) = store.get_change_points(pm.dag_id)
    assert cp.run_id == run and cp.n_after == 2 and cp.change > 0.15
    group_id = cp.group_id
    # The third night is back: no level was ever there. Missing once, the report stays
    # (a change at the edge of significance must not flicker); missing twice, it goes,
    # and so does its group (nobody was notified of it).
    pm.nights = 44
    pm.plant(store, range(42, 43))
    update_changes(store, pm.dag_id, NIGHTLY_ONLY, TRACKED)
    (kept,) = store.get_change_points(pm.dag_id)
    assert kept.id == cp.id and kept.missing == 1
    assert store.get_change_groups(pm.dag_id)[0].id == group_id
    pm.plant(store, range(43, 44))
    update_changes(store, pm.dag_id, NIGHTLY_ONLY, TRACKED)
    assert store.get_change_points(pm.dag_id) == []
    assert store.get_change_group(group_id) is None


def test_triage_states_who_when_and_inheritance(store: ResultsStore) -> None:
    pm = PerfMatrix(causes=[Cause("build", 30, 0.05, model="m2")], nights=42, seed=3)
    night = 25
    nightly(store, pm, range(night))
    while not store.get_change_groups(pm.dag_id):
        nightly(store, pm, range(night, night + 1))
        night += 1
    (group,) = store.get_change_groups(pm.dag_id)
    with pytest.raises(ValueError, match="not one of"):
        apply_triage(store, "group", group.id, "wontfix", by="ann")
    with pytest.raises(KeyError):
        apply_triage(store, "group", group.id + 99, "invalid", by="ann")
    with pytest.raises(KeyError, match="does not belong"):
        apply_triage(store, "group", group.id, "invalid", by="ann", dag_id="other")
    res = apply_triage(store, "group", group.id, "acknowledged", by="ann", note="bisecting")
    assert res.row.state == "acknowledged" and res.row.state_by == "ann"
    assert res.row.state_at is not None and res.row.note == "bisecting"
    members = store.get_change_points(pm.dag_id, group_id=group.id)
    assert members and {(p.state, p.state_by) for p in members} == {("acknowledged", "ann")}
    assert len(members) < len(pm.machines)  # the others are found on later nights
    # Cells found later join the group and take its state.
    nightly(store, pm, range(night, pm.nights))
    later = store.get_change_points(pm.dag_id, group_id=group.id)
    assert len(later) > len(members) and {p.id for p in members} <= {p.id for p in later}
    assert {p.state for p in later} == {"acknowledged"}
    assert [g.id for g in store.get_change_groups(pm.dag_id)] == [group.id]


def _bounds_suite(tmp_path: Path, pm: PerfMatrix) -> Path:
    include = tmp_path / "include"
    (include / "bounds").mkdir(parents=True)
    (include / "suites").mkdir()
    path = include / "bounds" / "b.yaml"
    bench = {"step_time_lower_bound": 0.9, "step_time_upper_bound": 1.1}
    path.write_text(yaml.safe_dump({"benchmarks": {"m0": bench}}))
    return path


def test_bounds_never_recenter_across_an_open_regression(
    store: ResultsStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-centering uses only points of an accepted level: an untriaged regression holds
    the bounds; accepting it moves them onto the new level with the same width."""
    pm = PerfMatrix(
        models=["m0"],
        machines=["k0", "k1"],
        nights=40,
        causes=[Cause("build", 25, 0.06, model="m0")],
    )
    path = _bounds_suite(tmp_path, pm)
    nightly(store, pm, range(pm.nights))
    # The history frame needs the benchmark of each point: the perf check's rows.
    for n in range(pm.nights):
        rid = f"scheduled__{pm.date(n).isoformat()}"
        for k in pm.machines:
            cid = pm.cell("m0", k)
            (m,) = store.get_metrics(pm.dag_id, rid, cid)
            store.replace_checks(
                pm.dag_id,
                rid,
                cid,
                [
                    verdict(
                        "step_time_within_bounds",
                        True,
                        type="step_time_within_bounds",
                        perf={
                            "benchmark": "m0",
                            "metric": "step_time",
                            "value": m.value,
                            "lower_bound": 0.9,
                            "upper_bound": 1.1,
                        },
                    )
                ],
            )
    update_changes(store, pm.dag_id, NIGHTLY_ONLY, TRACKED)  # the points learn their benchmark
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(tmp_path / "include"))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "include" / "suites"))
    file_text = path.read_text()
    end = pm.date(pm.nights)
    report = recenter(path, store=store, window_days=60, min_samples=5, now=end)
    (change,) = report.changes
    assert change.new is None and "held: open regression" in change.reason
    assert not report.stored and store.bounds_in_force("bounds/b.yaml") == {}

    (group,) = store.get_change_groups(pm.dag_id)
    suite = yaml.safe_load((ROOT / "include" / "suites" / "nightly_perf.yaml").read_text())
    suite["checks"] = [
        {"type": "step_time_within_bounds", "bounds_file": "bounds/b.yaml", "benchmark": "m0"}
    ]
    suite.pop("notify", None)
    (tmp_path / "include" / "suites" / f"{pm.dag_id}.yaml").write_text(yaml.safe_dump(suite))
    res = apply_triage(store, "group", group.id, "accepted", by="ann", note="new kernel")
    assert res.bounds and "width kept" in res.bounds[0], res.bounds
    # Stored with who and why; the bounds file (git's) is left as it was.
    assert path.read_text() == file_text
    b = store.bounds_in_force("bounds/b.yaml")["m0"]
    assert (b.reason, b.by, b.note) == ("accepted change", "ann", "new kernel")
    assert b.detail["group_id"] == group.id
    level = sorted(p.median_after for p in store.get_change_points(pm.dag_id))
    center = (b.step_time_lower_bound + b.step_time_upper_bound) / 2
    assert b.step_time_upper_bound - b.step_time_lower_bound == pytest.approx(0.2)
    assert level[0] <= center <= level[-1]
    # Now the daily re-centering may use the new level (and only it), starting from the
    # accepted bounds, and stores its own row: the file is still not written.
    report = recenter(path, store=store, window_days=60, min_samples=5, now=end)
    (change,) = report.changes
    after = sum(pm.nights - p.position for p in store.get_change_points(pm.dag_id))
    assert change.new is not None and change.samples == after < 2 * pm.nights
    assert change.old == pytest.approx((b.step_time_lower_bound, b.step_time_upper_bound))
    assert change.new[0] > 1.0  # the old level (~1.0) no longer pulls the band down
    assert report.stored and path.read_text() == file_text
    m = store.bounds_in_force("bounds/b.yaml")["m0"]
    assert (m.reason, m.by) == ("maintenance", "accelmatrix-maintenance")
    assert m.step_time_lower_bound == pytest.approx(change.new[0])
    assert [r.reason for r in store.get_bounds_history(["bounds/b.yaml"])] == [
        "maintenance",
        "accepted change",
    ]


# -- the CLI -------------------------------------------------------------------------------
def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(  # noqa: S603 (argv list)
        [sys.executable, "-m", "accelmatrix", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "plugins"), **(env or {})},
        timeout=120,
    )


def test_cli_changepoints_of_a_csv(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    start = PerfMatrix().date(0)
    lines = ["time,value"]
    for i in range(40):
        day = (start + timedelta(days=i)).date().isoformat()
        lines.append(f"{day},{(100 if i < 25 else 110) + rng.normal(0, 1):.3f}")
    f = tmp_path / "s.csv"
    f.write_text("\n".join(lines) + "\n")
    out = cli("changepoints", str(f))
    assert out.returncode == 0, out.stderr
    (cp,) = json.loads(out.stdout)["change_points"]
    assert cp["index"] == 25 and cp["time"] == lines[26].split(",")[0]
    assert cp["before"]["n"] == 25 and cp["after"]["n"] == 15
    assert cp["change"] == pytest.approx(0.1, abs=0.02) and cp["p_value"] < 1e-6


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("time,val\n1,1\n2,2\n3,3\n", "missing column(s) value"),
        ("time,value\n1,1\n2,fast\n3,3\n", "line 3: value 'fast' is not a number"),
        ("time,value\n1,1\n2,nan\n3,3\n", "line 3: value 'nan' is not a finite number"),
        ("time,value\n1,1\n2,2\n", "2 point(s); a series needs at least 3"),
        ("time,value\n1,1\nyesterday,2\n3,3\n", "neither an integer nor an ISO date"),
        ("time,value\n1,1\n2026-01-02,2\n3,3\n", "mixes integers and dates"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(content)
    out = cli("changepoints", str(f))
    assert out.returncode == 2 and out.stdout == ""
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_suite_listing_and_triage(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"ACCELMATRIX_HOME": str(home)}
    store = ResultsStore(f"sqlite:///{home / 'results.db'}")
    try:
        pm = PerfMatrix(
            models=["m0"], machines=["k0"], nights=36, causes=[Cause("build", 28, 0.1, model="m0")]
        )
        nightly(store, pm, range(pm.nights))
    finally:
        store.close()
    missing = cli("changepoints", "--suite", "nope", env=env)
    assert missing.returncode == 2 and "suites: perf_matrix" in missing.stderr
    table = cli("changepoints", "--suite", pm.dag_id, env=env)
    assert table.returncode == 0 and "[series, untriaged]" in table.stdout, table.stdout
    listed = json.loads(cli("changepoints", "--suite", pm.dag_id, "--json", env=env).stdout)
    (group,) = listed["groups"]
    assert group["change_points"][0]["runtime_version"] == f"nightly-{pm.date(28):%Y-%m-%d}"
    bad = cli("triage", "group", str(group["id"]), "--state", "done", env=env)
    assert bad.returncode == 2 and "allowed untriaged, acknowledged" in bad.stderr
    ok = cli("triage", "group", str(group["id"]), "--state", "invalid", "--user", "oncall", env=env)
    assert ok.returncode == 0 and "invalid (by oncall)" in ok.stdout
    listed = json.loads(cli("changepoints", "--suite", pm.dag_id, "--json", env=env).stdout)
    assert listed["groups"][0]["state"] == "invalid"
    assert listed["groups"][0]["change_points"][0]["state_by"] == "oncall"
    both = cli("changepoints", "x.csv", "--suite", pm.dag_id, env=env)
    assert both.returncode == 2 and "not both" in both.stderr
