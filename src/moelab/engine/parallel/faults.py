"""Failures on purpose, so that what a dead or stuck rank does to a launch is tested for real.

`MOELAB_ENGINE_FAULT="rank=1 phase=warmup action=raise"` makes that rank, at the moment it enters
that phase, fail in one of three ways a real rank fails:
    raise   raise a RuntimeError (a bug or a failed kernel in one rank)
    hang    stop making progress without exiting (a stuck kernel or a deadlock)
    alloc   take host memory 64 MiB at a time until the kernel's OOM killer ends it
Everything after that is the engine's real behaviour: the other ranks' collectives fail or time
out, rank 0 reports the first cause and ends every rank. Phases are the names the engine logs
(`moelab.engine phase=<name>`): building_weights / loading_weights, warmup. Unset, nothing happens.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass

ENV = "MOELAB_ENGINE_FAULT"
ACTIONS = ("raise", "hang", "alloc")


@dataclass(frozen=True)
class Fault:
    rank: int
    phase: str
    action: str


def parse(text: str) -> Fault:
    """'rank=1 phase=warmup action=raise' -> Fault; ValueError naming what is wrong."""
    kv = dict(part.split("=", 1) for part in text.replace(",", " ").split() if "=" in part)
    try:
        fault = Fault(int(kv["rank"]), kv["phase"], kv["action"])
    except (KeyError, ValueError):
        raise ValueError(f"{ENV}={text!r}: expected 'rank=N phase=NAME action={'|'.join(ACTIONS)}'") from None
    if fault.action not in ACTIONS:
        raise ValueError(f"{ENV}: action {fault.action!r} is not one of {', '.join(ACTIONS)}")
    return fault


@functools.lru_cache(maxsize=1)
def _configured() -> Fault | None:
    text = os.environ.get(ENV)
    return parse(text) if text else None


def hit(rank: int, phase: str) -> None:
    """Fail here if the environment asks this rank to fail in this phase."""
    f = _configured()
    if f is None or (f.rank, f.phase) != (rank, phase):
        return
    print(f"moelab.engine {ENV}: rank {rank} fails in phase {phase} ({f.action})", file=sys.stderr, flush=True)
    if f.action == "raise":
        raise RuntimeError(f"{ENV}: injected failure in rank {rank}, phase {phase}")
    if f.action == "hang":
        while True:
            time.sleep(3600)
    hold = []
    while True:  # touched pages, so they count against the memory limit at once
        hold.append(bytearray(64 << 20))
        for i in range(0, len(hold[-1]), 4096):
            hold[-1][i] = 1
