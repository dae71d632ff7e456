"""Resource usage samples (the runner's resources.jsonl) as rows of the metrics table.

Every local (and SSH) workload is supervised by backends/local_runner.py, which samples its
process group while it runs. Collecting those samples needs no suite YAML: each cell's
metrics table gets the series `cpu_percent`, `rss_mb` and `procs` (and `gpu_util_percent`,
`gpu_mem_mb` where a GPU was sampled) and the scalars `cpu_seconds`, `peak_rss_mb` and
`wall_seconds` of the finished workload, so a check such as
`{type: metric_between, metric: peak_rss_mb, max: 2048}` can bound them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE = "resources.jsonl"
UNITS = {
    "cpu_percent": "%",
    "rss_mb": "MB",
    "procs": None,
    "gpu_util_percent": "%",
    "gpu_mem_mb": "MB",
}
# The runner's last line, from the kernel's accounting once the workload exited.
FINAL_UNITS = {"cpu_seconds": "s", "peak_rss_mb": "MB", "wall_seconds": "s"}


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
                            "name": name,
                            "value": float(value),
                            "step": obj["step"],
                            "unit": unit,
                            "source": "resources",
                        }
                    )
    return rows


def _scalars(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": name, "value": float(v), "step": None, "unit": unit, "source": "resources"}
        for name, unit in FINAL_UNITS.items()
        if isinstance(v := obj.get(name), int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    ]
