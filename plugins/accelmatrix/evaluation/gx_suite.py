"""Compile check plans into a Great Expectations suite, run it, and build Data Docs.

Great Expectations is imported lazily (``import_gx``): the import costs seconds and DAG
parsing imports accelmatrix. Its import-time INFO chatter (hundreds of "Skipping registering
function" lines) and progress bars are silenced so the Airflow task log stays readable.

Each run uses a fresh in-memory (ephemeral) context: nothing is persisted except the Data
Docs HTML, so concurrent cells cannot interfere through a shared GE project directory. A
cell's tables (``observations``, the metrics tables ``steps`` and ``scalars``) are one
pandas data source with an asset per table; each table with expectations is one
validation, and the Data Docs show them all.
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from accelmatrix.evaluation.check_plan import OBSERVATIONS, CheckPlan, Expect, ExpectOutcome
from accelmatrix.evaluation.offline_docs import make_offline

if TYPE_CHECKING:
    import pandas as pd

    from accelmatrix.evaluation.metrics_table import Condition

__all__ = ["DOCS_SITE", "SuiteRun", "gx_loaded", "import_gx", "run_suite", "safe_suite_name"]

log = logging.getLogger(__name__)

DOCS_SITE = "accelmatrix"
# Loggers that are noisy at INFO while great_expectations imports (alembic: plugin setup,
# reached through GE's BigQuery compatibility module importing sqlalchemy_bigquery, which the
# Google provider installs).
_IMPORT_NOISE = ("alembic",)

_gx: SimpleNamespace | None = None


@contextlib.contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Raise loggers to WARNING for the duration, then restore what the host configured."""
    loggers = [logging.getLogger(n) for n in names]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, saved, strict=True):
            lg.setLevel(level)


# Data Docs views that compile GE's templates once per process tree (docs_views.py).
_VIEWS = "accelmatrix.evaluation.docs_views"


def gx_loaded() -> bool:
    """Whether this process has Great Expectations imported already (evaluating is cheap)."""
    return _gx is not None


def import_gx() -> SimpleNamespace:
    """Import Great Expectations once, quietly, with analytics off; return the parts we use."""
    global _gx
    if _gx is not None:
        return _gx
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network here anyway
    gx_logger = logging.getLogger("great_expectations")
    if gx_logger.level == logging.NOTSET:
        # GE logs INFO during runs too; keep it at WARNING unless the host chose a level.
        gx_logger.setLevel(logging.WARNING)
    started = time.perf_counter()
    # GE draws (disabled) tqdm bars; tqdm would start a monitor thread for them, and a
    # thread in a process that later forks (PreloadedLocalExecutor) can hold a lock the
    # child then waits on forever. The monitor only tunes refresh rates: off.
    import tqdm

    tqdm.tqdm.monitor_interval = 0
    with _quiet(_IMPORT_NOISE):
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )
    log.info(
        "imported great_expectations %s in %.1f s", gx.__version__, time.perf_counter() - started
    )
    _gx = SimpleNamespace(
        gx=gx,
        gxe=gxe,
        DataContextConfig=DataContextConfig,
        InMemoryStoreBackendDefaults=InMemoryStoreBackendDefaults,
        ProgressBarsConfig=ProgressBarsConfig,
    )
    return _gx


def safe_suite_name(name: str) -> str:
    """GE's filesystem stores reject '/' and '\\' in keys; keep names path-safe."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_") or "cell"


def _docs_text(text: str) -> str:
    """Data Docs insert a description into HTML unescaped; "<=" would start a tag."""
    return html.escape(text)


# Expect.kind -> the Great Expectations class that computes it.
_CLASSES = {
    "max": "ExpectColumnMaxToBeBetween",
    "min": "ExpectColumnMinToBeBetween",
    "mean": "ExpectColumnMeanToBeBetween",
    "median": "ExpectColumnMedianToBeBetween",
    "each": "ExpectColumnValuesToBeBetween",
    "not_null": "ExpectColumnValuesToNotBeNull",
    "in_set": "ExpectColumnValuesToBeInSet",
    "unique": "ExpectColumnValuesToBeUnique",
}


def _expectation(g: SimpleNamespace, e: Expect, plan: CheckPlan, position: int) -> Any:
    """The GE expectation of ``e``; ``meta`` ties its result back to the check."""
    kwargs: dict[str, Any] = {
        "column": e.column,
        "meta": {
            "check": plan.name,
            "check_index": plan.index,
            "check_type": plan.type,
            "position": position,
        },
        # Rendered by Data Docs in place of GE's generic "maximum value must be ...".
        "description": _docs_text(f"{plan.name}: {e.label}"),
    }
    if e.kind == "in_set":
        kwargs["value_set"] = list(e.value_set or ())
    elif e.kind not in ("not_null", "unique"):
        kwargs |= {"min_value": e.min_value, "max_value": e.max_value, "strict_min": e.strict_min}
    if e.condition:
        kwargs["row_condition"] = _row_condition(e.condition)
    if e.mostly is not None:
        kwargs["mostly"] = e.mostly
    return getattr(g.gxe, _CLASSES[e.kind])(**kwargs)


def _row_condition(condition: Condition) -> Any:
    """GE's row condition (``Column("step") >= 5``, joined with ``&``) of ``condition``."""
    from great_expectations.expectations.row_conditions import Column

    built = None
    for column, op, value in condition:
        c = Column(name=column)
        part = {"==": c.__eq__, ">=": c.__ge__, "<=": c.__le__}[op](value)
        built = part if built is None else built & part
    return built


def _outcome(result: Any, index_column: str | None) -> ExpectOutcome:
    """GE's result of one expectation, with the offending rows as (step, value)."""
    res = result.result or {}
    unexpected = []
    if index_column is not None:
        column = result.expectation_config.kwargs.get("column")
        for row in res.get("unexpected_index_list") or []:
            if isinstance(row, dict) and index_column in row:
                unexpected.append((_plain(row[index_column]), _plain(row.get(column))))
        unexpected.sort(key=lambda r: (str(type(r[0])), r[0]))
    return ExpectOutcome(
        success=bool(result.success),
        observed=res.get("observed_value"),
        unexpected=unexpected,
        element_count=res.get("element_count"),
        error=_exception_message(result.exception_info),
    )


def _plain(value: Any) -> Any:
    """A NumPy scalar from GE's result as the Python value (a step as int, a value as
    float); text stays text."""
    if isinstance(value, str) or value is None:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and not isinstance(value, float) else number


class SuiteRun:
    """The per-check expectation results of one suite run, plus the Data Docs index."""

    def __init__(
        self, by_check: dict[int, list[ExpectOutcome]], data_docs_index: Path | None
    ) -> None:
        self.by_check = by_check
        self.data_docs_index = data_docs_index

    def outcomes(self, plan: CheckPlan) -> list[ExpectOutcome]:
        """The check's outcomes in the order of its expectations."""
        return self.by_check.get(plan.index, [])

    def outcome(self, plan: CheckPlan) -> tuple[bool, str | None]:
        """(passed, GE error text): every expectation of the check ran and succeeded."""
        results = self.outcomes(plan)
        errors = [r.error for r in results if r.error]
        passed = len(results) == len(plan.expectations) and all(r.success for r in results)
        if len(results) != len(plan.expectations):
            errors.append(
                f"{len(results)} of {len(plan.expectations)} expectation result(s) came back"
            )
        return passed, "; ".join(errors) or None


def _exception_message(info: Any) -> str | None:
    """GE reports errors either flat or keyed by metric; find the first raised one."""
    if not isinstance(info, dict):
        return None
    if "raised_exception" in info:
        return str(info.get("exception_message")) if info["raised_exception"] else None
    for value in info.values():
        if message := _exception_message(value):
            return message
    return None


# The column that names a row of each table in a verdict ("steps 5, 10, ...").
CELL_TABLES = {"steps": "step", "scalars": "seq"}


def run_suite(
    plans: list[CheckPlan],
    frames: dict[str, pd.DataFrame],
    *,
    suite_name: str,
    data_docs_dir: Path | None = None,
    index_columns: dict[str, str] = CELL_TABLES,
) -> SuiteRun:
    """Validate each table of ``frames`` against the expectations on it; optionally build
    Data Docs of all of them. ``index_columns`` names, per table, the column that names an
    offending row (a step, a cell)."""
    g = import_gx()
    name = safe_suite_name(suite_name)
    config = g.DataContextConfig(
        store_backend_defaults=g.InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=g.ProgressBarsConfig(globally=False),
    )
    ctx = g.gx.get_context(project_config=config, mode="ephemeral")
    # GE "saves" an ephemeral context's project config after each datasource, asset and docs
    # site is added: it dumps the whole config to YAML (ruamel) into an in-memory store that
    # nothing reads back (the context reads ctx.config itself). Four dumps per cell were 0.09
    # of 0.34 s of CPU for a one-check cell, 0.13 s of the gate's run table (2026-11-28).
    ctx._save_project_config = _not_saved
    if data_docs_dir is not None:
        ctx.add_data_docs_site(
            DOCS_SITE,
            {
                "module_name": _VIEWS,
                "class_name": "LeanSiteBuilder",  # GE's pages and our index, no 4 MiB of assets
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(data_docs_dir),
                },
                "site_index_builder": {
                    "class_name": "DefaultSiteIndexBuilder",
                    "view": {"module_name": _VIEWS, "class_name": "CachedJinjaIndexPageView"},
                },
                # Same pages as GE's defaults; the views only share compiled templates.
                "site_section_builders": {
                    section: {"view": {"module_name": _VIEWS, "class_name": "CachedJinjaPageView"}}
                    for section in ("expectations", "validations", "profiling")
                },
            },
        )
    by_table: dict[str, list[Any]] = {}
    for plan in plans:
        for position, e in enumerate(plan.expectations):
            by_table.setdefault(e.table, []).append(_expectation(g, e, plan, position))
    source = ctx.data_sources.add_pandas("accelmatrix")
    results: list[tuple[str, Any]] = []
    for table, expectations in by_table.items():
        # The observations keep the cell's own suite name; a metrics table is named after it.
        suite_key = name if table == OBSERVATIONS else f"{name}.{table}"
        batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("cell")
        suite = ctx.suites.add(g.gx.ExpectationSuite(name=suite_key, expectations=expectations))
        definition = ctx.validation_definitions.add(
            g.gx.ValidationDefinition(name=suite_key, data=batch, suite=suite)
        )
        index = index_columns.get(table)
        result_format: dict[str, Any] = {"result_format": "SUMMARY"}
        if index is not None:
            # Every offending row, named by its step: the verdict and Data Docs list them.
            result_format = {
                "result_format": "COMPLETE",
                "unexpected_index_column_names": [index],
                "return_unexpected_index_query": False,
                "partial_unexpected_count": 20,
            }
        # run() also stores the result in the context's in-memory validation results store,
        # which is what build_data_docs renders: no Checkpoint/UpdateDataDocsAction needed.
        result = definition.run(
            batch_parameters={"dataframe": frames[table]}, result_format=result_format
        )
        results.append((table, result))

    by_check: dict[int, list[tuple[int, ExpectOutcome]]] = {}
    for table, result in results:
        for r in result.results:
            meta = r.expectation_config.meta
            by_check.setdefault(int(meta["check_index"]), []).append(
                (int(meta.get("position", 0)), _outcome(r, index_columns.get(table)))
            )
    ordered = {k: [o for _, o in sorted(v, key=lambda p: p[0])] for k, v in by_check.items()}

    index_page = None
    if data_docs_dir is not None:
        # GE's stores need the path-safe name; the page's title shows the cell id as it is.
        index_page = _build_docs(ctx, data_docs_dir, [r for _, r in results], suite_name)
    return SuiteRun(ordered, index_page)


def _not_saved() -> None:
    """An ephemeral context's project config is never saved (see run_suite)."""


def _build_docs(ctx: Any, data_docs_dir: Path, results: list[Any], suite_name: str) -> Path | None:
    """Best effort: the verdicts stand without Data Docs, so a rendering error only warns.
    The site is then made to render with no network (see offline_docs)."""

    try:
        data_docs_dir.mkdir(parents=True, exist_ok=True)
        # No GE index: make_offline writes ours (GE's needs a CDN to show a row).
        ctx.build_data_docs(site_names=[DOCS_SITE], build_index=False)
        make_offline(data_docs_dir, results, suite_name)
    except Exception:
        log.warning("building Data Docs in %s failed", data_docs_dir, exc_info=True)
        return None
    index = data_docs_dir / "index.html"
    if not index.is_file():
        log.warning("Data Docs were built but %s is missing", index)
        return None
    return index
