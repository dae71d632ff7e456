"""SSH key pairs that accelmatrix generates for the machines it creates (Cloud TPU VMs).

Why generated, and why per machine: a TPU VM is created for one cell and deleted after it;
its login key goes in through the node's ``ssh-keys`` metadata. A key per node means no
long-lived credential sits in a suite file, an Airflow Variable or a node's metadata after
the node is gone, and a leaked key opens exactly one short-lived VM.

Where the private key lives: ``$ACCELMATRIX_KEYS_DIR/<node>`` (mode 0600; default
``$ACCELMATRIX_HOME/ssh-keys``), because the provision task, the run task's trigger (in the
triggerer) and the teardown task may run in different processes or on different hosts:
like the artifacts dir, it must be shared by the workers and the triggerer (docker-compose
mounts the ``accelmatrix-keys`` volume there), but unlike it, it is never published. The resource record
(XCom) carries the key's path, never the key. Get-or-create: a retried provision reuses the
key already in the node's metadata. Teardown deletes it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from accelmatrix import settings

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


def key_dir() -> Path:
    return settings.keys_dir()


def key_path(name: str) -> Path:
    if not _NAME.match(name):
        raise ValueError(f"not a machine name usable as a key file name: {name!r}")
    return key_dir() / name


def ensure_key(name: str, comment: str) -> tuple[Path, str]:
    """The private key path and the OpenSSH public key line of machine ``name``.

    Created on first use by a hard link of a complete temp file (atomic, fails if the
    name exists), so two concurrent attempts cannot end up with two different keys and
    nobody reads half a key: the loser reads the winner's.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = key_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    private = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return path, f"{public.decode()} {comment}"


def remove_key(name: str) -> None:
    try:
        key_path(name).unlink()
    except FileNotFoundError:
        pass
