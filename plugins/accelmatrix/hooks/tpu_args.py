"""The arguments of a gcloud run: validation of names, labels and values, and flag formats.

The hook runs gcloud as an argv list, never a shell, and still checks every name, zone, label
and value it puts there against the API's rules before gcloud sees it (a bad value fails in
the task with a clear message, not as a gcloud usage error), and formats dict flags with
gcloud's ``^DELIM^`` escaping and durations as ``600s``. Separate from
``accelmatrix.hooks.tpu`` because these are pure functions of their inputs, apart from running
gcloud and handling its credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from accelmatrix.hooks.gcp_names import is_valid_label_key, is_valid_label_value, is_valid_name

ZONE_RE = re.compile(r"^[a-z][a-z0-9-]*[a-z0-9]$")
VALUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
_DICT_DELIMS = "|;~#!%^"


# -- argument helpers --------------------------------------------------------------------------
def dict_flag(flag: str, values: Mapping[str, str]) -> str:
    """``--flag=k=v,k2=v2`` for a gcloud dict flag, with gcloud's ``^DELIM^`` escaping when a
    value contains a comma (ssh keys, scripts)."""
    for k in values:
        if not k or "=" in k:
            raise ValueError(f"{flag}: invalid key {k!r}")
    text = "".join(f"{k}{v}" for k, v in values.items())
    delim = ","
    if "," in text:
        delim = next((d for d in _DICT_DELIMS if d not in text), "")
        if not delim:
            raise ValueError(f"{flag}: cannot find a delimiter absent from the values")
    body = delim.join(f"{k}={v}" for k, v in values.items())
    return f"{flag}={body}" if delim == "," else f"{flag}=^{delim}^{body}"


def _check_name(kind: str, name: str) -> None:
    if not is_valid_name(name):
        raise ValueError(
            f"invalid {kind} {name!r}: must match [a-z]([-a-z0-9]*[a-z0-9])? and be at most "
            "63 characters"
        )


def _check_labels(labels: Mapping[str, str]) -> None:
    for k, v in labels.items():
        if not is_valid_label_key(k) or not is_valid_label_value(v):
            raise ValueError(f"invalid label {k!r}={v!r} (use tpu_names.label_value)")


def _check_value(what: str, value: str) -> None:
    if not VALUE_RE.match(value):
        raise ValueError(f"invalid {what} {value!r}")


def _duration(value: int | float | str) -> str:
    """A gcloud duration (``600s``) from seconds, or a duration string as given."""
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("duration must be positive")
        return f"{int(value)}s"
    if not re.fullmatch(r"(\d+[dhms])+", value):
        raise ValueError(f"invalid duration {value!r} (e.g. 600s, 2h, 1d)")
    return value
