"""A GitHub webhook delivery judged: is it GitHub's, is it new, and which suite runs what.

Pure functions over the raw request (headers, body bytes) and the suites' ``github``
blocks: no Airflow, no network, so every refusal is tested without a server and the
endpoint (``ui.github_webhook``) only carries out the ``Decision``.

Rules, in the order they are applied (the first that refuses answers). The cheap ones come
first, so a flood of anonymous requests never costs a read of the secret:

1. A body over ``MAX_BODY`` (413), no well-formed ``X-Hub-Signature-256`` header (401), no
   ``X-GitHub-Delivery`` id (400).
2. No webhook secret configured: every delivery is refused (403). The secret is read only
   now (``secret`` may be a function; what it raises, the endpoint answers 503).
3. A wrong signature (401; an HMAC-SHA256 of the raw bytes, compared in constant time), or
   a body that is not a JSON object (400).
3. An event other than ``pull_request`` (``ping`` is answered), a repository or a label
   that no suite declares: 422, nothing started.
4. A ``pull_request`` that adds a suite's label, or a push (``synchronize``, ``reopened``)
   to a pull request that carries it: that suite runs the head commit. Closing a pull
   request that carries it cancels its runs still going. Other actions are answered 200
   with what was not done.
5. Trust is the endpoint's to check (it needs GitHub's answer): a head in a fork runs only
   when the label was just added by someone with write access (``needs_vouch``).
6. So is freshness (GitHub signs the body, not the delivery id, so a captured body can be
   sent again under a new id): ``stale`` says whether a delivery still describes the pull
   request as GitHub has it now, and ``action_key`` names what a delivery does, so the
   same thing is done once whatever the number of deliveries that ask for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# A record: the hook module imports no client at its top level.
from accelmatrix.hooks.github import PullRequestState

__all__ = [
    "MAX_BODY",
    "Decision",
    "action_key",
    "stale",
    "PullRequest",
    "SuiteTrigger",
    "decide",
    "run_id_for",
    "signature_ok",
]

# GitHub caps a delivery at 25 MB; a pull_request delivery is 20-60 KB. A megabyte leaves
# room for long descriptions and refuses anything built to exhaust the api-server.
MAX_BODY = 1 << 20
SHA_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")  # SHA-1, or SHA-256 repositories
SIGNATURE_RE = re.compile(r"^sha256=[0-9a-fA-F]{64}$")
# Pushes and re-openings run a pull request that already carries the label.
PUSH_ACTIONS = ("synchronize", "reopened")


@dataclass(frozen=True)
class SuiteTrigger:
    """A suite's ``github`` block, as the endpoint needs it."""

    dag_id: str
    repo: str
    label: str
    ref_param: str
    conn_id: str
    context: str
    compare: bool = False
    params: tuple[tuple[str, Any], ...] = ()  # other param values of the runs


@dataclass(frozen=True)
class PullRequest:
    """What a ``pull_request`` delivery says about the pull request and who acted."""

    repo: str
    number: int
    action: str
    head_sha: str
    head_repo: str
    base_ref: str
    base_sha: str
    sender: str
    labels: tuple[str, ...]
    added_label: str | None

    @property
    def fork(self) -> bool:
        """The head lives in another repository: its code is a stranger's until vouched."""
        return self.head_repo.lower() != self.repo.lower()


@dataclass(frozen=True)
class Decision:
    """What the endpoint answers, and which suites it starts for ``pull_request``.

    ``status``: the HTTP status. ``runs``: the suites to run on the head commit.
    ``needs_vouch``: the head is a fork's; each run needs the sender's write access (a
    label just added) or is refused with a comment (a push after the label).
    """

    status: int
    detail: str
    pull_request: PullRequest | None = None
    runs: tuple[SuiteTrigger, ...] = field(default_factory=tuple)
    needs_vouch: bool = False
    delivery_id: str | None = None
    event: str = ""


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (``sha256=<hex>``) is the HMAC-SHA256 of ``body`` under ``secret``,
    compared in constant time over the raw bytes (never a re-serialised JSON)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("ascii", "replace"))


def run_id_for(number: int, head_sha: str, kind: str = "verdict") -> str:
    """The run id of a pull request's head commit: fixed by (pull request, sha), so a
    redelivery, or a label removed and added again on the same commit, starts nothing more."""
    suffix = "" if kind == "verdict" else f"-{kind}"
    return f"pr-{int(number)}-{head_sha}{suffix}"


def decide(
    headers: Mapping[str, str],
    body: bytes,
    secret: str | None | Callable[[], str | None],
    triggers: Sequence[SuiteTrigger] | Callable[[], Sequence[SuiteTrigger]],
) -> Decision:
    """The endpoint's answer to one delivery (module docstring); ``headers`` lower-cased.
    ``secret`` and ``triggers`` may be functions: the secret is read only for a delivery
    that passed the cheap checks, the suites only for a signed ``pull_request`` one, so a
    flood of forged deliveries costs neither."""
    if len(body) > MAX_BODY:
        return Decision(413, f"delivery of {len(body)} bytes refused: at most {MAX_BODY}")
    signature = (headers.get("x-hub-signature-256") or "").strip()
    if not SIGNATURE_RE.match(signature):
        return Decision(401, "X-Hub-Signature-256 missing or wrong: not a delivery of this hook")
    delivery = (headers.get("x-github-delivery") or "").strip()
    if not delivery or len(delivery) > 200:
        return Decision(400, "X-GitHub-Delivery missing or longer than 200 characters")
    key = secret() if callable(secret) else secret
    if not key:
        return Decision(
            403,
            "no webhook secret configured: set the password of the Airflow connection "
            "accelmatrix_github_webhook to the webhook's secret; every delivery is refused "
            "until then",
        )
    if not signature_ok(key, body, signature):
        return Decision(401, "X-Hub-Signature-256 missing or wrong: not a delivery of this hook")
    event = (headers.get("x-github-event") or "").strip()
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Decision(400, "the body is not JSON", delivery_id=delivery, event=event)
    if not isinstance(payload, dict):
        return Decision(400, "the body is not a JSON object", delivery_id=delivery, event=event)
    if event == "ping":
        return Decision(200, "pong", delivery_id=delivery, event=event)
    if event != "pull_request":
        return Decision(
            422,
            f"event {event[:80]!r}: no suite runs on it (accelmatrix acts on pull_request)",
            delivery_id=delivery,
            event=event,
        )
    pr = _pull_request(payload)
    if pr is None:
        return Decision(
            400,
            "pull_request delivery without number, head sha, base or sender",
            delivery_id=delivery,
            event=event,
        )
    declared = triggers() if callable(triggers) else triggers
    of_repo = [t for t in declared if t.repo.lower() == pr.repo.lower()]
    if not of_repo:
        return Decision(
            422,
            f"repository {pr.repo[:140]!r}: no suite declares it (github.repo)",
            pr,
            delivery_id=delivery,
            event=event,
        )
    if pr.action == "labeled":
        runs = tuple(t for t in of_repo if t.label == pr.added_label)
        if not runs:
            labels = sorted({t.label for t in of_repo})
            return Decision(
                422,
                f"label {str(pr.added_label)[:60]!r}: no suite of {pr.repo} runs on it "
                f"(labels: {', '.join(labels)})",
                pr,
                delivery_id=delivery,
                event=event,
            )
    elif pr.action in (*PUSH_ACTIONS, "closed"):
        runs = tuple(t for t in of_repo if t.label in pr.labels)
        if not runs:
            return Decision(
                200, "no suite's label on this pull request", pr, delivery_id=delivery, event=event
            )
        if pr.action == "closed":  # closed or merged: its runs still going are cancelled
            return Decision(202, "closed", pr, runs, delivery_id=delivery, event=event)
    else:
        return Decision(
            200,
            f"action {pr.action[:40]!r}: nothing to run (runs on labeled, "
            + ", ".join(PUSH_ACTIONS)
            + "; cancels on closed)",
            pr,
            delivery_id=delivery,
            event=event,
        )
    return Decision(
        202, "accepted", pr, runs, needs_vouch=pr.fork, delivery_id=delivery, event=event
    )


def action_key(event: str, pr: PullRequest, label: str) -> str:
    """What a delivery does, for one suite's ``label``: (event, action, pull request, head
    sha, label). Done once: a replay under a new delivery id, or GitHub sending the same
    event twice, finds the key taken."""
    return f"{event}|{pr.action}|{pr.repo.lower()}#{pr.number}|{pr.head_sha}|{label}"


def stale(pr: PullRequest, now: PullRequestState, label: str) -> str | None:
    """Why ``pr`` (what a delivery says) no longer describes the pull request as GitHub has
    it ``now``, for the suite of ``label``; None when it does. A ``closed`` must find the
    pull request closed (a replay after a reopen finds it open); anything else must find it
    open, at the delivery's head sha (a replay after a push finds another head), and a
    ``labeled`` one with the label still on (a replay after the label was removed)."""
    if pr.action == "closed":
        return None if now.state == "closed" else f"#{pr.number} is {now.state} now"
    if now.state != "open":
        return f"#{pr.number} is {now.state} now"
    if now.head_sha != pr.head_sha:
        return (
            f"{pr.head_sha[:12]} is not the head of #{pr.number} any more ({now.head_sha[:12]} is)"
        )
    if label not in now.labels:
        return f"#{pr.number} no longer carries the label {label!r}"
    return None


def _pull_request(payload: dict[str, Any]) -> PullRequest | None:
    """The fields a decision needs, or None when one is missing or of the wrong type."""
    try:
        p = payload["pull_request"]
        head, base = p["head"], p["base"]
        repo = str(payload["repository"]["full_name"])
        head_repo = (head.get("repo") or {}).get("full_name") or ""
        number = p.get("number", payload.get("number"))
        sha = str(head["sha"]).lower()
        base_sha = str(base["sha"]).lower()
        sender = str(payload["sender"]["login"])
        labels = tuple(str(x["name"]) for x in p.get("labels") or [] if isinstance(x, dict))
        added = (payload.get("label") or {}).get("name")
    except (KeyError, TypeError, AttributeError):
        return None
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        return None
    if not SHA_RE.match(sha) or not SHA_RE.match(base_sha) or not sender:
        return None
    return PullRequest(
        repo=repo,
        number=number,
        action=str(payload.get("action") or ""),
        head_sha=sha,
        # A deleted fork has no head repo: a stranger's code all the same.
        head_repo=str(head_repo) or "(deleted fork)",
        base_ref=str(base.get("ref") or ""),
        base_sha=base_sha,
        sender=sender,
        labels=labels,
        added_label=str(added) if added is not None else None,
    )
