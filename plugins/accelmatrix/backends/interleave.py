"""The re-test session's workload: several builds' runs interleaved on one machine.

A re-test (confirm, bisect, compare) holds one machine per suspect cell and runs every
build's workload on it in a recorded order, A B B A ... (accelmatrix.spec.followup_plan plans
it). This script is that workload. It is stdlib only and is handed to the machine's own
Python as ``python -c <this file's text> <plan>``, so it runs wherever the suite's workload
runs (a local process, an SSH host, a TPU VM worker, a pod) with nothing to install or copy.

The plan (one JSON argument): ``{"order": [build index, ...], "runs": [{"build": name,
"argv": [...], "env": {...}}, ...]}``. Each sample is the build's argv run to its end, its
stdout and stderr passed through line by line, between two marker lines:

    ##accelmatrix-sample {"i": 3, "build": "nightly-2026-03-07", "event": "begin"}
    ##accelmatrix-sample {"i": 3, "build": "nightly-2026-03-07", "event": "end", "exit": 0, "seconds": 0.52}

accelmatrix.history.retests.session splits the collected log at these lines and reads each
sample's metrics from its own part. A sample that exits non-zero ends the session with its
exit code: a build that crashes is a failure to show, not a sample.

Profiles. When the plan says ``"keep": {"glob": "out/*.pt.trace.json", "per_build": 1,
"into": "out/accelmatrix-profiles"}`` (the suite collects profiler traces), the files a
sample wrote that match the glob are moved to ``<into>/<build>/<sample>-<name>``, up to
``per_build`` samples per build: the next sample of any build would overwrite them, and
the culprit report diffs the last good build's trace against the culprit's
(accelmatrix.history.culprits.culprit_profile). The session collects ``<into>/**``.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

MARK = "##accelmatrix-sample "


def main(argv):
    plan = json.loads(argv[0])
    runs = plan["runs"]
    kept = {}
    for i, k in enumerate(plan["order"]):
        run = runs[k]
        env = dict(os.environ)
        env.update(run.get("env") or {})
        env["ACCELMATRIX_SAMPLE"] = str(i)
        begin = {"i": i, "build": run["build"], "event": "begin"}
        print(MARK + json.dumps(begin), flush=True)
        t0 = time.monotonic()
        before = _stamps(plan["keep"]["glob"]) if plan.get("keep") else {}
        proc = subprocess.Popen(
            run["argv"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for raw in proc.stdout:
            sys.stdout.write(raw.decode("utf-8", "replace"))
            sys.stdout.flush()
        code = proc.wait()
        if code == 0 and plan.get("keep"):
            keep_profiles(plan["keep"], run["build"], i, before, kept)
        end = {"i": i, "build": run["build"], "event": "end", "exit": code}
        end["seconds"] = round(time.monotonic() - t0, 3)
        print(MARK + json.dumps(end), flush=True)
        if code != 0:
            return code
    return 0


def _stamps(pattern):
    """path -> (mtime_ns, size) of the files matching ``pattern`` under the work dir."""
    out = {}
    for path in Path.cwd().glob(pattern):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            out[path] = (st.st_mtime_ns, st.st_size)
    return out


def keep_profiles(keep, build, index, before, kept):
    """Move the files sample ``index`` of ``build`` wrote (new or changed since ``before``,
    the stamps taken as it began) that match ``keep["glob"]`` under
    ``keep["into"]/<build>/``, while the build has fewer than ``keep["per_build"]``
    samples kept; ``kept`` counts them per build."""
    if kept.get(build, 0) >= int(keep.get("per_build", 1)):
        return
    into = Path(keep.get("into", "out/accelmatrix-profiles")).resolve()
    found = [
        path
        for path, stamp in _stamps(keep["glob"]).items()
        if before.get(path) != stamp and into not in path.resolve().parents
    ]
    if not found:
        return
    dest = into / re.sub(r"[^A-Za-z0-9._-]", "_", build)
    dest.mkdir(parents=True, exist_ok=True)
    for path in found:
        path.replace(dest / f"{index}-{path.name}")
    kept[build] = kept.get(build, 0) + 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
