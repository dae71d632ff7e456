"""The runner samples the workload's CPU and memory; collect turns samples into metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from accelmatrix.backends.runner import RUNNER
from accelmatrix.metrics.resource_samples import resource_rows

# Busy for ~2 s with ~80 MB resident, in a child process (samples cover the whole group).
BURN = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time\\nt=time.time()\\nwhile time.time()-t<2: pass"])
block = bytearray(80 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
child.wait()
print("done", flush=True)
"""


def test_runner_samples_cpu_and_memory_of_the_process_group(tmp_path: Path):
    log_dir = tmp_path / "logs"
    subprocess.run(  # noqa: S603
        [sys.executable, str(RUNNER), "--log-dir", str(log_dir), "--cwd", str(tmp_path)]
        + ["--sample-interval", "0.25", "--", sys.executable, "-c", BURN],
        check=True,
        timeout=60,
        start_new_session=True,
    )
    status = json.loads((log_dir / "status.json").read_text())
    assert status["exit_code"] == 0
    if shutil.which("nvidia-smi") is None:
        assert status["gpu_sampling"] == "no GPU: nvidia-smi not found"
    lines = [json.loads(x) for x in (log_dir / "resources.jsonl").read_text().splitlines()]
    samples, final = lines[:-1], lines[-1]
    assert len(samples) >= 4
    assert [s["step"] for s in samples] == list(range(len(samples)))
    # The busy child keeps a core busy (shared with other jobs here); the runner is not counted.
    assert max(s["cpu_percent"] for s in samples) > 25
    assert max(s["rss_mb"] for s in samples) > 80
    assert max(s["procs"] for s in samples) == 2  # the workload and its child
    if shutil.which("nvidia-smi") is None:
        assert not any("gpu_util_percent" in s for s in samples)

    # The last line: totals from the kernel's accounting once the workload exited.
    assert final["final"] is True
    assert 0.5 < final["cpu_seconds"] < final["wall_seconds"] + 1  # idle would be ~0.05
    assert final["peak_rss_mb"] > 80

    rows = resource_rows(log_dir / "resources.jsonl")
    names = {r["name"] for r in rows}
    assert names == {
        f"runner.{n}"
        for n in ("cpu_percent", "rss_mb", "procs", "cpu_seconds", "peak_rss_mb", "wall_seconds")
    }
    assert [r["step"] for r in rows if r["name"] == "runner.peak_rss_mb"] == [None]
    rss = [r for r in rows if r["name"] == "runner.rss_mb"]
    assert rss[0]["unit"] == "MB" and rss[0]["source"] == "resources"
    assert [r["step"] for r in rss] == list(range(len(samples)))


def test_resource_rows_tolerate_garbage_and_absence(tmp_path: Path):
    assert resource_rows(tmp_path / "missing.jsonl") == []
    p = tmp_path / "resources.jsonl"
    p.write_text(
        '{"step": 0, "cpu_percent": 50.0, "rss_mb": 10, "procs": 1}\n'
        '{"step": "x", "cpu_percent": 1}\n'
        "[1, 2]\n"
        '{"step": 1, "cpu_percent": NaN, "rss_mb": true, "gpu_util_percent": 91.5}\n'
        '{"step": 2, "cpu_perc'
    )
    rows = resource_rows(p)
    assert [(r["name"], r["step"], r["value"]) for r in rows] == [
        ("runner.cpu_percent", 0, 50.0),
        ("runner.rss_mb", 0, 10.0),
        ("runner.procs", 0, 1.0),
        ("runner.gpu_util_percent", 1, 91.5),
    ]


def test_a_workload_shorter_than_the_interval_still_gets_totals(tmp_path: Path):
    log_dir = tmp_path / "logs"
    subprocess.run(  # noqa: S603
        [sys.executable, str(RUNNER), "--log-dir", str(log_dir), "--cwd", str(tmp_path)]
        + ["--sample-interval", "5", "--", sys.executable, "-c", "print('quick')"],
        check=True,
        timeout=30,
        start_new_session=True,
    )
    rows = {r["name"]: r["value"] for r in resource_rows(log_dir / "resources.jsonl")}
    assert rows["runner.peak_rss_mb"] > 1 and rows["runner.cpu_seconds"] > 0
    assert rows["runner.wall_seconds"] < 5


def test_sampling_can_be_disabled(tmp_path: Path):
    log_dir = tmp_path / "logs"
    subprocess.run(  # noqa: S603
        [sys.executable, str(RUNNER), "--log-dir", str(log_dir), "--cwd", str(tmp_path)]
        + ["--sample-interval", "0", "--", sys.executable, "-c", "import time; time.sleep(0.5)"],
        check=True,
        timeout=30,
        start_new_session=True,
    )
    assert not (log_dir / "resources.jsonl").exists()
    assert "gpu_sampling" not in json.loads((log_dir / "status.json").read_text())
