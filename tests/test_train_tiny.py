"""The tiny training workload, run for real (torch on CPU) as a subprocess.

Why subprocesses and not an import: the workload is what a cell runs as its own process,
and exit codes, stderr tracebacks, flushed per-step lines and files on disk are exactly
what the rest of accelmatrix consumes. The runs are started together in one module-scoped
fixture: each is mostly torch import (single threaded), so running them side by side on
2 cores roughly halves the module's time.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelmatrix.metrics.profiler import step_time_from_trace
from accelmatrix.metrics.sources import collect_metrics, parse_metric_sources

SCRIPT = Path(__file__).resolve().parents[1] / "include" / "workloads" / "train_tiny.py"
STEP_LINE = re.compile(
    r"^step (\d+) loss: (\S+) step_time: ([0-9.]+)s samples/s: ([0-9.]+|inf)$", re.MULTILINE
)
# Each run costs ~3 s of torch import, so every run checks several things at once.
RUNS: dict[str, list[str]] = {
    "default": [],  # 20 steps, torch.profiler.profile with a schedule
    "crash": ["--fail-mode", "crash", "--steps", "8", "--profiler", "light"],
    "diverge": ["--fail-mode", "diverge", "--steps", "8", "--model", "wide", "--profiler", "light"],
}


@dataclass
class Run:
    out: Path
    returncode: int
    stdout: str
    stderr: str
    wall: float


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("runs")
    started = time.monotonic()
    procs = {
        name: subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            [sys.executable, str(SCRIPT), "--out-dir", str(base / name), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=base,
        )
        for name, args in RUNS.items()
    }
    done: dict[str, Run] = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        wall = time.monotonic() - started
        done[name] = Run(base / name, proc.returncode, stdout, stderr, wall)
    return done


def _strict(text: str) -> dict:
    """Parse as strict JSON: bare NaN/Infinity (Python's json default) is refused."""

    def refuse(name: str) -> None:
        raise AssertionError(f"not strict JSON: bare {name}")

    return json.loads(text, parse_constant=refuse)


def losses(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [float(_strict(line)["loss"]) for line in lines]  # float("NaN") for a diverged one


def test_default_run_succeeds_and_writes_its_files(runs: dict[str, Run]) -> None:
    run = runs["default"]
    assert run.returncode == 0, run.stderr
    assert "Finished training run" in run.stdout
    assert [int(m.group(1)) for m in STEP_LINE.finditer(run.stdout)] == list(range(20))

    records = [json.loads(x) for x in (run.out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 20
    assert [r["step"] for r in records] == list(range(20))
    assert set(records[0]) == {"step", "loss", "step_time_s", "samples_per_s"}

    summary = json.loads((run.out / "train_metrics.json").read_text())
    assert summary["model"] == "mlp" and summary["steps"] == 20
    assert summary["final_loss"] == records[-1]["loss"]
    assert 0 < summary["train_runtime"] < run.wall
    # It learns: the last steps' loss is below the first steps'.
    assert sum(r["loss"] for r in records[-5:]) < sum(r["loss"] for r in records[:5])


def test_default_run_writes_exactly_one_trace_with_the_profiled_steps(
    runs: dict[str, Run],
) -> None:
    run = runs["default"]
    assert run.returncode == 0, run.stderr
    traces = list(run.out.rglob("*.pt.trace.json"))
    assert [t.name for t in traces] == ["trace.pt.trace.json"]

    st = step_time_from_trace(traces[0])
    assert st.steps == [3, 4, 5, 6, 7]  # --profile-from-step 3, --profile-steps 5
    assert st.method == "median" and len(st.gaps) == 4
    assert math.isfinite(st.step_time) and st.step_time > 0
    assert st.step_time < 1.0  # a tiny MLP step is milliseconds, not seconds


def test_collectors_read_a_real_run(runs: dict[str, Run]) -> None:
    run = runs["default"]
    log = run.out.parent / "default.log"
    log.write_text(run.stdout)
    sources = parse_metric_sources(
        [
            {"type": "json", "path": "train_metrics.json"},
            {"type": "jsonl", "path": "metrics.jsonl"},
            {"type": "log_regex", "name": "log_loss", "pattern": r"loss:\s*([0-9.eE+-]+)"},
            {"type": "profiler_trace"},
        ]
    )
    got = collect_metrics(sources, files_dir=run.out, log_path=log)
    assert got.diagnostics == []
    assert len(got.values("loss")) == 20
    assert got.values("log_loss")[0] == pytest.approx(got.values("final_loss")[0], abs=1e-6)
    assert got.values("step_time_steps") == [5.0]
    assert got.values("step_time")[0] > 0


def test_crash_mode_exits_nonzero_with_a_traceback(runs: dict[str, Run]) -> None:
    run = runs["crash"]
    assert run.returncode != 0
    assert "Traceback" in run.stderr and "step 4" in run.stderr
    assert "Finished training run" not in run.stdout
    assert [int(m.group(1)) for m in STEP_LINE.finditer(run.stdout)] == [0, 1, 2, 3]
    # Deterministic from the seed, whichever profiler records the trace.
    assert losses(run.out) == losses(runs["default"].out)[:4]


def test_diverge_mode_makes_the_loss_explode(runs: dict[str, Run]) -> None:
    run = runs["diverge"]
    assert run.returncode == 0, run.stderr  # diverging is a finding, not a crash
    assert "hidden=512" in run.stdout  # --model wide
    values = losses(run.out)
    assert math.isnan(values[-1]) or values[-1] > values[0]
    # The files stay strict JSON even with a NaN loss, and the collector reads it as NaN.
    summary = _strict((run.out / "train_metrics.json").read_text())
    assert summary["final_loss"] == "NaN" or math.isfinite(summary["final_loss"])


def test_light_profiler_writes_the_same_kind_of_trace(runs: dict[str, Run]) -> None:
    (trace,) = runs["diverge"].out.rglob("*.pt.trace.json")
    assert trace.name == "trace.pt.trace.json"
    st = step_time_from_trace(trace)
    assert st.steps == [3, 4, 5, 6, 7] and st.method == "median" and st.step_time > 0


def test_hang_mode_prints_steps_then_hangs(tmp_path: Path) -> None:
    """Not waited for: start it, see it reach the hang, kill it by its own PID."""
    proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
        [sys.executable, str(SCRIPT), "--out-dir", str(tmp_path / "out")]
        + ["--fail-mode", "hang", "--steps", "6", "--profiler", "light"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,  # raw pipe: select() must not miss lines already sitting in a buffer
    )
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"hanging" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                seen += chunk
        text = seen.decode()
        assert "step 2 loss:" in text and "step 3 hanging" in text, text
        time.sleep(0.5)
        assert proc.poll() is None  # still running: it really hangs
    finally:
        proc.kill()  # SIGKILL to this child's PID only
        proc.wait(timeout=10)
        proc.stdout.close()


def test_workload_is_standalone() -> None:
    """A cell's machine may only have torch: the script must not import accelmatrix."""
    text = SCRIPT.read_text()
    assert not re.search(r"^\s*(import|from)\s+accelmatrix", text, re.MULTILINE)
