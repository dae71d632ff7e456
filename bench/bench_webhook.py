#!/usr/bin/env python
"""The GitHub webhook under a flood: 1,000 hostile deliveries interleaved with 20 legitimate
ones, against a real api-server, must start exactly the 20 runs with no server error.

One real Airflow (dag-processor and api-server; SQLite) started by
``accelmatrix_testkit.AirflowStack``, a fake GitHub API on loopback (tests/fake_github.py)
answering permission checks and recording statuses, and a suite with a ``github`` block.
No scheduler: the runs a delivery creates stay queued, which is all this counts.

The hostile kinds, in turn: an unsigned delivery, a wrong signature, a replay of a
legitimate delivery's id, a body over the size limit, signed malformed JSON, a signed
event no suite runs on, a signed label no suite declares, a signed repository no suite
declares, and a fork labelled by a user with read access (a GitHub call each).

Printed: runs started (goal: exactly 20), answers by status, 5xx answers (goal: 0), and
the time from a legitimate delivery to its pending status (the answer comes after the
status is posted; goal <= 5 s), median and max. Prints figures; it is not a test.

    .venv/bin/python bench/bench_webhook.py [--hostile 1000] [--legit 20]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "tests"))  # the test kit and the fake GitHub API

from fake_github import FakeGithub  # noqa: E402

from accelmatrix_testkit import AirflowStack  # noqa: E402

DAG_ID = "pr_bench"
REPO = "acme/trainer"
SECRET = "bench-secret"
SUITE = {
    "description": "webhook bench",
    "owners": ["ml-infra"],
    "schedule": None,
    "axes": {"model": ["small"]},
    "machines": {"cpu": {"backend": "local"}},
    "machine": "cpu",
    "params": {"git_ref": {"type": "string", "default": "main"}},
    "github": {"repo": REPO, "label": "run-tpu-tests", "conn_id": "github_fake"},
    "workload": {"run": ["echo", "${params.git_ref}"]},
    "checks": [{"type": "log_contains", "pattern": "."}],
}


def payload(number: int, sha: str, *, label: str = "run-tpu-tests", repo: str = REPO,
            sender: str = "maintainer", fork: bool = False) -> bytes:  # fmt: skip
    return json.dumps(
        {
            "action": "labeled",
            "number": number,
            "label": {"name": label},
            "repository": {"full_name": repo},
            "sender": {"login": sender},
            "pull_request": {
                "number": number,
                "head": {"sha": sha, "repo": {"full_name": "x/fork" if fork else repo}},
                "base": {"sha": "b" * 40, "ref": "main"},
                "labels": [{"name": label}],
            },
        }
    ).encode()


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def hostile(k: int, legit_ids: list[str]) -> tuple[bytes, dict[str, str]]:
    """The k-th hostile delivery (kinds in turn, module docstring)."""
    sha = f"{k:040x}"
    body = payload(10_000 + k, sha)
    h = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": f"h-{k}"}
    kind = k % 9
    if kind == 0:
        return body, h  # unsigned
    if kind == 1:
        return body, {**h, "X-Hub-Signature-256": sign(body, "guess")}
    if kind == 2 and legit_ids:  # a replay: a legitimate delivery, byte for byte
        return REPLAYS[legit_ids[k % len(legit_ids)]]
    if kind == 3:
        big = body + b" " * (1 << 20)
        return big, {**h, "X-Hub-Signature-256": sign(big)}
    if kind == 4:
        bad = b'{"action": "labeled", '
        return bad, {**h, "X-Hub-Signature-256": sign(bad)}
    if kind == 5:
        return body, {**h, "X-GitHub-Event": "issues", "X-Hub-Signature-256": sign(body)}
    if kind == 6:
        other = payload(10_000 + k, sha, label="lgtm")
        return other, {**h, "X-Hub-Signature-256": sign(other)}
    if kind == 7:
        other = payload(10_000 + k, sha, repo="evil/repo")
        return other, {**h, "X-Hub-Signature-256": sign(other)}
    fork = payload(10_000 + k, sha, sender="stranger", fork=True)
    return fork, {**h, "X-Hub-Signature-256": sign(fork)}


REPLAYS: dict[str, tuple[bytes, dict[str, str]]] = {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hostile", type=int, default=1000)
    ap.add_argument("--legit", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    suites = tmp / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(json.dumps(SUITE))
    statuses: Counter[int] = Counter()
    latency: list[float] = []
    with FakeGithub(permissions={"maintainer": "write", "stranger": "read"}) as github:
        with AirflowStack(
            home=tmp / "airflow",
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            components=("dag-processor", "api-server"),
            env_extra={
                "AIRFLOW_CONN_GITHUB_FAKE": github.conn_uri_json(),
                "AIRFLOW_CONN_ACCELMATRIX_GITHUB_WEBHOOK": json.dumps(
                    {"conn_type": "generic", "password": SECRET}
                ),
            },
        ) as stack:
            stack.wait_for_dag(DAG_ID)
            every = max(1, args.hostile // max(1, args.legit))
            legit_ids: list[str] = []
            started = time.monotonic()
            with httpx.Client(base_url=stack.client.base_url, timeout=60) as client:
                for k in range(args.hostile + args.legit):
                    if k % (every + 1) == every and len(legit_ids) < args.legit:
                        n = len(legit_ids) + 1
                        body = payload(n, f"{n:x}".rjust(40, "c"))
                        did = f"legit-{n}"
                        h = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": did,
                             "X-Hub-Signature-256": sign(body)}  # fmt: skip
                        REPLAYS[did] = (body, h)
                        t0 = time.monotonic()
                        r = client.post("/accelmatrix/github/webhook", content=body, headers=h)
                        latency.append(time.monotonic() - t0)
                        legit_ids.append(did)
                    else:
                        body, h = hostile(k, legit_ids)
                        r = client.post("/accelmatrix/github/webhook", content=body, headers=h)
                    statuses[r.status_code] += 1
            elapsed = time.monotonic() - started
            runs = stack.api("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 1000})
            n_runs = runs["total_entries"]
    pending = sum(1 for s in github.statuses if s["state"] == "pending")
    print(f"deliveries: {sum(statuses.values())} ({args.hostile} hostile, {len(latency)} legit) "
          f"in {elapsed:.1f} s")  # fmt: skip
    print("answers by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    print(f"runs started: {n_runs} (goal: exactly {args.legit})")
    print(f"5xx answers: {sum(v for k, v in statuses.items() if k >= 500)} (goal: 0)")
    print(f"pending statuses posted: {pending}")
    if latency:
        print(
            f"delivery -> pending status: median {statistics.median(latency):.3f} s, "
            f"max {max(latency):.3f} s (goal: <= 5 s)"
        )
    ok = n_runs == args.legit and not any(k >= 500 for k in statuses)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
