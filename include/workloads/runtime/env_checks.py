#!/usr/bin/env python
"""Generic checks of one runtime (a Python environment) on one machine, as a JSON report.

Run BY the runtime's own interpreter, so what it observes is that runtime: its Python
version, the CLI tools on its PATH, the frameworks it can import, and the accelerators it
can see. Each observation is compared with what the suite expects and written as an item
{name, expected, observed, passed} of a report that the `report_items` check evaluates
(the system this replaces printed the same facts for a person to read).

The expected accelerator count is what the cell's machine declares
(ACCELMATRIX_MACHINE_RESOURCES, set by accelmatrix: `resources.gpus`), so a CPU machine
expects no GPU and a 4-GPU machine expects 4.

Standard library only (plus whatever frameworks it is asked to import): it must run in a
bare runtime. Exits 0 whenever it could write the report; the verdict is the evaluation's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def item(name: str, expected: str, observed: str, passed: bool) -> dict:
    return {"name": name, "expected": expected, "observed": observed, "passed": bool(passed)}


def check_python(want: str) -> dict:
    have = platform.python_version()
    ok = have == want or have.startswith(want.rstrip(".*") + ".")
    return item("python version", f"{want}.*", f"{have} ({sys.executable})", ok)


def check_tool(tool: str) -> dict:
    path = shutil.which(tool)
    return item(f"tool {tool}", "on PATH", path or "not found on PATH", path is not None)


def check_import(module: str) -> dict:
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the observation
        return item(f"import {module}", "importable", f"{type(e).__name__}: {e}", False)
    version = getattr(mod, "__version__", None)
    return item(f"import {module}", "importable", f"version {version or '?'}", True)


def visible_gpus() -> tuple[int, str]:
    """How many GPUs this runtime sees, and how it found out."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = [torch.cuda.get_device_name(i) for i in range(n)]
        return n, f"torch.cuda: {n}" + (f" ({', '.join(names)})" if names else "")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "no torch; nvidia-smi not found"
    res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)  # noqa: S603
    n = sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))
    return n, f"nvidia-smi -L: {n}"


def check_devices(resources: dict) -> dict:
    expected = int(resources.get("gpus") or 0)
    n, how = visible_gpus()
    machine = os.environ.get("ACCELMATRIX_MACHINE", "this machine")
    return item(f"GPUs visible ({machine} declares {expected})", str(expected), how, n == expected)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-version", required=True, help="e.g. 3.11")
    ap.add_argument("--tools", default="", help="comma-separated CLI tools")
    ap.add_argument("--imports", default="", help="comma-separated modules")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    resources = json.loads(os.environ.get("ACCELMATRIX_MACHINE_RESOURCES") or "{}")

    items = [check_python(args.python_version)]
    items += [check_tool(t) for t in csv(args.tools)]
    items += [check_import(m) for m in csv(args.imports)]
    items.append(check_devices(resources))

    report = {
        "runtime": os.environ.get("ACCELMATRIX_AXIS_RUNTIME"),
        "machine": os.environ.get("ACCELMATRIX_MACHINE"),
        "python": sys.executable,
        "items": items,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for it in items:
        mark = "ok  " if it["passed"] else "FAIL"
        print(f"{mark} {it['name']}: expected {it['expected']}, found {it['observed']}")
    failed = sum(not it["passed"] for it in items)
    print(f"environment: {len(items) - failed} of {len(items)} item(s) as expected", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
