"""Which build between the last good one and the first bad one caused a confirmed change.

A nightly suite tests one build a night, but a detector's change point is uncertain by a
night or two, and a weekly suite, skipped nights or per-commit builds leave several
untested builds between the last good run and the first bad one. Each build of that range
gets a **level**: measured on the re-test's machine against the last good build
(``history.retests.compare.level``), it sits at the old level, at the new one (nearer the
confirmed change than no change), or is not yet known.

Pinpoint halves the range one build at a time because each of its steps costs a new
machine. Here a session runs up to ``spec.followup.MAX_SESSION_BUILDS`` builds on one
machine, so the search tests every build of a short range at once, and a long one at
evenly spaced builds (a k-ary search: the range shrinks by the number of builds tested
per session, not by two). ``Search`` is pure state over the levels found so far; the
controller (``history.retests.followup``) runs the sessions and keeps the levels in the store.

The culprit is the first build at the new level after the last at the old one, once they
are neighbours. A build at the new level before one at the old level is a change that
does not hold (two changes, or one undone): the search stops as **ambiguous** and says
where, rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelmatrix.contracts.change_point_records import FOUND
from accelmatrix.history.retests.compare import NEW_LEVEL, OLD_LEVEL

__all__ = ["AMBIGUOUS", "FOUND", "RUNNING", "Search", "split_line", "spread"]

# FOUND lives with the record (contracts.change_point_records).
AMBIGUOUS = "ambiguous"
RUNNING = "running"


@dataclass
class Search:
    """The levels known over ``builds`` (oldest first): ``builds[0]`` is the last good
    build (the reference, at the old level by definition), ``builds[-1]`` the suspect
    build, at the new level once the change is confirmed."""

    builds: list[str]
    levels: dict[str, str]

    def __post_init__(self) -> None:
        if len(self.builds) < 2:
            raise ValueError("a search needs the last good build and the first bad one")
        if len(set(self.builds)) != len(self.builds):
            raise ValueError(f"builds listed twice in the range: {self.builds}")

    def _level(self, i: int) -> str | None:
        if i == 0:
            return OLD_LEVEL
        return self.levels.get(self.builds[i])

    @property
    def bounds(self) -> tuple[int, int]:
        """(last index at the old level, first index at the new level after it)."""
        n = len(self.builds)
        old = [i for i in range(n) if self._level(i) == OLD_LEVEL]
        lo = max(old)
        new = [i for i in range(lo + 1, n) if self._level(i) == NEW_LEVEL]
        return lo, (min(new) if new else n - 1)

    @property
    def contradiction(self) -> str | None:
        """A build at the new level before one at the old level, said in words; or None."""
        n = len(self.builds)
        new = [i for i in range(n) if self._level(i) == NEW_LEVEL]
        old = [i for i in range(n) if self._level(i) == OLD_LEVEL]
        if new and old and min(new) < max(old):
            return (
                f"{self.builds[min(new)]} is at the new level but the later "
                f"{self.builds[max(old)]} is back at the old one: the change does not hold"
            )
        return None

    @property
    def state(self) -> str:
        if self.contradiction is not None:
            return AMBIGUOUS
        lo, hi = self.bounds
        return FOUND if hi - lo == 1 and self._level(hi) == NEW_LEVEL else RUNNING

    def untested(self) -> list[str]:
        """The builds strictly between the bounds: where the culprit still may be."""
        lo, hi = self.bounds
        return self.builds[lo + 1 : hi]

    @property
    def culprit(self) -> str | None:
        return self.builds[self.bounds[1]] if self.state == FOUND else None

    @property
    def last_good(self) -> str | None:
        return self.builds[self.bounds[0]] if self.state == FOUND else None


def split_line(changes: list[float]) -> float:
    """The line between the old level and the new one, from every tested build's measured
    change against the last good build (oldest first; the last good build's own 0 first).

    Builds differ by themselves (1-2 % on real fleets), the last good build included, so
    "half the change from the last good build" puts a build that is slow by itself on the
    wrong side as often as the last good build happens to be fast. The best single split
    of the ordered changes (least squares, as a change point over the builds) gives the
    old level as the mean of the builds before it and the new level as the mean of those
    after; the line is halfway between. Each build's own offset then counts once, not
    twice."""
    x = [float(v) for v in changes]
    if len(x) < 2:
        raise ValueError("a split needs the last good build and one more")
    best: tuple[float, float] | None = None
    for k in range(1, len(x)):
        a, b = x[:k], x[k:]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        cost = sum((v - ma) ** 2 for v in a) + sum((v - mb) ** 2 for v in b)
        if best is None or cost < best[0]:
            best = (cost, (ma + mb) / 2)
    assert best is not None
    return best[1]


def spread(builds: list[str], room: int) -> list[str]:
    """At most ``room`` of ``builds``, evenly spaced (all of them when they fit)."""
    if room <= 0:
        return []
    if len(builds) <= room:
        return list(builds)
    step = (len(builds) + 1) / (room + 1)
    picks = sorted({min(len(builds) - 1, round(step * (k + 1)) - 1) for k in range(room)})
    return [builds[i] for i in picks]
