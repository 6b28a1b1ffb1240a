"""A fake engine for the study tests: a real OpenAI-compatible server process whose flags decide
how it behaves, so a `command`-engine study meets every kind of trial a real study meets.

    --backend slow|fast|refuse   refuse: argparse-style refusal naming the flag, exit 2 (bad_args)
    --quant none|q8|bad          bad: serves confident answers unlike the reference (garbage_output)
    --batch N                    requests served at once (a numeric knob: more is faster)
    fast + q8 together           illegal memory access at startup, although each alone works

Stdlib only. Run as a script; the one test here checks its decision table without a process.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["the", "expert", "router", "token", "gate", "layer", "cache", "batch", "kernel", "tensor", "warp", "block"]


def behaviour(backend: str, quant: str) -> str:
    if backend == "refuse":
        return "refuse"
    if backend == "fast" and quant == "q8":
        return "ima"
    return "garbage" if quant == "bad" else "ok"


def answer(prompt: str, n: int, salt: str) -> list[str]:
    return [" " + WORDS[hashlib.sha256(f"{salt}|{prompt}|{i}".encode()).digest()[0] % len(WORDS)] for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # close after each answer: the stream ends with the connection
    salt, step_s, gate = "ok", 0.004, threading.Semaphore(4)

    def log_message(self, *a):
        pass

    def _json(self, obj: dict, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json({})
        elif self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "fake-moe", "object": "model"}]})
        else:
            self._json({"error": {"message": "not found"}}, 404)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = int(req.get("max_tokens") or 16)
        toks = answer(str(req.get("prompt")), n, Handler.salt)
        with Handler.gate:  # at most --batch requests generate at once
            if not req.get("stream"):
                time.sleep(Handler.step_s * n)
                k = int(req.get("logprobs") or 0)
                lp = {"tokens": toks, "token_logprobs": [-0.1 * (1 + i % 3) for i in range(n)],
                      "top_logprobs": [{t: -0.1 * (1 + i % 3), " other": -3.0} for i, t in enumerate(toks)]} if k else None
                self._json({"id": "c", "object": "text_completion", "model": "fake-moe",
                            "choices": [{"index": 0, "text": "".join(toks), "logprobs": lp, "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i, t in enumerate(toks):
                time.sleep(Handler.step_s)
                last = i == n - 1
                ev = {"choices": [{"index": 0, "text": t, "finish_reason": "length" if last else None}]}
                if last:
                    ev["usage"] = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
                self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")


def main() -> None:
    ap = argparse.ArgumentParser(prog="fake-engine")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", default="slow")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    kind = behaviour(a.backend, a.quant)
    if kind == "refuse":
        print(f"fake-engine: error: argument --backend: invalid choice: '{a.backend}' (choose from 'slow', 'fast')",
              file=sys.stderr, flush=True)
        sys.exit(2)
    print(f"server_args backend={a.backend} quant={a.quant} batch={a.batch}", flush=True)
    print("Loading safetensors checkpoint shards: 1/1", flush=True)
    if kind == "ima":
        time.sleep(0.2)
        print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(1)
    Handler.salt = "bad" if kind == "garbage" else "ok"
    Handler.step_s = (0.002 if a.backend == "fast" else 0.004) * (1 + a.batch / 32)
    Handler.gate = threading.Semaphore(a.batch)
    httpd = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    httpd.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"Uvicorn running on http://127.0.0.1:{a.port}", flush=True)
    httpd.serve_forever()


def test_fake_decision_table():
    assert behaviour("refuse", "none") == "refuse"
    assert behaviour("fast", "q8") == "ima" and behaviour("fast", "none") == "ok" and behaviour("slow", "q8") == "ok"
    assert behaviour("slow", "bad") == "garbage"
    assert answer("p", 3, "ok") == answer("p", 3, "ok") != answer("p", 3, "bad")


if __name__ == "__main__":
    main()
