"""Results back on the pull request: a commit status and one comment, edited in place.

Each gate of a run started for a pull request (``ui.github_webhook``) calls ``report_run``.
The comment is rebuilt from the store every time, from every run of that commit (the
verdict run, and the compare run when the suite asks for one), so whichever gate ends
last writes the whole story and an earlier commit's comment is replaced, never added to:

* the cells and their states, and each failed check with expected against observed;
* the head's perf against the base commit (Δ %, 95 % interval, verdict by size), measured
  on one machine per cell with the two builds interleaved (``history.retests.build_compare``);
* links: the matrix page, the run's report, the comparison;
* a verdict for every case (``verdict_of``): "Safe to merge" only when every cell that is
  not quarantined passed and, when the suite asks for a comparison, every metric was
  *measured* not slower. A comparison that failed, was cancelled, measured nothing or left
  a metric undecided is "perf not decided", never a green.

The status follows: ``pending`` while a run of the commit is going, then ``success``,
``failure`` (a cell failed or a metric is slower) or ``error`` (perf not decided: GitHub's
commit statuses have no neutral state; ``error`` blocks a required check as it must, and
says "the check could not decide", not "the head is bad"; docs/pull-requests.md). A GitHub
outage never changes a run's verdict: each call is retried, then the failure is logged once
with the command that posts the report again.

Everything in the comment that a workload could have printed (cell messages, checks'
expected and observed values, the comparison's problems) and what a pull request names
(its base branch) goes through ``md_text``: escaped for GitHub Markdown (no link, image,
HTML, mention or reference can form) and capped in length.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from accelmatrix import settings
from accelmatrix.cell_state import CellState, RunState
from accelmatrix.contracts.run_records import CellRecord
from accelmatrix.hooks.github import GithubError, PullRequestHook
from accelmatrix.results.pull_requests import PullRequestRun
from accelmatrix.results.store import ResultsStore

log = logging.getLogger("accelmatrix.lifecycle")

ATTEMPTS = 3
BACKOFF_S = 1.0
MAX_CELL_ROWS = 60
MAX_CHECK_ROWS = 30
COMPARE_JSON = (
    "compare.json"  # history.retests.build_compare.REPORT_JSON: written by the compare gate
)


@dataclass(frozen=True)
class PerfRow:
    """One cell's one metric of the compare run, as the comment shows it."""

    cell_id: str
    metric: str
    median_base: float
    median_head: float
    change: float
    ci_low: float
    ci_high: float
    pairs: int
    verdict: str
    worse: bool | None


@dataclass(frozen=True)
class Report:
    """What goes back to the pull request for one commit of one suite."""

    state: str  # pending | success | failure | error (the commit status; error: not decided)
    description: str
    body: str
    target_url: str


def base_url() -> str:
    from airflow.configuration import conf

    return (conf.get("api", "base_url", fallback="") or "http://localhost:8080").rstrip("/")


def matrix_url(dag_id: str, run_id: str) -> str:
    """The run's matrix page (the plugin's app, behind Airflow's login)."""
    return (
        f"{base_url()}/accelmatrix/suites/{quote(dag_id, safe='')}?run_id={quote(run_id, safe='')}"
    )


def _file_url(dag_id: str, run_id: str, name: str) -> str:
    rel = f"{settings.safe_name(run_id)}/{name}"
    return f"{base_url()}/accelmatrix/suites/{quote(dag_id, safe='')}/files/{quote(rel)}"


def comment_marker(dag_id: str) -> str:
    """The hidden line that finds the pull request's comment of ``dag_id`` again."""
    return f"<!-- accelmatrix:pr-report {dag_id} -->"


def refusal_comment(dag_id: str, why: str) -> str:
    return f"**accelmatrix `{dag_id}` did not run.** {why}.\n\n{refusal_marker(dag_id)}"


def refusal_marker(dag_id: str) -> str:
    """The hidden line of the bot's "a maintainer must add the label" comment."""
    return f"<!-- accelmatrix:needs-maintainer {dag_id} -->"


def repost_command(dag_id: str, run_id: str) -> str:
    return f"python -m accelmatrix pr-report --dag-id {dag_id} --run-id {run_id}"


def set_status_quietly(hook: PullRequestHook, repo: str, sha: str, state: str, **kw: Any) -> bool:
    """A commit status, retried; a failure is logged, never raised. Whether it was set."""
    try:
        _retried(lambda: hook.set_status(repo, sha, state, **kw))
        return True
    except GithubError as e:
        log.warning("GitHub status %s of %s@%s not set: %s", state, repo, sha[:12], e)
        return False


def report_run(
    store: ResultsStore,
    dag_id: str,
    run_id: str,
    *,
    context: str,
    conn_id: str,
    hook: PullRequestHook | None = None,
) -> Report | None:
    """Post the pull request's status and comment for the commit ``run_id`` ran (module
    docstring); None when the run was not started for a pull request. Never raises for a
    GitHub problem: logged once, with the command that posts it again."""
    pr = store.pull_request_run(dag_id, run_id)
    if pr is None:
        return None
    runs = store.pull_request_runs(dag_id, pr.repo, pr.number)
    report = build_report(
        store, pr, [r for r in runs if r.head_sha == pr.head_sha],
        compare_asked=suite_asks_compare(dag_id),
    )  # fmt: skip
    hook = hook or PullRequestHook(conn_id)
    comment_id = next((r.comment_id for r in runs if r.comment_id is not None), None)
    try:
        _retried(
            lambda: hook.set_status(
                pr.repo, pr.head_sha, report.state, context=context,
                description=report.description, target_url=report.target_url,
            )
        )  # fmt: skip
        new_id = _retried(
            lambda: hook.upsert_comment(
                pr.repo, pr.number, marker=comment_marker(dag_id), body=report.body,
                comment_id=comment_id,
            )
        )  # fmt: skip
        if new_id != comment_id:
            store.set_pull_request_comment(dag_id, pr.repo, pr.number, new_id)
        log.info(
            "PR %s#%d: status %s (%s), comment %s",
            pr.repo, pr.number, report.state, report.description, new_id,
        )  # fmt: skip
    except GithubError as e:
        log.error(
            "PR %s#%d not updated (%s); the run's verdict stands. Post it again with: %s",
            pr.repo, pr.number, e, repost_command(dag_id, run_id),
        )  # fmt: skip
    return report


def suite_asks_compare(dag_id: str) -> bool:
    """Whether the suite ``dag_id``'s github block asks for the perf comparison (False when
    the suite is gone or invalid: then only a compare run recorded for the head counts)."""
    from accelmatrix.spec.loader import load_suite
    from accelmatrix.spec.suite_error import SuiteError
    from accelmatrix.spec.suite_files import suite_files, suite_id

    for path in suite_files(settings.suites_dir()):
        if suite_id(path) == dag_id:
            try:
                gh = load_suite(path).github
            except (SuiteError, OSError):
                return False
            return bool(gh and gh.compare)
    return False


@dataclass(frozen=True)
class PerfVerdict:
    """What the compare run decided: still running, the slower rows, or why it decided
    nothing (``undecided``: empty when every metric was measured faster, same or slower)."""

    running: bool
    slower: tuple[PerfRow, ...] = ()
    undecided: tuple[str, ...] = ()


def perf_verdict(
    run_state: str | None, rows: list[PerfRow], problems: list[str] | None
) -> PerfVerdict:
    """The comparison's verdict from the compare run's state (the store's ``runs.state``),
    its rows and problems (``compare.json``; ``problems`` None: not written). Decided means
    every metric has a verdict by size ("same", or "different" with a direction) and the
    run measured every cell it was asked for (no problem)."""
    if problems is None and not rows:
        if run_state in (RunState.PASSED, RunState.FAILED, RunState.OVER_BUDGET):
            why = {
                RunState.FAILED: "the compare run failed before it compared anything",
                RunState.OVER_BUDGET: "the compare run was refused over budget",
            }.get(run_state, "the compare run wrote no comparison")
            return PerfVerdict(False, undecided=(why,))
        return PerfVerdict(True)
    slower = tuple(r for r in rows if r.worse)
    undecided = [
        f"{r.cell_id} {r.metric} {r.change:+.1%} in [{r.ci_low:+.1%}, {r.ci_high:+.1%}]: "
        f"{r.verdict}"
        for r in rows
        if r.worse is None and r.verdict != "same"
    ]
    undecided += list(problems or [])
    if not rows and not undecided:
        undecided.append("the comparison has no metric")
    if run_state == RunState.FAILED and not undecided:
        undecided.append("the compare run failed")
    return PerfVerdict(False, slower, tuple(undecided))


def build_report(
    store: ResultsStore,
    pr: PullRequestRun,
    runs: list[PullRequestRun],
    *,
    compare_asked: bool = False,
) -> Report:
    """The status and comment of ``pr``'s head commit from its ``runs`` (pure over the
    store's rows and the compare run's ``compare.json``). ``compare_asked``: the suite asks
    for the comparison, so no comparison is not a green either."""
    dag_id = pr.dag_id
    verdict = next((r for r in runs if r.kind == "verdict"), None)
    compare = next((r for r in runs if r.kind == "compare"), None)
    lines = [f"### accelmatrix `{dag_id}` on {pr.head_sha[:12]}", ""]
    pending, failed = [], False
    perf = PerfVerdict(False)
    target = matrix_url(dag_id, (verdict or pr).run_id)
    if verdict is not None:
        run = store.get_run(dag_id, verdict.run_id)
        state = run.state if run else None
        cells = store.get_cells(dag_id, verdict.run_id)
        if state not in (RunState.PASSED, RunState.FAILED):
            pending.append("the cells")
        failed = state == RunState.FAILED
        lines += _cells_section(store, dag_id, verdict.run_id, cells, state)
        lines += [
            f"[matrix]({target}) · [run report]({_file_url(dag_id, verdict.run_id, 'index.html')})",
            "",
        ]
    if compare is not None:
        rows, problems = _perf_rows(dag_id, compare.run_id)
        run = store.get_run(dag_id, compare.run_id)
        perf = perf_verdict(run.state if run else None, rows, problems)
        if perf.running:
            pending.append("the perf comparison")
            lines += ["**Perf against the base** (" + pr.base_sha[:12] + "): running", ""]
        else:
            lines += _perf_section(pr, rows, perf)
            lines += [
                f"[comparison]({_file_url(dag_id, compare.run_id, 'compare.html')}) · "
                f"[compare run]({matrix_url(dag_id, compare.run_id)})",
                "",
            ]
    elif compare_asked:
        perf = PerfVerdict(False, undecided=("no comparison was started for this commit",))
    if pending:
        state, desc = "pending", f"{dag_id}: waiting for " + " and ".join(pending)
        lines.insert(2, f"⏳ Running: {' and '.join(pending)}.\n")
    elif failed or perf.slower:
        why = []
        if failed:
            why.append("cells failed")
        if perf.slower:
            why.append(f"{len(perf.slower)} metric(s) slower than the base")
        state, desc = "failure", f"{dag_id}: " + ", ".join(why)
        lines.insert(2, f"❌ **Not safe to merge**: {', '.join(why)}.\n")
    elif perf.undecided:
        first = perf.undecided[0]
        more = f" (+{len(perf.undecided) - 1} more)" if len(perf.undecided) > 1 else ""
        state, desc = "error", f"{dag_id}: perf not decided: {first}{more}"
        lines.insert(
            2,
            "⚠️ **Perf not decided**: every cell that is not quarantined passed, but the "
            "comparison with the base decided nothing for: "
            + "; ".join(md_text(u, 200) for u in perf.undecided[:5])
            + (f"; and {len(perf.undecided) - 5} more" if len(perf.undecided) > 5 else "")
            + ". Not a verdict on the head: run the comparison again with more pairs "
            + f"(`python -m accelmatrix compare {dag_id} --base {pr.base_sha} "
            + f"--head {pr.head_sha} --pairs 20`), or push again to re-run both.\n",
        )
    else:
        state, desc = "success", f"{dag_id}: every cell passed, no perf regression"
        lines.insert(2, "✅ **Safe to merge**: every cell that is not quarantined passed"
                     + (" and every metric was measured not slower than the base."
                        if compare else ".") + "\n")  # fmt: skip
    lines.append(comment_marker(dag_id))
    return Report(state=state, description=desc, body="\n".join(lines), target_url=target)


def _cells_section(
    store: ResultsStore, dag_id: str, run_id: str, cells: list[CellRecord], state: Any
) -> list[str]:
    out = [f"**Cells** (run {md_text(run_id, 250)}, {state or 'running'}):", "",
           "| cell | state | why |",
           "|---|---|---|"]  # fmt: skip
    shown = sorted(cells, key=lambda c: (c.state == CellState.PASSED, c.cell_id))
    for c in shown[:MAX_CELL_ROWS]:
        why = "" if c.state == CellState.PASSED else (c.message or "")
        out.append(f"| {md_text(c.cell_id, 120)} | {c.state} | {md_text(why, 200)} |")
    if len(shown) > MAX_CELL_ROWS:
        out.append(f"| … {len(shown) - MAX_CELL_ROWS} more on the matrix page | | |")
    failed_checks = [ch for ch in store.get_checks(dag_id, run_id) if not ch.passed]
    if failed_checks:
        out += ["", "**Failed checks:**", "", "| cell | check | expected | observed |",
                "|---|---|---|---|"]  # fmt: skip
        for ch in failed_checks[:MAX_CHECK_ROWS]:
            out.append(
                f"| {md_text(ch.cell_id, 120)} | {md_text(ch.check_name, 80)} | "
                f"{md_text(ch.expected or '', 120)} | {md_text(ch.observed or '', 120)} |"
            )
        if len(failed_checks) > MAX_CHECK_ROWS:
            out.append(f"| … {len(failed_checks) - MAX_CHECK_ROWS} more | | | |")
    out.append("")
    return out


def _perf_rows(dag_id: str, run_id: str) -> tuple[list[PerfRow], list[str] | None]:
    """The compare run's rows and problems (problems None: ``compare.json`` not written)."""
    path = settings.artifacts_dir() / settings.safe_name(dag_id) / settings.safe_name(run_id)
    path = path / COMPARE_JSON
    if not path.is_file():
        return [], None
    try:
        data = json.loads(path.read_text())
        rows = [
            PerfRow(
                cell_id=str(r["cell_id"]), metric=str(r["metric"]),
                median_base=float(r["comparison"]["median_base"]),
                median_head=float(r["comparison"]["median_head"]),
                change=float(r["comparison"]["change"]),
                ci_low=float(r["comparison"]["ci_low"]),
                ci_high=float(r["comparison"]["ci_high"]),
                pairs=int(r["comparison"]["pairs"]), verdict=str(r["verdict"]),
                worse=r.get("worse") if isinstance(r.get("worse"), bool) else None,
            )
            for r in data.get("results") or []
        ]  # fmt: skip
        problems = [str(p) for p in data.get("problems") or []]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [], [f"the comparison could not be read: {e}"]
    return rows, problems


def _perf_section(pr: PullRequestRun, rows: list[PerfRow], perf: PerfVerdict) -> list[str]:
    out = [
        f"**Perf against the base** {md_text(pr.base_ref, 100)} ({pr.base_sha[:12]}), both "
        "builds interleaved on one machine per cell:",
        "",
    ]
    if rows:
        out += ["| cell | metric | base | head | Δ | 95 % CI | pairs | verdict |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows[:MAX_CELL_ROWS]:
            verdict = r.verdict if r.worse is None else ("**slower**" if r.worse else "faster")
            if r.worse is None and r.verdict != "same":
                verdict = f"not decided ({md_text(r.verdict, 20)})"
            out.append(
                f"| {md_text(r.cell_id, 120)} | {md_text(r.metric, 80)} | {r.median_base:.4g} | "
                f"{r.median_head:.4g} | {r.change:+.2%} | [{r.ci_low:+.2%}, {r.ci_high:+.2%}] | "
                f"{r.pairs} | {verdict} |"
            )
        if len(rows) > MAX_CELL_ROWS:
            out.append(
                f"| … {len(rows) - MAX_CELL_ROWS} more on the comparison page | | | | | | | |"
            )
        out.append("")
    if perf.undecided:
        out += ["not decided: " + md_text("; ".join(perf.undecided), 600), ""]
    return out


# Characters GitHub Markdown gives a meaning to: backslash-escaped (CommonMark escapes every
# ASCII punctuation character), so no emphasis, code span, link, image or table cell forms.
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-.!|~])")
# What GitHub turns into links or notifications without any punctuation of ours: mentions
# (@user, @org/team), references (#12, GH-12), and bare URLs (http://, www.). A zero-width
# space after the trigger character breaks each; the text still reads the same.
_ZWSP = "\u200b"
_AUTOLINK = re.compile(r"(?i)(@|#|gh-|://|www\.)")


def md_text(text: Any, limit: int) -> str:
    """``text`` as GitHub Markdown that shows it literally: one line, cut to ``limit``
    characters *before* escaping (so a cut never splits an escape), HTML and entities
    neutralised (``&``, ``<``, ``>`` as entities), every Markdown punctuation
    backslash-escaped, mentions, references and bare URLs broken by a zero-width space.
    Why not a code span: a fork's text can hold backticks, and GitHub still links URLs
    next to one; escaping each character holds whatever the text is."""
    s = " ".join(str(text).split())
    if len(s) > limit:
        s = s[: max(0, limit - 1)] + "…"
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _AUTOLINK.sub(
        lambda m: ":" + _ZWSP + "//" if m.group(1) == "://" else m.group(1) + _ZWSP, s
    )
    return _MD_PUNCT.sub(r"\\\1", s)


def _retried(fn: Callable[[], Any]) -> Any:
    """``fn`` again after a GitHub error that may pass (not reached, 5xx, rate limit)."""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except GithubError as e:
            if attempt == ATTEMPTS - 1 or not (e.status == 0 or e.status >= 500 or e.status == 429):
                raise
            time.sleep(BACKOFF_S * (2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover
