"""Golden case files: loading, the per-config case plan, and the evaluation strategies.

Case file format (tgis-tester's), YAML or JSON, a list of:

    - name: greedy-basic
      single_shard_only: false      # dropped for sharded configs (num_shard > 1)
      skip_check: false             # runs, but the response is not compared
      request: {params: {...}, requests: [{text: ...}]}     # generation
      response: {responses: [{text, generatedTokenCount, stopReason, tokens: [...]}]}
    - name: too-many-tokens
      request: {params: {stopping: {max_new_tokens: 5000}}, requests: [{text: hi}]}
      error: {code: INVALID_ARGUMENT, message: "max_new_tokens must be <= 1024"}
    - name: embed-basic            # embedding models
      request: {texts: [...]}
      response: {embeddings: [[...]]}

Every unary generation case also runs as a streaming variant ``<name>[stream]``.
Strategies: ``exact`` (text), ``approximate`` (text, counts and stop reason exact,
logprobs within epsilon), ``embedding`` (cosine similarity >= threshold).

Stdlib + PyYAML only: imported by the workload scripts, which run without accelmatrix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STRATEGIES = ("exact", "approximate", "embedding")
CASE_KEYS = {"name", "single_shard_only", "skip_check", "request", "response", "error"}


class CaseFileError(ValueError):
    """A case file that cannot be used; the message names the file and the case."""


def load_cases(path: Path, *, require_expected: bool = True) -> list[dict[str, Any]]:
    """Read and validate a case file (YAML or JSON).

    ``require_expected=False`` accepts cases without response/error (the recorder's input).
    """
    text = Path(path).read_text()
    if Path(path).suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, list):
        raise CaseFileError(f"{path}: a case file is a list of cases, got {type(data).__name__}")
    seen: set[str] = set()
    for i, case in enumerate(data):
        where = f"{path}: case [{i}]"
        if not isinstance(case, dict):
            raise CaseFileError(f"{where}: a case is a mapping")
        unknown = set(case) - CASE_KEYS
        if unknown:
            raise CaseFileError(
                f"{where}: unknown field(s) {sorted(unknown)} (allowed: {sorted(CASE_KEYS)})"
            )
        name = case.get("name")
        if not isinstance(name, str) or not name:
            raise CaseFileError(f"{where}: name is required")
        if name in seen:
            raise CaseFileError(f"{where}: duplicate case name {name!r}")
        seen.add(name)
        if not isinstance(case.get("request"), dict):
            raise CaseFileError(f"{path}: case {name!r}: request is required (a mapping)")
        if "response" in case and "error" in case:
            raise CaseFileError(f"{path}: case {name!r}: give either response or error, not both")
        if require_expected and "response" not in case and "error" not in case:
            raise CaseFileError(f"{path}: case {name!r}: give exactly one of response or error")
        if "error" in case and not {"code", "message"} <= set(case["error"] or {}):
            raise CaseFileError(f"{path}: case {name!r}: error needs code and message")
    return data


def is_embedding(case: dict[str, Any]) -> bool:
    return "texts" in case["request"]


@dataclass
class PlannedCase:
    """One thing the runner does: a case in one variant, or why it does not run."""

    name: str
    variant: str  # unary | stream
    case: dict[str, Any]
    check: bool = True
    skip_reason: str | None = None

    @property
    def id(self) -> str:
        return self.name if self.variant == "unary" else f"{self.name}[stream]"


def plan_cases(cases: list[dict[str, Any]], *, num_shard: int, stream: bool) -> list[PlannedCase]:
    """Apply the skip rules and add the streaming variants."""
    out: list[PlannedCase] = []
    for case in cases:
        variants = ["unary"]
        if stream and not is_embedding(case):
            variants.append("stream")
        for v in variants:
            p = PlannedCase(case["name"], v, case, check=not case.get("skip_check", False))
            if case.get("single_shard_only") and num_shard > 1:
                p.skip_reason = f"single_shard_only (num_shard {num_shard})"
            out.append(p)
    return out


# -- comparison ---------------------------------------------------------------------------
def compare(
    case: dict[str, Any],
    actual: dict[str, Any],
    *,
    strategy: str,
    epsilon: float = 1e-2,
    threshold: float = 0.90,
) -> str | None:
    """None if ``actual`` matches the case, else the first difference, in words.

    ``actual`` is ``{"response": {...}}`` or ``{"error": {code, message}}``.
    """
    if "error" in case:
        want = case["error"]
        if "error" not in actual:
            return f"expected error {want['code']} {want['message']!r}, got a response"
        got = actual["error"]
        if got.get("code") != want["code"]:
            return f"error code: expected {want['code']}, got {got.get('code')} ({got.get('message')!r})"
        if got.get("message") != want["message"]:
            return f"error message: expected {want['message']!r}, got {got.get('message')!r}"
        return None
    if "error" in actual:
        got = actual["error"]
        return f"expected a response, got error {got.get('code')} {got.get('message')!r}"
    want, got = case["response"], actual["response"]
    if strategy == "embedding" or "embeddings" in want:
        return _compare_embeddings(want, got, threshold)
    wr, gr = want.get("responses") or [], got.get("responses") or []
    if len(wr) != len(gr):
        return f"responses: expected {len(wr)}, got {len(gr)}"
    for i, (w, g) in enumerate(zip(wr, gr, strict=True)):
        diff = _compare_response(w, g, strategy, epsilon)
        if diff:
            return f"responses[{i}].{diff}"
    return None


def _compare_response(w: dict, g: dict, strategy: str, epsilon: float) -> str | None:
    if w.get("text") != g.get("text"):
        return f"text: expected {w.get('text')!r}, got {g.get('text')!r}"
    if strategy == "exact":
        return None
    for key in ("generatedTokenCount", "inputTokenCount", "stopReason", "seed"):
        if key in w and w[key] != g.get(key):
            return f"{key}: expected {w[key]!r}, got {g.get(key)!r}"
    wt, gt = w.get("tokens"), g.get("tokens")
    if wt is None:
        return None
    if gt is None or len(wt) != len(gt):
        return f"tokens: expected {len(wt)}, got {None if gt is None else len(gt)}"
    for j, (a, b) in enumerate(zip(wt, gt, strict=True)):
        if a.get("text") != b.get("text"):
            return f"tokens[{j}].text: expected {a.get('text')!r}, got {b.get('text')!r}"
        if "logprob" in a:
            lp = b.get("logprob")
            if not isinstance(lp, int | float) or abs(a["logprob"] - lp) > epsilon:
                d = "n/a" if not isinstance(lp, int | float) else f"{abs(a['logprob'] - lp):.4g}"
                return (
                    f"tokens[{j}].logprob: expected {a['logprob']:.6g}, got {lp} "
                    f"(|diff| {d} > epsilon {epsilon})"
                )
    return None


def cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return 0.0
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb) if na and nb else 0.0


def _compare_embeddings(want: dict, got: dict, threshold: float) -> str | None:
    we, ge = want.get("embeddings") or [], got.get("embeddings") or []
    if len(we) != len(ge):
        return f"embeddings: expected {len(we)}, got {len(ge)}"
    for i, (a, b) in enumerate(zip(we, ge, strict=True)):
        if len(a) != len(b):
            return f"embeddings[{i}]: expected dimension {len(a)}, got {len(b)}"
        sim = cosine(a, b)
        if sim < threshold:
            return f"embeddings[{i}]: cosine similarity {sim:.4f} < threshold {threshold}"
    return None


@dataclass
class CaseResult:
    """One row of results.jsonl."""

    name: str
    variant: str
    status: str  # passed | failed | unchecked | skipped
    passed: bool
    reason: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variant": self.variant,
            "id": self.name if self.variant == "unary" else f"{self.name}[stream]",
            "status": self.status,
            "passed": self.passed,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
        }
