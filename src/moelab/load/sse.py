"""Incremental parser of one HTTP/1.1 response carrying an OpenAI-style SSE stream.

Fed read by read with the arrival time of each read; fills a `Sample`: status, one arrival stamp
per SSE event that carries text, usage, errors. Handles chunked, Content-Length and
close-delimited bodies; a non-200 status turns the body into the error detail.
"""
from __future__ import annotations

import asyncio
import json
import time

from moelab.load.client import Sample


class Response:
    """Parses one HTTP response fed read by read: headers, then chunked or length- or
    close-delimited body, then (streaming) SSE events `data: {...}\\n\\n` until `data: [DONE]`."""

    def __init__(self, sample: Sample, done: asyncio.Future, stream: bool, close):
        self.s, self.done, self.stream, self.close = sample, done, stream, close
        self.head = b""
        self.headers_done = False
        self.chunked = False
        self.length: int | None = None
        self.raw = bytearray()  # undecoded body bytes (chunk framing still in)
        self.body = bytearray()  # decoded body bytes not yet consumed as SSE events
        self.full = bytearray()  # whole decoded body for non-streamed answers
        self.finished = False
        self.t: float | None = None  # arrival time of the latest read: the end of a finished answer

    def feed(self, data: bytes, t: float) -> None:
        """`data` arrived at time `t` (perf_counter clock)."""
        self.t = t
        if not self.headers_done:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            self._parse_head(bytes(self.head[:i]))
            data, self.headers_done = self.head[i + 4:], True
            if self.s.status != 200:
                self.stream = False  # collect the error body
        self.raw += data
        self._dechunk()
        if self.stream:
            self._events(t)
        if self.length is not None and len(self.full) >= self.length:
            self._finish()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        self.s.status = int(lines[0].split()[1])
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == b"transfer-encoding" and b"chunked" in v:
                self.chunked = True
            elif k == b"content-length":
                self.length = int(v)

    def _dechunk(self) -> None:
        if not self.chunked:
            self.body += self.raw
            self.full += self.raw
            self.raw.clear()
            return
        pos = 0
        raw = self.raw
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(raw[pos:eol]).split(b";")[0] or b"0", 16)
            if size == 0:
                self._finish()
                pos = len(raw)
                break
            if len(raw) < eol + 2 + size + 2:
                break
            piece = raw[eol + 2:eol + 2 + size]
            self.body += piece
            if not self.stream:
                self.full += piece
            pos = eol + 2 + size + 2
        del raw[:pos]

    def _events(self, t: float) -> None:
        buf = self.body
        pos = 0
        while True:
            j = buf.find(b"\n\n", pos)
            if j < 0:
                break
            ev = bytes(buf[pos:j]).strip()
            pos = j + 2
            if not ev.startswith(b"data:"):
                continue
            payload = ev[5:].strip()
            if payload == b"[DONE]":
                self._finish()
                break
            try:
                doc = json.loads(payload)
            except ValueError:
                self._fail("bad_stream", f"invalid SSE JSON: {payload[:80]!r}")
                break
            usage = doc.get("usage")
            if usage:
                self.s.prompt_tokens = usage.get("prompt_tokens")
                self.s.output_tokens = usage.get("completion_tokens")
            for ch in doc.get("choices") or ():
                if ch.get("text") or (ch.get("delta") or {}).get("content"):
                    self.s.arrivals.append(t)
        del buf[:pos]

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.s.end = self.t if self.t is not None else time.perf_counter()
        if self.s.status != 200:
            self.s.error, self.s.error_detail = f"http_{self.s.status}", bytes(self.full[:200]).decode(errors="replace")
        elif not self.stream:
            self.s.body = bytes(self.full).decode(errors="replace")
        if self.s.output_tokens is None and self.stream:
            self.s.output_tokens = len(self.s.arrivals)
        if not self.done.done():
            self.done.set_result(None)
        self.close()

    def _fail(self, kind: str, detail: str) -> None:
        if self.finished:
            return
        self.s.error, self.s.error_detail = kind, detail
        self.finished = True
        self.s.end = time.perf_counter()
        if not self.done.done():
            self.done.set_result(None)
        self.close()

    def eof(self, exc: BaseException | None) -> None:
        if self.finished or self.done.done():  # done cancelled: the caller timed out and closed us
            return
        if self.headers_done and not self.chunked and self.length is None:
            self._finish()  # close-delimited body: the close is the end
        else:
            self._fail("disconnect", f"connection closed mid-response ({exc or 'EOF'})")
