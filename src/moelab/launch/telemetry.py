"""Telemetry sampler: several times a second, the tree's host RSS, GPU memory per process, the phase.

Each sample is one JSON line in telemetry.jsonl: {"t": seconds since launch, "rss": bytes of the
whole tree, "procs": count, "gpu": {pid: bytes} or null without NVML, "phase": log phase,
"cgroup": cgroup usage bytes or null}. The sampler also notices death (to the sample, with the
phase at death) and stalls: no new log line and no RSS growth for `stall_after_s`.
"""
from __future__ import annotations

import json
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

from moelab.launch.logcapture import LogCapture
from moelab.launch.proctree import ProcessTree


@lru_cache(maxsize=1)
def _nvml():
    """pynvml, initialised once per process; None without the bindings, a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded ...
        return None


def gpu_memory_by_pid() -> dict[int, int] | None:
    """{pid: bytes} for every compute process on every GPU NVML sees; None without NVML."""
    nv = _nvml()
    if nv is None:
        return None
    out: dict[int, int] = {}
    try:
        for i in range(nv.nvmlDeviceGetCount()):
            for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i)):
                if isinstance(p.usedGpuMemory, int):  # None inside some containers
                    out[p.pid] = out.get(p.pid, 0) + p.usedGpuMemory
    except Exception:
        return None
    return out


def gpu_used_total() -> list[int] | None:
    """Used bytes per GPU (the teardown baseline); None without NVML."""
    nv = _nvml()
    try:
        return None if nv is None else [nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used
                                        for i in range(nv.nvmlDeviceGetCount())]
    except Exception:
        return None


class Sampler:
    def __init__(self, tree: ProcessTree, log: LogCapture, path: Path, is_dead: Callable[[], bool],
                 cgroup_usage: Callable[[], int | None], interval_s: float = 0.2, stall_after_s: float = 60.0):
        self.tree, self.log, self.path = tree, log, path
        self.interval, self.stall_after = interval_s, stall_after_s
        self._is_dead, self._cg = is_dead, cgroup_usage
        self.t0 = time.monotonic()
        self.samples = 0
        self.last_rss = 0
        self.peak_rss = 0
        self.peak_gpu = 0
        self.gpu_seen = False
        self.last_growth_at = self.t0
        self.died_at: float | None = None
        self.phase_at_death: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moelab-telemetry", daemon=True)
        self._thread.start()

    @property
    def stalled_for(self) -> float:
        """Seconds with neither a new log line nor RSS growth."""
        return time.monotonic() - max(self.log.last_line_at, self.last_growth_at)

    def _run(self) -> None:
        with open(self.path, "w", buffering=1) as out:
            while not self._stop.is_set():
                try:
                    self.sample(out)
                except Exception as e:  # a sampler bug must not take the launch down; say so once
                    out.write(json.dumps({"t": round(time.monotonic() - self.t0, 3), "error": repr(e)}) + "\n")
                    self._stop.wait(1.0)
                if self.died_at is not None and not self.tree.refresh():
                    break  # nothing left to measure
                self._stop.wait(self.interval)

    def sample(self, out) -> None:
        alive = self.tree.refresh()
        rss = self.tree.rss(alive)
        pids = {p.pid for p in alive}
        gpu = gpu_memory_by_pid()
        mine = None if gpu is None else {pid: b for pid, b in gpu.items() if pid in pids}
        now = time.monotonic()
        if rss > self.peak_rss + (1 << 20):
            self.last_growth_at = now
        self.peak_rss = max(self.peak_rss, rss)
        if mine is not None:
            self.gpu_seen = True
            self.peak_gpu = max(self.peak_gpu, sum(mine.values()))
        if self.died_at is None and self._is_dead():
            self.died_at, self.phase_at_death = now, self.log.phase
        else:
            self.last_rss = rss if rss else self.last_rss  # keep the last value measured alive
        self.samples += 1
        out.write(json.dumps({"t": round(now - self.t0, 3), "rss": rss, "procs": len(alive), "gpu": mine,
                              "phase": self.log.phase, "cgroup": self._cg(),
                              "stalled_s": round(self.stalled_for, 1)}) + "\n")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict:
        return {"samples": self.samples, "peak_rss_bytes": self.peak_rss, "last_rss_bytes": self.last_rss,
                "peak_gpu_bytes": self.peak_gpu if self.gpu_seen else None, "phase": self.log.phase,
                "interval_s": self.interval}
