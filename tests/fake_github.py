"""A fake GitHub REST API on 127.0.0.1: records every call, answers the few the pull request
loop makes (the token's user, a pull request's state, collaborator permission, commit
statuses, issue comments), and can be taken down (every call answered 503) to play an
outage, or slowed down (every answer after ``delay_s``) to play a slow GitHub.

Comments have an author, as on GitHub: the bot's token writes as ``bot_login``; a comment
planted with ``add_comment`` by anyone else is refused to the bot's PATCH (403), as GitHub
refuses to let one user edit another's comment.

The product talks to it through Airflow's GitHub provider (PyGithub) with the connection's
host set to this server's URL, exactly as it would talk to GitHub Enterprise.
"""

from __future__ import annotations

import json
import re
import threading
import time
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
    """``permissions``: login -> permission (others: 404, not a collaborator). ``pulls``:
    number -> {head, state, labels} (others: 404), set with ``set_pull``."""

    permissions: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    # id -> {number, body, user}
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    statuses: list[dict[str, Any]] = field(default_factory=list)  # with "sha"
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    bot_login: str = "accelmatrix-bot"
    down: bool = False
    failing: str | None = None  # a path pattern answered 503 (an outage of one endpoint)
    delay_s: float = 0.0
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
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                with fake._lock:
                    fake.calls.append(Call(self.command, self.path, body))
                    if fake.down or (fake.failing and re.fullmatch(fake.failing, path)):
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

    def set_pull(
        self, number: int, head: str, *, state: str = "open", labels: tuple[str, ...] = ()
    ) -> None:
        """The pull request ``number`` as GitHub has it now."""
        with self._lock:
            self.pulls[number] = {"head": head, "state": state, "labels": list(labels)}

    def add_comment(self, number: int, body: str, user: str) -> int:
        """A comment written by ``user`` (not the bot); its id."""
        with self._lock:
            cid = 1000 + len(self.comments) + 1
            self.comments[cid] = {"number": number, "body": body, "user": user}
            return cid

    def _route(self, method: str, path: str, full: str, body: Any) -> tuple[int, Any]:
        if path == "/user" and method == "GET":
            return 200, {"login": self.bot_login, "type": "User"}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/pulls/(\d+)", path):
            pull = self.pulls.get(int(m.group(1)))
            if pull is None or method != "GET":
                return 404, {"message": "Not Found"}
            return 200, {
                "number": int(m.group(1)),
                "state": pull["state"],
                "head": {"sha": pull["head"]},
                "labels": [{"name": x} for x in pull["labels"]],
            }
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/collaborators/([^/]+)/permission", path):
            perm = self.permissions.get(m.group(1))
            if perm is None:
                return 404, {"message": "Not Found"}
            return 200, {"permission": perm, "user": {"login": m.group(1)}}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/statuses/([0-9a-f]+)", path):
            if method == "POST":
                # "at": when it was posted (time.monotonic), for the webhook bench.
                self.statuses.append({"sha": m.group(1), "at": time.monotonic(), **(body or {})})
                return 201, {"id": len(self.statuses), **(body or {})}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/comments", path):
            number = int(m.group(1))
            if method == "GET":
                page = int(re.search(r"page=(\d+)", full).group(1)) if "page=" in full else 1
                mine = [
                    {"id": i, "body": c["body"], "user": {"login": c["user"]}}
                    for i, c in sorted(self.comments.items())
                    if c["number"] == number
                ]
                return 200, mine[(page - 1) * 100 : page * 100]
            if method == "POST":
                cid = 1000 + len(self.comments) + 1
                self.comments[cid] = {"number": number, "body": body["body"],
                                      "user": self.bot_login}  # fmt: skip
                return 201, {"id": cid, "body": body["body"]}
        if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", path):
            cid = int(m.group(1))
            if method == "PATCH":
                if cid not in self.comments:
                    return 404, {"message": "Not Found"}
                if self.comments[cid]["user"] != self.bot_login:
                    return 403, {"message": "You must have push access to edit this comment"}
                self.comments[cid]["body"] = body["body"]
                return 200, {"id": cid, "body": body["body"]}
        return 404, {"message": f"no route {method} {path}"}

    def statuses_of(self, sha: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.statuses if s["sha"] == sha]

    def comments_on(self, number: int, *, by_bot: bool = True) -> list[str]:
        """The bodies of the comments on ``number`` (the bot's only, unless ``by_bot`` is
        False)."""
        with self._lock:
            return [
                c["body"]
                for _, c in sorted(self.comments.items())
                if c["number"] == number and (not by_bot or c["user"] == self.bot_login)
            ]

    def calls_to(self, method: str, pattern: str) -> int:
        """How many calls ``method`` made to a path matching ``pattern``."""
        with self._lock:
            return sum(
                1 for c in self.calls if c.method == method and re.fullmatch(pattern, c.path)
            )
