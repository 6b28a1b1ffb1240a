"""Start a bad_server.py (or the calibrated bench server) as a real child process, end it after."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(mode: str = "healthy", *args: str, script: Path | None = None, command: list[str] | None = None,
          env: dict | None = None, timeout: float = 10.0):
    """Yield the base URL of a running server; the process is ended (and reaped) on exit.

    `command`: any server's argv instead (`--port N` and `args` are appended) that listens once ready."""
    port = _port()
    if command:
        argv = [*command, "--port", str(port), *args]
    else:
        argv = [sys.executable, str(script or HERE / "bad_server.py"), "--port", str(port)]
        argv += ([] if script else ["--mode", mode]) + list(args)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv} did not start")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
