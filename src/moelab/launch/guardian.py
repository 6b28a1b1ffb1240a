"""The guardian: a small process that outlives moelab and ends a trial's server tree if moelab goes.

moelab starts one guardian per launch, before the server, and keeps the write end of a pipe to
it; the guardian blocks reading the other end. However moelab ends (an exception, Ctrl-C, SIGKILL,
a closed terminal), the kernel closes that write end, the guardian reads end-of-file and ends every
process that carries the trial's marker (TERM, a grace period, then KILL), then removes the trial's
cgroup. A clean teardown tells it so first, and it exits touching nothing.

The protocol is lines on the pipe:

    root 12345        the server's pid (its process group is ended too)
    done              moelab tore the tree down itself; exit quietly

The guardian runs in its own session (a terminal's SIGHUP or Ctrl-C does not reach it) and writes
what it did to `guardian.log` in the trial folder.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


class Guardian:
    """moelab's side: start the guardian, tell it the server's pid, stand it down after teardown."""

    def __init__(self, marker: str, trial_dir: Path, grace_s: float = 3.0, cgroup: Path | None = None) -> None:
        log = open(Path(trial_dir) / "guardian.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moelab.launch.guardian", marker, str(grace_s), str(cgroup or "")],
                stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True, close_fds=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            log.close()

    def _say(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def root(self, pid: int) -> None:
        self._say(f"root {pid}")

    def stand_down(self, timeout: float = 5.0) -> None:
        """The tree is gone: let the guardian exit without acting."""
        self._say("done")
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def guard(marker: str, grace_s: float, cgroup: str, stream) -> int:
    """Block until moelab says `done` (exit 0) or goes away (end the tree, exit 0)."""
    root = None
    for raw in iter(stream.readline, b""):
        word, _, arg = raw.decode(errors="replace").strip().partition(" ")
        if word == "done":
            return 0
        if word == "root" and arg.isdigit():
            root = int(arg)
    # end of file without `done`: moelab is gone
    from moelab.launch.proctree import ProcessTree, marked_pids

    root = root or next(iter(marked_pids(marker)), None)
    if root is None:
        print(f"{_stamp()} moelab went away; no process of trial {marker} was left", flush=True)
    else:
        print(f"{_stamp()} moelab went away without tearing down (trial {marker}); ending the server tree",
              flush=True)
        rep = ProcessTree(root, marker).teardown(grace_s)
        print(f"{_stamp()} ended: TERM to {rep.termed}, KILL to {rep.killed}, survivors "
              f"{rep.survivors or 'none'}", flush=True)
    if cgroup:
        for _ in range(20):  # the kernel frees an emptied cgroup a moment after its last process
            try:
                os.rmdir(cgroup)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
    return 0


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    marker, grace, cgroup = sys.argv[1], float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else ""
    return guard(marker, grace, cgroup, sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
