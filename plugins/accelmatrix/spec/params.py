"""Param values given outside the trigger form (``plan --params``, ``demo --conf``), checked
the way the form checks them.

Airflow validates a triggered run's params against each Param's JSON schema; the CLI used
to take any JSON and plan with it, so a value below a param's minimum or a misspelt param
name produced a plan no real run could have. One schema per param, built here, serves both.
"""

from __future__ import annotations

import json
from typing import Any

from accelmatrix.spec.followup_plan import COMPARE_KEY, compare_followup
from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.spec.suite import ParamSpec, Suite

# Not a suite param, but every suite DAG has it (dag_factory._params).
CELLS_SCHEMA = {"type": "array", "items": {"type": "string"}}


class ParamsError(ValueError):
    """Param values a run would refuse; one line per problem, naming the param."""

    def __init__(self, source: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{source}: invalid params\n" + "\n".join(f"  - {p}" for p in problems))


def param_schema(p: ParamSpec) -> dict[str, Any]:
    """The JSON schema of one param, as the trigger form's Param gets it."""
    return p.json_schema()


def parse_params(text: str | None, suite: Suite, source: str) -> dict[str, Any]:
    """``text`` (a JSON object) checked against ``suite``'s params; raises ParamsError."""
    if not text:
        return {}
    try:
        values = json.loads(text)
    except ValueError as e:
        problem = f'not JSON: {e} (expected an object like {{"steps": 20}})'
        raise ParamsError(source, [problem]) from None
    if not isinstance(values, dict):
        raise ParamsError(source, [f"expected a JSON object of param values, got {values!r}"])
    check_params(suite, values, source)
    return values


def check_params(suite: Suite, values: dict[str, Any], source: str) -> None:
    """Every name must be a param of the suite (or ``cells``) and every value must fit it."""
    import jsonschema

    allowed = [*suite.params, "cells"]
    problems = []
    for name, value in values.items():
        if name == "cells":
            schema = CELLS_SCHEMA
        elif name in suite.params:
            schema = param_schema(suite.params[name])
        else:
            problems.append(f"{name}: not a param of this suite (params: {', '.join(allowed)})")
            continue
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as e:
            problems.append(f"{name}: {e.message} (allowed: {_describe(schema)})")
    if problems:
        raise ParamsError(source, problems)


def _describe(schema: dict[str, Any]) -> str:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    parts = [" or ".join(types)]
    if "enum" in schema:
        parts.append("one of " + ", ".join(repr(v) for v in schema["enum"] if v is not None))
    if "minimum" in schema:
        parts.append(f">= {schema['minimum']:g}")
    if "maximum" in schema:
        parts.append(f"<= {schema['maximum']:g}")
    if "pattern" in schema:
        parts.append(f"matching {schema['pattern']!r}")
    if "items" in schema:
        parts[0] = "array of strings"
    return ", ".join(parts)


def check_run_conf(suite: Suite, dag_id: str, conf: dict[str, Any], source: str) -> None:
    """What ``plan`` would refuse about a run triggered with ``conf``, refused up front.

    The param values as ``check_params`` checks them (ParamsError), then the `cells` globs:
    one that selects no cell this run could run, or a run with no cell at all, is a
    PlanError naming the valid cell ids. ``POST .../dagRuns`` (the trigger form too) gets
    this through accelmatrix.ui.trigger_guard, ``plan --params``/``--cells`` through the
    same ``expand``.
    """
    if COMPARE_KEY in conf:
        # "Compare two builds": the block names its cells; the rest are param values.
        rest = {k: v for k, v in conf.items() if k != COMPARE_KEY}
        check_params(suite, rest, source)
        user_params = {k: v for k, v in rest.items() if k in suite.params}
        compare_followup(suite, dag_id, conf, params=user_params)
        return
    check_params(suite, conf, source)
    only = conf.get("cells") or None
    if only == ["*"]:
        only = None
    user_params = {k: v for k, v in conf.items() if k in suite.params}
    plan = expand(suite, dag_id, params=user_params, only=only)
    if not plan.cells:
        raise PlanError(
            f"no cell to run: all {len(plan.excluded)} cell(s) of {dag_id} are excluded with "
            "these params ("
            + "; ".join(f"{e.id}: {e.reason}" for e in plan.excluded[:8])
            + (" ..." if len(plan.excluded) > 8 else "")
            + ")"
        )
