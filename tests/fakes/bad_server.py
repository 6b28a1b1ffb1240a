"""A real, small OpenAI-compatible HTTP server that answers in one scripted (mis)behaviour.

Stdlib only, so it behaves like an engine and not like moelab. It serves /health, /v1/models and
/v1/completions (plain JSON with legacy logprobs, or streamed as SSE over chunked encoding) and
/v1/chat/completions (plain JSON). Modes (--mode):
  healthy  a "random-weight model": tokens drawn from a generator seeded by the prompt, so different
           prompts get different answers; finite logprobs with a clear top-1 margin
  nan      like healthy, but every logprob is NaN (json.dumps writes the NaN literal)
  repeat   every prompt is answered with the token "!" repeated
  garbage  mostly U+FFFD replacement characters (what broken byte-level decoding looks like)
  drift    healthy-looking, but seeded differently: only a reference comparison can tell
  die      healthy until request --die-after, then the process exits in the middle of a stream
  error    every second request gets HTTP 500
Timing of streamed answers: --ttft-ms before the first token, --itl-ms between tokens.
Usage: python bad_server.py --port N --mode MODE
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import threading
import time

from openai_http import OpenAIHandler, serve

WORDS = ("the of and to in is was for on that with as by at from it an be this which or are not "
         "but had his have one all were they her she there been if more when will would who so no").split()
LOCK = threading.Lock()


def answer(prompt: str, n: int, mode: str) -> list[tuple[str, float, dict]]:
    """[(token, logprob, top_logprobs)] for a prompt; deterministic per (prompt, mode)."""
    seed = prompt + ("drift" if mode == "drift" else "")
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    out = []
    for _ in range(n):
        if mode == "repeat":
            tok = "!"
        elif mode == "garbage":
            tok = "\ufffd" * rng.randint(1, 3) if rng.random() < 0.9 else rng.choice(WORDS)
        else:
            tok = " " + rng.choice(WORDS)
        lp = -rng.uniform(0.05, 0.5)
        alts = {tok: lp}
        for w in rng.sample(WORDS, 4):  # runners-up at least 1.5 nats behind: no near-ties
            alts.setdefault(" " + w, lp - rng.uniform(1.5, 4.0))
        if mode == "nan":
            lp, alts = float("nan"), {k: float("nan") for k in alts}
        out.append((tok, lp, alts))
    return out


class Handler(OpenAIHandler):
    protocol_version = "HTTP/1.1"
    model_id = "bad-moe"
    mode, ttft, itl, die_after, served = "healthy", 0.0, 0.0, 10**9, 0

    def models_entry(self) -> dict:
        return {**super().models_entry(), "max_model_len": 2048}

    def do_POST(self):
        req = self._body()
        with LOCK:
            Handler.served += 1
            nth = Handler.served
        if Handler.mode == "error" and nth % 2 == 0:
            return self._json(500, {"error": {"message": "internal error (scripted)"}})
        chat = self.path.startswith("/v1/chat")
        prompt = json.dumps(req.get("messages")) if chat else str(req.get("prompt", ""))
        n = int(req.get("max_tokens") or 16)
        toks = answer(prompt, n, Handler.mode)
        usage = {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": n,
                 "total_tokens": max(1, len(prompt) // 4) + n}
        if req.get("stream"):
            return self._stream(req, toks, usage, die=Handler.mode == "die" and nth >= Handler.die_after)
        text = "".join(t for t, _, _ in toks)
        if chat:
            content = [{"token": t, "logprob": lp, "top_logprobs": [{"token": k, "logprob": v} for k, v in a.items()]}
                       for t, lp, a in toks]
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": {"content": content}, "finish_reason": "length"}
        else:
            choice = {"index": 0, "text": text, "finish_reason": "length",
                      "logprobs": {"tokens": [t for t, _, _ in toks], "token_logprobs": [lp for _, lp, _ in toks],
                                   "top_logprobs": [a for _, _, a in toks], "text_offset": list(range(n))}}
        self._json(200, {"id": "cmpl-bad", "object": "text_completion", "model": req.get("model"),
                         "choices": [choice], "usage": usage})

    def _stream(self, req: dict, toks: list, usage: dict, die: bool) -> None:
        self._start_stream()
        start = time.perf_counter()
        for i, (tok, lp, alts) in enumerate(toks):
            due = start + Handler.ttft + i * Handler.itl
            time.sleep(max(0.0, due - time.perf_counter()))
            if die and i == len(toks) // 2:
                os._exit(3)  # the "engine" crashes with the stream half written
            self._event({"id": "cmpl-bad", "object": "text_completion", "model": req.get("model"),
                         "choices": [{"index": 0, "text": tok, "finish_reason": None,
                                      "logprobs": {"tokens": [tok], "token_logprobs": [lp], "top_logprobs": [alts]}
                                      if req.get("logprobs") else None}]})
        if (req.get("stream_options") or {}).get("include_usage"):
            self._event({"choices": [], "usage": usage})
        self._end_stream()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="healthy",
                    choices=["healthy", "nan", "repeat", "garbage", "drift", "die", "error"])
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--die-after", type=int, default=5)
    a = ap.parse_args()
    Handler.mode, Handler.ttft, Handler.itl, Handler.die_after = a.mode, a.ttft_ms / 1e3, a.itl_ms / 1e3, a.die_after
    serve(Handler, a.port, f"bad_server mode={a.mode} listening on 127.0.0.1:{a.port}")


if __name__ == "__main__":
    main()
