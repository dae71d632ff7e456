"""`python -m accelmatrix.inference record --suite S --model M [--config C] [--out F]`.

Records the golden responses of one model of an inference suite: takes the model's case
file and its base config from the suite (the first config the suite runs for that model,
or --config), and runs include/workloads/inference/record.py, which starts the local model
server with that config, replays every request and writes the responses into the case file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from accelmatrix import settings
from accelmatrix.spec.loader import load_suite, suite_id
from accelmatrix.spec.plan import expand


def base_config(suite, suite_name: str, model: str, config: str | None) -> tuple[str, dict]:
    """(label, normalized value) of the config to record against."""

    kinds = {a for a, k in suite.axis_kinds.items() if k == "inference_model_config"}
    if not kinds:
        raise SystemExit(f"{suite_name}: no axis of kind inference_model_config (axis_kinds)")
    axis = sorted(kinds)[0]
    if config is not None:
        if config not in suite.axes[axis]:
            raise SystemExit(
                f"--config {config!r} is not a value of axis {axis!r} "
                f"(values: {', '.join(suite.axes[axis])})"
            )
        return config, suite.axes[axis][config]
    plan = expand(suite, suite_name)
    for cell in plan.cells:
        if cell.axes.get("model") == model:
            label = cell.axes[axis]
            return label, suite.axes[axis][label]
    raise SystemExit(f"the suite runs no config for model {model!r}")


def cmd_record(args: argparse.Namespace) -> int:

    suite = load_suite(args.suite)
    models = suite.axes.get("model")
    if not isinstance(models, dict) or args.model not in models:
        allowed = ", ".join(models) if isinstance(models, dict) else "none"
        raise SystemExit(f"--model {args.model!r} is not a value of axis model (values: {allowed})")
    model_value = models[args.model]
    label, cfg = base_config(suite, suite_id(args.suite), args.model, args.config)
    cases = settings.include_dir() / model_value["cases"]
    out = Path(args.out) if args.out else cases
    script = settings.include_dir() / "workloads" / "inference" / "record.py"
    print(f"recording {args.model} against config {label} ({cfg['short_name']})")
    argv = [sys.executable, str(script), "--model", args.model, "--config-json", cfg["json"]]
    argv += ["--cases", str(cases), "--out", str(out)]
    return subprocess.run(argv, check=False).returncode  # noqa: S603 (argv list)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accelmatrix.inference")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record golden responses against a base config")
    rec.add_argument("--suite", required=True, help="suite YAML file")
    rec.add_argument("--model", required=True, help="value of the suite's model axis")
    rec.add_argument("--config", default=None, help="config label (default: the model's first)")
    rec.add_argument("--out", default=None, help="output case file (default: overwrite)")
    args = ap.parse_args(argv)
    return cmd_record(args)


if __name__ == "__main__":
    sys.exit(main())
