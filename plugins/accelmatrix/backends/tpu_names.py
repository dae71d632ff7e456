"""Deterministic, valid names and labels for Cloud TPU resources.

A cell's TPU VM (and its queued resource, which uses the same id) is named from who asks for
it: ``(dag_id, run_id, cell_id[, attempt])``. The name must be the same on every retry, so a
retried provision task finds the node it created before, and different for every other cell,
so two cells never share a machine. It is a readable prefix plus a hash of the full identity:

    am-<dag>-<cell>-<hash>      e.g.  am-tpu-smoke-model-tiny-mlp-chips-4-k3f2q7xw5m

Rules applied (Compute Engine style resource ids, which Cloud TPU node ids follow):

* ``[a-z]([-a-z0-9]*[a-z0-9])?``: starts with a letter, ends with a letter or digit;
* at most ``MAX_NAME_LEN`` = 63 characters. The TPU API reference documents no separate
  limit for node ids and gcloud checks none, so the RFC 1035 label limit that Google
  applies to resource ids is used;
* the hash is 10 base32 characters (50 bits) of SHA-256 over the unabbreviated identity, so
  truncating or lower-casing the readable part never makes two cells collide in practice
  (1 024 cells of one run: collision odds ~ 1e-9).

Label values (Google labels): at most 63 characters of lowercase letters, digits, ``_`` and
``-``; keys also start with a lowercase letter. A value that had to be shortened keeps a short
hash suffix, so different long values stay different.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

from accelmatrix.backends.base import MANAGED_BY
from accelmatrix.hooks.gcp_names import (  # the API's rules; names built here pass them
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    MAX_LABEL_LEN,
    MAX_NAME_LEN,
    NAME_RE,
    is_valid_label_key,
    is_valid_label_value,
    is_valid_name,
)

__all__ = [
    "LABEL_KEY_RE",
    "LABEL_VALUE_RE",
    "MAX_LABEL_LEN",
    "MAX_NAME_LEN",
    "NAME_RE",
    "identity_hash",
    "is_valid_label_key",
    "is_valid_label_value",
    "is_valid_name",
    "label_key",
    "label_value",
    "managed_labels",
    "node_name",
]

MAX_LABELS = 64
HASH_LEN = 10
NAME_PREFIX = "am"
_DAG_BUDGET = 20  # characters of the dag id kept when the name gets long


def identity_hash(*parts: object, length: int = HASH_LEN) -> str:
    """Lowercase base32 digest of ``parts`` (letters and 2-7: valid in names and labels)."""
    raw = hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).digest()
    return base64.b32encode(raw).decode().lower()[:length]


def _slug(text: str) -> str:
    """Lowercase, every run of characters outside ``[a-z0-9]`` becomes one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def node_name(
    dag_id: str,
    run_id: str,
    cell_id: str,
    attempt: int | None = None,
    *,
    prefix: str = NAME_PREFIX,
    max_len: int = MAX_NAME_LEN,
) -> str:
    """The TPU node id (also used as queued resource id) of one cell.

    ``attempt`` is left out by default so that a retry finds the same node; pass it only to
    force a fresh machine (it is then part of the hash and of the readable part).
    """
    if not NAME_RE.match(prefix) or len(prefix) > 8:
        raise ValueError(f"prefix {prefix!r} must be a short valid name")
    if max_len < len(prefix) + HASH_LEN + 2 or max_len > MAX_NAME_LEN:
        raise ValueError(f"max_len must be between {len(prefix) + HASH_LEN + 2} and 63")
    ident: tuple[object, ...] = (dag_id, run_id, cell_id)
    if attempt is not None:
        ident += (int(attempt),)
    digest = identity_hash(*ident)
    budget = max_len - len(prefix) - len(digest) - 2  # two '-' around the readable part
    dag, cell = _slug(dag_id), _slug(cell_id)
    if attempt is not None:
        cell = f"{cell}-a{int(attempt)}".strip("-")
    if len(dag) + len(cell) + 1 > budget:
        dag = dag[: min(len(dag), _DAG_BUDGET, max(budget // 3, 0))].strip("-")
        cell = cell[: max(budget - len(dag) - (1 if dag else 0), 0)].strip("-")
    readable = "-".join(p for p in (dag, cell) if p)[:budget].strip("-")
    name = "-".join(p for p in (prefix, readable, digest) if p)
    if not is_valid_name(name):  # cannot happen; a guard against future edits
        raise RuntimeError(f"generated an invalid TPU name {name!r}")
    return name


def label_value(text: str) -> str:
    """A Google label value standing for ``text`` (lossy but stable; long ones get a hash)."""
    value = re.sub(r"[^a-z0-9_-]", "_", str(text).lower())
    if len(value) > MAX_LABEL_LEN:
        digest = identity_hash(str(text), length=8)
        value = f"{value[: MAX_LABEL_LEN - len(digest) - 1]}-{digest}"
    return value


def label_key(text: str) -> str:
    """A Google label key for ``text``: starts with a lowercase letter, <= 63 characters."""
    key = label_value(text)
    if not key or not key[0].isalpha():
        key = f"k{key}"
    if len(key) > MAX_LABEL_LEN:
        key = label_value(key)
    return key


def managed_labels(
    dag_id: str,
    run_id: str,
    cell_id: str,
    expires_at: float,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Labels on every resource accelmatrix creates (the janitor selects on ``managed-by``).

    ``ttl`` is the Unix time after which a janitor may delete the resource. ``extra`` (the
    cell's own labels) cannot override the five managed keys.
    """
    labels = {label_key(k): label_value(v) for k, v in (extra or {}).items()}
    labels.update(
        {
            "managed-by": MANAGED_BY,
            "dag": label_value(dag_id),
            "run": label_value(run_id),
            "cell": label_value(cell_id),
            "ttl": str(int(expires_at)),
        }
    )
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(labels)} labels; Google allows at most {MAX_LABELS}")
    return labels
