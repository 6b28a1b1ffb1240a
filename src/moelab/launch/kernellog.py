"""Kernel log lines about the trial's own processes: OOM kills and segfaults, where readable.

`dmesg` needs privileges on many hosts (kernel.dmesg_restrict); when it cannot be read this says
nothing rather than guessing. Only lines naming one of the trial's PIDs are kept, so another
process's OOM kill on a shared host is never blamed on this server.
"""
from __future__ import annotations

import re
import subprocess

_OOM = re.compile(r"Killed process (\d+)|oom-kill:.*?\bpid=(\d+)")
_SEGV = re.compile(r"\[(\d+)\]: segfault at|\[(\d+)\]: trap ")


def read_dmesg(timeout: float = 1.0) -> list[str]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.splitlines() if out.returncode == 0 else []


def lines_for(pids: set[int], lines: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(OOM-kill lines, segfault/trap lines) that name one of `pids`."""
    lines = read_dmesg() if lines is None else lines
    oom, segv = [], []
    for ln in lines:
        for rx, bucket in ((_OOM, oom), (_SEGV, segv)):
            m = rx.search(ln)
            if m and int(next(g for g in m.groups() if g)) in pids:
                bucket.append(ln.strip())
    killed = [ln for ln in oom if "Killed process" in ln]
    return killed or oom, segv  # the "Killed process" line says it all; the oom-kill: line is its long twin
