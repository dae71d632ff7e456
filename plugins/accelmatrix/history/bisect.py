"""Which build between the last good one and the first bad one caused a confirmed change.

A nightly suite tests one build a night, but a weekly suite, skipped nights or per-commit
builds leave several untested builds between the last good run and the first bad one.
The search is a plain binary search over that ordered range, as Pinpoint runs it: test
the middle build, keep the half that still holds the change, repeat until the good and
bad ends are neighbours. Each step re-tests one build against the last good build,
interleaved, with the same repeats and test as the confirmation (``history.confirm``):

* confirmed (the middle build is worse than the good one) -> the culprit is at or before
  it;
* not reproduced -> the middle build is still good, the culprit is after it;
* undecided at the repeat cap -> the search stops as **ambiguous** and says at which build
  (a change that builds in over several builds, or noise too large for the cap).

``Bisect`` is pure state: the controller (``history.followup``) asks it for the next build
and feeds it each step's verdict; the store keeps its steps. It never runs more than
``max_steps(n)`` = ceil(log2 n) + 2 steps for n candidate builds (a binary search needs
ceil(log2 n); the two spare are for a step that had to be repeated after an
infrastructure failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from accelmatrix.history.confirm import CONFIRMED, NOT_REPRODUCED

__all__ = ["AMBIGUOUS", "FOUND", "Bisect", "Step", "max_steps"]

FOUND = "found"
AMBIGUOUS = "ambiguous"
RUNNING = "running"


def max_steps(candidates: int) -> int:
    """The most steps a bisect of ``candidates`` builds (those after the last good one, the
    known bad one included) may take."""
    if candidates <= 1:
        return 0
    return math.ceil(math.log2(candidates)) + 2


@dataclass
class Step:
    """One tested build: its index in the range, name, verdict and the medians seen."""

    index: int
    build: str
    verdict: str
    median_good: float | None = None
    median_build: float | None = None
    n: int = 0
    p_value: float | None = None


@dataclass
class Bisect:
    """A binary search over ``builds`` (oldest first): ``builds[0]`` is the last good build,
    ``builds[-1]`` the first build known bad (confirmed)."""

    builds: list[str]
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.builds) < 2:
            raise ValueError("a bisect needs the last good build and the first bad one")
        if len(set(self.builds)) != len(self.builds):
            raise ValueError(f"builds listed twice in the range: {self.builds}")

    @property
    def bounds(self) -> tuple[int, int]:
        """(last known good index, first known bad index) after the recorded steps."""
        lo, hi = 0, len(self.builds) - 1
        for s in self.steps:
            if s.verdict == CONFIRMED:
                hi = min(hi, s.index)
            elif s.verdict == NOT_REPRODUCED:
                lo = max(lo, s.index)
        return lo, hi

    @property
    def state(self) -> str:
        """running | found | ambiguous."""
        if any(s.verdict not in (CONFIRMED, NOT_REPRODUCED) for s in self.steps):
            return AMBIGUOUS
        lo, hi = self.bounds
        if lo >= hi:  # contradictory verdicts (a good build after a bad one)
            return AMBIGUOUS
        if hi - lo == 1:
            return FOUND
        if len(self.steps) >= max_steps(len(self.builds) - 1):
            return AMBIGUOUS
        return RUNNING

    def next_build(self) -> tuple[int, str] | None:
        """The build to test next (its index and name), or None when the search is over."""
        if self.state != RUNNING:
            return None
        lo, hi = self.bounds
        mid = (lo + hi) // 2
        return mid, self.builds[mid]

    def record(self, step: Step) -> None:
        """Add a step's outcome; it must be the build ``next_build`` named."""
        expected = self.next_build()
        if expected is None or expected[0] != step.index:
            raise ValueError(f"step for build {step.build!r} was not the one due ({expected})")
        self.steps.append(step)

    @property
    def culprit(self) -> str | None:
        """The first bad build, once found."""
        return self.builds[self.bounds[1]] if self.state == FOUND else None

    @property
    def last_good(self) -> str | None:
        """The last good build before the culprit, once found."""
        return self.builds[self.bounds[0]] if self.state == FOUND else None
