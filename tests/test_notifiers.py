"""Notifications through Airflow's notifiers and provider hooks, against real local servers
on 127.0.0.1: a webhook that fails once, and a small GitHub REST API that keeps issues."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from accelmatrix.notifications import dedup as alerts
from accelmatrix.notifications import transport as notify
from accelmatrix.notifications.notifiers import NotifyError
from accelmatrix.results.store import ResultsStore
from accelmatrix.spec.notify import AlertSink, WebhookNotify
from accelmatrix_testkit import records


class Server:
    """A real HTTP server on 127.0.0.1; ``answer(method, path, body)`` -> (status, json)."""

    def __init__(self, answer) -> None:
        self.received: list[tuple[str, str, dict[str, str], Any]] = []
        received, outer = self.received, self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                received.append((self.command, self.path, dict(self.headers), body))
                status, out = answer(self.command, self.path, body)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        outer.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def server_factory():
    servers: list[Server] = []

    def make(answer) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _http_conn(port: int, endpoint: str, password: str | None = None) -> str:
    conn: dict[str, Any] = {
        "conn_type": "http",
        "host": "127.0.0.1",
        "port": port,
        "schema": "http",
        "extra": {"endpoint": endpoint},
    }
    if password:
        conn["password"] = password
    return json.dumps(conn)


def test_webhook_fails_once_then_is_accepted_on_the_retry(server_factory, monkeypatch):
    posts = []

    def answer(method: str, path: str, body: Any) -> tuple[int, Any]:
        posts.append(body)
        return (503, {"error": "warming up"}) if len(posts) == 1 else (200, {"ok": True})

    srv = server_factory(answer)
    monkeypatch.setenv("AIRFLOW_CONN_CI_HOOK", _http_conn(srv.port, "/hooks/ci", "s3cret"))
    payload = {"dag_id": "tiered_ci", "state": "failed", "text": "x"}
    assert notify.send_webhook(WebhookNotify(conn_id="ci_hook"), payload) == 200
    assert len(srv.received) == 2  # the 503, then the accepted retry
    assert [r[1] for r in srv.received] == ["/hooks/ci", "/hooks/ci"]
    assert posts[0] == posts[1] == payload
    assert all(r[2]["Authorization"] == "Bearer s3cret" for r in srv.received)


def test_client_errors_are_not_retried(server_factory, monkeypatch):
    srv = server_factory(lambda m, p, b: (404, {"message": "Not Found"}))
    monkeypatch.setenv("AIRFLOW_CONN_CI_HOOK", _http_conn(srv.port, "/nope"))
    with pytest.raises(NotifyError, match="answered 404"):
        notify.send_webhook(WebhookNotify(conn_id="ci_hook"), {"a": 1})
    assert len(srv.received) == 1


def test_a_server_down_on_every_try_gives_up_after_the_attempts(server_factory, monkeypatch):
    srv = server_factory(lambda m, p, b: (502, {}))
    monkeypatch.setenv("AIRFLOW_CONN_CI_HOOK", _http_conn(srv.port, "/"))
    with pytest.raises(NotifyError, match="answered 502"):
        notify.send_webhook(WebhookNotify(conn_id="ci_hook"), {"a": 1})
    assert len(srv.received) == 3


class FakeGithub:
    """Issues of one repository, as GitHub's REST API answers for them (what PyGithub uses)."""

    def __init__(self) -> None:
        self.issues: dict[int, dict[str, Any]] = {}
        self.comments: dict[int, list[str]] = {}
        self.url = ""

    def _issue(self, n: int) -> dict[str, Any]:
        return {**self.issues[n], "number": n, "url": f"{self.url}/repos/acme/ml/issues/{n}"}

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:4] != ["repos", "acme", "ml", "issues"]:
            return 404, {"message": "Not Found"}
        if method == "POST" and len(parts) == 4:
            n = len(self.issues) + 1
            self.issues[n] = {"title": body["title"], "body": body["body"], "state": "open"}
            self.issues[n]["labels"] = [{"name": x} for x in body.get("labels", [])]
            return 201, self._issue(n)
        n = int(parts[4])
        if method == "GET" and len(parts) == 5:
            return 200, self._issue(n)
        if method == "POST" and parts[5:] == ["comments"]:
            self.comments.setdefault(n, []).append(body["body"])
            return 201, {"id": len(self.comments[n]), "body": body["body"]}
        if method == "PATCH" and len(parts) == 5:
            self.issues[n]["state"] = body.get("state", self.issues[n]["state"])
            return 200, self._issue(n)
        return 404, {"message": "Not Found"}


def test_a_resolved_alert_closes_its_github_issue(server_factory, monkeypatch, tmp_path):
    gh = FakeGithub()
    srv = server_factory(gh.answer)
    gh.url = srv.url
    monkeypatch.setenv(
        "AIRFLOW_CONN_GH",
        json.dumps({"conn_type": "github", "host": srv.url, "password": "ghp_token"}),
    )
    store = ResultsStore(f"sqlite:///{tmp_path / 'r.db'}")
    sink = AlertSink(conn_id="gh", format="github", repo="acme/ml", labels=["perf"])
    planned = [{"id": "model=a"}]
    t = datetime(2026, 3, 1, tzinfo=UTC)

    def gate(run_id: str, state: str, day: int) -> list[dict[str, Any]]:
        ev = alerts.update_alerts(
            store,
            "nightly",
            run_id,
            planned,
            {"model=a": records.cell("model=a", state=state, message=f"{state} in {run_id}")},
            run_url=f"http://airflow/runs/{run_id}",
            now=t + timedelta(days=day),
        )
        assert alerts.deliver([sink], ev, store) == len(ev)
        return ev

    assert [e["event"] for e in gate("r1", "failed", 0)] == ["opened"]
    assert gate("r2", "failed", 1) == []  # a plain recurrence: no noise
    assert list(gh.issues) == [1] and gh.issues[1]["state"] == "open"
    assert gh.issues[1]["title"].startswith("[accelmatrix] nightly model=a: failure")
    assert store.get_alert("nightly", "model=a").issues == {"gh:acme/ml": 1}

    assert [e["event"] for e in gate("r3", "passed", 2)] == ["resolved"]
    assert list(gh.issues) == [1]  # no new issue for the resolution
    assert gh.issues[1]["state"] == "closed"
    assert "resolved" in gh.comments[1][0]
    creates = [r for r in srv.received if r[0] == "POST" and r[1].endswith("/issues")]
    assert len(creates) == 1
    assert all(r[2]["Authorization"].endswith("ghp_token") for r in srv.received)

    # Failing again opens a new issue (the closed one stays closed).
    gate("r4", "failed", 3)
    assert gh.issues[1]["state"] == "closed" and gh.issues[2]["state"] == "open"
    assert store.get_alert("nightly", "model=a").issues == {"gh:acme/ml": 2}
    store.close()


def test_repo_is_only_for_github_sinks() -> None:
    with pytest.raises(ValueError, match="github only"):
        AlertSink(conn_id="s", format="slack", repo="acme/ml")
