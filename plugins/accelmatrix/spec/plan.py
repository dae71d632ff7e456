"""Expand a suite's axes into the run plan: the cells to run and the cells excluded.

The plan is computed inside the DAG's `plan` task (not at parse time), so UI params can
filter cells and resolve `${params.*}`, and a run keeps the plan it started with even if the
YAML changes mid-run. Each cell is a ``CellSpec`` (accelmatrix.spec.cell), validated here once
its placeholders are filled in: the mapped tasks need nothing else to provision, run and
evaluate it.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from accelmatrix.spec.axis_kinds import cell_extras
from accelmatrix.spec.cell import CellSpec
from accelmatrix.spec.checks import CheckBase, parse_checks
from accelmatrix.spec.suite import MAX_CELLS, QuarantineRule, Suite
from accelmatrix.spec.support import unsupported_reason
from accelmatrix.spec.templating import escape, render, render_tree, run_variables

# Workload fields that lifecycle/operators render a second time with the backend variables.
SECOND_PASS = frozenset({"run", "setup", "services", "env", "artifacts"})


class PlanError(ValueError):
    """The matrix cannot be planned (too many cells, nothing to run, ...)."""


@dataclass
class Excluded:
    id: str
    axes: dict[str, str]
    reason: str


@dataclass
class Plan:
    suite_id: str
    cells: list[CellSpec] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    runtime_version: str | None = None  # the suite's, rendered for this run

    def by_machine(self, machines: list[str]) -> dict[str, list[CellSpec]]:
        """Cells grouped by machine, one list per machine (empty lists included)."""
        out: dict[str, list[CellSpec]] = {m: [] for m in machines}
        for c in self.cells:
            out[c.machine].append(c)
        return out

    def table(self) -> str:
        """The run plan as a fixed-width table, for the task log and the CLI."""
        rows = [("#", "cell", "machine", "status")]
        for c in self.cells:
            status = "run" + (f" (quarantined: {c.quarantine_reason})" if c.quarantined else "")
            status += "".join(f"  [{n}]" for n in c.notes)
            rows.append((str(c.index), c.id, c.machine, status))
        for e in self.excluded:
            rows.append(("-", e.id, "-", f"excluded: {e.reason}"))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
        lines.insert(1, "-" * max(len(x) for x in lines))
        head = (
            f"Run plan for {self.suite_id}: {len(self.cells)} cell(s) to run, "
            f"{len(self.excluded)} excluded"
        )
        return head + "\n" + "\n".join(lines)


def cell_id(axes: dict[str, str]) -> str:
    """Stable, readable id: `runtime=pt213,machine=cpu-small` (axis order of the YAML)."""
    return ",".join(f"{k}={v}" for k, v in axes.items())


def _matches(rule_value: str | list[str], label: str) -> bool:
    wants = [rule_value] if isinstance(rule_value, str) else rule_value
    return any(fnmatch.fnmatchcase(label, w) for w in wants)


def expand(
    suite: Suite,
    suite_id: str,
    *,
    params: dict[str, Any] | None = None,
    only: list[str] | None = None,
    logical_date: datetime | None = None,
    runtime_version: str | None = None,
) -> Plan:
    """Every combination of the axes, minus exclusions, minus cells not selected by ``only``.

    ``params`` are the run's param values (defaults from the suite where missing); ``only``
    is a list of fnmatch globs over cell ids (the `cells` UI param); ``logical_date`` (the
    DAG run's; None: now) resolves the ``${run.*}`` placeholders; ``runtime_version``, when
    given, is the build under test instead of the suite's template (a re-test of a named
    build: ``spec.followup``).
    """
    values = {name: {} for name in suite.axes}
    for name, raw in suite.axes.items():
        labels = suite.axis_labels(name)
        if isinstance(raw, dict):
            values[name] = dict(raw)
        else:
            values[name] = dict(zip(labels, raw, strict=True))

    resolved_params = {k: p.default for k, p in suite.params.items()}
    resolved_params.update(params or {})

    run_vars = run_variables(logical_date)
    rendered_checks: dict[str, list[CheckBase]] = {}
    param_vars = {f"params.{k}": v for k, v in resolved_params.items()}
    if runtime_version is None and suite.runtime_version is not None:
        runtime_version = render(suite.runtime_version, {**run_vars, **param_vars})
    if runtime_version is not None:
        run_vars["run.runtime_version"] = runtime_version
    plan = Plan(suite_id=suite_id, runtime_version=runtime_version)
    names = list(suite.axes)
    # Each glob of ``only`` -> the cells it matched, with the reason each is not run (None:
    # it runs). A glob that selects no runnable cell is a mistake, never an empty run.
    globs: dict[str, list[tuple[str, str | None]]] = {g: [] for g in only or []}
    runnable: list[str] = []  # the ids a glob may select in this run, in matrix order
    for combo in itertools.product(*(list(values[n]) for n in names)):
        axes = dict(zip(names, combo, strict=True))
        cid = cell_id(axes)
        reason = next(
            (
                r.reason
                for r in suite.exclude
                if all(_matches(want, axes[a]) for a, want in r.match.items())
            ),
            None,
        ) or unsupported_reason(suite, axes)
        if reason is None:
            reason = _param_axis_reason(suite.param_axes, axes, resolved_params)
        if reason is None:
            runnable.append(cid)
        if only:
            matched = [g for g in only if fnmatch.fnmatchcase(cid, g)]
            for g in matched:
                globs[g].append((cid, reason))
            if reason is None and not matched:
                reason = "not selected by the `cells` param"
        if reason is not None:
            plan.excluded.append(Excluded(id=cid, axes=axes, reason=reason))
            continue

        machine = axes.get("machine") if "machine" in suite.axes else suite.machine
        if machine is None:
            machine = next(iter(suite.machines))
        variables: dict[str, Any] = {"cell.id": cid, **run_vars}
        for a, label in axes.items():
            variables[f"axis.{a}"] = label
            v = values[a][label]
            if isinstance(v, dict):
                for k, fv in v.items():
                    variables[f"axis.{a}.{k}"] = fv
        for k, v in resolved_params.items():
            variables[f"params.{k}"] = v

        q_reason = _quarantine_reason(suite.quarantine, cid)
        spec = suite.machines[machine]
        kind_env, notes = cell_extras(suite.axis_kinds, {a: values[a][axes[a]] for a in axes})
        # The fields the backend renders again (for ${work_dir}, ...) get their substituted
        # values escaped: a param holding "${python}" must reach the workload as written.
        workload = {
            k: render_tree(v, variables, keep_unknown=True, escape_values=k in SECOND_PASS)
            for k, v in suite.workload.model_dump(mode="json").items()
        }
        # e.g. CPU-only hides GPUs
        workload["env"] = {**workload["env"], **{k: escape(v) for k, v in kind_env.items()}}
        plan.cells.append(
            _cell_spec(
                suite_id,
                id=cid,
                index=len(plan.cells),
                axes=axes,
                values={a: values[a][axes[a]] for a in axes},
                machine=machine,
                backend=spec.backend,
                pool=suite.pool_for(machine),
                # A machine may name a dated build: image: trainer:${run.runtime_version}.
                machine_spec=render_tree(
                    spec.model_dump(mode="json"), variables, keep_unknown=True
                ),
                # Backend variables (${work_dir}, ...) stay for the backend to fill in.
                workload=workload,
                checks=_rendered_checks(suite, suite_id, variables, rendered_checks),
                quarantined=q_reason is not None,
                quarantine_reason=q_reason,
                notes=notes,
            )
        )

    if unselected := [g for g, hits in globs.items() if not any(r is None for _, r in hits)]:
        raise PlanError(_unselected_message(suite_id, unselected, globs, runnable))
    if len(plan.cells) > MAX_CELLS:
        raise PlanError(
            f"the matrix has {len(plan.cells)} cells after exclusions; Airflow maps at most "
            f"{MAX_CELLS} ([core] max_map_length): split the suite or exclude cells"
        )
    return plan


# The refusal of a glob that selects nothing lists at most this many valid cell ids.
LISTED_IDS = 64


def _unselected_message(
    suite_id: str,
    unselected: list[str],
    globs: dict[str, list[tuple[str, str | None]]],
    runnable: list[str],
) -> str:
    """Why the `cells` globs are refused, and the ids a glob could select instead."""
    lines = []
    for g in unselected:
        if not (hits := globs[g]):
            lines.append(f"cells: {g!r} matches no cell id of {suite_id}")
            continue
        why = "; ".join(f"{cid} ({reason})" for cid, reason in hits[:8])
        more = f" ... and {len(hits) - 8} more" if len(hits) > 8 else ""
        lines.append(f"cells: {g!r} matches only cells this run excludes: {why}{more}")
    if not runnable:
        lines.append(f"no cell of {suite_id} can run with these params")
        return "\n".join(lines)
    listed = runnable[:LISTED_IDS]
    more = f" ... and {len(runnable) - len(listed)} more" if len(runnable) > len(listed) else ""
    example = listed[0].split(",")[0] + ",*"
    lines.append(
        f"valid cell ids ({len(runnable)}; a glob like {example} selects several): "
        + "; ".join(listed)
        + more
    )
    return "\n".join(lines)


def _rendered_checks(
    suite: Suite, suite_id: str, variables: dict[str, Any], seen: dict[str, list[CheckBase]]
) -> list[CheckBase]:
    """The suite's checks with this cell's placeholders filled in, validated again, and
    the exit status check every cell has.

    The suite validated the text with its placeholders (``steps: ${params.steps}``); the
    values a run gives them must make valid checks too, or the run stops here, before any
    machine is provisioned, naming the check and the field. ``seen`` caches validated
    renderings: most cells of a matrix render their checks alike.
    """
    rendered = [
        render_tree(c.model_dump(mode="json"), variables, keep_unknown=True) for c in suite.checks
    ]
    key = json.dumps(rendered, sort_keys=True, default=str)
    if key not in seen:
        try:
            seen[key] = _with_exit_status(parse_checks(rendered))
        except ValidationError as exc:
            problems = "; ".join(
                f"checks[{e['loc'][0]}].{'.'.join(str(x) for x in e['loc'][2:])}: {e['msg']}"
                for e in exc.errors()
            )
            raise PlanError(
                f"suite {suite_id}: a check is invalid once its placeholders are filled in "
                f"for cell {variables.get('cell.id')}: {problems}"
            ) from None
    return seen[key]


def _with_exit_status(checks: list[CheckBase]) -> list[CheckBase]:
    """Every cell checks its exit status (expected 0) unless the suite says otherwise."""
    if any(c.type == "exit_status" for c in checks):
        return checks
    return [*parse_checks([{"type": "exit_status", "expected": 0}]), *checks]


def _cell_spec(suite_id: str, **fields: Any) -> CellSpec:
    """The cell, validated now that its placeholders are filled in.

    The suite validated its text with the placeholders; a value a run gives one (a param,
    an axis value) must still make a valid machine and workload, or the run stops here,
    before anything is provisioned, naming the cell and the field.
    """
    try:
        return CellSpec(**fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise PlanError(
            f"suite {suite_id}: cell {fields['id']} is invalid once its placeholders are "
            f"filled in: {problems}"
        ) from None


def _quarantine_reason(rules: list[QuarantineRule | str], cid: str) -> str | None:
    for r in rules:
        glob, reason = (r, "quarantined") if isinstance(r, str) else (r.cells, r.reason)
        if fnmatch.fnmatchcase(cid, glob):
            return reason
    return None


def _param_axis_reason(
    param_axes: list[str], axes: dict[str, str], params: dict[str, Any]
) -> str | None:
    """Why a cell is not in this run: a `param_axes` param selects another value."""
    for axis in param_axes:
        want = params.get(axis)
        if want not in (None, "all") and axes[axis] != want:
            return f"param {axis}={want} selects another {axis}"
    return None
