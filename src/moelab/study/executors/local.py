"""Packed trials on this machine: side by side on disjoint GPU sets, or on disjoint CPU sets.

With GPUs (NVML sees some), a trial gets as many of the free GPUs as it has ranks
(`EngineAdapter.gpus_needed`: --tp-size x DP x PP), passed as CUDA_VISIBLE_DEVICES; its foreign-process
and memory checks look at those GPUs only. Without GPUs, each of `parallel` slots owns a fixed,
disjoint share of the CPUs this process may use (taskset and OMP_NUM_THREADS for the server tree).
Every trial keeps its own port (picked at launch), telemetry, cgroup, guardian and teardown: each
runs `run_trial` in a thread of the driver, which stays the only writer of the store.

    >>> shares([0, 1, 2, 3, 4], 2)
    [[0, 1, 2], [3, 4]]
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Callable, ClassVar

from moelab.spec import LaunchSpec
from moelab.study.executors.base import Executor, Need, TrialJob


def shares(cpus: list[int], n: int) -> list[list[int]]:
    """`cpus` cut into n disjoint contiguous shares (the first ones one larger when uneven)."""
    n = max(1, min(n, len(cpus)))
    k, m = divmod(len(cpus), n)
    return [cpus[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]


def visible_gpus() -> list[int]:
    """NVML indices this process may use: all it sees, narrowed by CUDA_VISIBLE_DEVICES (indices)."""
    from moelab import hw

    found = [g.index for g in hw.gpus()]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and all(x.strip().isdigit() for x in cvd.split(",") if x.strip()):
        allowed = {int(x) for x in cvd.split(",") if x.strip()}
        found = [i for i in found if i in allowed]
    return found


def resolve_parallel(parallel: str | int, gpus: list[int], cpus: list[int]) -> int:
    """`--parallel N|auto`: auto is one trial per GPU, or per CPU on a machine without GPUs."""
    if str(parallel) == "auto":
        return max(1, len(gpus) or len(cpus))
    n = int(parallel)
    if n < 1:
        raise ValueError(f"--parallel {parallel}: give a count of at least 1, or auto")
    return n


class LocalExecutor(Executor):
    name: ClassVar[str] = "local"

    def __init__(self, parallel: str | int = "auto", gpus: list[int] | None = None,
                 cpus: list[int] | None = None) -> None:
        self.gpus = visible_gpus() if gpus is None else list(gpus)
        cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        self.slots = resolve_parallel(parallel, self.gpus, cpus)
        self.free_gpus = list(self.gpus)
        self.free_cpus = shares(cpus, self.slots)  # one share per slot, handed out and back
        self.running: dict[int, tuple[TrialJob, threading.Thread, list[int], list[int]]] = {}
        self.done: queue.Queue = queue.Queue()

    def describe(self) -> str:
        where = f"GPUs {','.join(map(str, self.gpus))}" if self.gpus else \
            f"CPU shares {' | '.join(','.join(map(str, s)) for s in self.free_cpus)}"
        return f"local, {self.slots} trials side by side on {where}"

    def need(self, spec: LaunchSpec) -> Need:
        from moelab.engines import ENGINES

        return Need(gpus=ENGINES.create(spec.engine).gpus_needed(spec.args) if self.gpus else 0)

    def refuse(self, need: Need) -> str | None:
        if need.gpus > len(self.gpus):
            return f"needs {need.gpus} GPUs, this machine has {len(self.gpus)}"
        return None

    def fits_now(self, need: Need) -> bool:
        return len(self.running) < self.slots and len(self.free_gpus) >= need.gpus and bool(self.free_cpus)

    def submit(self, job: TrialJob) -> None:
        gpus = [self.free_gpus.pop(0) for _ in range(job.need.gpus)]
        cpus = self.free_cpus.pop(0)
        job.spec = job.spec.model_copy(update={"gpus": gpus if self.gpus else job.spec.gpus,
                                               "cpus": None if self.gpus else cpus})
        job.placement = {"executor": self.name, **({"gpus": gpus} if self.gpus else {"cpus": cpus})}

        def work() -> None:
            try:
                out = job.run(on_progress=lambda p: self.done.put(("progress", job, {"event": "progress",
                                                                                     "id": job.tid, **p})))
            except BaseException as e:  # noqa: BLE001 - handed to the driver thread, which decides
                out = e
            self.done.put(("done", job, out))

        t = threading.Thread(target=work, name=f"moelab-trial-{job.tid}", daemon=True)
        self.running[job.tid] = (job, t, gpus, cpus)
        t.start()

    def wait(self, on_event: Callable[[dict], None]) -> tuple[TrialJob, object]:
        while True:
            kind, job, what = self.done.get()
            if kind == "progress":
                on_event(what)
                continue
            _, t, gpus, cpus = self.running.pop(job.tid)
            t.join()
            self.free_gpus = sorted(self.free_gpus + gpus)
            self.free_cpus.append(cpus)
            return job, what

    def stop(self) -> None:
        """End every running trial's server tree (found by the trial's owner mark), then let each
        thread's supervisor finish its own teardown and stand its guardian down."""
        from moelab.study.runner import sweep

        sweep([job.spec.marks for job, *_ in self.running.values()])
        for job, t, *_ in list(self.running.values()):
            t.join(timeout=30)
        self.running.clear()
