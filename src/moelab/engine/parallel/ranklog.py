"""Log lines of a rank in SGLang's style, `[2026-12-01 10:11:12 TP1] <line>`.

Every rank writes to the same stdout/stderr (the ranks of one launch share the pipe to their
supervisor, as SGLang's do), so lines interleave; the prefix says whose each one is, and
moelab's classifier strips it to find each rank's first traceback. `install("TP1")` wraps
sys.stderr (and sys.stdout on ranks that print no JSON document) in a `RankStream`, which
buffers partial writes and prefixes each complete line once:

    >>> import io; s = RankStream(io.StringIO(), "TP1", clock=lambda: "2026-12-01 10:11:12")
    >>> for part in ("phase=start ", "pid=7\\nnext"):
    ...     _ = s.write(part)
    >>> s.flush(); s.stream.getvalue()
    '[2026-12-01 10:11:12 TP1] phase=start pid=7\\n[2026-12-01 10:11:12 TP1] next\\n'
"""
from __future__ import annotations

import io
import sys
import threading
import time
from typing import Callable, TextIO


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class RankStream(io.TextIOBase):
    def __init__(self, stream: TextIO, label: str, clock: Callable[[], str] = _now) -> None:
        self.stream, self.label, self.clock = stream, label, clock
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + s).split("\n")
            if lines:
                prefix = f"[{self.clock()} {self.label}] "
                self.stream.write("".join(f"{prefix}{ln}\n" for ln in lines))
                self.stream.flush()
        return len(s)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self.stream.write(f"[{self.clock()} {self.label}] {self._partial}\n")
                self._partial = ""
            self.stream.flush()

    def fileno(self) -> int:  # faulthandler and subprocess write to the real descriptor
        return self.stream.fileno()


def label(rank: int) -> str:
    return f"TP{rank}"


def install(rank: int, stdout: bool = True) -> None:
    """Prefix this process's stderr (and stdout unless it carries a JSON document) with its rank."""
    sys.stderr = RankStream(sys.__stderr__, label(rank))
    if stdout:
        sys.stdout = RankStream(sys.__stdout__, label(rank))
