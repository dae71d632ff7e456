"""A fake GitHub REST API on 127.0.0.1: records every call, answers the few the pull request
loop makes (collaborator permission, commit statuses, issue comments), and can be taken
down (every call answered 503) to play an outage.

The product talks to it through Airflow's GitHub provider (PyGithub) with the connection's
host set to this server's URL, exactly as it would talk to GitHub Enterprise.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    body: Any


@dataclass
class FakeGithub:
    """``permissions``: login -> permission (others: 404, not a collaborator)."""

    permissions: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> {number, body}
    statuses: list[dict[str, Any]] = field(default_factory=list)  # with "sha"
    down: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def conn_uri_json(self) -> str:
        """The Airflow GitHub connection (JSON form of AIRFLOW_CONN_<ID>) to this server."""
        return json.dumps({"conn_type": "github", "password": "fake-token", "host": self.url})

    def __enter__(self) -> FakeGithub:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self, status: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                path = self.path.split("?")[0]
                with fake._lock:
                    fake.calls.append(Call(self.command, self.path, body))
                    if fake.down:
                        return self._answer(503, {"message": "Service Unavailable"})
                    status, data = fake._route(self.command, path, self.path, body)
                self._answer(status, data)

            do_GET = do_POST = do_PATCH = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def _route(self, method: str, path: str, full: str, body: Any) -> tuple[int, Any]:
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/collaborators/([^/]+)/permission", path):
            perm = self.permissions.get(m.group(1))
            if perm is None:
                return 404, {"message": "Not Found"}
            return 200, {"permission": perm, "user": {"login": m.group(1)}}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/statuses/([0-9a-f]+)", path):
            if method == "POST":
                self.statuses.append({"sha": m.group(1), **(body or {})})
                return 201, {"id": len(self.statuses), **(body or {})}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/comments", path):
            number = int(m.group(1))
            if method == "GET":
                page = int(re.search(r"page=(\d+)", full).group(1)) if "page=" in full else 1
                mine = [
                    {"id": i, "body": c["body"]}
                    for i, c in sorted(self.comments.items())
                    if c["number"] == number
                ]
                return 200, mine[(page - 1) * 100 : page * 100]
            if method == "POST":
                cid = 1000 + len(self.comments) + 1
                self.comments[cid] = {"number": number, "body": body["body"]}
                return 201, {"id": cid, "body": body["body"]}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", path):
            cid = int(m.group(1))
            if method == "PATCH":
                if cid not in self.comments:
                    return 404, {"message": "Not Found"}
                self.comments[cid]["body"] = body["body"]
                return 200, {"id": cid, "body": body["body"]}
        return 404, {"message": f"no route {method} {path}"}

    def statuses_of(self, sha: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.statuses if s["sha"] == sha]

    def comments_on(self, number: int) -> list[str]:
        with self._lock:
            return [c["body"] for _, c in sorted(self.comments.items()) if c["number"] == number]
