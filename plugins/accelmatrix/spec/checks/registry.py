"""The one table of check types: ``type`` -> its pydantic model, filled by the family modules.

Every family module of ``accelmatrix.spec.checks`` decorates its models with ``@register``;
the package imports every module it holds (``import_modules``), so a new check type is a
new module and nothing else lists it. The union a suite validates against (``check_union``)
and ``CHECK_TYPES`` are read from here, and the evaluation's planner table
(``accelmatrix.evaluation.checks``) is checked against it, so a type cannot exist in one
place and be missing in another.

This module is the bottom of the package: it imports no family module and no base class,
so the families can import it without a cycle.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar, Union

from pydantic import Field

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["check_type_of", "check_union", "import_modules", "register", "registered"]

M = TypeVar("M", bound="BaseModel")

_MODELS: dict[str, type[BaseModel]] = {}


def check_type_of(model: type[BaseModel]) -> str:
    """The ``type`` tag of a check model: the default of its ``type: Literal[...]`` field."""
    field = model.model_fields.get("type")
    tag = None if field is None else field.default
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"{model.__name__} needs a field `type: Literal[...] = '<tag>'`")
    return tag


def register(model: type[M]) -> type[M]:
    """Class decorator: make ``model`` a check type of suites, under its ``type`` tag.

    Two models under one tag would make the union ambiguous: that raises, naming both.
    """
    tag = check_type_of(model)
    known = _MODELS.get(tag)
    if known is not None and _name(known) != _name(model):
        raise ValueError(
            f"check type {tag!r} is registered twice: {known.__module__}.{known.__qualname__} "
            f"and {model.__module__}.{model.__qualname__}"
        )
    _MODELS[tag] = model
    return model


def _name(obj: Any) -> str:
    """Module and qualified name: the same class imported again (a reload) is no duplicate."""
    return f"{obj.__module__}.{obj.__qualname__}"


def registered() -> dict[str, type[BaseModel]]:
    """Every registered check type and its model, in registration order (a copy)."""
    return dict(_MODELS)


def check_union() -> Any:
    """The discriminated union of every registered model, on ``type``.

    Built from the table rather than spelled out, so pydantic's "expected tags" message and
    the loader's field paths always name every check type there is.
    """
    if not _MODELS:
        raise RuntimeError("no check type is registered (were the family modules imported?)")
    members = tuple(_MODELS.values())
    return Annotated[Union[members], Field(discriminator="type")]  # noqa: UP007


def import_modules(package: str, path: Iterable[str], first: Iterable[str] = ()) -> list[str]:
    """Import every module of ``package`` (its ``__path__``): ``first`` in that order, then
    the others sorted by name; returns their names in import order.

    A family registers itself when imported: this is what makes "add a module" enough. The
    imports are by name, so a package ``__init__`` calling this is no edge in the import
    graph (the families import the registry, never their package).
    """
    found = sorted(m.name for m in pkgutil.iter_modules(list(path)) if not m.ispkg)
    first = list(first)
    missing = [name for name in first if name not in found]
    if missing:
        raise ImportError(f"{package} has no module {', '.join(missing)}")
    names = first + [name for name in found if name not in first]
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names
