"""A full artifacts disk fails collect as infrastructure, clearly, and keeps what it can.

The cell's artifacts dir is a 256 KiB tmpfs (a real size-limited filesystem: mount needs
root, the test skips in the group "tmpfs" of tests/needs.py without it); the workload prints three metric lines and leaves a 1 MiB
artifact. Found by the fault matrix ("artifacts disk full"): collect failed with a bare
``OSError: [Errno 28] No space left on device`` (no path) as ``collect_failed``, and stored
none of the metric rows of the log it already had.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from needs import missing
from test_step_failures import _evaluate, _run

from accelmatrix import lifecycle
from accelmatrix_testkit.small_disk import mount_tmpfs, unmount

SUITE = """
description: one cell that prints metrics and leaves an artifact bigger than its disk
axes:
  n: {a: 1}
machines:
  cpu: {backend: local}
machine: cpu
workload:
  setup: []
  run: ["${python}", "-c", "import os; os.makedirs('out', exist_ok=True); open('out/big.bin', 'wb').write(os.urandom(1 << 20)); [print(f'step {i} loss: {1 / i:.3f}') for i in (1, 2, 3)]; print('done')"]
  timeout: 120
  artifacts: ["out/**"]
  metrics:
    - {type: log_regex, name: loss, pattern: "^step \\\\d+ loss: ([0-9.]+)$", series: true}
checks:
  - {type: log_contains, pattern: done}
"""


def test_a_full_artifacts_disk_fails_collect_as_infrastructure_and_keeps_the_rows(
    accel_home, tmp_path
):
    suite = tmp_path / "full.yaml"
    suite.write_text(textwrap.dedent(SUITE))
    ref = lifecycle.RunRef(dag_id="full", run_id="manual__full")
    (cell,) = lifecycle.plan_run(str(suite), ref, {})
    art = ref.artifacts(cell.id)
    why = mount_tmpfs(art, "256k")
    if why is not None:
        missing("tmpfs", f"cannot mount a 256 KiB tmpfs on {art} (root needed): {why}")
    try:
        resource = _run(cell, ref)
        with pytest.raises((OSError, RuntimeError)) as err:  # before the fix: OSError
            lifecycle.collect(cell, resource, ref)
        assert type(err.value).__name__ == "ArtifactsDiskFull", repr(err.value)
        assert str(art) in str(err.value) and "bytes free" in str(err.value)
        store = lifecycle.results_store()
        row = store.get_cell("full", ref.run_id, cell.id)
        assert row.state == "infra_failed"
        assert (
            row.message.startswith("collect failed: artifacts disk full")
            and str(art) in row.message
        )
        loss = [r for r in store.get_metrics("full", ref.run_id, cell.id) if r.name == "loss"]
        assert sorted(r.step for r in loss) == [0, 1, 2]  # the log's rows are kept
        assert _evaluate(cell, ref) == "infra_failed"
        lifecycle.teardown(cell, resource, ref)  # the machine still goes
        assert not Path(resource.work_dir).exists()
    finally:
        unmount(art)
