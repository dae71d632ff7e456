"""HTTP client of server.py: replay one case (unary or streaming) and return what came back.

Streaming responses are assembled into the unary shape (text concatenated, tokens
appended, the final message's stopReason), so both variants are compared against the
same golden response.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

TIMEOUT = 30


def _post(port: int, path: str, body: dict) -> tuple[int, http.client.HTTPResponse, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp, conn


def _error(status: int, raw: bytes) -> dict[str, Any]:
    try:
        err = json.loads(raw)
        return {"error": {"code": err.get("code"), "message": err.get("message")}}
    except ValueError:
        return {"error": {"code": f"HTTP_{status}", "message": raw.decode(errors="replace")}}


def call(port: int, case: dict[str, Any], variant: str = "unary") -> dict[str, Any]:
    """``{"response": ...}`` or ``{"error": {code, message}}`` for one case."""
    req = case["request"]
    if "texts" in req:
        return _unary(port, "/embed", {"texts": req["texts"]})
    if variant == "unary":
        return _unary(port, "/generate", {"params": req.get("params"), "requests": req["requests"]})
    responses = []
    for r in req["requests"]:  # the streaming API takes one request at a time
        one = _stream(port, {"params": req.get("params"), "request": r})
        if "error" in one:
            return one
        responses.append(one["response"])
    return {"response": {"responses": responses}}


def _unary(port: int, path: str, body: dict) -> dict[str, Any]:
    status, resp, conn = _post(port, path, body)
    try:
        raw = resp.read()
    finally:
        conn.close()
    if status != 200:
        return _error(status, raw)
    return {"response": json.loads(raw)}


def _stream(port: int, body: dict) -> dict[str, Any]:
    status, resp, conn = _post(port, "/generate_stream", body)
    try:
        if status != 200:
            return _error(status, resp.read())
        out: dict[str, Any] = {"text": ""}
        tokens: list[dict] = []
        for line in resp:
            if not line.strip():
                continue
            msg = json.loads(line)
            out["text"] += msg.get("text", "")
            tokens.extend(msg.get("tokens", []))
            for key in ("generatedTokenCount", "inputTokenCount", "stopReason", "seed"):
                if key in msg:
                    out[key] = msg[key]
        if tokens:
            out["tokens"] = tokens
        return {"response": out}
    finally:
        conn.close()
