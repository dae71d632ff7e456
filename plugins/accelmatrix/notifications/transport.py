"""Failure notifications: a JSON POST to a webhook when a run has failed cells.

Replaces "open a GitHub issue with a link to the logs" of the nightly CI this project
supersedes: the payload carries the link to the Airflow run, every failed cell with its
failed checks, and the failed tests by name (read from the cells' JUnit reports), so the
reader knows what broke without opening anything. Sent once per run, by the gate.

The target comes from an Airflow connection (see spec/notify.py), the run link from Airflow's
``[api] base_url``. Delivery goes through Airflow notifiers (notifications/notifiers.py: the http
provider's HttpHook with retries, the github provider for issues). ``post_json`` stays a
one-shot ``urllib`` POST for callers that hold a URL rather than a connection.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from accelmatrix.contracts.change_point_records import ChangeGroup, ChangePoint, Confirmation
from accelmatrix.masking import mask_connection
from accelmatrix.metrics.junit import parse_junit_glob
from accelmatrix.notifications.notifiers import GithubIssueNotifier, HttpJsonNotifier, NotifyError
from accelmatrix.spec.notify import WebhookNotify

log = logging.getLogger(__name__)

__all__ = ["NotifyError", "build_payload", "post_json", "run_url", "send_webhook", "webhook_target"]

MAX_TESTS_PER_CELL = 50


# NotifyError is defined with the notifiers (which raise it) and re-exported here.


def run_url(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """The run's page in the Airflow UI: ``{[api] base_url}/dags/{dag_id}/runs/{run_id}``."""
    if base_url is None:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="") or "http://localhost:8080"
    return f"{base_url.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def webhook_target(conn_id: str) -> tuple[str, dict[str, str]]:
    """(url, headers) of an Airflow HTTP connection; a password becomes a bearer token."""
    from airflow.sdk import Connection

    conn = Connection.get(conn_id)
    mask_connection(conn_id)
    if not conn.host:
        raise NotifyError(f"connection {conn_id!r} has no host")
    scheme = conn.schema if conn.schema in ("http", "https") else "http"
    host = conn.host if "://" in conn.host else f"{scheme}://{conn.host}"
    if conn.port:
        host = f"{host}:{conn.port}"
    endpoint = str(conn.extra_dejson.get("endpoint") or "/")
    url = host.rstrip("/") + "/" + endpoint.lstrip("/")
    headers = {"Content-Type": "application/json"}
    if conn.password:
        headers["Authorization"] = f"Bearer {conn.password}"
    return url, headers


def post_json(url: str, payload: dict[str, Any], headers: dict[str, str], timeout: float) -> int:
    """POST ``payload`` as JSON; the HTTP status, or NotifyError for anything but 2xx."""
    if not url.startswith(("http://", "https://")):
        raise NotifyError(f"webhook URL must be http(s), got {url.split(':', 1)[0]!r}")
    body = json.dumps(payload, default=str).encode()
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            return int(resp.status)
    except urllib.error.HTTPError as e:
        raise NotifyError(f"webhook answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        raise NotifyError(f"webhook unreachable: {e}") from None


def failed_tests(junit_globs: list[str], files_dir: Any) -> list[str]:
    """``classname::name (failure: first line)`` of every failed test in a cell's JUnit
    reports (``junit_globs``: the globs of its ``junit`` checks)."""
    from pathlib import Path

    out: list[str] = []
    for glob in junit_globs:
        result, _ = parse_junit_glob(Path(files_dir), glob)
        out.extend(str(f) for f in result.failures)
    return out[:MAX_TESTS_PER_CELL]


def build_payload(
    *,
    dag_id: str,
    run_id: str,
    state: str,
    failed_cells: list[dict[str, Any]],
    git_ref: str | None = None,
    cost: float | None = None,
    base_url: str | None = None,
) -> dict[str, Any]:
    """The JSON body: what failed and where to look."""
    lines = [f"{dag_id} run {run_id}: {state}"]
    for c in failed_cells:
        lines.append(f"- {c['cell']} ({c['state']})")
        lines += [f"  - test {t}" for t in c.get("failed_tests", [])]
    url = run_url(dag_id, run_id, base_url)
    lines.append(url)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "state": state,
        "run_url": url,
        "git_ref": git_ref,
        "cost": cost,
        "failed_cells": failed_cells,
        "text": "\n".join(lines),
    }


def send_webhook(spec: WebhookNotify, payload: dict[str, Any]) -> int:
    """POST the run summary through the connection, retrying 5xx/429/unreachable."""
    notifier = HttpJsonNotifier(
        http_conn_id=spec.conn_id, payload=payload, timeout=spec.timeout_seconds
    )
    notifier.notify({})
    log.info("notified webhook %s (HTTP %s)", spec.conn_id, notifier.status)
    return int(notifier.status or 0)


# -- per-cell alerts (dedup.py decides when; these say what) ---------------------
def alert_text(alert: dict[str, Any]) -> tuple[str, str]:
    """(one-line title, markdown body) of an alert event, shared by every sink format."""
    verb = {"opened": "failing", "recurred": "still failing", "resolved": "resolved"}[
        alert["event"]
    ]
    kind = "perf regression" if alert["kind"] == "regression" else "failure"
    if alert["event"] == "resolved":
        title = f"[accelmatrix] {alert['dag_id']} {alert['cell_id']}: resolved"
    else:
        title = f"[accelmatrix] {alert['dag_id']} {alert['cell_id']}: {kind} ({verb})"
    lines = [
        f"*Suite* `{alert['dag_id']}`, *cell* `{alert['cell_id']}`: {verb}",
        f"*State* {alert.get('state') or '-'}; occurrences {alert['recurrences']} "
        f"since {alert['opened_at']}",
    ]
    if alert.get("message"):
        lines.append(f"> {alert['message'][:500]}")
    for t in alert.get("trend") or []:
        lines.append(
            f"- {t['benchmark']} {t['metric']}: "
            + ", ".join(f"{p['value']:.6g}{' (out)' if p['violated'] else ''}" for p in t["points"])
            + f" vs bounds [{t['lower']:.6g}, {t['upper']:.6g}]"
        )
    lines.append(f"Run: {alert['run_url']}")
    return title, "\n".join(lines)


def slack_payload(alert: dict[str, Any]) -> dict[str, Any]:
    """Slack incoming-webhook body: ``text`` (notification fallback) and Block Kit blocks."""
    title, body = alert_text(alert)
    return {
        "text": title,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"<{alert['run_url']}|Airflow run>"}],
            },
        ],
    }


def github_payload(alert: dict[str, Any], labels: list[str]) -> dict[str, Any]:
    """GitHub "create an issue" body, for a github sink without ``repo`` (each event POSTed
    as a new issue). A sink with ``repo`` keeps one issue per alert (send_github_issue)."""
    title, body = alert_text(alert)
    return {
        "title": title[:256],
        "body": body.replace("*", "**"),
        "labels": [*labels, alert["kind"], alert["event"]],
    }


def issue_key(sink: Any) -> str:
    """Key of a sink's issue in ``alerts.issues``."""
    return f"{sink.conn_id}:{sink.repo}"


def send_github_issue(sink: Any, alert: dict[str, Any], store: Any = None) -> int | None:
    """Keep the alert's one issue in ``sink.repo`` in step; returns its number.

    opened: a new issue (a re-opened alert gets a new one; the old stays closed);
    recurred (escalated to a regression): a comment on the open issue; resolved: a comment,
    then the issue is closed, never a new issue. The number lives in the alert's row
    (``alerts.issues``), so the gate of a later run finds it.
    """
    title, body = alert_text(alert)
    body = body.replace("*", "**")
    row = store.get_alert(alert["dag_id"], alert["cell_id"]) if store is not None else None
    issues = dict((row.issues if row is not None else None) or {})
    key = issue_key(sink)
    number = None if alert["event"] == "opened" else issues.get(key)
    if number is None and alert["event"] == "resolved":
        log.info("alert %s resolved: no issue of %s to close", alert["cell_id"], key)
        return None
    notifier = GithubIssueNotifier(
        github_conn_id=sink.conn_id,
        repo=sink.repo,
        title=title[:256],
        body=body,
        labels=[*sink.labels, alert["kind"]],
        issue_number=number,
        close=alert["event"] == "resolved",
    )
    notifier.notify({})
    if store is not None and notifier.issue_number != number:
        issues[key] = notifier.issue_number
        store.upsert_alert(alert["dag_id"], alert["cell_id"], issues=issues)
    log.info(
        "alert %s %s: issue %s#%s",
        alert["cell_id"],
        alert["event"],
        sink.repo,
        notifier.issue_number,
    )
    return notifier.issue_number


def send_alert(sink: Any, alert: dict[str, Any], store: Any = None) -> int:
    """Deliver one alert event to one sink (spec.notify.AlertSink) in its format."""
    if sink.format == "github" and sink.repo:
        send_github_issue(sink, alert, store)
        return 200
    headers: dict[str, str] = {}
    if sink.format == "github":
        payload = github_payload(alert, list(sink.labels))
        headers["Accept"] = "application/vnd.github+json"
    else:
        payload = slack_payload(alert)
    notifier = HttpJsonNotifier(
        http_conn_id=sink.conn_id, payload=payload, headers=headers, timeout=sink.timeout_seconds
    )
    notifier.notify({})
    log.info(
        "alert %s %s sent to %s (HTTP %s)",
        alert["cell_id"],
        alert["event"],
        sink.conn_id,
        notifier.status,
    )
    return int(notifier.status or 0)


# -- change groups (accelmatrix.history.series.grouping decides what; these say it) ----------------
def history_url(dag_id: str, group_id: int | None = None, base_url: str | None = None) -> str:
    """The suite's history page on the matrix page (the trend charts and the group list)."""
    if base_url is None:
        from airflow.configuration import conf

        base_url = conf.get("api", "base_url", fallback="") or "http://localhost:8080"
    url = f"{base_url.rstrip('/')}/accelmatrix/suites/{quote(dag_id, safe='')}/history"
    return url + (f"#group-{group_id}" if group_id is not None else "")


def group_event(
    group: ChangeGroup,
    points: list[ChangePoint],
    confirmation: Confirmation | None = None,
) -> dict[str, Any]:
    """The notification of a change group: the cause, its size, builds and links, and its
    re-test (``history.retests.followup``): verdict, culprit build, bisect steps."""
    dag_id = group.dag_id
    retest = None
    if confirmation is not None:
        retest = {
            "state": confirmation.state,
            "good_build": confirmation.good_build,
            "suspect_build": confirmation.suspect_build,
            "culprit": confirmation.culprit,
            "last_good": confirmation.last_good,
            "reason": confirmation.reason,
            "decision": confirmation.decision,
            "steps": confirmation.steps or [],
            "runs": list(confirmation.run_ids or []),
        }
    return {
        "confirmation": retest,
        "dag_id": dag_id,
        "group_id": group.id,
        "kind": group.kind,
        "direction": group.direction,
        "summary": group.summary,
        "series_count": group.series_count,
        "cells": list(group.cells),
        "machines": list(group.machines),
        "build": group.runtime_version,
        "previous_build": group.prev_runtime_version,
        "logical_date": group.logical_date.isoformat(),
        "change_median": group.change_median,
        "run_url": run_url(dag_id, group.run_id) if group.run_id else "",
        "trend_url": history_url(dag_id, group.id),
        "points": [
            {
                "cell_id": p.cell_id,
                "metric": p.metric,
                "machine": p.machine,
                "before": p.median_before,
                "after": p.median_after,
                "change": p.change,
                "p_value": p.p_value,
                "run_url": run_url(dag_id, p.run_id),
            }
            for p in points
        ],
    }


def group_text(ev: dict[str, Any]) -> tuple[str, str]:
    """(one-line title, markdown body) of a change-group notification."""
    cause = {"build": "build", "infrastructure": "infrastructure", "series": "series"}[ev["kind"]]
    title = f"[accelmatrix] {ev['dag_id']}: perf {ev['direction']} ({cause}): {ev['summary']}"
    retest = ev.get("confirmation") or {}
    if retest.get("culprit"):
        title += f"; {retest['state']}: first bad build {retest['culprit']}"
    elif retest:
        title += f"; re-test: {retest['state'].replace('_', ' ')}"
    lines = [
        f"*Suite* `{ev['dag_id']}`: {ev['summary']}",
        f"*Builds* {ev['previous_build'] or '-'} -> {ev['build'] or '-'} "
        f"(first at logical date {ev['logical_date'][:10]})",
        f"*Series* {ev['series_count']} in {len(ev['cells'])} cell(s) on "
        f"{', '.join(ev['machines']) or '-'}",
    ]
    for p in ev["points"][:20]:
        lines.append(
            f"- `{p['cell_id']}` {p['metric']}: {p['before']:.6g} -> {p['after']:.6g} "
            f"({p['change']:+.1%}, p={p['p_value']:.2g}) <{p['run_url']}|run>"
        )
    if len(ev["points"]) > 20:
        lines.append(f"- ... and {len(ev['points']) - 20} more")
    if (c := ev.get("confirmation")) is not None:
        lines.append(f"*Re-test* {c['state']}: {c['good_build']} vs {c['suspect_build']}")
        for d in (c.get("decision") or {}).values():
            lines.append(
                f"- medians {d['median_good']:.6g} -> {d['median_suspect']:.6g} "
                f"({d['change']:+.1%}, p={d['p_worse']:.2g}, {d['n_good']} + "
                f"{d['n_suspect']} runs): {d['verdict']}"
            )
        for step in c["steps"]:
            lines.append(f"- bisect {step['build']}: {step['verdict']} ({step['n']} runs)")
        if c.get("culprit"):
            lines.append(f"*First bad build* {c['culprit']} (last good {c['last_good']})")
        lines += _profile_lines(c.get("decision") or {})
        if c.get("reason"):
            lines.append(f"_{c['reason']}_")
    lines.append(f"Trend: {ev['trend_url']}")
    return title, "\n".join(lines)


def _profile_lines(decision: dict[str, Any]) -> list[str]:
    """The culprit report (history.culprits.culprit_profile stores it with the decision, its text
    ready): the cause's class with its sibling evidence, and the op-level diff of the
    culprit against the last good build (the verdict and the top 3 ops, or why there is
    none). Each line once: targets of one cell share their traces."""
    lines: list[str] = []
    for d in decision.values():
        if a := d.get("attribution"):
            text = f"*Cause* {a['summary']}"
            if text not in lines:
                lines.append(text)
    for d in decision.values():
        p = d.get("profile")
        if not p:
            continue
        text = f"*Ops* {p['good']} -> {p['bad']}: " + (p.get("summary") or f"_{p.get('error')}_")
        if text not in lines:
            lines.append(text)
    return lines


def send_change_group(sink: Any, ev: dict[str, Any]) -> int:
    """Deliver one change-group notification to one sink, in its format (a github sink
    with a repo gets a new issue for the group)."""
    title, body = group_text(ev)
    labels = [*getattr(sink, "labels", []), "perf", ev["direction"], ev["kind"]]
    if sink.format == "github" and sink.repo:
        notifier = GithubIssueNotifier(
            github_conn_id=sink.conn_id,
            repo=sink.repo,
            title=title[:256],
            body=body.replace("*", "**"),
            labels=labels,
            issue_number=None,
            close=False,
        )
        notifier.notify({})
        return 200
    if sink.format == "github":
        payload: dict[str, Any] = {
            "title": title[:256],
            "body": body.replace("*", "**"),
            "labels": labels,
        }
        headers = {"Accept": "application/vnd.github+json"}
    else:
        payload = {
            "text": title,
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
                {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
                {
                    "type": "context",
                    "elements": [{"type": "mrkdwn", "text": f"<{ev['trend_url']}|trend>"}],
                },
            ],
            "accelmatrix": ev,
        }
        headers = {}
    notifier = HttpJsonNotifier(
        http_conn_id=sink.conn_id, payload=payload, headers=headers, timeout=sink.timeout_seconds
    )
    notifier.notify({})
    log.info(
        "change group %s of %s sent to %s (HTTP %s)",
        ev["group_id"],
        ev["dag_id"],
        sink.conn_id,
        notifier.status,
    )
    return int(notifier.status or 0)
