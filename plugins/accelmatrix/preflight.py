"""Run a suite's preflight checks before anything is provisioned (see spec/preflight_checks.py).

The `preflight` task sits between `plan` and every cell's `provision`. It runs every
check (not only up to the first failure: a report listing all that is wrong saves round
trips), logs a table of what was expected and what was found, records it in the run's
artifacts (preflight.json) and on every planned cell, and fails when any check failed, so
no cell is provisioned and the gate shows why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accelmatrix import settings
from accelmatrix.cell_state import CellState
from accelmatrix.results import results_store
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.loader import load_suite
from accelmatrix.spec.preflight_checks import (
    CommandPreflight,
    ConnectionPreflight,
    CpuCountPreflight,
    DiskFreePreflight,
    HttpPreflight,
    PreflightCheck,
)
from accelmatrix.spec.templating import TemplateError, render_tree
from accelmatrix.steps.common import CellFailed

OUTPUT_CHARS = 300


@dataclass
class PreflightResult:
    name: str
    type: str
    expected: str
    found: str
    passed: bool


@dataclass
class PreflightReport:
    results: list[PreflightResult]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[PreflightResult]:
        return [r for r in self.results if not r.passed]

    def table(self) -> str:
        rows = [("check", "ok", "expected", "found")] + [
            (r.name, "ok" if r.passed else "FAIL", r.expected, r.found) for r in self.results
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        lines.insert(1, "-" * max(len(x) for x in lines))
        n = len(self.failures)
        head = (
            f"Preflight: all {len(self.results)} check(s) passed"
            if not n
            else f"Preflight FAILED: {n} of {len(self.results)} check(s) failed; "
            "nothing was provisioned"
        )
        return head + "\n" + "\n".join(lines)

    def summary(self) -> str:
        """One line per failure, for cell messages and the task's exception."""
        return "; ".join(f"{r.name}: expected {r.expected}, found {r.found}" for r in self.failures)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "results": [asdict(r) for r in self.results]}


def variables(params: dict[str, Any]) -> dict[str, Any]:
    """What preflight strings may refer to: it runs on the Airflow worker."""
    out: dict[str, Any] = {
        "python": sys.executable,
        "include_dir": str(settings.include_dir()),
        "work_root": str(settings.work_root()),
        "accelmatrix_home": str(settings.home()),
    }
    out.update({f"params.{k}": v for k, v in params.items()})
    return out


def run_preflight(checks: list[PreflightCheck], params: dict[str, Any]) -> PreflightReport:
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(PreflightCheck)
    values = variables(params)
    results = []
    for i, check in enumerate(checks):
        name = check.name or f"{check.type}[{i}]"
        try:
            rendered = adapter.validate_python(render_tree(check.model_dump(mode="json"), values))
            results.append(_RUNNERS[type(rendered)](rendered, name))
        except TemplateError as e:
            results.append(PreflightResult(name, check.type, "valid placeholders", str(e), False))
        except Exception as e:  # noqa: BLE001 - a broken probe is a failed check, reported
            results.append(
                PreflightResult(name, check.type, "check runs", f"{type(e).__name__}: {e}", False)
            )
    return PreflightReport(results)


def _command(c: CommandPreflight, name: str) -> PreflightResult:
    want = [f"exit {c.expect_exit}"]
    if c.stdout_contains is not None:
        want.append(f"output containing {c.stdout_contains!r}")
    if c.min_lines is not None:
        want.append(f">= {c.min_lines} output line(s)")
    expected = f"`{' '.join(c.argv)}`: " + ", ".join(want)
    try:
        res = subprocess.run(  # noqa: S603 (argv list, no shell)
            c.argv, capture_output=True, text=True, timeout=c.timeout, errors="replace"
        )
    except FileNotFoundError:
        return PreflightResult(name, c.type, expected, f"{c.argv[0]!r} not found", False)
    except subprocess.TimeoutExpired:
        return PreflightResult(name, c.type, expected, f"no answer within {c.timeout} s", False)
    out = res.stdout.strip()
    lines = [x for x in out.splitlines() if x.strip()]
    ok = res.returncode == c.expect_exit
    ok &= c.stdout_contains is None or c.stdout_contains in res.stdout
    ok &= c.min_lines is None or len(lines) >= c.min_lines
    shown = (out or res.stderr.strip()).replace("\n", " | ")[:OUTPUT_CHARS]
    found = f"exit {res.returncode}, {len(lines)} line(s): {shown or '(no output)'}"
    return PreflightResult(name, c.type, expected, found, ok)


def _http(c: HttpPreflight, name: str) -> PreflightResult:
    expected = f"GET {c.url} -> HTTP {c.expect_status}"
    try:
        with urllib.request.urlopen(c.url, timeout=c.timeout) as resp:  # noqa: S310 (http(s) only)
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return PreflightResult(name, c.type, expected, f"unreachable: {reason}", False)
    return PreflightResult(name, c.type, expected, f"HTTP {status}", status == c.expect_status)


def _disk_free(c: DiskFreePreflight, name: str) -> PreflightResult:
    path = Path(c.path).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the work root may not exist yet: measure where it will be
    free = shutil.disk_usage(probe).free / 1e9
    return PreflightResult(
        name,
        c.type,
        f">= {c.min_gb:g} GB free at {path}",
        f"{free:.1f} GB free on the file system of {probe}",
        free >= c.min_gb,
    )


def _cpu_count(c: CpuCountPreflight, name: str) -> PreflightResult:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return PreflightResult(name, c.type, f">= {c.min} CPU(s)", f"{n} CPU(s) usable", n >= c.min)


def _connection(c: ConnectionPreflight, name: str) -> PreflightResult:
    from airflow.sdk import BaseHook

    expected = f"Airflow connection {c.conn_id!r} defined"
    try:
        conn = BaseHook.get_connection(c.conn_id)
    except Exception as e:  # noqa: BLE001 - AirflowNotFoundException and friends
        hint = f"not defined ({type(e).__name__}); create it: airflow connections add {c.conn_id}"
        return PreflightResult(name, c.type, expected, hint, False)
    return PreflightResult(name, c.type, expected, f"defined (type {conn.conn_type or '?'})", True)


_RUNNERS: dict[type, Any] = {
    CommandPreflight: _command,
    HttpPreflight: _http,
    DiskFreePreflight: _disk_free,
    CpuCountPreflight: _cpu_count,
    ConnectionPreflight: _connection,
}


def write_report(path: Path, report: PreflightReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")


def preflight_step(
    suite_path: str, planned: list[CellSpec], ref: Any, params: dict[str, Any]
) -> dict[str, Any]:
    """The `preflight` task: run the checks, record the report, fail before provisioning."""
    import logging

    log = logging.getLogger(__name__)
    suite = load_suite(suite_path)
    resolved = {k: p.default for k, p in suite.params.items()}
    resolved.update({k: v for k, v in params.items() if k in suite.params})
    report = run_preflight(suite.preflight, resolved)
    log.info("%s", report.table())
    run_dir = (
        settings.artifacts_dir() / settings.safe_name(ref.dag_id) / settings.safe_name(ref.run_id)
    )
    write_report(run_dir / "preflight.json", report)
    if report.passed:
        return report.to_json()
    store = results_store()
    message = f"not run: preflight failed: {report.summary()}"[:2000]
    for cell in planned:
        store.upsert_cell(
            ref.dag_id, ref.run_id, cell.id, state=CellState.PREFLIGHT_FAILED, message=message
        )
    raise CellFailed(report.table())
