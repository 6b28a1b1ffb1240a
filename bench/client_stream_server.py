"""Calibrated stream server: OpenAI-style SSE tokens on a known schedule, for judging load clients.

A real HTTP/1.1 server on 127.0.0.1 (raw asyncio, stdlib only). For every POST to
/v1/completions or /v1/chat/completions with "stream": true it answers, counted from the moment
the request is fully read: the first token after --ttft-ms, then one token every --itl-ms
(absolute deadlines, so lateness never accumulates), `max_tokens` tokens in all, then a usage
chunk (when stream_options.include_usage) and `data: [DONE]`. --itl-ms 0 writes all tokens in one
burst: the client, not the server, then sets the pace (the ceiling test). Each event carries the
server's own perf_counter send stamp in "t" (CLOCK_MONOTONIC, shared by processes on one host).
Serves /health and /v1/models too. Usage: python bench/client_stream_server.py --port N
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import signal
import time

MODEL = "calibrated"
LATE: dict[str, list[float]] = {"first": [], "next": []}  # ms each write came after its due time


def lateness() -> dict:
    """p50/p99 of the server's own lateness: what the client's error must not be blamed for."""
    out = {}
    for k, xs in LATE.items():
        s = sorted(xs)
        out[k] = {"n": len(s), "p50_ms": s[len(s) // 2] if s else None, "p99_ms": s[int(len(s) * 0.99)] if s else None}
    return out


def event(i: int, t: float, chat: bool) -> bytes:
    """One SSE event in one chunk. Formatted with bytes %, not json.dumps: at 25,000 events/s the
    server's own CPU time must stay small next to the client it is judging."""
    if chat:
        data = (b'data: {"id":"cmpl-cal","object":"chat.completion.chunk","model":"calibrated","choices":'
                b'[{"index":0,"delta":{"content":" t%d"},"finish_reason":null}],"t":%.6f}\n\n' % (i, t))
    else:
        data = (b'data: {"id":"cmpl-cal","object":"text_completion","model":"calibrated","choices":'
                b'[{"index":0,"text":" t%d","finish_reason":null}],"t":%.6f}\n\n' % (i, t))
    return b"%x\r\n%s\r\n" % (len(data), data)


def tail(n: int, include_usage: bool) -> bytes:
    out = b""
    if include_usage:
        u = b"data: " + json.dumps({"id": "cmpl-cal", "choices": [], "model": MODEL, "usage": {
            "prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}).encode() + b"\n\n"
        out += b"%x\r\n%s\r\n" % (len(u), u)
    d = b"data: [DONE]\n\n"
    return out + b"%x\r\n%s\r\n" % (len(d), d) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: %s\r\n\r\n"


def plain(code: int, obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (code, len(body))) + body


class Ticker:
    """Writes every stream's due tokens from one timer callback, instead of one coroutine wake-up
    per token: at 25,000 tokens/s the server's own CPU time must stay small next to the client it
    judges, or its lateness would be blamed on the client. Heap items: (due, seq, stream)."""

    def __init__(self, itl: float):
        self.itl, self.heap, self.seq, self.handle = itl, [], 0, None
        self.loop = asyncio.get_running_loop()

    def add(self, due: float, st: dict) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (due, self.seq, st))
        if self.heap[0][2] is st:  # now the earliest: re-arm the timer
            self._arm()

    def _arm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = self.loop.call_later(max(0.0, self.heap[0][0] - time.perf_counter()), self._tick)

    def _tick(self) -> None:
        self.handle = None
        now = time.perf_counter()
        while self.heap and self.heap[0][0] <= now + 20e-6:
            due, _, st = heapq.heappop(self.heap)
            i, t = st["i"], time.perf_counter()
            LATE["first" if i == 0 else "next"].append((t - due) * 1e3)
            st["w"].write(event(i, t, st["chat"]))
            st["i"] = i + 1
            if st["i"] < st["n"]:
                self.seq += 1
                heapq.heappush(self.heap, (due + self.itl, self.seq, st))
            else:
                st["w"].write(tail(st["n"], st["usage"]))
                st["done"].set_result(None)
        if self.heap:
            self._arm()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ttft: float, itl: float,
                 ticker: Ticker) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:  # keep-alive: aiohttp clients (vllm bench serve) reuse connections
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            hdr = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(hdr.get("content-length", "0")))
            t_req = time.perf_counter()
            keep = hdr.get("connection", "").lower() != "close"
            if method == "GET":
                obj = {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 65536}]} \
                    if path.startswith("/v1/models") else lateness() if path.startswith("/calibration") else {}
                writer.write(plain(200, obj))
            else:
                req = json.loads(body or b"{}")
                n, chat = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16), "chat" in path
                usage = bool((req.get("stream_options") or {}).get("include_usage"))
                writer.write(HEAD % (b"keep-alive" if keep else b"close"))
                if itl <= 0:  # burst: everything right after TTFT
                    await asyncio.sleep(max(0.0, t_req + ttft - time.perf_counter()))
                    t = time.perf_counter()
                    LATE["first"].append((t - t_req - ttft) * 1e3)
                    writer.write(b"".join(event(i, t, chat) for i in range(n)) + tail(n, usage))
                else:
                    st = {"w": writer, "i": 0, "n": n, "chat": chat, "usage": usage, "done": loop.create_future()}
                    ticker.add(t_req + ttft, st)
                    await st["done"]
            await writer.drain()
            if not keep:
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    a = ap.parse_args()
    ticker = Ticker(a.itl_ms / 1e3)
    server = await asyncio.start_server(lambda r, w: handle(r, w, a.ttft_ms / 1e3, a.itl_ms / 1e3, ticker),
                                        "127.0.0.1", a.port, backlog=4096)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: os._exit(0))
    print(f"calibrated stream server on 127.0.0.1:{a.port} ttft={a.ttft_ms} ms itl={a.itl_ms} ms", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    # select() takes its timeout in microseconds, epoll in milliseconds: with epoll every token
    # would be up to 1 ms late and tokens of different streams would bunch into the same ms.
    import selectors

    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    asyncio.set_event_loop(loop)
    loop.run_until_complete(main())
