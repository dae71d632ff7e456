"""`${...}` placeholders in suite strings.

Suites need per-cell values inside argv lists, env values and check fields (the model of
the cell, a UI param, the work dir). We substitute them per string, never through a shell,
so a value can hold spaces, quotes or `;` and still arrive as one argv element.

Grammar: `${axis.NAME}` (the value label), `${axis.NAME.FIELD}` (a field of a mapping
value), `${params.NAME}`, `${cell.id}`, and backend variables `${work_dir}`,
`${include_dir}`, `${python}`, `${num_workers}` (hosts of a multi-host slice) that only the
backend running the cell knows. `$${` escapes.

Run variables, resolved by the plan from the DAG run's logical date (the date of a
scheduled or backfilled run, not the wall clock, so a backfill of 2026-03-01 tests the
2026-03-01 nightly build): `${run.ds}` (`2026-03-01`), `${run.ds_nodash}` (`20260301`),
`${run.logical_date}` (ISO-8601) and `${run.runtime_version}` (the suite's rendered
`runtime_version`). They play the role of Airflow's `{{ ds }}` without Jinja: no template
language ever sees a suite string.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

PLACEHOLDER = re.compile(r"\$(\$?)\{([^}]*)\}")
BACKEND_VARS = ("work_dir", "include_dir", "python", "num_workers")
RUN_VARS = ("run.ds", "run.ds_nodash", "run.logical_date", "run.runtime_version")
_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_RUN_ALTS = "|".join(re.escape(v) for v in RUN_VARS)
_REF = re.compile(
    rf"^(?:axis\.{_NAME}(?:\.{_NAME})?|params\.{_NAME}|cell\.id|{'|'.join(BACKEND_VARS)}"
    rf"|{_RUN_ALTS})$"
)


class TemplateError(ValueError):
    """A placeholder is malformed or refers to something that does not exist."""


def references(text: str) -> list[str]:
    """Every placeholder reference in ``text`` (escaped ones excluded)."""
    return [m.group(2) for m in PLACEHOLDER.finditer(text) if not m.group(1)]


def check_references(
    text: str, *, axes: Mapping[str, Iterable[str]], params: Iterable[str]
) -> None:
    """Raise TemplateError unless every reference in ``text`` can be resolved for every cell.

    ``axes`` maps axis name -> the field names its mapping values have (empty for scalar axes).
    """
    params = set(params)
    for ref in references(text):
        if not _REF.match(ref):
            raise TemplateError(
                f"unknown placeholder ${{{ref}}}: use ${{axis.NAME}}, ${{axis.NAME.FIELD}}, "
                f"${{params.NAME}}, ${{cell.id}} or one of "
                + ", ".join(f"${{{v}}}" for v in (*BACKEND_VARS, *RUN_VARS))
            )
        parts = ref.split(".")
        if parts[0] == "axis":
            if parts[1] not in axes:
                raise TemplateError(
                    f"${{{ref}}}: no axis named {parts[1]!r} (axes: {', '.join(sorted(axes))})"
                )
            fields = set(axes[parts[1]])
            if len(parts) == 3 and parts[2] not in fields:
                allowed = ", ".join(sorted(fields)) or "none: its values are scalars"
                raise TemplateError(
                    f"${{{ref}}}: axis {parts[1]!r} values have no field {parts[2]!r} "
                    f"(fields: {allowed})"
                )
        elif parts[0] == "params" and parts[1] not in params:
            raise TemplateError(
                f"${{{ref}}}: no param named {parts[1]!r} (params: {', '.join(sorted(params))})"
            )


def run_variables(logical_date: datetime | None, runtime_version: str | None = None) -> dict:
    """The ``run.*`` variables of a DAG run with this logical date (None: now, UTC).

    A manual Airflow 3 run may have no logical date; it then tests "today's" build.
    """
    when = (logical_date or datetime.now(UTC)).astimezone(UTC)
    out: dict[str, Any] = {
        "run.ds": when.strftime("%Y-%m-%d"),
        "run.ds_nodash": when.strftime("%Y%m%d"),
        "run.logical_date": when.isoformat(),
    }
    if runtime_version is not None:
        out["run.runtime_version"] = runtime_version
    return out


def escape(value: str) -> str:
    """``value`` with every placeholder escaped, so a later ``render`` yields it verbatim."""
    return PLACEHOLDER.sub(lambda m: "$" + m.group(0), value)


def render(
    text: str,
    variables: Mapping[str, Any],
    *,
    keep_unknown: bool = False,
    escape_values: bool = False,
) -> str:
    """Substitute placeholders found in ``variables`` (flat dotted keys).

    With ``keep_unknown`` a reference that is not in ``variables`` stays as it is, so the plan
    can resolve axes and params and leave backend variables to the backend. Pass
    ``escape_values`` when the result is rendered again: a substituted value that itself
    contains ``${python}`` (a UI param, say) then reaches the workload as written instead
    of being expanded by the second pass.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "${" + m.group(2) + "}" if not keep_unknown else m.group(0)
        ref = m.group(2)
        if ref in variables:
            value = variables[ref]
            out = "" if value is None else str(value)
            return escape(out) if escape_values else out
        if keep_unknown:
            return m.group(0)
        raise TemplateError(f"placeholder ${{{ref}}} has no value here")

    return PLACEHOLDER.sub(sub, text)


def render_tree(
    obj: Any,
    variables: Mapping[str, Any],
    *,
    keep_unknown: bool = False,
    escape_values: bool = False,
) -> Any:
    """``render`` applied to every string inside nested lists and dicts (keys untouched)."""
    kw = {"keep_unknown": keep_unknown, "escape_values": escape_values}
    if isinstance(obj, str):
        return render(obj, variables, **kw)
    if isinstance(obj, list):
        return [render_tree(v, variables, **kw) for v in obj]
    if isinstance(obj, dict):
        return {k: render_tree(v, variables, **kw) for k, v in obj.items()}
    return obj


def strings_in(obj: Any) -> Iterable[str]:
    """Every string inside nested lists and dicts, for validation."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for v in obj:
            yield from strings_in(v)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings_in(v)
