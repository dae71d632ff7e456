"""Checks a user writes in suite YAML to validate one matrix cell.

Each check is a small pydantic model in its family's module here (``workload``,
``training``, ``ci``, ``runtime``, ...), registered under its ``type`` in ``registry``;
its observation (the planner) is the module of the same name in
``accelmatrix.evaluation.checks``. ``Check`` is the discriminated union on ``type`` so a
suite file gets precise errors ("min must be <= max") at load time instead of a confusing
failure deep inside the evaluation task. Only pydantic is imported: suite parsing runs
during DAG parsing and must stay cheap.

Adding a check type is adding a module: every module of this package is imported below,
and ``Check`` and ``CHECK_TYPES`` are derived from the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from pydantic import ConfigDict, TypeAdapter

from accelmatrix.spec.checks.check_fields import CheckBase
from accelmatrix.spec.checks.registry import check_union, import_modules, registered

__all__ = ["CHECK_TYPES", "Check", "CheckBase", "parse_checks"]

# The checks every workload has come first in the union, so pydantic's "expected tags"
# message for a mistyped `type` starts with the ones a user most likely meant.
import_modules(__name__, __path__, first=("workload", "training"))

if TYPE_CHECKING:
    # Statically a check is any registered model; the union exists only at runtime.
    Check: TypeAlias = CheckBase
else:
    Check = check_union()

CHECK_TYPES: tuple[str, ...] = tuple(registered())

_CHECK_LIST = TypeAdapter(list[Check], config=ConfigDict(title="checks"))


def parse_checks(raw: list[dict]) -> list[Check]:
    """Validate a list of check dicts (e.g. from YAML); raises pydantic ValidationError."""
    return _CHECK_LIST.validate_python(raw)
