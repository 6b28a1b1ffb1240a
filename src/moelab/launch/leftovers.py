"""Servers left from earlier moelab runs: found by their trial marker, judged by their owner.

Every process a launch starts inherits two variables: the trial's marker (`MOELAB_TRIAL`) and the
owner (`MOELAB_OWNER=<pid>:<start time>` of the moelab process that launched it). A leftover is a
marked process whose owner is gone (its pid is dead, or reused by a process started at another
time). The guardian normally ends such trees within seconds; what it could not end (it was killed
too) is found here by `moelab doctor` and the next `moelab launch`, and ended on request. A
process whose owner still runs is never touched: it belongs to a live study.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from moelab.launch.proctree import MARKER, ProcessTree, environ_of

OWNER = "MOELAB_OWNER"


def owner_tag(pid: int | None = None) -> str:
    """`<pid>:<start time>` of this (or the given) process: what a leftover's owner is checked against."""
    p = psutil.Process(pid or os.getpid())
    return f"{p.pid}:{p.create_time():.2f}"


def owner_alive(tag: str | None) -> bool:
    if not tag or ":" not in tag:
        return False
    pid, _, started = tag.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == started
    except (psutil.Error, ValueError):
        return False


@dataclass
class Leftover:
    """One trial's processes that outlived their moelab."""

    marker: str
    owner: str | None
    pids: list[int] = field(default_factory=list)
    root: int | None = None
    command: str = ""

    def describe(self) -> str:
        return f"pid {self.root} ({self.command[:90]}) and {len(self.pids) - 1} more" if len(self.pids) > 1 \
            else f"pid {self.root} ({self.command[:90]})"


def find(select: Callable[[dict[str, str]], bool] = lambda env: True, live_owner: bool = False) -> list[Leftover]:
    """Trials whose processes carry a marker, whose owner is gone (or alive too: `live_owner`, a
    driver's own sweep after an interrupt or a lost worker), and that `select(env)` picks."""
    by_marker: dict[str, Leftover] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        env = environ_of(int(d.name))
        if not env or MARKER not in env or (not live_owner and owner_alive(env.get(OWNER))) or not select(env):
            continue
        lo = by_marker.setdefault(env[MARKER], Leftover(env[MARKER], env.get(OWNER)))
        lo.pids.append(int(d.name))
    for lo in by_marker.values():
        marked = set(lo.pids)
        for pid in sorted(lo.pids):
            try:
                p = psutil.Process(pid)
                if p.ppid() not in marked:  # the top of the tree: the server (or what is left of it)
                    lo.root, lo.command = pid, " ".join(p.cmdline()) or p.name()
                    break
            except psutil.Error:
                continue
        lo.root = lo.root or min(lo.pids)
    return [lo for lo in by_marker.values() if lo.pids]


def end(leftovers: list[Leftover], grace_s: float = 3.0) -> list[int]:
    """TERM, then KILL, every process of these trials; the pids that were ended."""
    ended = []
    for lo in leftovers:
        ProcessTree(lo.root, lo.marker).teardown(grace_s)
        ended += lo.pids
    return ended
