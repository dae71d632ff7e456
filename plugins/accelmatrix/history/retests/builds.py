"""The builds between two builds: what a bisect searches.

A suite names the build under test with ``runtime_version`` (``nightly-${run.ds}``: the
build of the run's logical date). Between the last good build and the first bad one:

* for a build named by its date (the template uses ``${run.ds}`` or ``${run.ds_nodash}``),
  the builds of the days in between: nothing to write in the suite;
* otherwise the suite's ``builds.list``, an argv command (never a shell) whose arguments
  may hold ``${from}`` and ``${to}``; it prints the build ids between them, one per line,
  oldest first (the two ends may be printed or not).

The answer always starts with the good build and ends with the bad one.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from datetime import date, datetime, timedelta

__all__ = ["MAX_BUILDS", "BuildsError", "builds_between", "date_template"]

# A range longer than this is refused: 1,024 builds take 10 bisect steps, and a list that
# long from a command is more likely a wrong command than a real range.
MAX_BUILDS = 1024
LIST_TIMEOUT_S = 60

_DATE = {
    "${run.ds}": (r"(\d{4}-\d{2}-\d{2})", "%Y-%m-%d"),
    "${run.ds_nodash}": (r"(\d{8})", "%Y%m%d"),
}
_PLACEHOLDER = re.compile(r"\$\{[^}]+\}")


class BuildsError(ValueError):
    """The builds between two builds could not be listed (the message says why)."""


def date_template(template: str | None) -> tuple[re.Pattern[str], str] | None:
    """(pattern matching a build name, date format) when ``template`` names builds by the
    run's date; None otherwise. Other placeholders match anything (a param in the name)."""
    if not template:
        return None
    found = [k for k in _DATE if k in template]
    if len(found) != 1:
        return None
    key = found[0]
    group, fmt = _DATE[key]
    parts = []
    pos = 0
    for m in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[pos : m.start()]))
        parts.append(group if m.group(0) == key else r".*?")
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(parts) + "$"), fmt


def builds_between(
    good: str,
    bad: str,
    *,
    template: str | None,
    list_command: Sequence[str] | None = None,
    source: str = "the suite",
) -> list[str]:
    """``[good, ..., bad]``: every build from the last good one to the first bad one."""
    if good == bad:
        raise BuildsError(f"the last good and the first bad build are the same: {good!r}")
    if list_command:
        return _from_command(good, bad, list_command, source)
    dated = date_template(template)
    if dated is None:
        raise BuildsError(
            f"{source}: cannot list the builds between {good!r} and {bad!r}: runtime_version "
            f"{template!r} does not name builds by ${{run.ds}} or ${{run.ds_nodash}}; add "
            "`builds: {list: [argv...]}` printing the builds between ${from} and ${to}"
        )
    pattern, fmt = dated
    mg, mb = pattern.match(good), pattern.match(bad)
    if not mg or not mb:
        raise BuildsError(
            f"{source}: build {good if not mg else bad!r} does not match runtime_version "
            f"{template!r}"
        )
    d0 = datetime.strptime(mg.group(1), fmt).date()
    d1 = datetime.strptime(mb.group(1), fmt).date()
    if d1 <= d0:
        raise BuildsError(f"{source}: build {bad!r} is not after {good!r}")
    days = (d1 - d0).days
    if days + 1 > MAX_BUILDS:
        raise BuildsError(
            f"{source}: {days + 1} builds from {good!r} to {bad!r}: at most {MAX_BUILDS}"
        )
    start, end = mb.span(1)

    def named(d: date) -> str:
        return bad[:start] + d.strftime(fmt) + bad[end:]

    return [good, *(named(d0 + timedelta(days=k)) for k in range(1, days)), bad]


def _from_command(good: str, bad: str, command: Sequence[str], source: str) -> list[str]:
    argv = [a.replace("${from}", good).replace("${to}", bad) for a in command]
    try:
        done = subprocess.run(  # noqa: S603 (argv list from the suite, no shell)
            argv, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildsError(f"{source}: builds.list {argv} did not run: {e}") from None
    if done.returncode != 0:
        raise BuildsError(
            f"{source}: builds.list {argv} exited with {done.returncode}: "
            f"{done.stderr.strip()[-500:]}"
        )
    inner = [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
    inner = [b for b in inner if b not in (good, bad)]
    out = [good, *inner, bad]
    if len(set(out)) != len(out):
        raise BuildsError(f"{source}: builds.list {argv} printed a build twice")
    if len(out) > MAX_BUILDS:
        raise BuildsError(f"{source}: builds.list printed {len(out)} builds: at most {MAX_BUILDS}")
    return out
