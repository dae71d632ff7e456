"""The culprit report on the history page (issue 42: "shown on the change's page, a table
and a bar chart"): a re-test's stored op-level diff and cause class rendered below the
change list, from a real (temporary) results store. The diff is the one
history.culprits.culprit_profile computes from traces kept in a bisect session's evidence (generated
kineto-shaped traces: one op 60 % slower, one op new in the culprit); the class the one
history.culprits.attribution reads from the planted nights."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from test_history_page import APP, DAG, DATES, FIRST_BAD, Svg, plant_backfill

from accelmatrix import settings
from accelmatrix.history.culprits import culprit_profile
from accelmatrix.history.culprits.culprit_profile import attach, attach_attribution, build_dir
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.followup_plan import PROFILES_DIR, session_cell_id
from accelmatrix.ui import files, history, op_diff_view, render
from accelmatrix_testkit.chrome_traces import SynthOp, make_ops, synth_trace

CELL = "c=a"
RUN = "accelmatrix_bisect__1_1"
GOOD = f"nightly-{DATES[FIRST_BAD - 1]:%Y-%m-%d}"
BAD = f"nightly-{DATES[FIRST_BAD]:%Y-%m-%d}"
# A target's verdict as history.retests.followup stores it (_decision), before the culprit report.
VERDICT = {
    "verdict": "new_level", "change": 0.05, "n_good": 10, "n_suspect": 10,
    "median_good": 1.0, "median_suspect": 1.05, "p_worse": 0.001,
}  # fmt: skip
NEW_OP = SynthOp(name="aten::copy_", dims="[[64, 64], [64, 64]]", us=40.0, calls=2)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultsStore:
    """A temporary results store, artifacts dir (the kept traces) and suites dir."""
    monkeypatch.setenv("ACCELMATRIX_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    monkeypatch.setenv("ACCELMATRIX_SUITES_DIR", str(tmp_path / "suites"))
    monkeypatch.setenv("ACCELMATRIX_INCLUDE_DIR", str(tmp_path / "include"))
    s = ResultsStore(f"sqlite:///{tmp_path / 'results.db'}")
    s.ensure_schema()
    yield s
    s.close()


def _keep(build: str, data: bytes) -> Path:
    """A trace where a bisect session's driver keeps it (backends/interleave.py)."""
    d = settings.cell_artifacts_dir(DAG, RUN, session_cell_id(CELL, 1))
    d = d / "files" / PROFILES_DIR / build_dir(build)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "0-step.pt.trace.json"
    path.write_bytes(data)
    return path


def _retest(store: ResultsStore, group: int, change: int) -> dict:
    """A found re-test of ``group`` whose decision carries what the gate stores: the diff
    of the kept traces (culprit_profile.attach) and the class (attach_attribution)."""
    row = store.start_confirmation(
        DAG, group, state="found", run_ids=[RUN], round=1, good_build=GOOD,
        suspect_build=BAD, last_good=GOOD, culprit=BAD,
        targets=[{"cell_id": CELL, "metric": "step_time", "change_id": change}],
    )  # fmt: skip
    assert row is not None
    decision = {f"{CELL}|step_time": dict(VERDICT)}
    attach(row, decision)
    attach_attribution(store, row, decision, reproduced=True)
    store.save_confirmation(DAG, id=row.id, decision=decision)
    return decision[f"{CELL}|step_time"]


def _page(store: ResultsStore) -> str:
    view = history.load_history(store, DAG, 30)
    return render.history_page(view, page_base=APP, n_runs=30, form_base=APP, can_edit=False)


def test_the_keys_are_the_ones_the_gate_stores_under() -> None:
    assert op_diff_view.PROFILE_KEY == culprit_profile.PROFILE_KEY
    assert op_diff_view.ATTRIBUTION_KEY == culprit_profile.ATTRIBUTION_KEY


def test_a_change_with_a_stored_diff_shows_its_table_bars_class_and_traces(
    store: ResultsStore,
) -> None:
    planted = plant_backfill(store)
    ops = make_ops(np.random.default_rng(5), n=10, max_calls=4)
    slow = max(ops, key=lambda o: o.us * o.calls)
    base_path = _keep(GOOD, synth_trace(ops, steps=30, seed=1))
    new_path = _keep(BAD, synth_trace([*ops, NEW_OP], steps=30, seed=2, scale={slow.name: 1.6}))
    stored = _retest(store, planted.group, planted.change)
    prof = stored[culprit_profile.PROFILE_KEY]
    # the slowed op first; the new op is a third of the regression, beyond its noise: a
    # second change, so no single op is named
    assert prof["verdict"] == "several" and prof["rows"][0]["op"] == slow.name
    assert prof["rows"][1]["op"] == NEW_OP.name

    page = _page(store)
    dom = Svg(page)
    anchor = f"culprit-group-{planted.group}"
    (section,) = [a for t, a in dom.tags if t == "section" and a.get("id") == anchor]
    assert section["data-entry"] == f"group-{planted.group}"
    # Below the change list, linked from the change's re-test cell with its cause and top op.
    assert page.index('id="changes"') < page.index(f'id="{anchor}"') < page.index('id="history"')
    (link,) = dom.find("a", "culprit-link")
    assert link["href"] == f"#{anchor}"
    assert f"culprit report (cause: the code, top op {slow.name})" in page

    # The table: every stored row, in the stored (ranked) order, with its figures.
    rows = dom.find("tr", "op-row")
    assert [r["data-op"] for r in rows] == [r["op"] for r in prof["rows"]]
    assert rows[0]["data-op"] == slow.name and rows[0]["data-status"] == "changed"
    new = [r for r in rows if r["data-op"] == NEW_OP.name]
    assert len(new) == 1 and new[0]["data-status"] == "new"
    first = prof["rows"][0]
    cells = _row_texts(page, slow.name)
    assert cells[3] == f"{first['delta_us'] / 1000:+.3f} ms"  # Δ per step
    assert cells[4] == f"{first['delta_pct'] * 100:+.0f} %"  # Δ %: about +60 %
    assert 45 <= first["delta_pct"] * 100 <= 75
    # share of the regression, with its 95 % interval across the samples
    lo, hi = first["share_lo"] * 100, first["share_hi"] * 100
    assert cells[5] == f"{first['share'] * 100:.0f} % [{lo:.0f}, {hi:.0f}]"
    assert lo <= first["share"] * 100 <= hi
    new_cells = _row_texts(page, NEW_OP.name)
    assert new_cells[4] == "-" and new_cells[6] == "new"  # no Δ % for a new op

    # The bars: the top ops' Δ, the slowed op's the longest, widths to scale, the new op
    # marked as such.
    bars = [a for t, a in dom.tags if t == "g" and "op-bar" in a.get("class", "")]
    shown = prof["rows"][: op_diff_view.CHART_OPS]
    assert [b["data-op"] for b in bars] == [r["op"] for r in shown]
    assert [float(b["data-delta-us"]) for b in bars] == pytest.approx(
        [r["delta_us"] for r in shown], abs=1e-3
    )
    rects = [a for t, a in dom.tags if t == "rect" and "bar" in a.get("class", "").split()]
    widths = [float(r["width"]) for r in rects]
    assert widths[0] == max(widths)
    top = max(abs(r["delta_us"]) for r in shown)
    for w, r in zip(widths, shown, strict=True):
        assert w == pytest.approx(max(widths[0] * abs(r["delta_us"]) / top, 0.5), abs=0.15)
    kinds = {b["data-op"]: rect["class"] for b, rect in zip(bars, rects, strict=True)}
    assert kinds[slow.name] == "bar slower"
    if NEW_OP.name in kinds:
        assert kinds[NEW_OP.name] == "bar slower new"
    assert not re.search(r"<script", page, re.I)  # the pages' CSP allows no script

    # The class and the sibling evidence: the code, c=a moved, c=b (flat nights) did not.
    (cause,) = dom.find("p", "cause")
    assert cause["data-cause"] == "code"
    siblings = {a["data-cell-id"]: a["class"] for t, a in dom.tags if t == "tr" and "data-cell-id" in a and a.get("class") in ("moved", "flat")}  # fmt: skip
    assert siblings == {"c=a": "moved", "c=b": "flat"}

    # Both traces, linked through the evidence route, which serves them.
    traces = dom.find("a", "trace")
    assert [t["href"].rsplit("/", 1)[1] for t in traces] == [base_path.name, new_path.name]
    assert f">{build_dir(GOOD)}/{base_path.name}<" in page
    for t, path in zip(traces, (base_path, new_path), strict=True):
        rel = t["href"].removeprefix(f"{APP}/suites/{DAG}/files/")
        served = files.evidence_file(DAG, unquote(rel))
        assert served is not None and served[0] == path.resolve()


def test_a_change_without_a_diff_renders_without_the_section(store: ResultsStore) -> None:
    planted = plant_backfill(store)
    # Its re-test found the culprit but kept no trace (a suite without profiler traces).
    _retest(store, planted.group, planted.change)
    confirmation = store.get_confirmations(DAG)[0]
    assert culprit_profile.PROFILE_KEY not in confirmation.decision[f"{CELL}|step_time"]
    dom = Svg(_page(store))
    assert dom.find("section", "culprit") and dom.find("p", "cause")  # the class alone ...
    assert not dom.find("tr", "op-row") and not dom.find("svg", "opdiff-bars")  # no diff

    # A stored diff that does not decode (a row written by another version) is left out;
    # the page still renders, with the class.
    bad = {**confirmation.decision[f"{CELL}|step_time"], "profile": {"rows": "?"}}
    store.save_confirmation(DAG, id=confirmation.id, decision={f"{CELL}|step_time": bad})
    dom = Svg(_page(store))
    assert dom.find("p", "cause") and not dom.find("tr", "op-row")

    # Without a class or a diff (a re-test from before the culprit report): no section.
    store.save_confirmation(DAG, id=confirmation.id, decision={f"{CELL}|step_time": dict(VERDICT)})
    dom = Svg(_page(store))
    assert not dom.find("section", "culprit") and not dom.find("a", "culprit-link")
    assert [a for t, a in dom.tags if a.get("id") == f"group-{planted.group}"]  # still listed


def test_a_broken_trace_is_one_line_in_the_report(store: ResultsStore) -> None:
    planted = plant_backfill(store)
    ops = make_ops(np.random.default_rng(5), n=6, max_calls=3)
    _keep(GOOD, synth_trace(ops, steps=5, seed=1))
    _keep(BAD, synth_trace(ops, steps=5, seed=2)[:999])
    _retest(store, planted.group, planted.change)
    page = _page(store)
    dom = Svg(page)
    assert len(dom.find("p", "opdiff-error")) == 1
    assert "no op-level diff:" in page and "truncated trace JSON" in page
    assert not dom.find("tr", "op-row") and not dom.find("svg", "opdiff-bars")


def _row_texts(page: str, op: str) -> list[str]:
    """The cells' texts of the table row of ``op`` (each cell's first text)."""
    m = re.search(rf'<tr class="op-row[^"]*" data-op="{re.escape(op)}"[^>]*>(.*?)</tr>', page)
    assert m, op
    return [re.sub(r"<[^>]+>.*", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", m.group(1))]
