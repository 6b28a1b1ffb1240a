"""Capture a server's merged stdout/stderr: time-stamped lines to server.log, kept in memory too.

The file is flushed line by line, so the log is complete up to the moment of a SIGKILL. Each line
in the file is `<UTC ISO time> <line>`; the classifier strips that prefix again, and line numbers in
verdict evidence are line numbers of server.log. The launch phase is read from each line through
the engine adapter's `phase_of`. Secrets are masked before a line is kept or written (engines log
their own arguments: vLLM prints `api_key=...` among its non-default args).
"""
from __future__ import annotations

import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable

_PORT_ERR = re.compile(r"Address already in use|EADDRINUSE|\[Errno 98\]")


class LogCapture:
    def __init__(self, stream: IO[bytes], path: Path, phase_of: Callable[[str], str | None],
                 max_lines: int = 200_000, mask: Callable[[str], str] = lambda s: s) -> None:
        self._mask = mask
        self.path = path
        self.lines: list[str] = []
        self.phase = "start"
        self.phase_line: int | None = None
        self.last_line_at = time.monotonic()
        self.port_error_at: float | None = None
        self._phase_of = phase_of
        self._max = max_lines
        self._stream = stream
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="moelab-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with open(self.path, "w", encoding="utf-8", buffering=1) as out:
            for raw in iter(self._stream.readline, b""):
                line = self._mask(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
                stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
                out.write(f"{stamp} {line}\n")
                with self._lock:
                    if len(self.lines) < self._max:
                        self.lines.append(line)
                    self.last_line_at = time.monotonic()
                    phase = self._phase_of(line)
                    if phase:
                        self.phase, self.phase_line = phase, len(self.lines)
                    if self.port_error_at is None and _PORT_ERR.search(line):
                        self.port_error_at = time.monotonic()

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def drain(self, timeout: float) -> bool:
        """Wait (bounded) for the reader to reach EOF; False if something still holds the pipe."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        self.drain(2.0)
        try:
            self._stream.close()
        except OSError:
            pass
