#!/usr/bin/env python
"""Test one runtime on one machine: generic environment checks, then its notebooks.

The workload of the runtime x machine suite (the successor of a shell script that opened
every notebook of a runtime with `nbconvert --execute --allow-errors` and left a person to
scroll through the output):

1. `env_checks.py` runs under the RUNTIME's interpreter and writes out/env_report.json.
2. Each of the runtime's notebooks is executed with papermill on a kernel of the runtime's
   interpreter, with parameters injected (runtime, machine, expected_gpus). The executed
   notebook and an HTML rendering (nbconvert) land in out/notebooks/, also when it failed.
   A failing notebook prints which cell failed (index in the source notebook, execution
   count, source excerpt) and its traceback to the log, and makes this script exit 1
   after the remaining notebooks ran.

The kernel is registered without network or `jupyter kernelspec install`: a kernel.json
under <work dir>/jupyter/kernels/ points at the runtime's python, and JUPYTER_PATH points
there. This script runs on the interpreter that has papermill (accelmatrix's `${python}`);
the runtime's interpreter only needs ipykernel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
SOURCE_EXCERPT_LINES = 8


def csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def register_kernel(root: Path, name: str, python: str) -> None:
    """A kernelspec for the runtime's interpreter, found through JUPYTER_PATH."""
    spec = root / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"accelmatrix runtime {name}",
                "language": "python",
            }
        )
    )
    os.environ["JUPYTER_PATH"] = str(root)


def source_index(executed: Path, exec_index: int) -> int:
    """Index of a failing cell in the SOURCE notebook.

    papermill's index counts the injected-parameters cell but not the error banner it
    inserts at the top afterwards.
    """
    cells = [
        c
        for c in json.loads(executed.read_text())["cells"]
        if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])
    ]
    injected = sum(
        1
        for c in cells[:exec_index]
        if "injected-parameters" in c.get("metadata", {}).get("tags", [])
    )
    return exec_index - injected


def report_failure(nb: str, executed: Path, err) -> None:
    idx = source_index(executed, err.cell_index)
    lines = (err.source or "").splitlines()
    excerpt = "\n".join(f"    | {line}" for line in lines[:SOURCE_EXCERPT_LINES])
    if len(lines) > SOURCE_EXCERPT_LINES:
        excerpt += f"\n    | ... ({len(lines) - SOURCE_EXCERPT_LINES} more line(s))"
    print(
        f"NOTEBOOK FAILED: {nb} cell {idx} (In [{err.exec_count}]) raised "
        f"{err.ename}: {err.evalue}\n  cell source:\n{excerpt}\n  traceback:",
        flush=True,
    )
    for block in err.traceback:
        for line in ANSI.sub("", block).splitlines():
            print(f"    {line}")
    print(f"  executed notebook kept: {executed}", flush=True)


def render_html(executed: Path) -> Path | None:
    from nbconvert import HTMLExporter

    try:
        body, _ = HTMLExporter().from_filename(str(executed))
    except Exception as e:  # noqa: BLE001 - a rendering problem must not hide the result
        print(f"could not render {executed.name} as HTML: {type(e).__name__}: {e}")
        return None
    html = executed.with_suffix(".html")
    html.write_text(body, encoding="utf-8")
    return html


def run_notebooks(args: argparse.Namespace, names: list[str]) -> int:
    """Execute every notebook; the number that failed."""
    has_kernel = subprocess.run(  # noqa: S603 (argv list)
        [args.runtime_python, "-c", "import ipykernel"], capture_output=True, text=True
    )
    if has_kernel.returncode != 0:
        print(
            f"NOTEBOOK FAILED: the runtime {args.runtime_python} cannot run notebooks: "
            f"ipykernel is not importable ({has_kernel.stderr.strip().splitlines()[-1:]})"
        )
        return len(names)
    kernel = "accelmatrix-runtime"
    register_kernel(args.work_dir / "jupyter", kernel, args.runtime_python)

    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    out_dir = args.out_dir / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {
        "runtime": os.environ.get("ACCELMATRIX_AXIS_RUNTIME", "unknown"),
        "machine": os.environ.get("ACCELMATRIX_MACHINE", "unknown"),
        "expected_gpus": int(
            json.loads(os.environ.get("ACCELMATRIX_MACHINE_RESOURCES") or "{}").get("gpus") or 0
        ),
    }
    failed = 0
    for name in names:
        src = args.notebook_dir / name
        executed = out_dir / Path(name).name
        t0 = time.monotonic()
        print(f"notebook {name}: executing with parameters {params}", flush=True)
        try:
            pm.execute_notebook(
                str(src),
                str(executed),
                parameters=params,
                kernel_name=kernel,
                cwd=str(args.work_dir),
                progress_bar=False,
                start_timeout=60,
                execution_timeout=args.cell_timeout,
            )
        except PapermillExecutionError as e:
            failed += 1
            report_failure(name, executed, e)
        except Exception as e:  # noqa: BLE001 - missing file, dead kernel, bad notebook
            failed += 1
            print(f"NOTEBOOK FAILED: {name} could not be executed: {type(e).__name__}: {e}")
        else:
            print(f"notebook {name}: passed in {time.monotonic() - t0:.1f} s", flush=True)
        if executed.exists():
            render_html(executed)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runtime-python", required=True, help="interpreter under test; `current`: this one"
    )
    ap.add_argument("--python-version", required=True)
    ap.add_argument("--tools", default="")
    ap.add_argument("--imports", default="")
    ap.add_argument("--notebooks", default="", help="comma-separated notebook files")
    ap.add_argument("--notebook-dir", type=Path, default=HERE / "notebooks")
    ap.add_argument("--work-dir", type=Path, default=Path.cwd())
    ap.add_argument("--out-dir", type=Path, default=Path("out"))
    ap.add_argument("--cell-timeout", type=int, default=300)
    args = ap.parse_args(argv)
    if args.runtime_python == "current":
        args.runtime_python = sys.executable
    args.out_dir.mkdir(parents=True, exist_ok=True)

    env = subprocess.run(  # noqa: S603 (argv list)
        [
            args.runtime_python,
            str(HERE / "env_checks.py"),
            "--python-version",
            args.python_version,
            "--tools",
            args.tools,
            "--imports",
            args.imports,
            "--out",
            str(args.out_dir / "env_report.json"),
        ],
        check=False,
    )
    if env.returncode != 0:
        print(f"env_checks.py exited with {env.returncode} under {args.runtime_python}")
        return 2
    names = csv(args.notebooks)
    if not names:
        print("no notebooks for this runtime")
        return 0
    failed = run_notebooks(args, names)
    print(f"notebooks: {len(names) - failed} of {len(names)} passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
