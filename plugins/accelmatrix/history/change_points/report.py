"""A suite's change points as text and JSON: for the gate's log and the CLI.

Open regression groups first (they need a person), then the rest, newest first; under
each group its change points, one line each, with before -> after, the change, its
significance and the builds, so the log on its own says what moved, where and from when.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec

from accelmatrix.contracts.change_point_records import (
    OPEN_STATES,
    PLACED_BY_RETEST,
    ChangeGroup,
    ChangePoint,
    Confirmation,
)
from accelmatrix.contracts.json_types import JsonObject

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore

__all__ = [
    "changes_json",
    "changes_table",
    "confirmation_line",
    "confirmation_lines",
    "ordered_groups",
]


def ordered_groups(groups: list[ChangeGroup]) -> list[ChangeGroup]:
    """Open regression groups first, then the others; newest first within each."""

    def key(g: ChangeGroup) -> tuple[int, float]:
        urgent = g.direction == "regression" and g.state in OPEN_STATES
        return (0 if urgent else 1, -g.logical_date.timestamp())

    return sorted(groups, key=key)


def changes_table(store: ResultsStore, dag_id: str, *, only_open: bool = True) -> str:
    """The suite's change groups and points as an aligned text table ('' when none)."""
    groups = ordered_groups(store.get_change_groups(dag_id))
    if only_open:
        groups = [g for g in groups if g.direction == "regression" and g.state in OPEN_STATES]
    if not groups:
        return ""
    points = store.get_change_points(dag_id)
    retests = {c.group_id: c for c in store.get_confirmations(dag_id)}
    lines = []
    for g in groups:
        who = f" by {g.state_by}" if g.state_by else ""
        lines.append(
            f"group {g.id} [{g.kind}, {g.state}{who}] {g.logical_date:%Y-%m-%d}: {g.summary}"
        )
        members = [p for p in points if p.group_id == g.id]
        rows = [
            (
                p.cell_id,
                p.metric,
                p.machine or "-",
                f"{_num(p.median_before)} -> {_num(p.median_after)}",
                _pct(p.change),
                f"{p.p_value:.1e}" if _finite(p.p_value) else "-",
                f"{p.prev_runtime_version or '-'} -> {p.runtime_version or '-'}"
                + (
                    f" (placed by the re-test; detector: {p.detected_runtime_version or '-'})"
                    if p.placed_by == PLACED_BY_RETEST
                    else ""
                ),
                str(p.id),
            )
            for p in members
        ]
        header = (
            "cell",
            "metric",
            "machine",
            "median before -> after",
            "change",
            "p",
            "builds",
            "id",
        )
        lines += _aligned([header, *rows], indent="  ")
        if (c := retests.get(g.id)) is not None:
            lines += ["  " + ln for ln in confirmation_lines(c)]
    return "\n".join(lines)


def changes_json(store: ResultsStore, dag_id: str) -> JsonObject:
    """Every change group of the suite with its change points (JSON-able)."""
    groups = ordered_groups(store.get_change_groups(dag_id))
    points = store.get_change_points(dag_id)
    retests = {c.group_id: _jsonable(c) for c in store.get_confirmations(dag_id)}
    grouped = {g.id for g in groups}
    return {
        "dag_id": dag_id,
        "groups": [
            {
                **_jsonable(g),
                "change_points": [_jsonable(p) for p in points if p.group_id == g.id],
                "confirmation": retests.get(g.id),
            }
            for g in groups
        ],
        "ungrouped": [_jsonable(p) for p in points if p.group_id not in grouped],
    }


def confirmation_line(c: Confirmation) -> str:
    """One line on a group's re-test: its state, the decisive comparison (both medians,
    the change with its 95 % interval, the paired p-value, the pairs), the culprit, what
    it cost."""
    text = f"re-test {c.id} of group {c.group_id}: {c.state}"
    decision = c.decision or {}
    if decision:
        d = max(decision.values(), key=lambda d: abs(d.get("change") or 0))
        text += (
            f" ({c.good_build or '-'} median {_num(d.get('median_good'))} vs "
            f"{c.suspect_build or '-'} median {_num(d.get('median_suspect'))}, "
            f"{_pct(d.get('change'))} [{_pct(d.get('ci_low'))}, {_pct(d.get('ci_high'))}], "
            f"p={_p(d.get('p_paired', d.get('p_worse')))}, "
            f"{d.get('pairs', d.get('n_suspect'))} pairs on one machine)"
        )
    if c.culprit:
        text += f"; first bad build {c.culprit} (last good {c.last_good or '-'})"
    text += _culprit_report(decision)
    if c.reason:
        text += f"; {c.reason}"
    if c.cost is not None:
        text += f"; cost {c.cost:.4f} USD in {len(c.run_ids or [])} session(s)"
    if c.run_id:
        text += f"; waiting for run {c.run_id}"
    return text


def _culprit_report(decision: dict[str, Any]) -> str:
    """The cause's class and the first op that got slower, from what
    ``history.culprits.culprit_profile`` stored with the decision (first target that has them)."""
    text = ""
    attribution = next((d["attribution"] for d in decision.values() if d.get("attribution")), None)
    if attribution:
        text += f"; cause: {attribution['summary'].split(':')[0]}"
    profile = next((d["profile"] for d in decision.values() if d.get("profile")), None)
    if profile and profile.get("error"):
        text += f"; {profile['error']}"
    elif profile and (slower := [r for r in profile.get("rows", []) if r["excess_us"] > 0]):
        r = slower[0]
        text += f"; top op {r['op']} {r['delta_us'] / 1000:+.2f} ms per step"
        if r.get("share") is not None:
            text += f" ({r['share']:.0%} of the regression)"
    return text


def confirmation_lines(c: Confirmation) -> list[str]:
    """``confirmation_line`` and, when builds between were tested, each build's level."""
    lines = [confirmation_line(c)]
    steps = c.steps or []
    if steps:
        rows = [("build", "pairs", "median good", "median build", "change", "95 % CI", "p",
                 "verdict")]  # fmt: skip
        rows += [
            (
                s["build"],
                str(s.get("n") or 0),
                _num(s.get("median_good")),
                _num(s.get("median_build")),
                _pct(s.get("change")),
                f"[{_pct(s.get('ci_low'))}, {_pct(s.get('ci_high'))}]",
                _p(s.get("p_value")),
                s["verdict"],
            )
            for s in steps
        ]
        lines.append(f"bisect of {len(c.builds or [])} builds:")
        lines += _aligned(rows, indent="  ")
    return lines


def _p(v: Any) -> str:
    return f"{v:.2g}" if _finite(v) else "-"


def _jsonable(row: ChangeGroup | ChangePoint | Confirmation) -> dict[str, Any]:
    out = {}
    for k, v in msgspec.structs.asdict(row).items():
        if hasattr(v, "isoformat"):
            v = v.isoformat()
        elif isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def _aligned(rows: list[tuple[str, ...]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _num(v: Any) -> str:
    return f"{v:.6g}" if _finite(v) else "-"


def _pct(v: Any) -> str:
    return f"{v:+.1%}" if _finite(v) else "-"
