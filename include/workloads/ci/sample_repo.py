#!/usr/bin/env python
"""Publish include/workloads/ci_sample as a git repository with a good and a broken commit.

Why: the tiered_ci suite clones a project at a git ref, as CI does. On a machine without the
real project this makes one, so the demo and the tests exercise a real ``git clone`` and
``git checkout`` of a real history:

  v1 (branch main)  the sample project as shipped: lint clean, every test passes
  v2-broken         one commit later: ``median`` has an off-by-one bug (a unit test fails)
                    and an unused import (a lint finding)

``--if-missing``: do nothing when REPO already exists or is a URL (a real remote), so the
suite can run this as its first setup step and still test any repository.
Commands are argv lists; git runs with a fixed identity and no user or system config.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "ci_sample"
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache")
BUG = (
    "        return float(ordered[mid])\n",
    "        return float(ordered[mid - 1])  # off by one: the broken commit\n",
)


def git(*args: str, cwd: Path) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    exe = shutil.which("git")
    if exe is None:
        raise SystemExit("sample_repo: git is not installed")
    subprocess.run(  # noqa: S603 - argv list, fixed executable
        [exe, "-c", "user.name=accelmatrix", "-c", "user.email=ci@accelmatrix.invalid", *args],
        cwd=cwd,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def publish(repo: Path) -> None:
    """Create a bare repository at ``repo`` holding tags v1 and v2-broken."""
    with tempfile.TemporaryDirectory(prefix="ci-sample-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(SAMPLE, work, ignore=IGNORE)
        git("init", "--quiet", "--initial-branch=main", cwd=work)
        git("add", "-A", cwd=work)
        git("commit", "--quiet", "-m", "ci_sample v1", cwd=work)
        git("tag", "v1", cwd=work)
        stats = work / "ci_sample" / "stats.py"
        text = stats.read_text()
        assert BUG[0] in text, "the sample changed: update BUG"
        text = text.replace(BUG[0], BUG[1]).replace(
            "from collections.abc import Sequence\n",
            "import os\nfrom collections.abc import Sequence\n",
        )
        stats.write_text(text)
        git("commit", "--quiet", "-am", "median: 'simplify' (breaks a test and lint)", cwd=work)
        git("tag", "v2-broken", cwd=work)
        git("reset", "--quiet", "--hard", "v1", cwd=work)  # main stays at the good commit
        repo.parent.mkdir(parents=True, exist_ok=True)
        git("clone", "--quiet", "--bare", "--", str(work), str(repo), cwd=Path(tmp))
        git("push", "--quiet", "--tags", "--", str(repo), cwd=work)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", help="path of the bare repository to create")
    ap.add_argument("--if-missing", action="store_true")
    args = ap.parse_args(argv)
    if "://" in args.repo or args.repo.startswith("git@"):
        if args.if_missing:
            print(f"sample_repo: {args.repo} is a remote URL: nothing to publish")
            return 0
        ap.error("REPO must be a local path")
    repo = Path(args.repo)
    if repo.exists():
        if args.if_missing:
            print(f"sample_repo: {repo} exists: using it as it is")
            return 0
        ap.error(f"{repo} exists")
    publish(repo)
    print(f"sample_repo: published {SAMPLE} to {repo} (tags v1, v2-broken; main = v1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
