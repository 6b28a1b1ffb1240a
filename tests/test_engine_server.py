"""`moelab serve` end to end: a real server process on 127.0.0.1 with the tiny preset on CPU,
driven over real HTTP (completions, chat, streaming, logprobs, determinism, batching, errors)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.embedded


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`python -m moelab.cli serve ARGS --port P` (on CPU unless ARGS say otherwise), ready when it logs
    phase=ready; TERM on close."""

    def __init__(self, *args: str, log: Path, env: dict[str, str] | None = None) -> None:
        if "--device" not in args:  # the same model and numbers on a GPU machine too
            args = (*args, "--device", "cpu")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "moelab.cli", "serve", *args, "--port", str(self.port)],
                                     stdout=subprocess.PIPE, stderr=log.open("w"), start_new_session=True, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 90
        while "phase=ready" not in log.read_text():
            assert self.proc.poll() is None, f"server died: {log.read_text()}"
            assert time.monotonic() < deadline, f"server not ready: {log.read_text()}"
            time.sleep(0.1)

    def post(self, path: str, body) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def stream(self, path: str, body: dict) -> list:
        req = urllib.request.Request(self.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            lines = [ln.decode().strip() for ln in r if ln.strip()]
        assert lines[-1] == "data: [DONE]"
        return [json.loads(ln[len("data: "):]) for ln in lines[:-1]]

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Serve("--preset", "tiny", "--max-running-requests", "16", log=tmp_path_factory.mktemp("srv") / "log")
    yield s
    s.stop()


PROMPT = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}


def test_startup_phases_models_health_version(srv):
    log = srv.log.read_text()
    phases = [ln.split()[1] for ln in log.splitlines() if ln.startswith("moelab.engine phase=")]
    assert phases[0] == "phase=start" and "phase=building_weights" in phases and phases[-1] == "phase=ready"
    assert "layer 2/2" in log and f"127.0.0.1:{srv.port}" in log and "moe_runner_backend=grouped" in log
    assert srv.get("/health")["status"] == "ok"
    assert srv.get("/v1/models")["data"][0]["id"] == "moelab-tiny"
    assert "version" in srv.get("/version")


def test_completion_with_logprobs_and_usage(srv):
    code, r = srv.post("/v1/completions", {**PROMPT, "logprobs": 3})
    assert code == 200 and r["object"] == "text_completion"
    c = r["choices"][0]
    lp = c["logprobs"]
    assert c["finish_reason"] == "length" and len(lp["tokens"]) == 12 == r["usage"]["completion_tokens"]
    assert "".join(lp["tokens"]) == c["text"]  # printable-ASCII model: tokens spell the text
    assert r["usage"]["prompt_tokens"] == len(PROMPT["prompt"].encode())
    for tok, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3 and chosen <= 0
        assert max(top.values()) == pytest.approx(chosen)  # greedy: the chosen token is the top one
        assert tok in top


def test_greedy_is_deterministic_alone_and_in_a_batch(srv):
    alone = [srv.post("/v1/completions", {**PROMPT, "prompt": f"Prompt number {i}."})[1]["choices"][0]["text"]
             for i in range(6)]
    before = srv.get("/stats")
    with ThreadPoolExecutor(6) as ex:
        batched = list(ex.map(lambda i: srv.post("/v1/completions", {**PROMPT, "prompt": f"Prompt number {i}.",
                                                                      "max_tokens": 40})[1]["choices"][0]["text"],
                              range(6)))
    after = srv.get("/stats")
    assert [b[:len(a)] for a, b in zip(alone, batched)] == alone
    # the six requests really ran together: steps with more than one sequence happened
    assert after["max_batch"] > 1
    steps, gen = after["steps"] - before["steps"], after["generated_tokens"] - before["generated_tokens"]
    assert gen / steps > 2, f"mean batch {gen / steps:.2f}: the concurrent requests were not batched"


def test_streaming_completion_equals_non_streaming(srv):
    whole = srv.post("/v1/completions", {**PROMPT, "stop": None, "logprobs": 1})[1]["choices"][0]
    chunks = srv.stream("/v1/completions", {**PROMPT, "logprobs": 1, "stream_options": {"include_usage": True}})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["text"]
    streamed = [lp for c in chunks if c["choices"] for lp in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == whole["logprobs"]["token_logprobs"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_chat_plain_streaming_and_logprobs(srv):
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    code, r = srv.post("/v1/chat/completions", body)
    assert code == 200 and r["object"] == "chat.completion"
    msg, lp = r["choices"][0]["message"], r["choices"][0]["logprobs"]["content"]
    assert msg["role"] == "assistant" and len(lp) == 8 and all(len(x["top_logprobs"]) == 2 for x in lp)
    chunks = srv.stream("/v1/chat/completions", {k: v for k, v in body.items() if "logprobs" not in k})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == msg["content"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_stop_seed_min_tokens(srv):
    text = srv.post("/v1/completions", {**PROMPT, "max_tokens": 30})[1]["choices"][0]["text"]
    stop = text[5:7]
    r = srv.post("/v1/completions", {**PROMPT, "max_tokens": 30, "stop": [stop]})[1]["choices"][0]
    assert r["finish_reason"] == "stop" and r["text"] == text[:text.index(stop)]
    sampled = [srv.post("/v1/completions", {**PROMPT, "temperature": 1.0, "top_p": 0.9, "seed": s})[1]
               ["choices"][0]["text"] for s in (7, 7, 8)]
    assert sampled[0] == sampled[1] != sampled[2]
    r = srv.post("/v1/completions", {**PROMPT, "max_tokens": 5, "min_tokens": 5, "ignore_eos": True})[1]
    assert r["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    ({"prompt": "x", "temperature": 7}, 400, "temperature"),
    ({"prompt": "x", "max_tokens": "lots"}, 400, "max_tokens"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x" * 600}, 400, "prompt"),  # longer than the 512-token context
    ({"prompt": "x", "max_tokens": 600}, 400, "prompt"),
    ({"prompt": "x", "model": "gpt-9"}, 404, "model"),
])
def test_bad_requests_get_openai_errors(srv, body, status, param):
    code, r = srv.post("/v1/completions", body)
    assert code == status and r["error"]["message"] and r["error"]["param"] == param
    assert srv.post("/v1/chat/completions", {"messages": "hi"})[0] == 400


def test_overload_and_kv_capacity(tmp_path):
    s = Serve("--preset", "tiny", "--max-running-requests", "1", "--max-queued-requests", "1",
              "--max-total-tokens", "300", log=tmp_path / "log")
    try:
        code, r = s.post("/v1/completions", {"prompt": "x" * 100, "max_tokens": 250})
        assert code == 400 and "--max-total-tokens" in r["error"]["message"]
        body = {"prompt": "hello", "max_tokens": 200, "ignore_eos": True}
        with ThreadPoolExecutor(6) as ex:
            codes = sorted(c for c, _ in ex.map(lambda _: s.post("/v1/completions", body), range(6)))
        assert codes[0] == 200 and codes[-1] == 503, codes  # one runs, one waits, the rest are refused
    finally:
        assert s.stop() == 0


def test_client_that_goes_away_frees_its_kv_slots(srv):
    aborted = srv.get("/stats")["aborted"]
    req = urllib.request.Request(srv.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": "abc", "max_tokens": 400, "ignore_eos": True,
                                                  "stream": True}).encode())
    r = urllib.request.urlopen(req, timeout=30)
    r.readline()
    r.close()  # hang up mid-stream
    deadline = time.monotonic() + 10
    while (st := srv.get("/stats"))["running"] or st["kv_tokens_free"] != st["kv_tokens_total"]:
        assert time.monotonic() < deadline, f"the aborted request still holds the engine: {st}"
        time.sleep(0.1)
    assert st["aborted"] == aborted + 1
