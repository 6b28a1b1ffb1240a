"""A fake engine for the study tests: a real OpenAI-compatible server process whose flags decide
how it behaves, so a `command`-engine study meets every kind of trial a real study meets.

    --backend slow|fast|refuse   refuse: argparse-style refusal naming the flag, exit 2 (bad_args)
    --quant none|q8|bad          bad: serves confident answers unlike the reference (garbage_output)
    --batch N                    requests served at once (a numeric knob: more is faster)
    fast + q8 together           illegal memory access at startup, although each alone works

Stdlib only. Run as a script (tests/test_study_process.py starts it per trial).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import threading
import time

from openai_http import OpenAIHandler, serve

WORDS = ["the", "expert", "router", "token", "gate", "layer", "cache", "batch", "kernel", "tensor", "warp", "block"]


def behaviour(backend: str, quant: str) -> str:
    if backend == "refuse":
        return "refuse"
    if backend == "fast" and quant == "q8":
        return "ima"
    return "garbage" if quant == "bad" else "ok"


def answer(prompt: str, n: int, salt: str) -> list[str]:
    return [" " + WORDS[hashlib.sha256(f"{salt}|{prompt}|{i}".encode()).digest()[0] % len(WORDS)] for i in range(n)]


class Handler(OpenAIHandler):
    protocol_version = "HTTP/1.0"  # close after each answer: the stream ends with the connection
    salt, step_s, gate = "ok", 0.0025, threading.Semaphore(4)

    def do_POST(self):
        req = self._body()
        n = int(req.get("max_tokens") or 16)
        toks = answer(str(req.get("prompt")), n, Handler.salt)
        with Handler.gate:  # at most --batch requests generate at once
            if not req.get("stream"):
                time.sleep(Handler.step_s * n)
                k = int(req.get("logprobs") or 0)
                lp = {"tokens": toks, "token_logprobs": [-0.1 * (1 + i % 3) for i in range(n)],
                      "top_logprobs": [{t: -0.1 * (1 + i % 3), " other": -3.0} for i, t in enumerate(toks)]} if k else None
                self._json(200, {"id": "c", "object": "text_completion", "model": Handler.model_id,
                            "choices": [{"index": 0, "text": "".join(toks), "logprobs": lp, "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}})
                return
            self._start_stream()
            t0 = time.monotonic()
            for i, t in enumerate(toks):
                # Steps on a fixed schedule from the first: a wake-up late under CPU contention is
                # made up at the next step instead of adding to every step, so the slow/fast ratio
                # a study measures holds on a loaded 2-core machine.
                time.sleep(max(0.0, t0 + (i + 1) * Handler.step_s - time.monotonic()))
                last = i == n - 1
                ev = {"choices": [{"index": 0, "text": t, "finish_reason": "length" if last else None}]}
                if last:
                    ev["usage"] = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
                self._event(ev)
            self._end_stream()


def main() -> None:
    ap = argparse.ArgumentParser(prog="fake-engine")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", default="slow")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--model", default="fake-moe", help="the name it serves the model under")
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
    Handler.step_s = (0.001 if a.backend == "fast" else 0.0025) * (1 + a.batch / 32)
    Handler.gate = threading.Semaphore(a.batch)
    Handler.model_id = a.model
    serve(Handler, a.port, f"Uvicorn running on http://127.0.0.1:{a.port}")


if __name__ == "__main__":
    main()
