"""A real OpenAI-compatible HTTP server that knows the answers to a task, and gets chosen ones wrong.

Stdlib only (plus bad_server.py beside it, for /health, /v1/models and the JSON replies), so it
behaves like an engine and not like moelab. It reads an answer key (a JSONL of
{"id", "prompt", "answer"} lines) and answers each known prompt through /v1/completions and
/v1/chat/completions with the right answer, except:
  --wrong-ids a,b     these items get a wrong answer (the right one with its last character changed)
  --fail-ids a,b      these items get HTTP 500
  --wrong-above K     any request that arrives while more than K others are in flight is answered
                      wrong (an accuracy that falls only under load); --latency-ms keeps requests
                      in flight long enough to overlap
Unknown prompts get "?". /health and /v1/models answer as an engine's do.
Usage: python answer_server.py --port N --key task.jsonl [--wrong-ids ...] [--latency-ms 20]
"""
from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from http.server import ThreadingHTTPServer

from bad_server import LOCK, Handler as BadHandler


def wrong(answer: str) -> str:
    last = answer[-1:] or "0"
    return answer[:-1] + ("1" if last != "1" else "2")


class Handler(BadHandler):
    key: dict[str, tuple[str, str]] = {}  # prompt -> (id, answer)
    wrong_ids: set[str] = set()
    fail_ids: set[str] = set()
    wrong_above = 10**9
    latency = 0.0
    in_flight = 0

    def do_POST(self):
        req = self._body()
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            return self._json(404, {"error": {"message": "not found"}})
        prompt = req["messages"][-1]["content"] if chat else req.get("prompt")
        prompt = prompt[0] if isinstance(prompt, list) else prompt
        with LOCK:
            others = Handler.in_flight
            Handler.in_flight += 1
        try:
            time.sleep(self.latency)
            item_id, answer = self.key.get(prompt, (None, "?"))
            if item_id in self.fail_ids:
                return self._json(500, {"error": {"message": "scripted failure", "type": "internal_server_error"}})
            if item_id in self.wrong_ids or others > self.wrong_above:
                answer = wrong(answer)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
            else:
                choice = {"index": 0, "text": answer, "logprobs": None, "finish_reason": "stop"}
            self._json(200, {"id": "cmpl-key", "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": req.get("model"), "choices": [choice],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(answer),
                                       "total_tokens": len(prompt) + len(answer)}})
        finally:
            with LOCK:
                Handler.in_flight -= 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--wrong-ids", default="")
    ap.add_argument("--fail-ids", default="")
    ap.add_argument("--wrong-above", type=int, default=10**9)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    a = ap.parse_args()
    with open(a.key) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    Handler.key = {r["prompt"]: (str(r.get("id", i + 1)), r["answer"]) for i, r in enumerate(rows)}
    Handler.wrong_ids = set(filter(None, a.wrong_ids.split(",")))
    Handler.fail_ids = set(filter(None, a.fail_ids.split(",")))
    Handler.wrong_above, Handler.latency = a.wrong_above, a.latency_ms / 1000
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    srv.serve_forever()


if __name__ == "__main__":
    main()
