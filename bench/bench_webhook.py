#!/usr/bin/env python
"""The GitHub webhook under a flood: 1,000 hostile deliveries interleaved with 20 legitimate
ones, against a real api-server, must start exactly the 20 runs, cancel none, edit no
comment the bot did not write, and answer fast with no server error.

One real Airflow (dag-processor and api-server; SQLite) started by
``accelmatrix_testkit.AirflowStack``, a fake GitHub API on loopback (tests/fake_github.py)
answering the pull requests' state, permission checks, comments and statuses, and a suite
with a ``github`` block. No scheduler: the runs a delivery creates stay queued, which is
all this counts (a run cancelled by a delivery would be failed).

The hostile kinds, in turn (12): an unsigned delivery, a wrong signature, a replay of a
legitimate delivery's id, a body over the size limit (drained, then 413), signed malformed
JSON, a signed event no suite runs on, a signed label no suite declares, a signed
repository no suite declares, a fork labelled by a user with read access (GitHub calls
after the answer), a legitimate signed body replayed under a new delivery id, an old head
of a legitimate pull request (a body captured before a push), and a ``closed`` replayed
after the pull request was reopened. Every legitimate pull request also carries a
stranger's comment holding the bot's markers.

Printed: runs started (goal: exactly 20) and cancelled (goal: 0), answers by status, 5xx
answers (goal: 0), comments the bot edited that it did not write (goal: 0), bot comments
per pull request (goal: at most 1 of each kind), the answer time of every delivery (goal:
<= 1 s at the 99th percentile, whatever GitHub's latency: ``--github-delay 15``), and the
time from a legitimate delivery to its pending status. Prints figures; it is not a test.

``--db-restart S``: the fault matrix's metadata database restart, applied to the webhook.
Airflow's metadata database is a PostgreSQL on loopback (``accelmatrix_testkit.services``)
holding the webhook secret (a connection, not an environment variable); a third of the way
through, it is stopped (fast shutdown) for S seconds, longer than the secret is cached, then
started again, with deliveries sent throughout. Printed: misleading 403s (goal: 0); the
legitimate deliveries refused for the outage (503, or accepted but failed) are then
redelivered under their own ids, as a maintainer's "Redeliver" does, and the runs counted.

    .venv/bin/python bench/bench_webhook.py [--hostile 1000] [--legit 20] [--github-delay 0]
        [--db-restart 40]
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
from accelmatrix_testkit.services import PostgresServer  # noqa: E402

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
            sender: str = "maintainer", fork: bool = False, action: str = "labeled") -> bytes:  # fmt: skip
    return json.dumps(
        {
            "action": action,
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


KINDS = 12


def legit_sha(n: int) -> str:
    return f"{n:x}".rjust(40, "c")


def old_sha(n: int) -> str:
    return f"{n:x}".rjust(40, "e")


def hostile(k: int, legit_ids: list[str]) -> tuple[bytes, dict[str, str]]:
    """The k-th hostile delivery (kinds in turn, module docstring)."""
    sha = f"{k:040x}"
    body = payload(10_000 + k, sha)
    h = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": f"h-{k}"}
    kind = k % KINDS
    n = (k // KINDS) % max(1, len(legit_ids)) + 1  # a legitimate pull request
    if kind == 9 and legit_ids:  # a legitimate body, byte for byte, under a new id
        return REPLAYS[legit_ids[n - 1]][0], {**REPLAYS[legit_ids[n - 1]][1], **h}
    if kind == 10 and legit_ids:  # an old head of a legitimate pull request
        old = payload(n, old_sha(n), action="synchronize" if k % 2 else "labeled")
        return old, {**h, "X-Hub-Signature-256": sign(old)}
    if kind == 11 and legit_ids:  # closed, replayed after the pull request was reopened
        closed = payload(n, legit_sha(n), action="closed")
        return closed, {**h, "X-Hub-Signature-256": sign(closed)}
    if kind >= 9:
        kind = 0
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
    GITHUB.set_pull(10_000 + k, sha, labels=("run-tpu-tests",))
    return fork, {**h, "X-Hub-Signature-256": sign(fork)}


GITHUB = FakeGithub(permissions={"maintainer": "write", "stranger": "read"})


REPLAYS: dict[str, tuple[bytes, dict[str, str]]] = {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hostile", type=int, default=1000)
    ap.add_argument("--legit", type=int, default=20)
    ap.add_argument("--github-delay", type=float, default=0.0,
                    help="seconds the fake GitHub takes to answer each call")  # fmt: skip
    ap.add_argument("--db-restart", type=float, default=0.0,
                    help="seconds the metadata database is down during the deliveries")  # fmt: skip
    args = ap.parse_args()
    if args.db_restart:
        with PostgresServer(databases=("airflow",)) as pg:
            return run(args, pg)
    return run(args, None)


def run(args: argparse.Namespace, pg: PostgresServer | None) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    suites = tmp / "suites"
    suites.mkdir()
    (suites / f"{DAG_ID}.yaml").write_text(json.dumps(SUITE))
    statuses: Counter[int] = Counter()
    answer: list[float] = []
    legit_answer: list[float] = []
    sent_at: dict[str, float] = {}
    planted: list[int] = []
    github = GITHUB
    with github:
        for n in range(1, args.legit + 1):
            github.set_pull(n, legit_sha(n), labels=("run-tpu-tests",))
            planted.append(github.add_comment(
                n, "<!-- accelmatrix:pr-report pr_bench --> <!-- accelmatrix:needs-maintainer "
                "pr_bench --> looks fine to me", user="stranger",
            ))  # fmt: skip
        env = {"AIRFLOW_CONN_GITHUB_FAKE": github.conn_uri_json()}
        if pg is None:
            env["AIRFLOW_CONN_ACCELMATRIX_GITHUB_WEBHOOK"] = json.dumps(
                {"conn_type": "generic", "password": SECRET}
            )
        with AirflowStack(
            home=tmp / "airflow",
            dags_folder=ROOT / "dags",
            suites_dir=suites,
            components=("dag-processor", "api-server"),
            database_url=pg.url("airflow") if pg else None,
            env_extra=env,
        ) as stack:
            if pg is not None:  # the secret in the metadata database
                stack.airflow("connections", "add", "accelmatrix_github_webhook",
                              "--conn-type", "generic", "--conn-password", SECRET)  # fmt: skip
            stack.wait_for_dag(DAG_ID)
            total = args.hostile + args.legit
            # With a restart: deliveries paced over 3 outages' time, the outage in the middle.
            pace = 3 * args.db_restart / total if pg else 0.0
            down_at, up_at = (total // 3, None) if pg else (None, None)
            refused: dict[str, tuple[bytes, dict[str, str]]] = {}
            unanswered = misleading = 0
            github.delay_s = args.github_delay
            every = max(1, args.hostile // max(1, args.legit))
            legit_ids: list[str] = []
            started = time.monotonic()
            with httpx.Client(base_url=stack.client.base_url, timeout=60) as client:
                for k in range(total):
                    if k == down_at:
                        pg.take_down()
                        t_down = time.monotonic()
                    if (
                        up_at is None
                        and down_at is not None
                        and k > down_at
                        and (time.monotonic() - t_down >= args.db_restart)
                    ):
                        pg.bring_up()
                        up_at = k
                    time.sleep(pace)
                    if k % (every + 1) == every and len(legit_ids) < args.legit:
                        n = len(legit_ids) + 1
                        body = payload(n, legit_sha(n))
                        did = f"legit-{n}"
                        h = {"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": did,
                             "X-Hub-Signature-256": sign(body)}  # fmt: skip
                        REPLAYS[did] = (body, h)
                        legit_ids.append(did)
                        sent_at[legit_sha(n)] = time.monotonic()
                    else:
                        body, h = hostile(k, legit_ids)
                    t0 = time.monotonic()
                    try:
                        r = client.post("/accelmatrix/github/webhook", content=body, headers=h)
                    except httpx.TransportError:  # the api-server exited with its database
                        unanswered += 1
                        stack.revive_exited()
                        if h["X-GitHub-Delivery"].startswith("legit-"):
                            refused[h["X-GitHub-Delivery"]] = (body, h)
                        continue
                    answer.append(time.monotonic() - t0)
                    if h["X-GitHub-Delivery"].startswith("legit-"):
                        legit_answer.append(answer[-1])
                        if r.status_code >= 500:
                            refused[h["X-GitHub-Delivery"]] = (body, h)
                    if r.status_code == 403 and "no webhook secret" in r.text:
                        misleading += 1
                    statuses[r.status_code] += 1
                if pg is not None and up_at is None:
                    time.sleep(max(0.0, args.db_restart - (time.monotonic() - t_down)))
                    pg.bring_up()
                if pg is not None:
                    # A maintainer's "Redeliver" of every legitimate delivery that was
                    # refused, or accepted but whose work failed (forgotten: not a 409).
                    stack.revive_exited()
                    time.sleep(5)
                    for did, (body, h) in REPLAYS.items():
                        r = client.post("/accelmatrix/github/webhook", content=body, headers=h)
                        if r.status_code != 409:
                            refused[did] = (body, h)
            elapsed = time.monotonic() - started
            # The work after the answers: wait for every pending status (a slow GitHub
            # makes this long), then for the queue to drain.
            deadline = time.monotonic() + max(120.0, 60 * args.github_delay + 120)
            pending_at: dict[str, float] = {}
            while time.monotonic() < deadline and len(pending_at) < len(legit_ids):
                for st in list(github.statuses):
                    if st["state"] == "pending" and st["sha"] not in pending_at:
                        pending_at[st["sha"]] = st["at"]
                time.sleep(0.2)
            time.sleep(2 + 4 * args.github_delay)  # the queue's last GitHub calls
            runs = stack.api("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 1000})
            n_runs = runs["total_entries"]
            cancelled = sum(1 for r in runs["dag_runs"] if r["state"] == "failed")
    edited = sum(
        1 for c in github.calls if c.method == "PATCH"
        and any(c.path.endswith(f"/issues/comments/{cid}") for cid in planted)
    )  # fmt: skip
    per_pr: Counter[tuple[int, str]] = Counter()
    for body_ in (c for c in github.comments.values() if c["user"] == github.bot_login):
        kind = "report" if "pr-report" in body_["body"] else "refusal"
        per_pr[(body_["number"], kind)] += 1
    to_pending = [pending_at[s] - sent_at[s] for s in pending_at if s in sent_at]
    answer.sort()
    p99 = answer[min(len(answer) - 1, int(0.99 * len(answer)))]
    print(f"deliveries: {sum(statuses.values())} ({args.hostile} hostile, {len(legit_ids)} legit) "
          f"in {elapsed:.1f} s; GitHub answering after {args.github_delay:g} s")  # fmt: skip
    print("answers by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    print(f"runs started: {n_runs} (goal: exactly {args.legit})")
    print(f"runs cancelled: {cancelled} (goal: 0)")
    print(f"5xx answers: {sum(v for k, v in statuses.items() if k >= 500)} (goal: 0)")
    print(f"comments of others the bot edited: {edited} (goal: 0)")
    print(f"bot comments per pull request and kind: max {max(per_pr.values(), default=0)} "
          f"over {len(per_pr)} (goal: 1)")  # fmt: skip
    print(f"answer time: median {statistics.median(answer):.3f} s, p99 {p99:.3f} s, "
          f"max {answer[-1]:.3f} s (goal: p99 <= 1 s); legit max {max(legit_answer):.3f} s")  # fmt: skip
    print(f"pending statuses posted: {len(pending_at)} of {len(legit_ids)}")
    if pg is not None:
        print(f"metadata database down {args.db_restart:g} s from delivery {down_at}: "
              f"misleading 403s {misleading} (goal: 0); unanswered (api-server down) "
              f"{unanswered}; legitimate deliveries redelivered {len(refused)}")  # fmt: skip
    if to_pending:
        print(
            f"delivery -> pending status: median {statistics.median(to_pending):.3f} s, "
            f"max {max(to_pending):.3f} s"
        )
    ok = (
        misleading == 0
        and n_runs == args.legit and cancelled == 0 and edited == 0
        # With the database down, 503 is the truthful answer (GitHub's Redeliver retries).
        and (pg is not None or not any(k >= 500 for k in statuses)) and p99 <= 1.0
        and len(pending_at) == len(legit_ids)
    )  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
