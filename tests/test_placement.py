"""One change, one first bad build (history.retests.placement), against a real SQLite results store.

A planted 6 % step lands on night 12; the detector places it; a re-test then proves a
different first bad build (a night early, as a bisect among builds that differ by
themselves may). The change, its group, the summary and the CLI's table move to the
re-test's build and say so; the detector's placement stays beside it; later passes, the
gate's window and the maintenance pass alike, keep it there and add no second change.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from accelmatrix.contracts.change_point_records import PLACED_BY_RETEST
from accelmatrix.history.change_points.report import changes_json, changes_table
from accelmatrix.history.change_points.tracking import update_changes
from accelmatrix.history.retests.placement import night_of, place
from accelmatrix.history.series.grouping import as_utc
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.loader import load_suite
from accelmatrix_testkit.perf_matrix import Cause, PerfMatrix

TRACKED = {"step_time": "median"}


def _build(pm: PerfMatrix, night: int) -> str:
    return f"nightly-{pm.date(night):%Y-%m-%d}"


def test_a_retests_culprit_moves_the_change_its_group_and_its_summary(tmp_path: Path) -> None:
    pm = PerfMatrix(models=["m0"], machines=["k0"], causes=[Cause("build", 12, 0.08, "m0")],
                    nights=20, seed=3)  # fmt: skip
    suite_file = tmp_path / "perf.yaml"
    suite_file.write_text(pm.suite_yaml())
    suite = load_suite(suite_file)
    store = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    pm.plant(store)
    update_changes(store, pm.dag_id, suite.history, TRACKED, full=True)
    (found,) = [p for p in store.get_change_points(pm.dag_id) if p.direction == "regression"]
    detected = found.runtime_version
    night = (as_utc(found.logical_date) - pm.date(0)).days
    culprit, last_good = _build(pm, night - 1), _build(pm, night - 2)

    row = store.start_confirmation(
        pm.dag_id,
        found.group_id,
        state="found",
        targets=[{"change_id": found.id, "cell_id": found.cell_id, "metric": "step_time"}],
        good_build=last_good,
        suspect_build=detected,
        culprit=culprit,
        last_good=last_good,
    )
    nights = list(reversed(store.get_runs(pm.dag_id, which="suite")))
    moved = place(store, row, nights)
    assert [p.id for p in moved] == [found.id]

    def check() -> None:
        (p,) = [p for p in store.get_change_points(pm.dag_id) if p.direction == "regression"]
        assert p.id == found.id
        assert p.runtime_version == culprit and p.prev_runtime_version == last_good
        assert as_utc(p.logical_date) == pm.date(night - 1)
        assert p.placed_by == PLACED_BY_RETEST
        assert p.detected_runtime_version == detected  # the detector's own, for audit
        group = store.get_change_group(p.group_id)
        assert group.runtime_version == culprit
        assert f"from build {culprit} (after {last_good})" in group.summary
        assert f"proved by the re-test (the detector placed it at {detected})" in group.summary
        table = changes_table(store, pm.dag_id)
        assert f"{last_good} -> {culprit} (placed by the re-test; detector: {detected})" in table
        assert detected not in table.split("(the detector placed")[0]
        js = changes_json(store, pm.dag_id)["groups"][0]["change_points"][0]
        assert js["placed_by"] == "retest" and js["detected_runtime_version"] == detected

    check()
    # The gate's window pass and the maintenance pass re-find the step on the detector's
    # night: the change keeps the re-test's night, no second change is added.
    update_changes(store, pm.dag_id, suite.history, TRACKED)
    check()
    update_changes(store, pm.dag_id, suite.history, TRACKED, full=True)
    check()
    store.close()


def test_the_culprits_night_is_the_night_that_ran_it_or_the_first_after_the_last_good(
    tmp_path: Path,
) -> None:
    pm = PerfMatrix(models=["m0"], machines=["k0"], nights=6)
    store = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    # A weekly-like series: nights 0, 2, 4 only.
    for n in (0, 2, 4):
        pm.plant(store, range(n, n + 1))
    nights = list(reversed(store.get_runs(pm.dag_id, which="suite")))
    first, before = night_of(nights, _build(pm, 2), _build(pm, 1))
    assert first.runtime_version == _build(pm, 2) and before.runtime_version == _build(pm, 0)
    # A build between two runs (night 3's): the first run that holds it is night 4's.
    first, before = night_of(nights, _build(pm, 3), _build(pm, 2))
    assert first.runtime_version == _build(pm, 4)
    assert as_utc(first.logical_date) == pm.date(0) + timedelta(days=4)
    # Neither build ran a night: nothing to move to.
    assert night_of(nights, _build(pm, 5), _build(pm, 3)) is None
    store.close()


def test_a_deleted_change_or_groups_id_is_never_handed_out_again(tmp_path: Path) -> None:
    """SQLite reuses the largest deleted rowid unless the table says AUTOINCREMENT: a
    retracted change's id went to the next change, which inherited its re-test."""
    from datetime import UTC, datetime

    store = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    when = datetime(2026, 9, 1, tzinfo=UTC)
    point = {"cell_id": "c", "metric": "m", "run_id": "r", "logical_date": when, "position": 1,
             "n_before": 8, "n_after": 3, "direction": "regression"}  # fmt: skip
    first = store.save_change_point("d", **point)
    gid = store.save_change_group("d", kind="series", direction="regression", logical_date=when)
    row = store.start_confirmation("d", gid, state="undecided")
    store.delete_change_points([first])
    store.delete_change_groups([gid])
    assert store.save_change_point("d", **point) != first
    new_gid = store.save_change_group("d", kind="series", direction="regression",
                                      logical_date=when)  # fmt: skip
    assert new_gid != gid
    assert store.get_confirmations("d", group_id=new_gid) == []
    assert row is not None
    store.close()
