#!/usr/bin/env python3
"""The change-point detector on real, human-annotated series: the Turing Change Point
Dataset (TCPD; G. J. J. van den Burg and C. K. I. Williams, "An Evaluation of Change Point
Detection Algorithms", 2020, arXiv:2003.06222).

bench_changepoints.py measures the detector on generated perf series with known answers;
this measures it on series that nobody generated (GDP, passenger counts, well logs, ...),
scored against five human annotators each, the way the paper scores its methods. These
are not perf series (trends, seasonality and variance changes are common, clean level
shifts less so), so read the result as a diagnosis of the detector's weaknesses on real
data, not as a goal to tune the defaults to.

Getting the data (it is not shipped here). Clone https://github.com/alan-turing-institute/TCPD
and copy ``annotations.json`` and every ``datasets/<name>/<name>.json`` into one folder:

    git clone https://github.com/alan-turing-institute/TCPD && mkdir -p /tmp/tcpd
    cp TCPD/annotations.json TCPD/datasets/*/*.json /tmp/tcpd/

Some series are only downloadable by script (``make`` in the TCPD clone fetches them and
checks their checksums); without them the script scores what is there and lists the rest.
Multivariate series are skipped (the detector is univariate). A series with missing
values is skipped and listed: in the paper's own runs the methods that cannot take missing
values fail on it (``uk_coal_employ``, the only such series) and its averages drop it.
The ``quality_control_*`` series are synthetic, with a known answer, made to check the
annotators; they are reported apart and left out of the main mean, as in the paper.

The metrics, as the paper defines them (section 4). A change point is the index of the
first point of a new segment, 0-based, which is what ``ChangePoint.index`` is. Index 0 is
added to every set, predictions and each annotator's alike (it is always a "change").

* F1, margin M = 5. ``TP(T, X)``: the points of T that have a point of X at most M away,
  each prediction serving at most one of them. The paper leaves open which prediction an
  annotation takes; as in the paper's own code, each annotation (here earliest first)
  takes the nearest free one. (A largest one-to-one pairing, which the wording also
  allows, counts a few more where predictions crowd: +0.004 mean F1 at the defaults.)
  With annotators k = 1..K giving sets T_k and T* their union:
  precision P = |TP(T*, X)| / |X|, recall R = (1/K) sum_k |TP(T_k, X)| / |T_k|, and
  F1 = 2 P R / (P + R). Predicting nothing scores P = 1 and R = mean of 1 / |T_k| (only
  index 0 is found), so "zero" is a real baseline, and a strong one.
* Covering. Change points cut 0..n-1 into segments. The covering of an annotator's
  segmentation G by the predicted one G' is (1/n) sum_{A in G} |A| max_{A' in G'} J(A, A'),
  J the Jaccard index |A & A'| / |A | A'|; the score is its mean over annotators.

Both are 1 for a perfect answer. The "zero" rows predict no change at all: where the
detector scores below them, reporting nothing would have agreed better with the humans.

    .venv/bin/python bench/bench_tcpd.py --data /tmp/tcpd [--penalty 6 --min-effect 1 ...]
    .venv/bin/python bench/bench_tcpd.py --data /tmp/tcpd --sweep   # one line per setting
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

from accelmatrix.history.series.detector import DEFAULT, Detector, detect  # noqa: E402

MARGIN = 5
# The detector's fields that the command line can set (all optional; unset = DEFAULT).
FIELDS = (
    "noise_lag",
    "penalty",
    "min_size",
    "min_effect",
    "outlier",
    "tail_guard",
    "min_change",
    "max_p",
)
# --sweep: each field alone over a range around its default, then a few combinations
# (applied on top of the settings given on the command line, DEFAULT if none).
SWEEP: list[dict[str, float]] = [
    {},
    *({"penalty": p} for p in (3, 4.5, 9, 12)),
    *({"min_effect": e} for e in (0.5, 1.5, 2)),
    *({"min_size": s} for s in (2, 4, 5)),
    *({"outlier": o} for o in (3, 5, 6)),
    {"penalty": 3, "min_effect": 0.5, "min_size": 2},
    {"penalty": 12, "min_effect": 2, "min_size": 5},
    {"penalty": 3, "min_effect": 2},
    {"penalty": 12, "min_effect": 0.5},
    {"penalty": 9, "min_size": 5, "outlier": 6},
]


@dataclasses.dataclass(frozen=True)
class Series:
    name: str
    values: np.ndarray
    annotations: dict[str, list[int]]  # annotator id -> change points

    @property
    def qc(self) -> bool:
        return self.name.startswith("quality_control")


# -- metrics -----------------------------------------------------------------------------


def true_positives(truth: Iterable[int], predicted: Iterable[int], margin: int) -> int:
    """|TP(T, X)|: the points of T, earliest first, that find a prediction not yet taken at
    most ``margin`` away; each takes the nearest such prediction (on a tie, the earlier)."""
    free = sorted(set(predicted))
    found = 0
    for tau in sorted(set(truth)):
        near = [x for x in free if abs(x - tau) <= margin]
        if near:
            free.remove(min(near, key=lambda x: (abs(x - tau), x)))
            found += 1
    return found


def f1_score(
    annotations: Mapping[str, Iterable[int]], predicted: Iterable[int], margin: int = MARGIN
) -> float:
    """F1 against several annotators (the paper's F-measure with alpha = 1/2)."""
    x = set(predicted) | {0}
    per_annotator = [set(t) | {0} for t in annotations.values()]
    union = set().union(*per_annotator)
    precision = true_positives(union, x, margin) / len(x)
    recall = float(np.mean([true_positives(t, x, margin) / len(t) for t in per_annotator]))
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def segments(cps: Iterable[int], n: int) -> list[tuple[int, int]]:
    """The half-open segments [start, end) that change points cut 0..n-1 into."""
    bounds = sorted({0, n} | {c for c in cps if 0 < c < n})
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def cover(truth: Sequence[tuple[int, int]], predicted: Sequence[tuple[int, int]], n: int) -> float:
    """Covering of segmentation ``truth`` by ``predicted`` (both lists of [start, end))."""
    total = 0.0
    for a, b in truth:
        best = 0.0
        for c, d in predicted:
            inter = min(b, d) - max(a, c)
            if inter > 0:
                best = max(best, inter / ((b - a) + (d - c) - inter))
        total += (b - a) * best
    return total / n


def covering(annotations: Mapping[str, Iterable[int]], predicted: Iterable[int], n: int) -> float:
    """Mean over annotators of the covering of their segmentation by the predicted one."""
    pred = segments(predicted, n)
    return float(np.mean([cover(segments(t, n), pred, n) for t in annotations.values()]))


# -- data ----------------------------------------------------------------------------------


def load(data: Path) -> tuple[list[Series], list[str]]:
    """The univariate, complete series in ``data`` with their annotations, and a line for
    every annotated series that is not scored (and why)."""
    annotations = json.loads((data / "annotations.json").read_text())
    series, skipped = [], []
    for name in sorted(annotations):
        path = data / f"{name}.json"
        if not path.exists():
            skipped.append(f"{name}: no {name}.json in {data} (some are download-only)")
            continue
        d = json.loads(path.read_text())
        if d["n_dim"] != 1:
            skipped.append(f"{name}: multivariate ({d['n_dim']} dimensions)")
            continue
        raw = d["series"][0]["raw"]
        missing = sum(v is None for v in raw)
        if missing:
            skipped.append(f"{name}: {missing} missing values")
            continue
        if d["time"]["index"] != list(range(d["n_obs"])):
            skipped.append(f"{name}: time index not 0..n-1")
            continue
        series.append(Series(name, np.asarray(raw, dtype=np.float64), annotations[name]))
    return series, skipped


# -- scoring ---------------------------------------------------------------------------------


def score(
    series: Sequence[Series], detector: Detector | None
) -> dict[str, tuple[float, float, int]]:
    """name -> (F1, covering, number of predicted change points); ``None``: predict none."""
    out = {}
    for s in series:
        cps = [] if detector is None else [c.index for c in detect(s.values, detector)]
        out[s.name] = (
            f1_score(s.annotations, cps),
            covering(s.annotations, cps, s.values.size),
            len(cps),
        )
    return out


def means(
    series: Sequence[Series], scores: Mapping[str, tuple[float, float, int]], qc: bool
) -> tuple[tuple[float, ...], int]:
    """(mean F1, mean covering, mean change points) over the real (``qc`` False) or the
    quality-control series, and how many series that is."""
    names = [s.name for s in series if s.qc == qc]
    return tuple(float(np.mean([scores[n][i] for n in names])) for i in range(3)), len(names)


def report(series: Sequence[Series], detector: Detector) -> None:
    ours, zero = score(series, detector), score(series, None)
    print(
        f"{'dataset':<20} {'n':>4} {'ann':>3} {'cps':>4} {'F1':>6} {'cover':>6}   zero: F1  cover"
    )
    for s in series:
        f1, cov, k = ours[s.name]
        zf1, zcov, _ = zero[s.name]
        mark = "  *" if f1 < zf1 or cov < zcov else ""
        print(
            f"{s.name:<20} {s.values.size:>4} {len(s.annotations):>3} {k:>4} {f1:>6.3f} {cov:>6.3f}"
            f"         {zf1:.3f}  {zcov:.3f}{mark}"
        )
    print("(* below the zero baseline on F1 or covering)\n")
    for qc, label in ((False, "TCPD univariate"), (True, "quality control")):
        (f1, cov, k), count = means(series, ours, qc)
        (zf1, zcov, _), _ = means(series, zero, qc)
        print(f"mean, {label} ({count} series)")
        print(f"  detector  F1 {f1:.3f}  cover {cov:.3f}  ({k:.1f} change points a series)")
        print(f"  zero      F1 {zf1:.3f}  cover {zcov:.3f}")


def sweep(series: Sequence[Series], base: Detector) -> None:
    """One line of means per SWEEP setting, each applied on top of ``base``."""
    zero = score(series, None)
    (zf1, zcov, _), count = means(series, zero, qc=False)
    (qf1, qcov, _), qcount = means(series, zero, qc=True)
    print(f"means over {count} TCPD univariate series (and {qcount} quality-control series)")
    print(f"{'setting':<42} {'F1':>6} {'cover':>6} {'cps':>5}   {'QC F1':>6} {'cover':>6}")
    print(
        f"{'zero (no change points)':<42} {zf1:>6.3f} {zcov:>6.3f} {0:>5.1f}   {qf1:>6.3f} {qcov:>6.3f}"
    )
    for setting in SWEEP:
        ours = score(series, dataclasses.replace(base, **setting))
        (f1, cov, k), _ = means(series, ours, qc=False)
        (qf1, qcov, _), _ = means(series, ours, qc=True)
        label = " ".join(f"{key}={value}" for key, value in setting.items()) or (
            "defaults" if base == DEFAULT else "as given"
        )
        print(f"{label:<42} {f1:>6.3f} {cov:>6.3f} {k:>5.1f}   {qf1:>6.3f} {qcov:>6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tcpd"), help="TCPD JSON folder")
    for field in FIELDS:
        kind = int if field in ("min_size", "noise_lag") else float
        ap.add_argument(f"--{field.replace('_', '-')}", type=kind, help=f"Detector.{field}")
    ap.add_argument("--sweep", action="store_true", help="means only, for a set of settings")
    args = ap.parse_args()

    if not (args.data / "annotations.json").exists():
        sys.exit(f"no annotations.json in {args.data}: see this script's docstring")
    series, skipped = load(args.data)
    settings = {f: getattr(args, f) for f in FIELDS if getattr(args, f) is not None}
    detector = dataclasses.replace(DEFAULT, **settings)
    if skipped:
        print("not scored:\n  " + "\n  ".join(skipped) + "\n")
    if args.sweep:
        sweep(series, detector)
    else:
        print(f"{detector}\n")
        report(series, detector)


if __name__ == "__main__":
    main()
