"""A cell's metrics as the tables Great Expectations validates.

The long metric rows ``{name, value, step, unit, source}`` become two tables:

* ``steps``: one row per step, one column per stepped metric (the pivot a person draws when
  they say "the metrics table"), plus a ``step`` column. A metric that is absent on some
  rows of the table (logged every 10th step, or a step that was lost) gets a boolean
  ``<metric>__logged`` column, so an expectation can tell "never logged" from "logged as
  NaN": pandas holds both as NaN. A metric with a step logged more than once gets a
  ``<metric>__repeats`` column (how often each step was logged; the value kept is the last).
* ``scalars``: the metrics that have no stepped rows, one row per value in collection
  order (``metric``, ``seq``, ``value``): a summary's ``mfu`` or the runner's peak memory.

A check does not see these tables directly: it asks for the ``Rows`` of one metric
(``rows``: its steps, maybe past a warm-up, or its last step) and for a ``view`` of them, a
column of the same table that shows those rows and blanks the rest, so Great Expectations
computes every median, every row verdict and every list of offending steps over the real
table, and our code only says which rows a check covers.

Which row wins when a (metric, step) repeats: within one source the last one logged (a
resume from a checkpoint logs steps again, and the later value is the one the run went on
with); across two sources the first declared source (the order ``write_train_metrics``
reads). Pure pandas; no Great Expectations import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["STEP", "Condition", "MetricsTable", "Rows"]

STEP = "step"
SEQ = "seq"
STEPS_TABLE = "steps"
SCALARS_TABLE = "scalars"


# Which rows an expectation covers: every (column, operator, value) holds. Used by the run's
# table; the metrics tables select rows through views instead (see ``MetricsTable.view``).
Condition = tuple[tuple[str, str, Any], ...]

# How a view shows the selected rows, and what it puts in every other row:
#   values     the values; NaN elsewhere (GE's aggregates skip NaN)
#   nulls      the values; 0 elsewhere (ExpectColumnValuesToNotBeNull names the NaN rows)
#   nan_high   NaN as +inf (fails a max; counts in ``mostly``), NaN elsewhere (skipped)
#   nan_low    NaN as -inf (fails a min), NaN elsewhere
#   finite     the finite values, NaN and inf as NaN; 0 elsewhere (not_null names a missing,
#              NaN or infinite row)
VIEWS = ("values", "nulls", "nan_high", "nan_low", "finite")


@dataclass(frozen=True)
class Rows:
    """The rows of one metric a check covers: ``mask`` over the rows of ``table``.

    ``index`` (steps, or positions for a scalar metric) and ``values`` are the same rows
    for the verdict text, which names steps and values the way Great Expectations reported
    them; ``label`` says which rows in a view's column name ("steps 5+", "last step").
    """

    metric: str
    table: str
    column: str
    mask: np.ndarray
    index: np.ndarray
    values: np.ndarray
    index_name: str  # "step" or "seq"
    label: str = ""

    @property
    def n(self) -> int:
        return len(self.values)

    def last(self) -> Rows:
        """Only the last row (the newest step, or the last scalar logged)."""
        if self.n <= 1:
            return self
        import numpy as np

        mask = np.zeros_like(self.mask)
        mask[np.flatnonzero(self.mask)[-1]] = True
        label = "last step" if self.index_name == STEP else "last value"
        return Rows(
            self.metric,
            self.table,
            self.column,
            mask,
            self.index[-1:],
            self.values[-1:],
            self.index_name,
            label,
        )


class MetricsTable:
    """The ``steps`` and ``scalars`` tables of one cell, built once from its metric rows.

    ``expected_steps`` adds a row for every step of those ranges that no metric logged, so
    ``steps_complete`` can let Great Expectations name the missing ones.
    """

    def __init__(
        self, rows: list[dict[str, Any]], expected_steps: list[range] | tuple[range, ...] = ()
    ) -> None:
        import numpy as np
        import pandas as pd

        kept, repeats, scalars = _pick(rows)
        steps = sorted({s for (_, s) in kept} | {s for r in expected_steps for s in r})
        position = {s: i for i, s in enumerate(steps)}
        names = sorted({n for (n, _) in kept})
        data: dict[str, Any] = {STEP: np.asarray(steps, dtype="int64")}
        self._logged: dict[str, np.ndarray] = {}
        for name in names:
            values = np.full(len(steps), np.nan)
            logged = np.zeros(len(steps), dtype=bool)
            for (n, s), v in kept.items():
                if n == name:
                    values[position[s]] = v
                    logged[position[s]] = True
            data[name] = values
            self._logged[name] = logged
            if not logged.all():
                data[f"{name}__logged"] = logged
            counts = repeats.get(name)
            if counts:
                column = np.ones(len(steps), dtype="int64")
                column[~logged] = 0
                for s, k in counts.items():
                    column[position[s]] = k
                data[f"{name}__repeats"] = column
        self.steps: pd.DataFrame = pd.DataFrame(data)
        self.scalars: pd.DataFrame = pd.DataFrame(
            {
                "metric": [n for n, _ in scalars],
                SEQ: np.arange(len(scalars), dtype="int64"),
                "value": np.asarray([v for _, v in scalars], dtype="float64"),
            }
        )
        self._repeats = repeats

    def frames(self) -> dict[str, pd.DataFrame]:
        return {STEPS_TABLE: self.steps, SCALARS_TABLE: self.scalars}

    @property
    def names(self) -> list[str]:
        """Every metric with a value: the stepped ones, then the scalar-only ones."""
        stepped = list(self._logged)
        return stepped + sorted(set(self.scalars["metric"]) - set(stepped))

    def repeats_column(self, metric: str) -> str | None:
        """``<metric>__repeats`` when some step of ``metric`` was logged more than once."""
        return f"{metric}__repeats" if self._repeats.get(metric) else None

    def logged(self, metric: str) -> np.ndarray | None:
        """Per row of ``steps``: whether ``metric`` was logged there (None: not stepped)."""
        return self._logged.get(metric)

    def rows(self, metric: str, *, skip_first: int = 0) -> Rows | None:
        """The rows of ``metric`` (its steps, or its scalars), minus the first ``skip_first``
        warm-up steps; None when the metric was never collected."""
        import numpy as np

        logged = self._logged.get(metric)
        if logged is not None:
            table, column, index_name, mask = STEPS_TABLE, metric, STEP, logged.copy()
            index = self.steps[STEP].to_numpy()
        else:
            mask = (self.scalars["metric"] == metric).to_numpy()
            if not mask.any():
                return None
            table, column, index_name = SCALARS_TABLE, "value", SEQ
            index = self.scalars[SEQ].to_numpy()
        label = ""
        if skip_first:
            positions = np.flatnonzero(mask)
            mask[positions[:skip_first]] = False
            label = f"after {skip_first} warm-up"
        frame = self.steps if table == STEPS_TABLE else self.scalars
        values = frame[column].to_numpy()[mask]
        return Rows(metric, table, column, mask, index[mask], values, index_name, label)

    def view(self, rows: Rows, how: str) -> str:
        """The name of a column of ``rows.table`` that shows ``rows`` as ``how`` says
        (``VIEWS``), added to the table the first time it is asked for.

        Views select rows without GE row conditions, which cost more than the expectation
        they restrict (GE serialises a condition object many times per expectation). A
        metric logged at every step, judged whole, is its own column.
        """
        import numpy as np

        frame = self.steps if rows.table == STEPS_TABLE else self.scalars
        whole = rows.table == STEPS_TABLE and bool(rows.mask.all())
        if whole and how in ("values", "nulls"):
            return rows.column
        name = f"{rows.metric} ({', '.join(x for x in (rows.label, how) if x)})"
        if name not in frame:
            source = frame[rows.column].to_numpy(dtype="float64")
            if how in ("values", "nulls"):
                shown = source
            elif how == "finite":
                shown = np.where(np.isfinite(source), source, np.nan)
            else:
                shown = np.where(np.isnan(source), np.inf if how == "nan_high" else -np.inf, source)
            other = 0.0 if how in ("nulls", "finite") else np.nan
            frame[name] = np.where(rows.mask, shown, other)
        return name

    def rows_in(self, metric: str, steps: range, *, column: str | None = None) -> Rows:
        """Every row of ``steps`` (logged or not: see __init__) for ``metric``'s column, or
        for ``column``, a per-step column that describes it (``<metric>__repeats``)."""
        index = self.steps[STEP].to_numpy()
        mask = (index >= steps.start) & (index < steps.stop)
        name = column or metric
        values = self.steps[name].to_numpy(dtype="float64")[mask]
        label = f"steps {steps.start}-{steps.stop - 1}"
        return Rows(name, STEPS_TABLE, name, mask, index[mask], values, STEP, label)


def _pick(
    rows: list[dict[str, Any]],
) -> tuple[dict[tuple[str, int], float], dict[str, dict[int, int]], list[tuple[str, float]]]:
    """(kept stepped values, repeat counts per metric and step, scalar-only rows)."""
    kept: dict[tuple[str, int], float] = {}
    source_of: dict[tuple[str, int], Any] = {}
    repeats: dict[str, dict[int, int]] = {}
    stepped: set[str] = set()
    scalar_rows: list[tuple[str, float]] = []
    for r in rows:
        name = r.get("name")
        if not isinstance(name, str):
            continue
        step = r.get("step")
        if step is None:
            scalar_rows.append((name, _as_float(r.get("value"))))
            continue
        key = (name, int(step))
        stepped.add(name)
        times = int(r.get("repeats") or 1)
        if key not in kept:
            kept[key], source_of[key] = _as_float(r.get("value")), r.get("source")
            if times > 1:
                repeats.setdefault(name, {})[key[1]] = times
        elif source_of[key] == r.get("source"):  # logged again by the same source: last wins
            kept[key] = _as_float(r.get("value"))
            counts = repeats.setdefault(name, {})
            counts[key[1]] = counts.get(key[1], 1) + times
    scalars = [(n, v) for n, v in scalar_rows if n not in stepped]
    return kept, repeats, scalars


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
