"""Compare any two builds on demand: "is build B slower than build A on these cells?"

A perf engineer asks with the conf block ``accelmatrix_compare`` (``spec.followup``): from
the CLI (``python -m accelmatrix compare``), over REST (a run's conf), or a pull request's
run. The run's plan holds one session cell per selected cell: one machine each, both
builds set up once on it and run interleaved (A B B A), ``pairs`` samples of each.

At the run's gate, ``compare_run`` reads every session's samples (``history.retests.session``)
and compares the builds per cell and metric (``history.retests.compare``): both medians and n, the
change with its bootstrap 95 % interval, the paired Wilcoxon test, Mann-Whitney U, Cliff's
delta, and a verdict judged by the size of the change (``judge``: DIFFERENT beyond
``history.confirm.min_change``, SAME inside it, UNKNOWN when the pairs cannot tell), with
what the comparison cost. ``write_report`` leaves ``compare.json`` and ``compare.html``
in the run's directory, beside its report.

The metrics compared are those the suite's history follows (``series.tracked_metrics``),
or, for a suite that follows none, every metric its workload's log reports.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelmatrix import settings
from accelmatrix.contracts.json_types import JsonObject
from accelmatrix.history.retests.compare import DIFFERENT, SAME, Comparison, compare, judge
from accelmatrix.history.retests.session import pairs_of, read_samples, values_of
from accelmatrix.history.series.series import tracked_metrics
from accelmatrix.metrics.source_models import LogRegexSource
from accelmatrix.spec.followup_plan import Followup, session_cell_id

if TYPE_CHECKING:
    from accelmatrix.results.store import ResultsStore
    from accelmatrix.spec.suite import Suite

__all__ = ["BuildComparison", "MetricComparison", "compare_run", "table", "write_report"]

REPORT_JSON = "compare.json"
REPORT_HTML = "compare.html"


@dataclass(frozen=True)
class MetricComparison:
    """One cell's one metric: head against base, and the verdict by size."""

    cell_id: str
    metric: str
    higher_is_better: bool
    verdict: str  # different | same | unknown
    worse: bool | None  # different, and in the metric's worse direction
    comparison: Comparison

    def as_dict(self) -> JsonObject:
        out = asdict(self)
        out["comparison"] = _jsonable(self.comparison.as_dict())
        return out


@dataclass
class BuildComparison:
    """The answer to one request: every cell and metric, what it cost, what went wrong."""

    dag_id: str
    run_id: str
    base: str
    head: str
    pairs_asked: int
    min_change: float
    results: list[MetricComparison] = field(default_factory=list)
    cost: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def slower(self) -> list[MetricComparison]:
        return [r for r in self.results if r.worse]

    def as_dict(self) -> JsonObject:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "base": self.base,
            "head": self.head,
            "pairs_asked": self.pairs_asked,
            "min_change": self.min_change,
            "cost": self.cost,
            "machines": len({r.cell_id for r in self.results}),
            "problems": self.problems,
            "results": [r.as_dict() for r in self.results],
        }


def compare_run(
    store: ResultsStore, suite: Suite, dag_id: str, run_id: str, fu: Followup
) -> BuildComparison:
    """The comparison a compare run's sessions measured."""
    base, head = fu.builds[0], fu.builds[-1]
    statistics = tracked_metrics(suite) or {
        s.name: "median" for s in suite.workload.metrics if isinstance(s, LogRegexSource)
    }
    statistics = {
        m: stat
        for m, stat in statistics.items()
        if any(isinstance(s, LogRegexSource) and s.name == m for s in suite.workload.metrics)
    }
    min_change = suite.history.confirm.min_change
    out = BuildComparison(dag_id, run_id, base, head, fu.pairs, min_change)
    costs = [c.cost for c in store.get_cells(dag_id, run_id) if c.cost is not None]
    out.cost = sum(costs) if costs else None
    if not statistics:
        out.problems.append("the suite's workload reports no log metric to compare")
        return out
    for cell in fu.cells:
        sid = session_cell_id(cell, fu.round)
        path = settings.cell_artifacts_dir(dag_id, run_id, sid) / "output.log"
        session = read_samples(
            path, builds=fu.builds, round_=fu.round, sources=suite.workload.metrics,
            statistics=statistics,
        )  # fmt: skip
        out.problems += [f"{cell}: {p}" for p in session.failed]
        for metric in statistics:
            c = compare(
                values_of(session.samples, base, metric),
                values_of(session.samples, head, metric),
                pairs_of(session.samples, base, head, metric),
            )
            if c.pairs == 0:
                out.problems.append(f"{cell}: no pair of samples of {metric}")
                continue
            hib = suite.history.higher_is_better_for(metric)
            verdict = judge(c, min_change=min_change)
            worse = None
            if verdict == DIFFERENT:
                worse = (c.change < 0) if hib else (c.change > 0)
            out.results.append(MetricComparison(cell, metric, hib, verdict, worse, c))
    return out


def table(bc: BuildComparison) -> str:
    """The comparison as a text table, for the task log and the CLI."""
    head = f"{bc.head} against {bc.base}, {bc.pairs_asked} pairs a cell on one machine each"
    rows = [("cell", "metric", "base median", "head median", "change", "95 % CI", "p", "delta",
             "verdict")]  # fmt: skip
    for r in bc.results:
        c = r.comparison
        verdict = r.verdict if r.worse is None else ("slower" if r.worse else "faster")
        rows.append(
            (
                r.cell_id,
                r.metric,
                _num(c.median_base),
                _num(c.median_head),
                _pct(c.change),
                f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]",
                f"{c.p_paired:.2g}",
                f"{c.cliffs_delta:+.2f}",
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    cost = "-" if bc.cost is None else f"{bc.cost:.4f} USD"
    lines.append(
        f"{len(bc.slower)} slower, {sum(r.verdict == SAME for r in bc.results)} the same "
        f"(within +-{bc.min_change:.0%}), {sum(r.verdict == 'unknown' for r in bc.results)} "
        f"unknown (more pairs would tell); cost {cost}"
    )
    lines += [f"problem: {p}" for p in bc.problems]
    return "\n".join(lines)


def write_report(bc: BuildComparison, run_dir: Path) -> tuple[Path, Path]:
    """``compare.json``, ``compare.html`` and ``compare.txt`` (the table) in ``run_dir``;
    the paths of the first two."""
    run_dir.mkdir(parents=True, exist_ok=True)
    js = run_dir / REPORT_JSON
    js.write_text(json.dumps(bc.as_dict(), indent=2, default=str))
    page = run_dir / REPORT_HTML
    rows = []
    for r in bc.results:
        c = r.comparison
        verdict = r.verdict if r.worse is None else ("slower" if r.worse else "faster")
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html.escape(v)}</td>"
                for v in (
                    r.cell_id,
                    r.metric,
                    f"{_num(c.median_base)} (n={c.n_base})",
                    f"{_num(c.median_head)} (n={c.n_head})",
                    _pct(c.change),
                    f"[{_pct(c.ci_low)}, {_pct(c.ci_high)}]",
                    f"{c.p_paired:.2g}",
                    f"{c.p_mwu:.2g}",
                    f"{c.cliffs_delta:+.2f}",
                )
            )
            + f'<td class="v-{html.escape(verdict)}"><b>{html.escape(verdict)}</b></td></tr>'
        )
    (run_dir / "compare.txt").write_text(table(bc) + "\n")
    problems = "".join(f"<li>{html.escape(p)}</li>" for p in bc.problems)
    cost = "-" if bc.cost is None else f"{bc.cost:.4f} USD"
    page.write_text(
        "<!doctype html><meta charset=utf-8><title>"
        + html.escape(f"{bc.head} vs {bc.base}")
        + "</title><style>body{font:13px system-ui,sans-serif;margin:16px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        ".v-slower{color:#b00}.v-faster{color:#070}</style>"
        f"<h1>{html.escape(bc.dag_id)}: {html.escape(bc.head)} against "
        f"{html.escape(bc.base)}</h1>"
        f"<p>{bc.pairs_asked} pairs a cell, both builds interleaved on one machine per cell; "
        f"the change is the Hodges-Lehmann estimate of the pairs' log ratios with a bootstrap "
        f"95 % interval; a verdict needs the change beyond +-{bc.min_change:.0%} and p &lt;= "
        f"0.01 (slower / faster), or its whole interval inside it (same). Cost {cost}.</p>"
        "<table><tr><th>cell</th><th>metric</th><th>base median</th><th>head median</th>"
        "<th>change</th><th>95 % CI</th><th>p (Wilcoxon, paired)</th><th>p (Mann-Whitney)</th>"
        "<th>Cliff's delta</th><th>verdict</th></tr>"
        + "".join(rows)
        + "</table>"
        + (f"<h2>Problems</h2><ul>{problems}</ul>" if problems else "")
        + f'<p><a href="{REPORT_JSON}">JSON</a> &middot; <a href="index.html">run report</a></p>'
    )
    return js, page


def _num(v: float) -> str:
    return f"{v:.6g}" if isinstance(v, int | float) and math.isfinite(v) else "-"


def _pct(v: float) -> str:
    return f"{v:+.2%}" if isinstance(v, int | float) and math.isfinite(v) else "-"


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
