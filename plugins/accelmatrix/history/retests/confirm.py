"""Is a suspect change real? The re-test's policy, and the rule that makes a newest point a
suspect.

A change point says "from build S on, this series sits ``claimed`` worse than it did up to
build G". The nightly points behind it came from different nights and different machines:
a lone bad night, a noisy host or a two-night blip look the same as a real step until more
nights arrive. Chromeperf's answer (its "sandwich" verification) is to re-run both builds
now, interleaved, and let a statistical test decide before anybody is paged. Here both
builds, and the builds between them, run on **one machine per suspect cell**
(``spec.followup``), and ``history.retests.compare`` judges them by the size of the change:

* **confirmed**: the suspect build sits at the new level (its interval against the last
  good build lies beyond half the claimed change, and significantly so);
* **not reproduced**: it sits at the old level (its interval lies below half the claim):
  whatever the nightly points saw, the builds do not differ by it;
* **undecided**: neither yet. The re-test adds ``pairs`` more pairs (a session on a
  machine of its own, pooled with the earlier pairs) up to ``max_pairs`` per build, and
  undecided at the cap is reported as such (no page).

Each look at the pooled pairs is judged at the critical value that keeps the verdict's
error rate over every look the re-test may take, and over every series of the group
(``Policy.critical``, ``history.retests.sequential``): a change on the line is called wrong no
more often after four sessions than after one.

``Policy`` is the suite's ``history.confirm`` block in the controller's terms. Its
thresholds are fixed, not fitted to any one series: bench/bench_confirm.py prints the
confirmation rate of real changes, the false confirmations and the pairs they needed on
generated fleets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from accelmatrix.contracts.change_point_records import CONFIRMED, NOT_REPRODUCED
from accelmatrix.history.retests.sequential import ONE_SIDED_ALPHA, critical_z
from accelmatrix.history.series.detector import noise_sigma

__all__ = [
    "CONFIRMED",
    "NOT_REPRODUCED",
    "UNDECIDED",
    "Policy",
    "newest_point_suspect",
]

# CONFIRMED and NOT_REPRODUCED live with the record (contracts.change_point_records).
UNDECIDED = "undecided"


@dataclass(frozen=True)
class Policy:
    """How a suspect change is re-tested: pairs per build in each session, and the most
    pairs per build over all sessions."""

    pairs: int = 10
    max_pairs: int = 40
    # The line a confirm judges the suspect build by is half the claimed change, but never
    # above this: a claim from one or two nights after a step overstates it (a lone point
    # 3 sigmas out carries its own noise), and a re-test must not dismiss a real 6 % step
    # because the night claimed 12 %.
    min_change: float = 0.02

    def confirm_line(self, claimed: float) -> float:
        """Where the suspect build's change must lie beyond to be confirmed."""
        return min(abs(claimed) / 2, self.min_change)

    def critical(self, looks: Sequence[int], targets: int = 1) -> tuple[float, float]:
        """(z_new, z_old): the critical values a build's interval is judged at after looks
        at ``looks`` pooled pairs (every session so far, oldest first), up to
        ``max_pairs``, so that each verdict keeps its one-look error rate however many
        sessions it took (``history.retests.sequential``). ``targets``: the series judged together,
        any of which confirms the group (the new level's side is shared among them); the
        old level needs every one of them, so its side is not."""
        z_new = critical_z(looks, self.max_pairs, ONE_SIDED_ALPHA / max(1, targets))
        z_old = critical_z(looks, self.max_pairs, ONE_SIDED_ALPHA)
        return z_new, z_old


# The newest point is a suspect when it lies this many noise sigmas worse than the level of
# the nights before it: about 1 night in 740 per series on Gaussian noise, each costing one
# confirm run (not a page), so a step is re-tested the night it lands instead of after the
# detector has seen enough nights at the new level to report it.
SUSPECT_SIGMAS = 3.0
# ... judged against the median of this many nights before it, with this many at least.
SUSPECT_BASELINE = 14
SUSPECT_MIN_HISTORY = 8


def newest_point_suspect(
    values: Sequence[float],
    *,
    higher_is_better: bool = False,
    min_change: float = 0.0,
    sigmas: float = SUSPECT_SIGMAS,
) -> tuple[float, float] | None:
    """(claimed relative change, effect in sigmas) when the newest of ``values`` (finite,
    oldest first) lies ``sigmas`` noise sigmas worse than the median of the nights before
    it; None otherwise. The noise scale is the change-point detector's, from the nights
    before (``detector.noise_sigma``), so the newest point cannot hide in its own
    noise estimate."""
    x = _finite(values)
    if len(x) < SUSPECT_MIN_HISTORY + 1:
        return None
    before = x[:-1]
    level = float(np.median(before[-SUSPECT_BASELINE:]))
    sigma = noise_sigma(before)
    shift = (x[-1] - level) * (-1.0 if higher_is_better else 1.0)
    effect = shift / sigma
    change = abs(x[-1] / level - 1) if level else math.inf
    if effect >= sigmas and change >= min_change:
        return change, effect
    return None


def _finite(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([v for v in values if v is not None], dtype="float64")
    return a[np.isfinite(a)]
