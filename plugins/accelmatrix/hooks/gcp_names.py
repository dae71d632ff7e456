"""What Google Cloud accepts as a resource id or a label (the rules, not our naming).

The TPU hook checks names and labels against these before it calls gcloud;
``accelmatrix.backends.tpu_names`` builds names that pass them. They sit with the hooks
because they are the API's rules, and a hook must not import the backends that use it.
"""

from __future__ import annotations

import re

MAX_NAME_LEN = 63
MAX_LABEL_LEN = 63
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def is_valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LEN and bool(NAME_RE.match(name))


def is_valid_label_key(key: str) -> bool:
    return bool(LABEL_KEY_RE.match(key))


def is_valid_label_value(value: str) -> bool:
    return bool(LABEL_VALUE_RE.match(value))
