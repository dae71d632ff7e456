"""TpuVmBackend end to end: the REAL gcloud against the TPU emulator, the REAL sshd as the VM.

The emulator plays Cloud TPU (nodes, queued resources, operations, faults) and the guest
agent: the public key in a READY node's ``ssh-keys`` metadata is added to the loopback sshd's
authorized_keys, and removed when the node goes. So "SSH into the TPU VM with the key made
for it" works exactly while a real node would accept that key, and a multi-host slice is
several workers on 127.0.0.1, each with its own work dir.
"""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
from backend_of import backend_of

from accelmatrix.backends.base import CellContext, InfrastructureError, SetupFailed
from accelmatrix.backends.local.processes import pid_alive as _pid_alive
from accelmatrix.backends.machines.tpu_vm import TpuVmMachine
from accelmatrix.backends.tpu_names import node_name
from accelmatrix.backends.tpu_vm import backend as tpu_vm_module
from accelmatrix.backends.tpu_vm import ssh_keys
from accelmatrix.backends.tpu_vm.backend import TpuVmBackend
from accelmatrix.hooks.tpu import TpuVmHook
from accelmatrix.steps.provision.trigger import ProvisionTrigger
from accelmatrix_testkit.cells import bare_cell

pytest_plugins = ["tpu_env"]
# The real gcloud (needs.py group "gcloud") and the real sshd (group "ssh") for every test
# here; the pure model and error-parsing tests are in tests/test_tpu_vm_model.py.
pytestmark = pytest.mark.usefixtures("needs_gcloud")

ZONE = "us-central2-b"
RUN = "manual__2026-01-01T00:00:00+00:00"


@pytest.fixture
def spec(server, tmp_path) -> dict:
    return TpuVmMachine.model_validate(
        {
            "backend": "tpu-vm",
            "zone": ZONE,
            "accelerator_type": "v4-8",
            "runtime_version": "tpu-ubuntu2204-base",
            "ssh_user": server.user,
            "ssh_port": server.port,
            "python": sys.executable,
            "work_root": str(tmp_path / "vm"),
            "provision_timeout_seconds": 60,
            "provision_poll_seconds": 0.2,
            "node_check_seconds": 1,
        }
    ).model_dump(mode="json")


def backend(gcloud_env, spec, **over) -> TpuVmBackend:
    return backend_of(
        TpuVmBackend,
        {**spec, **over},
        hook=TpuVmHook(env=gcloud_env, timeout=60),
        poll_interval=0.2,
    )


def ctx(home: Path, cell: str = "model=a") -> CellContext:
    return CellContext(
        dag_id="tpu_smoke",
        run_id=RUN,
        cell_id=cell,
        artifacts_dir=home / "artifacts" / cell,
        ttl_seconds=3600,
        labels={"team": "ml"},
    )


def wait_done(b, handle, timeout=40.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = b.poll(handle)
        if st.done:
            return st
        time.sleep(0.1)
    raise AssertionError("workload did not finish")


def posts(emu, coll):
    return [r for r in emu.requests("POST") if r["path"].endswith(f"/{coll}")]


def test_single_host_cell_lifecycle(accel_home, emu, gcloud_env, spec, server):
    b = backend(gcloud_env, spec)
    c = ctx(accel_home)
    r = b.provision(c)
    name = node_name(c.dag_id, c.run_id, c.cell_id)
    assert r.name == name and r.state == "READY" and len(r.worker_resources) == 1
    labels = r.labels
    assert labels["managed-by"] == "accelmatrix" and labels["cell"] == "model_a"
    assert labels["team"] == "ml"

    # A key pair made for this node: private half 0600 on our side, public half in metadata.
    key = ssh_keys.key_path(name)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    meta = emu.node(name)["metadata"]["ssh-keys"]
    assert meta.startswith(f"{server.user}:ssh-ed25519 ")
    assert meta.split(":", 1)[1].split()[1] in server.authorized_keys.read_text()
    assert "PRIVATE" not in json.dumps(
        r.to_json()
    )  # the record carries the key's path, never the key
    assert r.worker_resources[0].ssh_target.host_key.startswith("ssh-ed25519 ")

    # Setup and the workload run on the VM over SSH, argv intact (no shell in between).
    v = b.variables(r)
    assert v["num_workers"] == "1" and v["work_dir"].startswith(spec["work_root"])
    lines = []
    b.setup(
        r,
        [[v["python"], "-c", "import sys; print('setup', sys.argv[1:])", "a b;c"]],
        {},
        60,
        lines.append,
    )
    assert lines[-1] == "setup ['a b;c']"
    code = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/m.json','w').write('{}')\nprint('Finished training run', os.environ['TPU_X'])"
    h = b.submit(r, [v["python"], "-c", code], {"TPU_X": "it's $HOME"})
    st = wait_done(b, h)
    assert st.exit_code == 0 and not st.infrastructure_failure
    out, _ = b.read_logs(h, 0)
    assert out == ["Finished training run it's $HOME"]
    assert b.collect(r, ["out/*.json"], Path(r.artifacts_dir) / "files") == ["out/m.json"]
    assert "Finished training run" in (Path(r.artifacts_dir) / "output.log").read_text()

    work = Path(r.worker_resources[0].work_dir)
    assert work.is_dir()
    b.teardown(r)
    assert emu.node(name) is None and not key.exists() and not work.exists()
    assert meta.split(":", 1)[1].split()[1] not in server.authorized_keys.read_text()
    b.teardown(r)  # already gone: not-found is fine


def test_retry_finds_the_node_and_a_preempted_node_is_replaced(accel_home, emu, gcloud_env, spec):
    b = backend(gcloud_env, spec, capacity="spot")
    c = ctx(accel_home)
    r1 = b.provision(c)
    r2 = b.provision(c)  # a retried provision task: the same node, the same key, no 2nd POST
    assert r2.name == r1.name and len(posts(emu, "nodes")) == 1
    assert posts(emu, "nodes")[0]["body"]["schedulingConfig"]["spot"] is True
    assert r2.worker_resources[0].work_dir == r1.worker_resources[0].work_dir

    emu.preempt(r1.name)  # a retry that finds its node preempted deletes it and fails
    with pytest.raises(InfrastructureError, match="PREEMPTED"):
        b.provision(c)
    assert emu.node(r1.name) is None and not ssh_keys.key_path(r1.name).exists()


@pytest.mark.slow(40)
def test_multi_host_slice_runs_on_every_worker(accel_home, emu, gcloud_env, spec):
    b = backend(gcloud_env, spec, accelerator_type="v4-16")  # 2 hosts
    r = b.provision(ctx(accel_home))
    assert len(r.workers) == 2 and len(r.worker_resources) == 2
    dirs = [Path(w.work_dir) for w in r.worker_resources]
    assert dirs[0] != dirs[1]  # one loopback host: each worker gets its own dir
    v = b.variables(r)
    assert v["num_workers"] == "2"
    py = v["python"]
    lines: list[str] = []
    b.setup(r, [[py, "-c", "open('setup.txt','w').write('x')"]], {}, 60, lines.append)
    assert all((d / "setup.txt").exists() for d in dirs)

    # ${work_dir} rendered once is retargeted per worker; worker 1 fails, worker 0 would wait.
    code = (
        "import os, sys, time\n"
        "me = sys.argv[1]\n"
        "print('worker in', me, flush=True)\n"
        "if me.endswith('worker1'): sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    h = b.submit(r, [py, "-c", code, v["work_dir"]], {})
    st = wait_done(b, h)
    assert st.exit_code == 3 and "worker 1" in st.detail and not st.infrastructure_failure
    pid0 = h.workers[0].pid
    deadline = time.time() + 15
    while _pid_alive(pid0) and time.time() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(pid0)  # its peer failed: worker 0 was stopped, not left to hang

    b.collect(r, [], Path(r.artifacts_dir) / "files")
    art = Path(r.artifacts_dir)
    assert f"worker in {dirs[0]}" in (art / "output.log").read_text()
    assert f"worker in {dirs[1]}" in (art / "workers" / "1" / "output.log").read_text()
    b.teardown(r)
    assert emu.state["nodes"] == {} and not any(d.exists() for d in dirs)


def test_setup_failure_names_the_worker(accel_home, emu, gcloud_env, spec):
    b = backend(gcloud_env, spec)
    r = b.provision(ctx(accel_home))
    py = b.variables(r)["python"]
    with pytest.raises(SetupFailed, match="worker 0.*exited with 4"):
        b.setup(r, [[py, "-c", "print('pip failed'); raise SystemExit(4)"]], {}, 60, lambda s: None)
    b.teardown(r)


def test_preemption_while_running_is_an_infrastructure_failure(accel_home, emu, gcloud_env, spec):
    b = backend(gcloud_env, spec, capacity="preemptible")
    r = b.provision(ctx(accel_home))
    py = b.variables(r)["python"]
    h = b.submit(r, [py, "-c", "import time; print('step 1', flush=True); time.sleep(60)"], {})
    assert not b.poll(h).done
    emu.preempt(r.name)
    st = wait_done(b, h, timeout=30)
    assert st.infrastructure_failure and "PREEMPTED" in st.detail and st.exit_code is None
    b.teardown(r)
    assert emu.node(r.name) is None


def test_a_workload_killed_by_preemption_is_never_a_test_failure(
    accel_home, emu, gcloud_env, spec, tmp_path
):
    """The workload dies with its node (here: exits 137 once the node is preempted) long
    before the periodic node check is due: the node is looked at then, not the exit code."""
    b = backend(gcloud_env, spec, capacity="spot", node_check_seconds=3600)
    r = b.provision(ctx(accel_home))
    py = b.variables(r)["python"]
    flag = tmp_path / "preempted"
    code = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.1)\n"
        "sys.exit(137)\n"
    )
    h = b.submit(r, [py, "-c", code], {})
    assert not b.poll(h).done  # the periodic check ran now: the next is an hour away
    emu.preempt(r.name)
    flag.touch()
    st = wait_done(b, h, timeout=30)
    assert st.infrastructure_failure and "PREEMPTED" in st.detail, st
    b.teardown(r)


def test_stockout_and_quota_leave_nothing_behind(accel_home, emu, gcloud_env, spec):
    b = backend(gcloud_env, spec)
    emu.stockout(leaves_node=True)  # the create operation fails; a TERMINATED node remains
    with pytest.raises(InfrastructureError, match="TERMINATED|vanished"):
        b.provision(ctx(accel_home))
    assert emu.state["nodes"] == {}
    assert not list(ssh_keys.key_dir().glob("*"))
    emu.reset()
    emu.set_faults(quota_exceeded=True)  # refused at once: nothing was created
    with pytest.raises(InfrastructureError, match="[Qq]uota"):
        b.provision(ctx(accel_home, "model=b"))
    assert emu.state["nodes"] == {}


@pytest.mark.slow(40)
def test_queued_resource_capacity_wait_and_timeout(accel_home, emu, gcloud_env, spec):
    b = backend(
        gcloud_env, spec, capacity="queued", valid_until_seconds=600, accelerator_type="v6e-16"
    )
    r = b.provision(ctx(accel_home))
    assert r.queued_resource == r.name and len(r.worker_resources) == 4
    (req,) = posts(emu, "queuedResources")
    assert req["body"]["queueingPolicy"] == {"validUntilDuration": "600s"}
    b.teardown(r)  # deleting the queued resource with --force takes the node along
    assert emu.state["queued_resources"] == {} and emu.state["nodes"] == {}

    emu.stockout()
    b = backend(gcloud_env, spec, capacity="queued", valid_until_seconds=1)
    with pytest.raises(InfrastructureError, match="FAILED"):
        b.provision(ctx(accel_home, "model=b"))
    assert emu.state["queued_resources"] == {}  # the failed request was deleted


@pytest.mark.slow(90)
def test_provision_trigger_defers_the_capacity_wait(
    accel_home, emu, gcloud_env, gcloud_in_environ, spec, caplog
):
    """begin -> (trigger polls) -> finish, as ProvisionOperator drives it in the DAG."""
    machine = {**spec, "capacity": "queued", "valid_until_seconds": 600}
    b = backend(gcloud_env, machine)
    pending = b.begin_provision(ctx(accel_home))
    assert pending.pending and emu.node(pending.name) is None  # still waiting

    async def first_event(trigger):
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first_event(ProvisionTrigger(machine, pending, poll_interval=0.2)))
    assert event["status"] == "ready"
    r = b.finish_provision(pending)
    assert r.state == "READY" and r.worker_resources
    b.teardown(r)

    # Resuming a task (the run step's replacement machine): not sooner than the settle
    # time after the deferral, or Airflow 3.3.2 may fail the resumed try (resume race).
    from accelmatrix.steps.task_ending import RESUME_SETTLE_SECONDS

    pending = b.begin_provision(ctx(accel_home, "model=settle"))
    cell = bare_cell("model=settle", machine, "tpu")
    trigger, _ = ProvisionTrigger.for_cell(cell, pending)
    again = ProvisionTrigger(**trigger.serialize()[1])  # as the triggerer loads it
    assert again.deferred_at == trigger.deferred_at and again.cell == cell
    assert trigger.serialize()[1]["machine_spec"] is None  # the cell carries the machine once
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "ready"
    assert time.time() - trigger.deferred_at >= RESUME_SETTLE_SECONDS - 0.1
    b.teardown(b.finish_provision(pending))

    # A capacity wait that fails: the trigger deletes the request before it fires.
    emu.stockout()
    machine = {**spec, "capacity": "queued", "valid_until_seconds": 1}
    pending = backend(gcloud_env, machine).begin_provision(ctx(accel_home, "model=b"))
    # The trigger also records the failure itself: the resumed task may never run (3.3.2
    # resume race), and the cell must not stay "provisioning" for evaluate to call "failed".
    owner = {"dag_id": "tpu_t", "run_id": "r1", "cell_id": "model=b"}
    trigger = ProvisionTrigger(machine, pending, poll_interval=0.2, owner=owner)
    assert ProvisionTrigger(**trigger.serialize()[1]).owner == owner
    event = asyncio.run(first_event(trigger))
    assert event["status"] == "failed" and "FAILED" in event["detail"]
    assert emu.state["queued_resources"] == {}
    from accelmatrix.lifecycle import results_store

    cell = results_store().get_cell("tpu_t", "r1", "model=b")
    assert cell.state == "infra_failed" and "provision failed" in cell.message, cell
    # ... and says so in the task's log (the trigger's lines are part of it).
    said = [r.getMessage() for r in caplog.records]
    assert any("provision failed for cell model=b (an infrastructure failure" in m for m in said), (
        said
    )


def test_unreachable_workers_fail_provision_and_delete_the_node(
    accel_home, emu, gcloud_env, spec, monkeypatch
):
    monkeypatch.setattr(tpu_vm_module, "SSH_READY_SECONDS", 2)
    b = backend(gcloud_env, spec, ssh_port=1)  # nothing listens there
    with pytest.raises(InfrastructureError, match="not reachable over SSH"):
        b.provision(ctx(accel_home))
    assert emu.state["nodes"] == {}


def test_list_managed_ignores_unmanaged(emu, gcloud_env, spec):
    emu.plant_node("am-mine", ZONE, labels={"managed-by": "accelmatrix", "dag": "d"})
    emu.plant_node("theirs", ZONE, labels={"managed-by": "terraform"})
    emu.plant_node("bare", ZONE)
    got = backend(gcloud_env, spec).list_managed()
    assert [(m.name, m.labels["dag"]) for m in got] == [("am-mine", "d")]


@pytest.mark.slow(60)
def test_teardown_waits_out_an_unreachable_tpu_api(
    accel_home,
    emu,
    gcloud_env,
    gcloud_in_environ,
    spec,
):
    """The teardown task meets the Cloud TPU API down for longer than gcloud's own retries
    (about 36 s here): it tries again until the API answers, then the node is gone. Before,
    its first failed gcloud call failed the task and the node ran on until the janitor."""
    from accelmatrix import lifecycle
    from accelmatrix_testkit.log_capture import logged

    b = backend(gcloud_env, spec)
    r = b.provision(ctx(accel_home, "model=outage"))
    cell = bare_cell("model=outage", spec, "tpu")
    ref = lifecycle.RunRef(dag_id="tpu_smoke", run_id=RUN)
    emu.take_down()
    up = threading.Timer(40, emu.bring_up)
    up.start()
    t = time.monotonic()
    try:
        with logged() as warned:
            held = lifecycle.teardown(cell, r, ref)
    finally:
        up.join()
    assert time.monotonic() - t >= 40  # it waited for the API, it did not skip the delete
    out = "\n".join(warned)
    assert "could not reach the API to delete" in out and "UNAVAILABLE" in out
    assert emu.node(r.name) is None
    assert held["held_seconds"] > 0
