"""Load suite YAML files into `Suite` models with errors a person can act on.

Every error names the file, the field path (``machines.gpu.backend``) and, where there is a
closed set, the allowed values. The DAG factory and the CLI both go through here, so
``python -m accelmatrix validate`` in pre-commit reports exactly what the scheduler would.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from accelmatrix.metrics.sources import MetricSource
from accelmatrix.spec.checks import Check
from accelmatrix.spec.plan import PlanError, expand
from accelmatrix.spec.preflight_checks import PreflightCheck
from accelmatrix.spec.suite import Machine, Suite
from accelmatrix.spec.suite_error import SuiteError
from accelmatrix.spec.suite_files import SUITE_SUFFIXES, suite_files, suite_id

__all__ = [
    "SUITE_SUFFIXES",
    "SuiteError",
    "load_suite",
    "load_suites",
    "resolve_suite",
    "suite_files",
    "suite_id",
]

MAX_FILE_BYTES = 1_000_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def resolve_suite(arg: str | Path, suites_dir: Path | str) -> Path:
    """A suite given as a path (``include/suites/x.yaml``) or a name (``x``) -> its file.

    Raises SuiteError naming the suites there are when a name matches none.
    """
    path = Path(arg)
    if path.suffix in SUITE_SUFFIXES or len(path.parts) > 1 or path.exists():
        return path
    for suffix in SUITE_SUFFIXES:
        candidate = Path(suites_dir) / f"{arg}{suffix}"
        if candidate.is_file():
            return candidate
    names = ", ".join(suite_id(p) for p in suite_files(suites_dir)) or "none"
    raise SuiteError(
        Path(suites_dir) / f"{arg}.yaml",
        [f"no suite named {str(arg)!r} in {suites_dir} (suites: {names}); or give a file path"],
    )


def read_yaml(path: Path | str) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SuiteError(path, [f"cannot read file: {e.strerror}"]) from None
    if len(data) > MAX_FILE_BYTES:
        raise SuiteError(path, [f"file is {len(data)} bytes; the limit is {MAX_FILE_BYTES}"])
    try:
        return yaml.load(data.decode("utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (safe loader)
    except UnicodeDecodeError:
        raise SuiteError(path, ["file is not UTF-8 text"]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SuiteError(path, [f"YAML syntax error: {where}{problem}"]) from None


def load_suite(path: Path | str) -> Suite:
    """Parse and validate one suite file. Raises SuiteError."""
    path = Path(path)
    if not re.match(r"^[a-z][a-z0-9_]*$", path.stem):
        raise SuiteError(
            path, [f"file name {path.stem!r} must match ^[a-z][a-z0-9_]*$ (it is the DAG id)"]
        )
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise SuiteError(path, [f"top level must be a mapping, got {type(data).__name__}"])
    try:
        suite = Suite.model_validate(data)
    except ValidationError as e:
        raise SuiteError(path, format_validation_error(e)) from None
    # Expanding the plan catches what only the full matrix shows (too many cells, ...).
    try:
        expand(suite, suite_id(path))
    except PlanError as e:
        raise SuiteError(path, [str(e)]) from None
    return suite


def format_validation_error(e: ValidationError) -> list[str]:
    """One readable line per pydantic error: `field.path: message (allowed: ...)`."""
    out = []
    for err in e.errors(include_url=False):
        loc = _loc(err["loc"])
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            # The field that picks the union member: `type` for checks and metric sources,
            # `backend` for machines (pydantic quotes it in the error's context).
            tag = str((err.get("ctx") or {}).get("discriminator", "backend")).strip("'\"")
            loc = f"{loc}.{tag}" if loc else tag
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(Suite, err["loc"][:-1])
            msg = f"unknown field {err['loc'][-1]!r}"
            if allowed:
                msg += f" (allowed: {', '.join(allowed)})"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and err["type"] not in (
            "value_error",
            "assertion_error",
            "union_tag_invalid",  # the message already quotes the tag
        ):
            shown = repr(err["input"])
            if len(shown) > 80:
                shown = shown[:77] + "..."
            msg += f" (got {shown})"
        # Cross-field rules name their own fields in the message.
        out.append(f"{loc}: {msg}" if loc else msg)
    return out


def _loc(parts: tuple[Any, ...]) -> str:
    s = ""
    for i, p in enumerate(parts):
        # A tag follows the union's own place: a list index (checks[1]) or a machine name.
        tag_place = i > 0 and (
            isinstance(parts[i - 1], int) or parts[i - 2 : i - 1] == ("machines",)
        )
        if isinstance(p, int):
            s += f"[{p}]"
        elif isinstance(p, str) and (
            p.startswith("function-") or "[" in p or (p in _UNION_TAGS and tag_place)
        ):
            continue  # pydantic's internal union/validator markers say nothing to a user
        else:
            s += ("." if s else "") + str(p)
    return s


def _tags_of(union: Any) -> set[str]:
    """The literal tag values (`type`/`backend`) of a discriminated union's members."""
    out: set[str] = set()
    for member in typing.get_args(typing.get_args(union)[0]):
        for key in ("type", "backend"):
            f = getattr(member, "model_fields", {}).get(key)
            if f is not None:
                out.update(a for a in typing.get_args(f.annotation) if isinstance(a, str))
    return out


def _union_tags() -> set[str]:
    """Loc parts pydantic adds for unions: built-in markers and every discriminator tag (a
    check's `loss_decreasing`, a source's `log_regex`, a machine's `tpu-vm`), so that the
    path reads `workload.metrics[2].name`, not `workload.metrics[2].log_regex.name`."""
    builtin = {"str", "int", "float", "bool", "list[...]", "dict[str,...]"}
    return builtin.union(*(_tags_of(u) for u in (Check, MetricSource, PreflightCheck, Machine)))


_UNION_TAGS = _union_tags()


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Walk the model along ``loc`` to name the fields allowed where an unknown key was."""
    current: Any = model
    for part in loc:
        current = _step(current, part)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _step(tp: Any, part: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _step(typing.get_args(tp)[0], part)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:
            return field.annotation
        # discriminated unions put the tag in the loc: find the member with that literal
        return None
    if origin in (list, dict):
        args = typing.get_args(tp)
        return args[-1] if args else None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for member in typing.get_args(tp):
            found = _tagged(member, part)
            if found is not None:
                return found
        for member in typing.get_args(tp):
            if typing.get_origin(member) in (list, dict) or (
                isinstance(member, type) and issubclass(member, BaseModel)
            ):
                return _step(member, part)
    return None


def _tagged(member: Any, tag: Any) -> Any:
    """The union member whose `type`/`backend` literal equals ``tag``."""
    if typing.get_origin(member) is typing.Annotated:
        member = typing.get_args(member)[0]
    if not (isinstance(member, type) and issubclass(member, BaseModel)):
        return None
    for key in ("type", "backend"):
        f = member.model_fields.get(key)
        if f is not None and tag in typing.get_args(f.annotation):
            return member
    return None


def load_suites(paths: Iterable[Path | str]) -> tuple[dict[str, Suite], dict[str, SuiteError]]:
    """Load many suites; one broken file never stops the others."""
    good: dict[str, Suite] = {}
    bad: dict[str, SuiteError] = {}
    ids: dict[str, Path] = {}
    for p in sorted(Path(x) for x in paths):
        first = ids.setdefault(suite_id(p), p)
        if first != p:  # x.yaml and x.yml would be two DAGs with one id
            bad[str(p)] = SuiteError(
                p, [f"DAG id {suite_id(p)!r} is already taken by {first}: rename one of them"]
            )
            continue
        try:
            good[str(p)] = load_suite(p)
        except SuiteError as e:
            bad[str(p)] = e
    return good, bad
