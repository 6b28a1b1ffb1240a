"""A lean streaming HTTP/1.1 client on raw non-blocking sockets, timestamps taken as bytes arrive.

Why not aiohttp: every layer between the socket and the timestamp adds latency and CPU per token,
and on a 2-core machine the client competes with the server (vllm#39963: a client buffer made
throughput collapse). Each read is stamped with the kernel's receive time of the data
(SO_TIMESTAMPNS, converted to the perf_counter clock), so a busy event loop that reads a few
milliseconds late does not shift the timestamps; where the kernel gives no stamp the client takes
`time.perf_counter()` as the first thing on reading. The parser then de-chunks and splits SSE
events in place; one JSON parse per event. One connection per request (`Connection: close`), so no
pool state can leak between requests.
"""
from __future__ import annotations

import asyncio
import json
import platform
import socket
import struct
import sys
import time
from urllib.parse import urlsplit

from pydantic import BaseModel, Field


class Sample(BaseModel):
    """One request as the client saw it. Times are perf_counter seconds; stats derive from these."""

    kind: str = "load"  # "load" or "probe" (a probe prompt mixed into the load)
    scheduled: float = 0.0  # when the schedule wanted it sent
    start: float = 0.0  # when the request was written to the socket: TTFT and E2E count from here
    connect_ms: float | None = None  # TCP connect time before `start` (client side, not the server's)
    arrivals: list[float] = Field(default_factory=list)  # one per SSE event carrying text
    end: float = 0.0
    prompt_tokens: int | None = None  # from the server's usage, when it reports one
    output_tokens: int | None = None  # usage.completion_tokens, else the number of text events
    requested_output: int | None = None
    status: int | None = None
    error: str | None = None  # error kind: connect, http_500, disconnect, timeout, bad_stream
    error_detail: str | None = None
    kernel_stamps: bool = False  # arrivals carry the kernel's receive time (immune to loop lag)
    body: str | None = None  # non-streamed answer (probe prompts), kept for the correctness check

    @property
    def ok(self) -> bool:
        return self.error is None


class Endpoint:
    """Where requests go: host, port and path prefix parsed once from the base URL."""

    def __init__(self, base_url: str, api_key: str | None = None):
        u = urlsplit(base_url if "://" in base_url else "http://" + base_url)
        self.auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        if u.scheme != "http":
            raise ValueError(f"only http:// URLs are supported, got {base_url!r}")
        self.host, self.port, self.prefix = u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/")

    def request(self, path: str, body: dict) -> bytes:
        data = json.dumps(body).encode()
        return (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{self.auth}Connection: close\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode() + data


# SO_TIMESTAMPNS: Python's socket module does not export it; 35 is its value (and that of the
# SCM_TIMESTAMPNS cmsg) in Linux's asm-generic socket.h, used by x86_64 and arm64. Elsewhere the
# loop's read time is used.
_TS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" and platform.machine() in
              ("x86_64", "aarch64", "arm64") else None)
_CMSG = socket.CMSG_SPACE(16) if _TS is not None else 0  # struct timespec: 2 x int64


def clock_offset() -> float:
    """CLOCK_REALTIME - perf_counter, read back to back (kernel stamps are wall-clock)."""
    best = None
    for _ in range(5):  # the pair read fastest is the most accurate
        a = time.perf_counter()
        w = time.time()
        b = time.perf_counter()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) / 2)
    return best[1]  # type: ignore[index]


async def open_socket(ep: Endpoint, timeout_s: float) -> socket.socket:
    """A connected non-blocking socket with kernel receive stamps on. Rate runs open it before the
    request is due, so that connecting does not make the send late. Raises OSError / TimeoutError."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6 if ":" in ep.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if _TS is not None:
        sock.setsockopt(socket.SOL_SOCKET, _TS, 1)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (ep.host, ep.port)), timeout_s)
    except BaseException:
        sock.close()
        raise
    return sock


async def send(ep: Endpoint, path: str, body: dict, sample: Sample, timeout_s: float,
               offset: float | None = None, connecting: asyncio.Task | None = None) -> Sample:
    """Send one request and fill `sample`; never raises for request-level failures. `connecting`:
    an `open_socket` task started ahead of time (else the connection is opened now)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    off = clock_offset() if offset is None else offset
    sample.start = time.perf_counter()  # replaced by the write time once connected
    try:
        sock = await (connecting if connecting is not None else open_socket(ep, timeout_s))
    except (OSError, asyncio.TimeoutError) as e:
        sample.error, sample.error_detail, sample.end = "connect", f"{type(e).__name__}: {e}", time.perf_counter()
        return sample
    fd = sock.fileno()
    reading = False

    def close() -> None:
        nonlocal reading
        if reading:
            loop.remove_reader(fd)
            reading = False

    from moelab.load.sse import Response  # here: sse.py imports Sample from this module

    resp = Response(sample, done, bool(body.get("stream")), close)

    def readable() -> None:
        try:
            data, anc, _, _ = sock.recvmsg(262144, _CMSG)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            close()
            resp.eof(e)
            return
        t = None
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == _TS and len(raw) >= 16:
                sec, nsec = struct.unpack("qq", raw[:16])
                t = sec + nsec * 1e-9 - off
                sample.kernel_stamps = True
        if t is None:
            t = time.perf_counter()
        if data:
            resp.feed(data, t)
        else:
            close()
            resp.eof(None)

    try:
        t = time.perf_counter()
        sample.connect_ms, sample.start = (t - sample.start) * 1e3, t  # connect_ms: time still waited here
        loop.add_reader(fd, readable)
        reading = True
        try:
            await asyncio.wait_for(loop.sock_sendall(sock, ep.request(path, body)), timeout_s)
            await asyncio.wait_for(done, max(0.001, timeout_s - (time.perf_counter() - sample.start)))
        except asyncio.TimeoutError:
            sample.error, sample.error_detail, sample.end = "timeout", f"no complete answer in {timeout_s:.0f} s", time.perf_counter()
        except OSError as e:
            if not done.done():
                sample.error, sample.error_detail, sample.end = "disconnect", f"{type(e).__name__}: {e}", time.perf_counter()
    finally:
        close()
        sock.close()
    return sample
