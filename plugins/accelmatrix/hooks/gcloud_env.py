"""A private, authorized gcloud configuration per Airflow connection, as a child environment.

Why not ``GoogleBaseHook.provide_authorized_gcloud()``: it sets ``CLOUDSDK_CONFIG`` and
``GOOGLE_APPLICATION_CREDENTIALS`` in ``os.environ`` for the whole process while it is
entered. A triggerer runs the triggers of many cells as threads of one process; two cells
with different connections would then run gcloud with each other's credentials and
project. So the provider's hook is used for what it is for (reading the connection: key
file or key JSON, project) and the gcloud configuration is built the way the provider
builds it (``gcloud auth activate-service-account``, or the ADC refresh token), but into a
directory of our own that reaches gcloud only through the ``env=`` of each subprocess.
``os.environ`` is never written.

Authenticating costs a few gcloud runs (seconds of CPU each): :class:`GcloudAuth` does it
once, on first use, and every later call reuses the directory until :meth:`close` (or
garbage collection / interpreter exit) removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Mapping

from accelmatrix.masking import mask_connection

# Variables of our own (venv) Python that must not leak into gcloud's bundled Python.
DROP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
# gcloud settings that hold in every environment: never prompt, never check for updates.
BASE_ENV = {
    "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
}
# Inherited variables that would choose credentials or a project other than the
# connection's: a connection-authorized call never sees the process's own.
CREDENTIAL_ENV = (
    "CLOUDSDK_CONFIG",
    "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE",
    "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE",
    "CLOUDSDK_CORE_ACCOUNT",
    "CLOUDSDK_CORE_PROJECT",
    "GOOGLE_APPLICATION_CREDENTIALS",
)


def inherited_env(*, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment as a gcloud child should get it (a copy)."""
    env = {k: v for k, v in os.environ.items() if k not in DROP_ENV and k not in drop}
    env.update(BASE_ENV)
    return env


class GcloudAuth:
    """The environment that runs gcloud as one Airflow GCP connection (thread safe)."""

    def __init__(self, gcp_conn_id: str, *, gcloud: str, project_id: str | None = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.gcloud = gcloud
        self.project_id = project_id
        self.authentications = 0  # how often gcloud was authorized (once per instance)
        self._lock = threading.Lock()
        self._env: dict[str, str] | None = None
        self._finalizer: weakref.finalize | None = None

    def env(self) -> dict[str, str]:
        """A fresh copy of the authorized child environment; authorizes on first use."""
        with self._lock:
            if self._env is None:
                self._env = self._authorize()
            return dict(self._env)

    def close(self) -> None:
        """Remove the private gcloud configuration (credentials included)."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
            self._env = self._finalizer = None

    def _authorize(self) -> dict[str, str]:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
        from google.auth import _cloud_sdk

        mask_connection(self.gcp_conn_id)
        base = GoogleBaseHook(gcp_conn_id=self.gcp_conn_id)
        if self.project_id is None:
            self.project_id = base.project_id
        key_path = base._get_field("key_path", None)  # noqa: SLF001 - the provider's reader
        keyfile_dict = base._get_field("keyfile_dict", None)  # noqa: SLF001
        if key_path and keyfile_dict:
            raise ValueError(
                f"connection {self.gcp_conn_id}: key_path and keyfile_dict are mutually exclusive"
            )
        config_dir = tempfile.mkdtemp(prefix="accelmatrix-gcloud-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, config_dir, True)
        if keyfile_dict:
            key_path = os.path.join(config_dir, "key.json")
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(keyfile_dict if isinstance(keyfile_dict, str) else json.dumps(keyfile_dict))
        env = inherited_env(drop=CREDENTIAL_ENV)
        env["CLOUDSDK_CONFIG"] = config_dir
        if self.project_id:
            env["CLOUDSDK_CORE_PROJECT"] = self.project_id
        if key_path:
            env["GOOGLE_APPLICATION_CREDENTIALS"] = key_path
            self._gcloud(env, "auth", "activate-service-account", f"--key-file={key_path}")
        else:
            adc = _cloud_sdk.get_application_default_credentials_path()
            if os.path.exists(adc):
                # Logged in with `gcloud auth application-default login`: the same
                # refresh token for gcloud itself, as the provider does it.
                with open(adc) as f:
                    creds = json.load(f)
                self._gcloud(env, "config", "set", "auth/client_id", creds["client_id"])
                self._gcloud(env, "config", "set", "auth/client_secret", creds["client_secret"])
                self._gcloud(
                    env,
                    "auth",
                    "activate-refresh-token",
                    creds["client_id"],
                    creds["refresh_token"],
                )
            # else: gcloud's own default (e.g. the GCE metadata server's service account).
        self.authentications += 1
        return env

    def _gcloud(self, env: Mapping[str, str], *args: str) -> None:
        """One setup run; its output is never shown (it may echo secrets)."""
        proc = subprocess.run(  # noqa: S603 - argv list, no shell
            [self.gcloud, *args, "--quiet"],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if proc.returncode != 0:
            # The command and status only: stderr can name the key or the token.
            raise RuntimeError(
                f"gcloud {args[0]} {args[1]} failed for connection {self.gcp_conn_id} "
                f"(exit {proc.returncode})"
            )
