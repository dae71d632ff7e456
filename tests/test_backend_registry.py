"""accelmatrix.backends.machine_kinds: each backend fact stated once, and everything reads it.

The registry's capabilities are checked against the backend classes themselves (a backend
that can defer provisioning overrides the methods that do it), the suite's machine union and
the loader's messages against the registry's kinds, and a suite that asks a backend for
something it cannot do is refused when it is loaded, naming file, field and allowed values.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from accelmatrix.backends.base import Backend, BackendError
from accelmatrix.backends.machine_kinds import CAPABILITIES, KINDS, get_backend, kind_of, kinds_that
from accelmatrix.cleanup import janitor
from accelmatrix.spec.loader import SuiteError, load_suite
from accelmatrix.spec.suite import Machine
from accelmatrix_testkit import fault_matrix

ROOT = Path(__file__).resolve().parents[1]

# The methods a backend overrides to have each capability (their defaults in Backend say no).
CAPABILITY_METHODS = {
    "defers_provisioning": ("begin_provision", "check_provision", "finish_provision"),
    "replaces_machine_on_retry": ("resource_problem", "refresh"),
    "runs_services": ("start_services",),
}

SSH = {"backend": "ssh", "ssh_conn_id": "box", "work_root": "/tmp/w"}


def _suite(tmp_path: Path, data: dict, name: str = "suite.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _with_services(machines: dict, **extra) -> dict:
    return {
        "axes": {"model": ["a"]},
        "machines": machines,
        "workload": {
            "run": ["python", "train.py"],
            "services": [
                {"name": "db", "run": ["python", "db.py"], "ready": {"port_file": "db.port"}}
            ],
        },
        **extra,
    }


@pytest.mark.parametrize("name", list(KINDS))
def test_each_entry_matches_its_backend_class(name):
    kind = KINDS[name]
    cls = kind.load()
    assert issubclass(cls, Backend) and cls.kind == name
    for capability, methods in CAPABILITY_METHODS.items():
        overridden = [m for m in methods if getattr(cls, m) is not getattr(Backend, m)]
        if getattr(kind, capability):
            assert overridden == list(methods), f"{name} claims {capability}"
        else:
            assert not overridden, f"{name} implements {overridden} but not {capability}"


def test_capabilities_are_the_documented_ones():
    assert set(CAPABILITY_METHODS) == set(CAPABILITIES)
    assert kinds_that("defers_provisioning") == ["tpu-vm"]
    assert kinds_that("replaces_machine_on_retry") == ["tpu-vm"]
    assert kinds_that("runs_services") == ["local"]
    with pytest.raises(ValueError, match="unknown capability"):
        kinds_that("flies")


def test_the_suite_machine_union_is_the_registry():
    members = typing.get_args(typing.get_args(Machine)[0])
    assert members == tuple(k.machine for k in KINDS.values())


def test_an_unknown_backend_names_every_kind(tmp_path):
    data = {"axes": {"m": ["a"]}, "machines": {"cpu": {"backend": "tpu"}}}
    data["workload"] = {"run": ["x"]}
    with pytest.raises(SuiteError) as e:
        load_suite(_suite(tmp_path, data))
    text = str(e.value)
    assert "machines.cpu.backend" in text
    assert all(f"'{name}'" in text for name in KINDS), text
    with pytest.raises(BackendError, match="unknown backend 'tpu' \\(allowed: local, ssh"):
        get_backend({"backend": "tpu"})


def test_services_on_a_backend_that_cannot_run_them_is_a_validation_error(tmp_path):
    path = _suite(tmp_path, _with_services({"remote": SSH}))
    with pytest.raises(SuiteError) as e:
        load_suite(path)
    text = str(e.value)
    assert str(path) in text
    assert "workload.services" in text and "'remote' is a ssh machine" in text
    assert "backends that can: local" in text


def test_services_are_checked_on_the_machines_cells_use(tmp_path):
    # A machine axis over local and ssh: the ssh cells could not start their services.
    data = _with_services({"cpu": {"backend": "local"}, "remote": SSH})
    data["axes"]["machine"] = ["cpu", "remote"]
    with pytest.raises(SuiteError, match="'remote' is a ssh machine"):
        load_suite(_suite(tmp_path, data))
    # Every cell on the local machine: the ssh machine next to it is never asked.
    ok = _with_services({"cpu": {"backend": "local"}, "remote": SSH}, machine="cpu")
    assert load_suite(_suite(tmp_path, ok, "ok.yaml")).workload.services


def test_the_fault_matrix_covers_every_kind_or_says_why_not():
    assert set(fault_matrix.BACKENDS) | set(fault_matrix.NOT_COVERED) == set(KINDS)
    assert not set(fault_matrix.BACKENDS) & set(fault_matrix.NOT_COVERED)


def test_the_janitor_key_comes_from_the_registry():
    assert janitor.machine_key({"backend": "local"}) == "local"
    assert janitor.machine_key(SSH) == "ssh:box:/tmp/w"
    tpu = {"backend": "tpu-vm", "gcp_conn_id": "g", "project": "p", "zone": "z"}
    assert janitor.machine_key(tpu) == "tpu-vm:g:p:z"
    for name in ("k8s-job", "k8s-jobset", "gke-tpu"):
        spec = {"backend": name, "kubernetes_conn_id": "k", "namespace": "ns"}
        assert janitor.machine_key(spec) == f"{name}:k:ns"
    assert janitor.machine_key({"backend": "gone"}) == "gone"
    assert kind_of("ssh").janitor_key(SSH) == janitor.machine_key(SSH)


def test_validating_a_suite_imports_no_backend_module_or_cloud_client():
    """spec reads the registry while a DAG file is parsed: only the machine models load."""
    code = (
        "import sys, json; from accelmatrix.spec.loader import load_suite; "
        f"load_suite({str(ROOT / 'include' / 'suites' / 'local_smoke.yaml')!r}); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "plugins")},
        timeout=120,
    ).stdout
    loaded = set(json.loads(out))
    heavy = {"kubernetes", "paramiko", "pandas", "sqlalchemy", "airflow", "great_expectations"}
    assert not {m.split(".")[0] for m in loaded} & heavy
    backend_modules = {k.backend_path.partition(":")[0] for k in KINDS.values()}
    assert not loaded & backend_modules
    assert not [m for m in loaded if m.startswith("accelmatrix.hooks")]
