"""Resource usage samples (the runner's resources.jsonl) as rows of the metrics table.

Every local (and SSH) workload is supervised by backends/runner/supervise.py, which samples
its process group while it runs. Collecting those samples needs no suite YAML: each cell's
metrics table gets the series `runner.cpu_percent`, `runner.rss_mb` and `runner.procs` (and
`runner.gpu_util_percent`, `runner.gpu_mem_mb` where a GPU was sampled) and the scalars
`runner.cpu_seconds`, `runner.peak_rss_mb` and `runner.wall_seconds` of the finished
workload, so a check such as `{type: metric_between, metric: runner.peak_rss_mb, max: 2048}`
can bound them.

For a multi-pod cell (``k8s-jobset``, ``gke-tpu``) there is no local runner: the backend
writes the same file with the group's timing, ``runner.all_pods_running_s`` (JobSet
creation until the last pod ran) and ``runner.rendezvous_s`` (spread of the pods' start
times), so "all pods running within" and "rendezvous within" are checks like any other.

They live in the `runner.` namespace, which no metric source may use (refused when the suite
loads, and at collect time for keys read from a workload's files): a workload that reports
its own `wall_seconds` must not collide with the sampler's, or one of the two would be lost.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE = "resources.jsonl"
NAMESPACE = "runner."  # reserved: see the module docstring
UNITS = {
    "cpu_percent": "%",
    "rss_mb": "MB",
    "procs": None,
    "gpu_util_percent": "%",
    "gpu_mem_mb": "MB",
}
# The runner's last line, from the kernel's accounting once the workload exited.
FINAL_UNITS = {
    "cpu_seconds": "s",
    "peak_rss_mb": "MB",
    "wall_seconds": "s",
    # Multi-pod cells (k8s-jobset): written by the backend, which is the runner there.
    "all_pods_running_s": "s",
    "rendezvous_s": "s",
}


def reserved_names() -> list[str]:
    """Every metric name the runner may emit (for messages and the README)."""
    return [NAMESPACE + n for n in (*UNITS, *FINAL_UNITS)]


def resource_rows(path: Path) -> list[dict[str, Any]]:
    """Metric rows {name, value, step, unit, source} from a resources.jsonl; [] if absent.

    Tolerates a truncated last line (the runner may be killed mid-write).
    """
    rows: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("final") is True:
            rows += _scalars(obj)
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
            continue
        for name, unit in UNITS.items():
            value = obj.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if math.isfinite(value):
                    rows.append(
                        {
                            "name": NAMESPACE + name,
                            "value": float(value),
                            "step": obj["step"],
                            "unit": unit,
                            "source": "resources",
                        }
                    )
    return rows


def _scalars(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": NAMESPACE + name,
            "value": float(v),
            "step": None,
            "unit": unit,
            "source": "resources",
        }
        for name, unit in FINAL_UNITS.items()
        if isinstance(v := obj.get(name), int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    ]
