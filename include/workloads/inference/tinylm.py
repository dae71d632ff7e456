"""A tiny deterministic "language model": the stand-in for a real model on the local backend.

Generation is a seeded hash chain over the last few words, so it is fully reproducible
and costs microseconds, yet behaves like a server under test: greedy and sampled decoding,
EOS, stop sequences, token logprobs, limits that produce errors. Logprobs are rounded to
the config's dtype (and summed per shard, like a tensor-parallel reduction), so float16,
bfloat16 and sharded configs differ from float32 in the last digits: exactly what the
approximate evaluation strategy must tolerate. Embeddings are hashed character trigrams,
so similar texts have similar vectors.

Stdlib only (workloads must not need accelmatrix on their path).
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

VOCAB = (
    "the a of to and in is it that for on with as was at by an be this from or are his "
    "her they have had not but all can we one you there which their will when who what "
    "so up out if about into than them then some would make like time just know people "
    "year good could see other only come its over think also back after use two how our "
    "work first well way even new want because any these give day most us sky blue red "
    "green river mountain cloud ocean light"
).split()
EOS = "</s>"
EMBED_DIM = 32


class RequestError(ValueError):
    """A request the server refuses (maps to gRPC INVALID_ARGUMENT)."""

    code = "INVALID_ARGUMENT"


@dataclass(frozen=True)
class ServerConfig:
    """The subset of a model config that changes what the model computes or accepts."""

    dtype: str = "float32"
    num_shard: int = 1
    max_batch_size: int = 12
    max_sequence_length: int = 2048
    max_new_tokens: int = 1024


def round_dtype(x: float, dtype: str) -> float:
    """``x`` as the nearest value representable in ``dtype`` (bfloat16 truncates)."""
    if dtype == "float16":
        return struct.unpack("<e", struct.pack("<e", x))[0]
    if dtype == "bfloat16":
        bits = struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _h(*parts: object) -> bytes:
    return hashlib.sha256("|".join(map(str, parts)).encode()).digest()


def tokenize(text: str) -> list[str]:
    return text.split()


def generate_one(model: str, text: str, params: dict, cfg: ServerConfig) -> dict:
    """One request -> a TGIS-shaped response dict (text, counts, stopReason, tokens)."""
    stopping = params.get("stopping") or {}
    want = params.get("response") or {}
    max_new = int(stopping.get("max_new_tokens", 20))
    min_new = int(stopping.get("min_new_tokens", 0))
    stops = list(stopping.get("stop_sequences") or [])
    if max_new > cfg.max_new_tokens:
        raise RequestError(f"max_new_tokens must be <= {cfg.max_new_tokens}")
    if min_new > max_new:
        raise RequestError("min_new_tokens must be <= max_new_tokens")
    words = tokenize(text)
    n_in = len(words) + 1  # + BOS
    if n_in + min_new >= cfg.max_sequence_length:
        raise RequestError(
            f"input tokens ({n_in}) plus min_new_tokens ({min_new}) must be < "
            f"{cfg.max_sequence_length}"
        )
    sampling = (params.get("method") or "GREEDY").upper() == "SAMPLE"
    seed = int((params.get("sampling") or {}).get("seed", 0)) if sampling else 0
    ctx = list(words)
    out_tokens: list[dict] = []
    stop_reason = "MAX_TOKENS"
    while len(out_tokens) < max_new:
        d = _h(model, seed, " ".join(ctx[-3:]), len(ctx) if sampling else "")
        tok = EOS if (d[4] < 14 and len(out_tokens) >= min_new) else VOCAB[d[0] % len(VOCAB)]
        raw = -(0.05 + int.from_bytes(d[5:8], "big") / float(1 << 24) * 3.0)
        # A tensor-parallel reduction: per-shard partial sums in the config's dtype.
        lp = round_dtype(
            sum(round_dtype(raw / cfg.num_shard, cfg.dtype) for _ in range(cfg.num_shard)),
            cfg.dtype,
        )
        out_tokens.append({"text": tok, "logprob": lp})
        if tok == EOS:
            stop_reason = "EOS_TOKEN"
            break
        ctx.append(tok)
        text_so_far = " ".join(t["text"] for t in out_tokens)
        if any(text_so_far.endswith(s) for s in stops):
            stop_reason = "STOP_SEQUENCE"
            break
    shown = [t["text"] for t in out_tokens if t["text"] != EOS]
    resp: dict = {
        "text": " ".join(shown),
        "generatedTokenCount": len(out_tokens),
        "inputTokenCount": n_in,
        "stopReason": stop_reason,
    }
    if sampling:
        resp["seed"] = seed
    if want.get("generated_tokens"):
        resp["tokens"] = [
            {"text": t["text"], **({"logprob": t["logprob"]} if want.get("token_logprobs") else {})}
            for t in out_tokens
        ]
    if want.get("input_tokens"):
        resp["inputTokens"] = [{"text": w} for w in ["<s>", *words]]
    return resp


def generate(model: str, body: dict, cfg: ServerConfig) -> dict:
    """A batch request ``{params, requests: [{text}]}`` -> ``{responses: [...]}``."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise RequestError("requests must be a non-empty list")
    if len(requests) > cfg.max_batch_size:
        raise RequestError(
            f"batch of {len(requests)} requests exceeds max_batch_size {cfg.max_batch_size}"
        )
    params = body.get("params") or {}
    return {
        "responses": [generate_one(model, str(r.get("text", "")), params, cfg) for r in requests]
    }


def embed(model: str, texts: list[str], cfg: ServerConfig) -> list[list[float]]:
    """Unit vectors of hashed character trigrams, rounded to the config's dtype."""
    if not texts:
        raise RequestError("texts must be a non-empty list")
    out = []
    for text in texts:
        v = [0.0] * EMBED_DIM
        s = f"  {text.lower()} "
        for i in range(len(s) - 2):
            d = _h(model, s[i : i + 3])
            v[d[0] % EMBED_DIM] += 1.0 if d[1] & 1 else -1.0
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([round_dtype(x / norm, cfg.dtype) for x in v])
    return out
