"""Record golden responses by replaying the requests of a case file against a base config.

    record.py --model tiny-gen --config-json '{"dtype": "float32", ...}' \
        --cases cases/tiny-gen.yaml --out cases/tiny-gen.yaml

Starts server.py with the base config on a free port, sends every case's request (unary),
and writes the case file back with each case's ``response`` (or ``error`` {code, message}
if the server refused it) replaced by what the server answered. Names, skip flags and
requests are kept. Golden responses are recorded, never written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from client import call  # noqa: E402
from golden import load_cases  # noqa: E402


def start_server(model: str, config_json: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    port_file = workdir / "server.port"
    proc = subprocess.Popen(  # noqa: S603 (argv list)
        [
            sys.executable,
            str(HERE / "server.py"),
            "--model",
            model,
            "--config-json",
            config_json,
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode}: {proc.stderr.read().decode()}"
            )
        if port_file.exists():
            port = int(port_file.read_text())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):  # noqa: S310
                    return proc, port
            except OSError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server not ready after 30 s")


def record(model: str, config_json: str, cases_path: Path, out: Path) -> list[dict]:
    cases = load_cases(cases_path, require_expected=False)
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(model, config_json, Path(tmp))
        try:
            for case in cases:
                got = call(port, case, "unary")
                case.pop("response", None)
                case.pop("error", None)
                case.update(got)
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=10)
    header = (
        f"# Golden responses of {model}, recorded by include/workloads/inference/record.py\n"
        f"# against the base config {config_json}. Re-record instead of editing by hand.\n"
    )
    if out.suffix == ".json":
        out.write_text(json.dumps(cases, indent=1) + "\n")
    else:
        import yaml

        out.write_text(header + yaml.safe_dump(cases, sort_keys=False, width=100))
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--cases", required=True, type=Path, help="case file with the requests")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    cases = record(args.model, args.config_json, args.cases, args.out)
    errors = sum("error" in c for c in cases)
    print(f"recorded {len(cases)} case(s) ({errors} expected error(s)) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
