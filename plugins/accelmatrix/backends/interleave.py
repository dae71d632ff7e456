"""The re-test session's workload: several builds' runs interleaved on one machine.

A re-test (confirm, bisect, compare) holds one machine per suspect cell and runs every
build's workload on it in a recorded order, A B B A ... (accelmatrix.spec.followup plans
it). This script is that workload. It is stdlib only and is handed to the machine's own
Python as ``python -c <this file's text> <plan>``, so it runs wherever the suite's workload
runs (a local process, an SSH host, a TPU VM worker, a pod) with nothing to install or copy.

The plan (one JSON argument): ``{"order": [build index, ...], "runs": [{"build": name,
"argv": [...], "env": {...}}, ...]}``. Each sample is the build's argv run to its end, its
stdout and stderr passed through line by line, between two marker lines:

    ##accelmatrix-sample {"i": 3, "build": "nightly-2026-03-07", "event": "begin"}
    ##accelmatrix-sample {"i": 3, "build": "nightly-2026-03-07", "event": "end", "exit": 0, "seconds": 0.52}

accelmatrix.history.session splits the collected log at these lines and reads each
sample's metrics from its own part. A sample that exits non-zero ends the session with its
exit code: a build that crashes is a failure to show, not a sample.
"""

import json
import os
import subprocess
import sys
import time

MARK = "##accelmatrix-sample "


def main(argv):
    plan = json.loads(argv[0])
    runs = plan["runs"]
    for i, k in enumerate(plan["order"]):
        run = runs[k]
        env = dict(os.environ)
        env.update(run.get("env") or {})
        env["ACCELMATRIX_SAMPLE"] = str(i)
        begin = {"i": i, "build": run["build"], "event": "begin"}
        print(MARK + json.dumps(begin), flush=True)
        t0 = time.monotonic()
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
        end = {"i": i, "build": run["build"], "event": "end", "exit": code}
        end["seconds"] = round(time.monotonic() - t0, 3)
        print(MARK + json.dumps(end), flush=True)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
