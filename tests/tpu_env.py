"""Fixtures for the TPU tests: the emulator as Cloud TPU and guest agent, gcloud pointed at it.

The emulator writes the keys of READY nodes into the loopback sshd's authorized_keys
(tests/sshd.py), so the TPU backend's SSH half reaches "the VM" with the key it generated.
"""

from __future__ import annotations

import pytest

from accelmatrix.hooks import ssh as ssh_hook
from accelmatrix_testkit.tpu_emulator import TpuEmulator

pytest_plugins = ["sshd"]


@pytest.fixture(scope="module")
def server(sshd_server):
    yield sshd_server
    ssh_hook.close_all()  # before sshd stops: no session outlives the module


@pytest.fixture(scope="module")
def emulator(server):
    with TpuEmulator(
        op_delay=0.3, qr_wait=0.3, qr_provision=0.3, authorized_keys=server.authorized_keys
    ) as emu:
        yield emu


@pytest.fixture(scope="module")
def gcloud_env(emulator, tmp_path_factory, needs_gcloud):  # noqa: ARG001 - the real gcloud
    return emulator.gcloud_env(tmp_path_factory.mktemp("gcloud-config"))


@pytest.fixture
def emu(emulator):
    emulator.reset()
    yield emulator
    emulator.reset()


@pytest.fixture
def gcloud_in_environ(gcloud_env, monkeypatch):
    """gcloud configured through os.environ, as the Airflow tasks and triggers see it."""
    monkeypatch.setenv("ACCELMATRIX_GCLOUD_AUTH", "env")
    for k, v in gcloud_env.items():
        monkeypatch.setenv(k, v)
    return gcloud_env
