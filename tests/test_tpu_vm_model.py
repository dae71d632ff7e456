"""The TPU-VM machine model and gcloud's error output: pure, no gcloud, sshd or emulator.

Moved out of tests/test_tpu_backend.py, whose every test needs the real gcloud and sshd:
a module-level skip there (gcloud missing) used to take these along.
"""

from __future__ import annotations

import sys

import pytest
from backend_of import backend_of
from pydantic import ValidationError

from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.tpu_vm.backend import TpuVmBackend

ZONE = "us-central2-b"


def spec_for_unreachable() -> dict:
    return TpuVmMachine.model_validate(
        {
            "backend": "tpu-vm",
            "zone": ZONE,
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
        }
    ).model_dump(mode="json")


@pytest.fixture
def spec(tmp_path) -> dict:
    """The execution fields test_tpu_backend.py sets (there: its loopback sshd's port)."""
    return TpuVmMachine.model_validate(
        {
            "backend": "tpu-vm",
            "zone": ZONE,
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
            "ssh_user": "tester",
            "ssh_port": 2222,
            "python": sys.executable,
            "work_root": str(tmp_path / "vm"),
            "provision_timeout_seconds": 60,
            "provision_poll_seconds": 0.2,
            "node_check_seconds": 1,
        }
    ).model_dump(mode="json")


def test_machine_model_execution_fields(spec):
    m = TpuVmMachine.model_validate(spec)
    assert m.ssh_port == spec["ssh_port"] and m.node_check_seconds == 1
    base = {k: spec[k] for k in ("backend", "zone", "accelerator_type", "runtime_version")}
    for bad in (
        {"metadata": {"ssh-keys": "me:ssh-ed25519 AAAA"}},  # ours to set, per node
        {"ssh_user": "root; rm -rf /"},
        {"work_root": "relative/dir"},
        {"work_root": "/a/../b"},
        {"ssh_key_file": "/home/me/.ssh/id_rsa"},  # no credentials in YAML
    ):
        with pytest.raises(ValidationError):
            TpuVmMachine.model_validate({**base, **bad})


def test_gcloud_connection_errors_are_unreachable_not_answers():
    """What gcloud printed against the emulator's closed port, and the API's own 503."""
    from accelmatrix.errors import InfrastructureError as Infra
    from accelmatrix.hooks.tpu import TpuNotFound, TpuUnreachable, parse_gcloud_error

    crashed = (
        "ERROR: gcloud crashed (ConnectionError): HTTPConnectionPool(host='127.0.0.1', "
        "port=43899): Max retries exceeded with url: /v2/projects/p/locations/us-central2-b/"
        "nodes/nope?alt=json (Caused by NewConnectionError('<urllib3.connection."
        "HTTPConnection object at 0x7f5876cf3470>: Failed to establish a new connection: "
        "[Errno 111] Connection refused'))\n\nIf you would like to report this issue, please "
        "run the following command:\n  gcloud feedback\n"
    )
    e = parse_gcloud_error(crashed, 1)
    assert isinstance(e, TpuUnreachable) and isinstance(e, Infra)
    assert e.status == "UNAVAILABLE" and "Connection refused" in str(e)
    unavailable = parse_gcloud_error(
        "ERROR: (gcloud.compute.tpus.tpu-vm.describe) UNAVAILABLE: The service is currently "
        "unavailable.\n",
        1,
    )
    assert isinstance(unavailable, TpuUnreachable)
    # An answer is not an outage: a missing node is final.
    gone = parse_gcloud_error(
        "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource 'x' was not found\n", 1
    )
    assert isinstance(gone, TpuNotFound) and not isinstance(gone, TpuUnreachable)
    assert backend_of(TpuVmBackend, spec_for_unreachable()).unreachable(e)
    assert not backend_of(TpuVmBackend, spec_for_unreachable()).unreachable(gone)
