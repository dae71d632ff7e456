"""Serve tinylm over HTTP on 127.0.0.1: the local stand-in for a TGIS inference server.

    server.py --model tiny-gen --config-json '{"dtype": "float16", ...}' --port-file PATH

Binds a free port (port 0) and writes it to --port-file once it accepts connections, so
the engine's readiness probe and the test runner find it without guessing ports.

Endpoints (JSON): GET /health; POST /generate {params, requests:[{text}]} -> {responses};
POST /generate_stream {params, request:{text}} -> NDJSON, one message per token then a
final message with stopReason; POST /embed {texts} -> {embeddings}. Refused requests answer
400 {code, message} like a gRPC INVALID_ARGUMENT status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tinylm import RequestError, ServerConfig, embed, generate  # noqa: E402

MAX_BODY = 1 << 20


def make_handler(model: str, cfg: ServerConfig, info: dict):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args) -> None:  # one line per request, to the log
            sys.stdout.write(f"{self.address_string()} {fmt % args}\n")
            sys.stdout.flush()

        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                raise RequestError(f"request body of {n} bytes exceeds {MAX_BODY}")
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError as e:
                raise RequestError(f"request body is not JSON: {e}") from None
            if not isinstance(body, dict):
                raise RequestError("request body must be a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, {"status": "ok", "model": model, **info})
            else:
                self._send(404, {"code": "NOT_FOUND", "message": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            try:
                body = self._body()
                if self.path == "/generate":
                    self._send(200, generate(model, body, cfg))
                elif self.path == "/embed":
                    texts = body.get("texts")
                    if not isinstance(texts, list):
                        raise RequestError("texts must be a list of strings")
                    self._send(200, {"embeddings": embed(model, [str(t) for t in texts], cfg)})
                elif self.path == "/generate_stream":
                    self._stream(body)
                else:
                    self._send(404, {"code": "NOT_FOUND", "message": f"no route {self.path}"})
            except RequestError as e:
                self._send(400, {"code": e.code, "message": str(e)})

        def _stream(self, body: dict) -> None:
            req = body.get("request")
            if not isinstance(req, dict):
                raise RequestError("request must be an object {text}")
            # Validated and computed before the first byte, so a refusal is a clean 400.
            resp = generate(model, {"params": body.get("params"), "requests": [req]}, cfg)
            r = resp["responses"][0]
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            msgs = [{"inputTokenCount": r["inputTokenCount"]}]
            words = r["text"].split(" ") if r["text"] else []
            for i in range(r["generatedTokenCount"]):
                m: dict = {
                    "text": ("" if i == 0 else " ") + words[i] if i < len(words) else "",
                    "generatedTokenCount": i + 1,
                }
                if "tokens" in r:
                    m["tokens"] = [r["tokens"][i]]
                msgs.append(m)
            final = {"stopReason": r["stopReason"], "generatedTokenCount": r["generatedTokenCount"]}
            if "seed" in r:
                final["seed"] = r["seed"]
            msgs.append(final)
            for m in msgs:
                line = (json.dumps(m) + "\n").encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


def _stop(*_: object) -> None:
    raise KeyboardInterrupt  # teardown's SIGTERM: leave serve_forever and close the socket


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--config-json", default="{}", help="the model config (JSON object)")
    ap.add_argument("--port-file", required=True, type=Path)
    args = ap.parse_args(argv)
    conf = json.loads(args.config_json)
    cfg = ServerConfig(
        dtype=conf.get("dtype", "float32"),
        num_shard=int(conf.get("num_shard", 1)),
        max_batch_size=int(conf.get("max_batch_size", 12)),
        max_sequence_length=int(conf.get("max_sequence_length", 2048)),
        max_new_tokens=int(conf.get("max_new_tokens", 1024)),
    )
    info = {
        "config": conf,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": "cpu",  # tinylm computes on the CPU whatever the config asks for
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(args.model, cfg, info))
    server.daemon_threads = True
    port = server.server_address[1]
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, args.port_file)
    print(f"serving {args.model} {cfg} on 127.0.0.1:{port}", flush=True)
    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        print("server stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
