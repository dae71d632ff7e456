"""Compile check plans into a Great Expectations suite, run it, and build Data Docs.

Great Expectations is imported lazily (``import_gx``): the import costs seconds and DAG
parsing imports accelmatrix. Its import-time INFO chatter (hundreds of "Skipping registering
function" lines) and progress bars are silenced so the Airflow task log stays readable.

Each run uses a fresh in-memory (ephemeral) context: nothing is persisted except the Data
Docs HTML, so concurrent cells cannot interfere through a shared GE project directory.
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

from accelmatrix.evaluation.check_plan import CheckPlan, Expect

if TYPE_CHECKING:
    import pandas as pd

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


def _expectation(g: SimpleNamespace, e: Expect, plan: CheckPlan) -> Any:
    """``ExpectColumnMaxToBeBetween``: on one row it checks the value and fails on null."""
    return g.gxe.ExpectColumnMaxToBeBetween(
        column=e.column,
        min_value=e.min_value,
        max_value=e.max_value,
        strict_min=e.strict_min,
        meta={"check": plan.name, "check_index": plan.index, "check_type": plan.type},
        # Rendered by Data Docs in place of GE's generic "maximum value must be ...".
        description=_docs_text(f"{plan.name}: {e.label}"),
    )


class SuiteRun:
    """The per-check expectation results of one suite run, plus the Data Docs index."""

    def __init__(self, by_check: dict[int, list[Any]], data_docs_index: Path | None) -> None:
        self.by_check = by_check
        self.data_docs_index = data_docs_index

    def outcome(self, plan: CheckPlan) -> tuple[bool, str | None]:
        """(passed, GE error text): every expectation of the check ran and succeeded."""
        results = self.by_check.get(plan.index, [])
        errors = [m for r in results if (m := _exception_message(r.exception_info))]
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


def run_suite(
    plans: list[CheckPlan],
    frame: pd.DataFrame,
    *,
    suite_name: str,
    data_docs_dir: Path | None = None,
) -> SuiteRun:
    """Validate the observation frame against the compiled suite; optionally build docs."""
    g = import_gx()
    name = safe_suite_name(suite_name)
    config = g.DataContextConfig(
        store_backend_defaults=g.InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=g.ProgressBarsConfig(globally=False),
    )
    ctx = g.gx.get_context(project_config=config, mode="ephemeral")
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
    batch = (
        ctx.data_sources.add_pandas("accelmatrix")
        .add_dataframe_asset("observations")
        .add_batch_definition_whole_dataframe("cell")
    )
    expectations = [_expectation(g, e, plan) for plan in plans for e in plan.expectations]
    suite = ctx.suites.add(g.gx.ExpectationSuite(name=name, expectations=expectations))
    definition = ctx.validation_definitions.add(
        g.gx.ValidationDefinition(name=name, data=batch, suite=suite)
    )
    # run() also stores the result in the context's in-memory validation results store,
    # which is what build_data_docs renders: no Checkpoint/UpdateDataDocsAction needed.
    result = definition.run(batch_parameters={"dataframe": frame})

    by_check: dict[int, list[Any]] = {}
    for r in result.results:
        by_check.setdefault(int(r.expectation_config.meta["check_index"]), []).append(r)

    index = None
    if data_docs_dir is not None:
        # GE's stores need the path-safe name; the page's title shows the cell id as it is.
        index = _build_docs(ctx, data_docs_dir, result, suite_name)
    return SuiteRun(by_check, index)


def _build_docs(ctx: Any, data_docs_dir: Path, result: Any, suite_name: str) -> Path | None:
    """Best effort: the verdicts stand without Data Docs, so a rendering error only warns.
    The site is then made to render with no network (see offline_docs)."""
    from accelmatrix.evaluation.offline_docs import make_offline

    try:
        data_docs_dir.mkdir(parents=True, exist_ok=True)
        # No GE index: make_offline writes ours (GE's needs a CDN to show a row).
        ctx.build_data_docs(site_names=[DOCS_SITE], build_index=False)
        make_offline(data_docs_dir, result, suite_name)
    except Exception:
        log.warning("building Data Docs in %s failed", data_docs_dir, exc_info=True)
        return None
    index = data_docs_dir / "index.html"
    if not index.is_file():
        log.warning("Data Docs were built but %s is missing", index)
        return None
    return index
