"""Pull requests on GitHub: the labeler's permission, commit statuses, one comment edited in
place. Talks to GitHub through Airflow's GitHub provider.

The client is the provider's ``GithubHook(github_conn_id).get_conn()`` (PyGithub): the token,
or a GitHub App installation, and the host for GitHub Enterprise are the connection's
business. Each operation here is one documented REST call made through that client's
requester (``Github.requester.requestJsonAndCheck``) rather than PyGithub's object model,
whose lazy-loading objects would add a GET of the repository or commit before each write:
one call per operation keeps the webhook's answer fast and what we send easy to read in a
trace. PyGithub's own retry (connection errors, 5xx) stays in force.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

# The login each connection's token acts as (GET /user), read once per process: it does not
# change while the connection's token stays, and the bot's own comments are found by it.
_logins: dict[str, str] = {}
_logins_lock = threading.Lock()

# GitHub's repository permission levels; these may push, so may vouch for a fork's head.
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
STATUS_STATES = ("pending", "success", "failure", "error")
MAX_DESCRIPTION = 140  # GitHub truncates nothing: it refuses a longer description (422)
MAX_COMMENT = 65_000  # GitHub refuses a comment body over 65,536 characters
# Seconds one GitHub call may take. PyGithub's default (15 s) is sized for a caller waiting
# on GitHub; ours run after the webhook answered, or in a gate, so a slow GitHub is waited
# for rather than given up on.
TIMEOUT_S = 60


class GithubError(Exception):
    """A GitHub call that failed: the status (0 when GitHub was not reached) and why."""

    def __init__(self, status: int, message: str):
        super().__init__(f"GitHub answered {status}: {message}" if status else message)
        self.status = status


@dataclass(frozen=True)
class PullRequestState:
    """A pull request as GitHub has it now (not as a delivery said it was)."""

    number: int
    state: str  # open | closed
    head_sha: str
    labels: tuple[str, ...]


class PullRequestHook:
    """One repository's pull requests, through the GitHub connection ``github_conn_id``."""

    def __init__(self, github_conn_id: str = "github_default"):
        self.github_conn_id = github_conn_id
        self._requester: Any = None

    def _call(self, verb: str, path: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        from github import GithubException

        if self._requester is None:
            from airflow.providers.github.hooks.github import GithubHook
            from github.Requester import Requester

            given = GithubHook(github_conn_id=self.github_conn_id).get_conn().requester
            self._requester = Requester(**{**given.kwargs, "timeout": TIMEOUT_S})
        try:
            _headers, data = self._requester.requestJsonAndCheck(
                verb, path, parameters=params or None, input=body
            )
        except GithubException as e:
            raise GithubError(e.status, _message(e.data)) from None
        except OSError as e:  # refused, reset, DNS, timeout: GitHub was not reached
            raise GithubError(0, f"GitHub not reached: {e}") from None
        return data

    def permission(self, repo: str, user: str) -> str:
        """``user``'s permission on ``repo`` (admin, maintain, write, triage, read, none)."""
        try:
            data = self._call(
                "GET", f"/repos/{_repo(repo)}/collaborators/{quote(user, safe='')}/permission"
            )
        except GithubError as e:
            if e.status == 404:  # not a collaborator at all
                return "none"
            raise
        return str((data or {}).get("permission") or "none")

    def login(self) -> str:
        """The login the connection's token acts as (``GET /user``), read once per process:
        the bot's own comments are those with its marker *and* this author."""
        with _logins_lock:
            known = _logins.get(self.github_conn_id)
        if known is not None:
            return known
        data = self._call("GET", "/user")
        login = str((data or {}).get("login") or "")
        if not login:
            raise GithubError(0, "GET /user answered no login: the bot's comments cannot be told")
        with _logins_lock:
            _logins[self.github_conn_id] = login
        return login

    def pull_request(self, repo: str, number: int) -> PullRequestState:
        """``repo#number`` as GitHub has it now: its state, head sha and labels."""
        data = self._call("GET", f"/repos/{_repo(repo)}/pulls/{int(number)}") or {}
        try:
            return PullRequestState(
                number=int(data["number"]),
                state=str(data["state"]),
                head_sha=str(data["head"]["sha"]).lower(),
                labels=tuple(
                    str(x["name"]) for x in data.get("labels") or [] if isinstance(x, dict)
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise GithubError(0, f"pull request {repo}#{number}: unexpected answer ({e})") from None

    def set_status(
        self, repo: str, sha: str, state: str, *, context: str, description: str, target_url: str
    ) -> None:
        """The commit status ``context`` of ``sha``."""
        if state not in STATUS_STATES:
            raise ValueError(f"status state {state!r}: allowed {', '.join(STATUS_STATES)}")
        self._call(
            "POST",
            f"/repos/{_repo(repo)}/statuses/{quote(sha, safe='')}",
            {
                "state": state,
                "context": context,
                "description": description[:MAX_DESCRIPTION],
                "target_url": target_url,
            },
        )

    def upsert_comment(
        self, repo: str, number: int, *, marker: str, body: str, comment_id: int | None = None
    ) -> int:
        """Edit the pull request's comment that carries ``marker`` (``comment_id`` when known,
        else found among its comments, written by the bot's own login), or post it: one
        comment per marker, whatever the number of runs. A marker in anyone else's comment
        is ignored: the bot never edits, nor is hidden by, a comment it did not write. Its
        id."""
        text = body if marker in body else f"{body}\n\n{marker}"
        if len(text) > MAX_COMMENT:
            text = text[: MAX_COMMENT - len(marker) - 30] + "\n\n(cut)\n\n" + marker
        if comment_id is None:
            comment_id = self._find_comment(repo, number, marker, self.login())
        if comment_id is not None:
            try:
                self._call(
                    "PATCH",
                    f"/repos/{_repo(repo)}/issues/comments/{int(comment_id)}",
                    {"body": text},
                )
                return int(comment_id)
            except GithubError as e:
                if e.status not in (403, 404):  # deleted, or not ours: post a new one
                    raise
        data = self._call(
            "POST", f"/repos/{_repo(repo)}/issues/{int(number)}/comments", {"body": text}
        )
        return int(data["id"])

    def _find_comment(self, repo: str, number: int, marker: str, author: str) -> int | None:
        for page in range(1, 31):  # 3,000 comments: further than any pull request goes
            data = self._call(
                "GET",
                f"/repos/{_repo(repo)}/issues/{int(number)}/comments",
                per_page=100,
                page=page,
            )
            for c in data or []:
                login = str(((c.get("user") or {}).get("login")) or "")
                if marker in (c.get("body") or "") and login.lower() == author.lower():
                    return int(c["id"])
            if not data or len(data) < 100:
                return None
        return None


def _repo(repo: str) -> str:
    owner, _, name = repo.partition("/")
    return f"{quote(owner, safe='')}/{quote(name, safe='')}"


def _message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("message") or data)[:300]
    return str(data)[:300]
