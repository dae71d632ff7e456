"""TpuVmHook: Cloud TPU VMs and queued resources through the ``gcloud`` CLI.

Every call runs ``gcloud compute tpus ...`` as an argv list (never a shell) with
``--format=json --quiet`` and returns the parsed JSON. A failed call raises a typed
exception parsed from gcloud's ``ERROR: (gcloud.<command>) ...`` line:

==========================  =================================================================
``TpuNotFound``             NOT_FOUND / 404
``TpuAlreadyExists``        ALREADY_EXISTS / 409
``TpuQuotaExceeded``        RESOURCE_EXHAUSTED that mentions quota (HTTP 429 on create)
``TpuStockout``             RESOURCE_EXHAUSTED otherwise (operation error code 8, "no more
                            capacity in the zone")
``TpuPermissionDenied``     PERMISSION_DENIED / UNAUTHENTICATED
``TpuInvalidArgument``      INVALID_ARGUMENT / FAILED_PRECONDITION
``TpuTimeout``              gcloud did not return within the timeout (its process group is
                            killed; the server-side operation may still complete)
``TpuUnreachable``          UNAVAILABLE, or gcloud "crashed" on a connection error once its
                            own retries (about 30 s) ran out: the same call may work later
``TpuError``                anything else (all of the above subclass it)
==========================  =================================================================

Quota, stockout, timeout and unreachable errors are also ``InfrastructureError`` (the machine failed us).

Credentials. Every gcloud run gets its credentials and configuration through its own
subprocess environment (``env=``), never through ``os.environ``: a triggerer runs many cells'
triggers as threads of one process, and a process-wide variable would hand one cell's
credentials to another's gcloud. Production: the hook's Airflow GCP connection is read with
the google provider's ``GoogleBaseHook`` and authorized once per hook into a private gcloud
configuration (:mod:`accelmatrix.hooks.gcloud_env`, which says why not
``provide_authorized_gcloud()``). Tests and other environments that configure gcloud
themselves pass ``env=`` (merged over ``os.environ``) or set ``ACCELMATRIX_GCLOUD_AUTH=env``:
then no Airflow connection is looked up at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from accelmatrix.hooks.gcloud_env import GcloudAuth, inherited_env
from accelmatrix.hooks.tpu_args import (
    VALUE_RE,
    ZONE_RE,
    _check_labels,
    _check_name,
    _check_value,
    _duration,
    dict_flag,
)
from accelmatrix.hooks.tpu_errors import (
    GRPC_STATUS,
    TpuAlreadyExists,
    TpuCapacityError,
    TpuError,
    TpuInvalidArgument,
    TpuNotFound,
    TpuPermissionDenied,
    TpuQuotaExceeded,
    TpuStockout,
    TpuTimeout,
    TpuUnreachable,
    parse_gcloud_error,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0
AUTH_MODE_ENV = "ACCELMATRIX_GCLOUD_AUTH"


# -- the hook ----------------------------------------------------------------------------------
class TpuVmHook:
    """Cloud TPU through gcloud. Methods return parsed JSON dicts (Google API shapes)."""

    def __init__(
        self,
        gcp_conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        gcloud: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        self.env = dict(env) if env is not None else None
        self.gcloud = gcloud or shutil.which("gcloud") or "gcloud"
        self.timeout = timeout
        self.calls: list[dict[str, Any]] = []  # (command, seconds, returncode) per gcloud run
        self._auth: GcloudAuth | None = None
        self._auth_lock = threading.Lock()

    # -- credentials -------------------------------------------------------------------------
    @property
    def uses_airflow_connection(self) -> bool:
        return self.env is None and os.environ.get(AUTH_MODE_ENV, "connection") != "env"

    @contextlib.contextmanager
    def authorized(self) -> Iterator[TpuVmHook]:
        """Authorize now (once per hook) and run the enclosed calls with it.

        Kept as a context for the callers that group calls with it; the authorization
        outlives it (until :meth:`close`), so no call in or out of it authorizes again.
        """
        self._child_env()
        yield self

    def close(self) -> None:
        """Remove the hook's private gcloud configuration, if it made one."""
        if self._auth is not None:
            self._auth.close()

    @property
    def authentications(self) -> int:
        """How often this hook authorized gcloud (0 or 1)."""
        return self._auth.authentications if self._auth is not None else 0

    def _child_env(self) -> dict[str, str]:
        """The environment of one gcloud child: a new dict per call, os.environ untouched."""
        if not self.uses_airflow_connection:
            env = inherited_env()
            env.update(self.env or {})
            return env
        with self._auth_lock:
            if self._auth is None:
                self._auth = GcloudAuth(
                    self.gcp_conn_id, gcloud=self.gcloud, project_id=self.project_id
                )
        env = self._auth.env()
        if self.project_id is None:
            self.project_id = self._auth.project_id
        return env

    # -- running gcloud ----------------------------------------------------------------------
    def run(self, args: list[str], *, timeout: float | None = None) -> Any:
        """``gcloud ARGS --format=json --quiet``; the parsed stdout (None when empty)."""
        return self._run(args, timeout=timeout)

    def _run(self, args: list[str], *, timeout: float | None) -> Any:
        env = self._child_env()
        argv = [self.gcloud, *args, "--format=json", "--quiet"]
        if self.project_id:
            argv.append(f"--project={self.project_id}")
        command = " ".join(a for a in args if not a.startswith("-"))
        limit = self.timeout if timeout is None else timeout
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,  # so a timeout can kill gcloud and its children
            )
        except FileNotFoundError as e:
            raise TpuError(f"gcloud not found ({self.gcloud}): install the Google Cloud CLI") from e
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            self._record(command, t0, None)
            raise TpuTimeout(
                f"gcloud {command} did not finish within {limit:.0f}s",
                command=f"gcloud {command}",
                stderr=err,
            ) from None
        self._record(command, t0, proc.returncode)
        if proc.returncode != 0:
            raise parse_gcloud_error(err, proc.returncode)
        out = out.strip()
        if not out:
            return None
        try:
            return json.loads(out)
        except ValueError as e:
            raise TpuError(f"gcloud {command} printed non-JSON output: {out[:200]!r}") from e

    def _record(self, command: str, t0: float, returncode: int | None) -> None:
        seconds = time.monotonic() - t0
        self.calls.append({"command": command, "seconds": seconds, "returncode": returncode})
        log.info("gcloud %s -> %s in %.1fs", command, returncode, seconds)

    # -- nodes -------------------------------------------------------------------------------
    def create_node(
        self,
        name: str,
        zone: str,
        accelerator_type: str,
        runtime_version: str,
        *,
        labels: Mapping[str, str] | None = None,
        spot: bool = False,
        preemptible: bool = False,
        reserved: bool = False,
        metadata: Mapping[str, str] | None = None,
        network: str | None = None,
        subnetwork: str | None = None,
        internal_ips: bool = False,
        service_account: str | None = None,
        tags: list[str] | None = None,
        description: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """``tpu-vm create``. Waits for the operation and returns the Node (READY), or with
        ``wait=False`` returns the Operation at once (``--async``)."""
        _check_name("node name", name)
        _check_value("zone", zone)
        _check_value("accelerator type", accelerator_type)
        _check_value("runtime version", runtime_version)
        if sum((spot, preemptible, reserved)) > 1:
            raise ValueError("spot, preemptible and reserved are mutually exclusive")
        args = [
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            name,
            f"--zone={zone}",
            f"--accelerator-type={accelerator_type}",
            f"--version={runtime_version}",
        ]
        args += self._node_flags(
            labels, metadata, network, subnetwork, internal_ips, service_account, tags
        )
        if description:
            args.append(f"--description={description}")
        args += [
            f
            for f, on in (
                ("--spot", spot),
                ("--preemptible", preemptible),
                ("--reserved", reserved),
            )
            if on
        ]
        if not wait:
            args.append("--async")
        return self.run(args, timeout=timeout) or {}

    @staticmethod
    def _node_flags(
        labels: Mapping[str, str] | None,
        metadata: Mapping[str, str] | None,
        network: str | None,
        subnetwork: str | None,
        internal_ips: bool,
        service_account: str | None,
        tags: list[str] | None,
    ) -> list[str]:
        args: list[str] = []
        if labels:
            _check_labels(labels)
            args.append(dict_flag("--labels", labels))
        if metadata:
            args.append(dict_flag("--metadata", metadata))
        if network:
            _check_value("network", network)
            args.append(f"--network={network}")
        if subnetwork:
            _check_value("subnetwork", subnetwork)
            args.append(f"--subnetwork={subnetwork}")
        if internal_ips:
            args.append("--internal-ips")
        if service_account:
            _check_value("service account", service_account)
            args.append(f"--service-account={service_account}")
        if tags:
            for t in tags:
                _check_value("tag", t)
            args.append(f"--tags={','.join(tags)}")
        return args

    def describe_node(self, name: str, zone: str) -> dict[str, Any]:
        """The Node; raises ``TpuNotFound``."""
        _check_name("node name", name)
        _check_value("zone", zone)
        return self.run(["compute", "tpus", "tpu-vm", "describe", name, f"--zone={zone}"]) or {}

    def get_node(self, name: str, zone: str) -> dict[str, Any] | None:
        """The Node, or None when it does not exist."""
        try:
            return self.describe_node(name, zone)
        except TpuNotFound:
            return None

    def delete_node(self, name: str, zone: str, *, wait: bool = True) -> bool:
        """Delete; True if a node was deleted, False if there was none (not an error)."""
        _check_name("node name", name)
        _check_value("zone", zone)
        args = ["compute", "tpus", "tpu-vm", "delete", name, f"--zone={zone}"]
        if not wait:
            args.append("--async")
        try:
            self.run(args)
        except TpuNotFound:
            return False
        return True

    def list_nodes(self, zone: str, labels: Mapping[str, str] | None = None) -> list[dict]:
        """Nodes of a zone, only those carrying all of ``labels`` when given.

        gcloud applies ``--filter`` on its side (the v2 API has no server-side filter); the
        result is checked again here for exact label equality.
        """
        _check_value("zone", zone)
        args = ["compute", "tpus", "tpu-vm", "list", f"--zone={zone}"]
        if labels:
            _check_labels(labels)
            terms = [f'labels.{k}="{v}"' for k, v in labels.items()]
            args.append("--filter=" + " AND ".join(terms))
        nodes = self.run(args) or []
        if labels:
            nodes = [
                n
                for n in nodes
                if all((n.get("labels") or {}).get(k) == v for k, v in labels.items())
            ]
        return nodes

    # -- queued resources --------------------------------------------------------------------
    def create_queued_resource(
        self,
        name: str,
        zone: str,
        accelerator_type: str,
        runtime_version: str,
        *,
        node_id: str | None = None,
        labels: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        spot: bool = False,
        guaranteed: bool = False,
        reserved: bool = False,
        valid_until_duration: int | float | str | None = None,
        valid_until_time: str | None = None,
        network: str | None = None,
        subnetwork: str | None = None,
        internal_ips: bool = False,
        service_account: str | None = None,
        tags: list[str] | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """``queued-resources create`` for one node (``node_id`` defaults to ``name``).

        Returns the QueuedResource (typically WAITING_FOR_RESOURCES: the create operation
        only covers accepting the request; poll :meth:`describe_queued_resource`).
        ``valid_until_duration`` is seconds or a gcloud duration (``2h``).
        """
        node_id = node_id or name
        _check_name("queued resource name", name)
        _check_name("node name", node_id)
        _check_value("zone", zone)
        _check_value("accelerator type", accelerator_type)
        _check_value("runtime version", runtime_version)
        if sum((spot, guaranteed, reserved)) > 1:
            raise ValueError("spot, guaranteed and reserved are mutually exclusive")
        if valid_until_duration is not None and valid_until_time is not None:
            raise ValueError("give valid_until_duration or valid_until_time, not both")
        args = [
            "compute",
            "tpus",
            "queued-resources",
            "create",
            name,
            f"--zone={zone}",
            f"--node-id={node_id}",
            f"--accelerator-type={accelerator_type}",
            f"--runtime-version={runtime_version}",
        ]
        args += self._node_flags(
            labels, metadata, network, subnetwork, internal_ips, service_account, tags
        )
        args += [
            f
            for f, on in (("--spot", spot), ("--guaranteed", guaranteed), ("--reserved", reserved))
            if on
        ]
        if valid_until_duration is not None:
            args.append(f"--valid-until-duration={_duration(valid_until_duration)}")
        if valid_until_time is not None:
            _check_value("valid-until time", valid_until_time)
            args.append(f"--valid-until-time={valid_until_time}")
        if not wait:
            args.append("--async")
        return self.run(args, timeout=timeout) or {}

    def describe_queued_resource(self, name: str, zone: str) -> dict[str, Any]:
        _check_name("queued resource name", name)
        _check_value("zone", zone)
        args = ["compute", "tpus", "queued-resources", "describe", name, f"--zone={zone}"]
        return self.run(args) or {}

    def get_queued_resource(self, name: str, zone: str) -> dict[str, Any] | None:
        try:
            return self.describe_queued_resource(name, zone)
        except TpuNotFound:
            return None

    def delete_queued_resource(
        self, name: str, zone: str, *, force: bool = True, wait: bool = True
    ) -> bool:
        """Delete (``--force`` also deletes its nodes); False if it did not exist."""
        _check_name("queued resource name", name)
        _check_value("zone", zone)
        args = ["compute", "tpus", "queued-resources", "delete", name, f"--zone={zone}"]
        if force:
            args.append("--force")
        if not wait:
            args.append("--async")
        try:
            self.run(args)
        except TpuNotFound:
            return False
        return True

    def list_queued_resources(self, zone: str) -> list[dict[str, Any]]:
        _check_value("zone", zone)
        return self.run(["compute", "tpus", "queued-resources", "list", f"--zone={zone}"]) or []


def queued_resource_state(qr: Mapping[str, Any]) -> str:
    """``WAITING_FOR_RESOURCES``, ``ACTIVE``, ... of a QueuedResource dict."""
    state = qr.get("state") or {}
    return str(state.get("state", "") if isinstance(state, dict) else state)


def queued_resource_error(qr: Mapping[str, Any]) -> str:
    """The reason a FAILED queued resource gives (empty when none)."""
    state = qr.get("state") or {}
    if not isinstance(state, dict):
        return ""
    err = (state.get("failedData") or {}).get("error") or {}
    return str(err.get("message", ""))


# Moved to tpu_errors.py and tpu_args.py; importable from here as before.
__all__ = [
    "AUTH_MODE_ENV",
    "DEFAULT_TIMEOUT",
    "GRPC_STATUS",
    "VALUE_RE",
    "ZONE_RE",
    "TpuAlreadyExists",
    "TpuCapacityError",
    "TpuError",
    "TpuInvalidArgument",
    "TpuNotFound",
    "TpuPermissionDenied",
    "TpuQuotaExceeded",
    "TpuStockout",
    "TpuTimeout",
    "TpuUnreachable",
    "TpuVmHook",
    "dict_flag",
    "parse_gcloud_error",
    "queued_resource_error",
    "queued_resource_state",
]
