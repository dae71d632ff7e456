"""A follow-up run: the suite re-testing named builds on a few cells, for a confirmation or a
bisect step (``accelmatrix.history.followup`` starts them; this module plans them).

A follow-up run is an ordinary run of the suite's DAG whose ``conf`` carries the block
``accelmatrix_followup``. Its plan holds, for each suspect cell, ``repeats`` cells per build,
interleaved (build A, build B, build A, ...), so that whatever drifts on the machine while
they run hits both builds alike. Each cell tests its own build: the build is the cell's
``${run.runtime_version}``, and the cell id names it (``model=small,build=nightly-2026-03-04,
repeat=2``), so the matrix page, the task log and the results say which build a cell ran.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.plan import Plan, PlanError, expand
from accelmatrix.spec.suite import Suite
from accelmatrix.spec.suite_parts import Model

__all__ = ["FOLLOWUP_KEY", "Followup", "base_cell", "expand_followup", "followup_of"]

FOLLOWUP_KEY = "accelmatrix_followup"


class Followup(Model):
    """The ``accelmatrix_followup`` block of a follow-up run's conf."""

    kind: Literal["confirm", "bisect"]
    confirmation: Annotated[int, Field(ge=1)]  # results.schema.confirmations.id
    round: Annotated[int, Field(ge=1)]
    cells: Annotated[list[str], Field(min_length=1, max_length=64)]
    builds: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=250)]], Field(min_length=1, max_length=2)
    ]
    repeats: Annotated[int, Field(ge=1, le=200)]
    max_usd: Annotated[float, Field(ge=0)] | None = None


def followup_of(conf: dict[str, Any] | None) -> Followup | None:
    """The follow-up block of a run's conf (or params), validated; None for an ordinary run.
    A malformed block is a PlanError naming the field."""
    raw = (conf or {}).get(FOLLOWUP_KEY)
    if raw is None:
        return None
    try:
        return Followup.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise PlanError(f"conf {FOLLOWUP_KEY}.{where}: {first['msg']}") from None


def expand_followup(
    suite: Suite,
    suite_id: str,
    followup: Followup,
    *,
    params: dict[str, Any] | None = None,
    logical_date: datetime | None = None,
) -> Plan:
    """The follow-up run's plan: each suspect cell x each build x ``repeats``, interleaved
    by repeat then build. Every listed cell must be a cell of the suite that runs with these
    params (a cell id is matched exactly, never as a glob)."""
    per_build: dict[str, dict[str, CellSpec]] = {}
    for build in followup.builds:
        plan = expand(
            suite, suite_id, params=params, logical_date=logical_date, runtime_version=build
        )
        per_build[build] = {c.id: c for c in plan.cells}
    first = per_build[followup.builds[0]]
    if missing := [c for c in followup.cells if c not in first]:
        raise PlanError(
            f"conf {FOLLOWUP_KEY}.cells: {', '.join(missing)} is not a cell of {suite_id} that "
            f"runs with these params; cells that run: {', '.join(sorted(first)) or 'none'}"
        )
    out = Plan(suite_id=suite_id, runtime_version=followup.builds[-1])
    for r in range(1, followup.repeats + 1):
        for cid in followup.cells:
            for build in followup.builds:
                base = per_build[build][cid]
                axes = {**base.axes, "build": build, "repeat": str(r)}
                out.cells.append(
                    base.model_copy(
                        update={
                            "id": f"{cid},build={build},repeat={r}",
                            "index": len(out.cells),
                            "axes": axes,
                            "values": {**base.values, "build": build, "repeat": r},
                        }
                    )
                )
    return out


def base_cell(cell_id: str) -> tuple[str, str | None]:
    """(the suite's cell id, the build) of a follow-up cell id; (cell_id, None) otherwise."""
    head, sep, _repeat = cell_id.rpartition(",repeat=")
    if not sep:
        return cell_id, None
    cid, sep, build = head.rpartition(",build=")
    return (cid, build) if sep else (cell_id, None)
