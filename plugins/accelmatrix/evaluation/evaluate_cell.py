"""``evaluate_cell``: observe a cell's outputs, validate them with GE, return verdicts."""

from __future__ import annotations

import time
from pathlib import Path

from accelmatrix.contracts.check_verdicts import CellOutputs, CheckVerdict, EvaluationReport
from accelmatrix.evaluation.gx_suite import import_gx, run_suite
from accelmatrix.evaluation.observe import plan_cell, tables
from accelmatrix.spec.checks import Check, parse_checks

__all__ = ["evaluate_cell"]


def evaluate_cell(
    checks: list[Check],
    outputs: CellOutputs,
    *,
    include_dir: Path,
    data_docs_dir: Path | None = None,
    suite_name: str = "cell",
) -> EvaluationReport:
    """Evaluate every check of one cell; a check that cannot be observed fails, never crashes.

    ``include_dir`` resolves ``bounds_file`` paths. With ``data_docs_dir``, Great Expectations
    Data Docs HTML for this cell is written there and its index returned in the report.
    """

    started = time.perf_counter()
    if not checks:
        # Nothing to validate: skip the multi-second Great Expectations import.
        return EvaluationReport([], True, None, time.perf_counter() - started)
    plans, inputs = plan_cell(checks, outputs, include_dir=Path(include_dir))
    run = run_suite(
        plans,
        tables(plans, inputs),
        suite_name=suite_name,
        data_docs_dir=Path(data_docs_dir) if data_docs_dir is not None else None,
    )
    verdicts = []
    for plan in plans:
        passed, error = run.outcome(plan)
        if plan.render is not None and len(run.outcomes(plan)) == len(plan.expectations):
            # A table check's text comes from what GE computed: observed values, the steps.
            plan.render(run.outcomes(plan))
        message = plan.success if passed else plan.failure
        if error:
            message = f"{message} (Great Expectations error: {error})"
        warning = not passed and plan.severity == "warning"
        verdicts.append(
            CheckVerdict(
                name=plan.name,
                type=plan.type,
                passed=passed or warning,
                expected=plan.expected,
                observed=plan.observed,
                message=f"WARNING: {message}" if warning else message,
                warning=warning,
                perf=plan.perf,
            )
        )
    return EvaluationReport(
        verdicts=verdicts,
        passed=all(v.passed for v in verdicts),
        data_docs_index=run.data_docs_index,
        seconds=time.perf_counter() - started,
    )


def rehearse(work_dir: Path, include_dir: Path) -> float:
    """Evaluate a small made-up cell (a log check, the exit status, a metric bound) with Data
    Docs under ``work_dir``; return the seconds it took.

    The first evaluation in a process loads the parts of Great Expectations, pandas and
    pyarrow that their imports leave for first use (~0.1 s of CPU). A process that forks task
    processes (PreloadedLocalExecutor) rehearses once so that no cell pays for it.
    """

    files = work_dir / "files"
    files.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / "output.log"
    log_path.write_text("step 1 loss: 0.5\nFinished training run\n")
    checks = parse_checks(
        [
            {"type": "exit_status"},
            {"type": "log_contains", "pattern": "Finished training run"},
            {"type": "metric_between", "metric": "loss", "max": 1.0},
        ]
    )
    started = time.perf_counter()
    report = evaluate_cell(
        checks,
        CellOutputs(
            files_dir=files,
            log_path=log_path,
            status={"exit_code": 0, "timed_out": False},
            metrics=[
                {"name": "loss", "value": 0.5, "step": 1, "unit": None, "source": "rehearsal"}
            ],
        ),
        include_dir=include_dir,
        data_docs_dir=work_dir / "data_docs",
        suite_name="accelmatrix.rehearsal",
    )
    if not report.passed:  # the made-up cell passes by construction; anything else is a bug
        raise RuntimeError(f"the rehearsal cell did not pass:\n{report.format_table()}")
    return time.perf_counter() - started


def warm_up(rehearse_with: Path | None = None) -> None:
    """Get this process ready to evaluate: import Great Expectations, compile the Data Docs
    templates, and with ``rehearse_with`` (the include dir) also evaluate a made-up cell.

    The triggerer's warm-up thread does not rehearse: a rehearsal beside a real evaluation
    would run two Great Expectations contexts at once. PreloadedLocalExecutor does, before
    any task runs.
    """
    import tempfile

    # Here, not at the top: docs_views imports Great Expectations (~2.5 s of CPU), which
    # only a process that evaluates should pay for.
    from accelmatrix.evaluation.docs_views import warm_templates

    import_gx()
    warm_templates()
    if rehearse_with is not None:
        with tempfile.TemporaryDirectory(prefix="accelmatrix-rehearsal-") as tmp:
            rehearse(Path(tmp), rehearse_with)
