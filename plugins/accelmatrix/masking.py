"""Register connection secrets with Airflow's secrets masker before we log anything.

Airflow masks a connection's password and "sensitive" extra fields when the Task SDK
fetches the connection for a task. accelmatrix also reads connections where that does not
happen (a provider hook built in the triggerer, a cached SSH client reused across cells),
and logs a lot (setup output, workload output streamed into the task log). Calling
:func:`mask_connection` wherever a connection is opened makes every later log line, in
this process, show ``***`` instead of a password, a private key (each of its lines), a
token or a kube config, whatever printed it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

# Extra keys whose values are secrets, beyond what Airflow's own list already covers.
SENSITIVE_EXTRA = (
    "private_key",
    "private_key_passphrase",
    "passphrase",
    "password",
    "token",
    "access_token",
    "api_key",
    "secret",
    "keyfile_dict",
    "kube_config",
    "client_key",
    "client_secret",
)
_masked: set[str] = set()


def _mask(value: Any) -> None:
    from airflow.sdk.log import mask_secret

    if value is None:
        return
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    text = str(value)
    if len(text) < 4:  # masking "a" or "123" would blank out ordinary log text
        return
    mask_secret(text)
    # A PEM key or kube config printed line by line must be masked line by line too.
    for line in text.splitlines():
        line = line.strip()
        if len(line) >= 16 and not line.startswith("-----"):
            mask_secret(line)


def mask_connection(conn_id: str) -> None:
    """Mask the secrets of Airflow connection ``conn_id`` in every later log line."""
    if conn_id in _masked:
        return
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception as e:  # the caller's own connect reports a missing connection better
        log.debug("not masking %s: %s", conn_id, e)
        return
    _mask(getattr(conn, "password", None))
    extra = getattr(conn, "extra_dejson", None) or {}
    for key, value in extra.items():
        if any(s in key.lower() for s in SENSITIVE_EXTRA):
            _mask(value)
    _masked.add(conn_id)
