"""The executor interface: run a study's trials concurrently; the driver keeps the store.

A `TrialJob` is everything `run_trial` needs for one stored trial, plain data that pickles (Ray
ships it to a node). An executor starts jobs (`submit`), hands back finished ones in the order
they finish (`wait`), and on an interrupt ends every trial still running (`stop`). It never
writes the store: the driver thread does, from what `wait` returns.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from moelab.spec import LaunchSpec


@dataclass(frozen=True)
class Need:
    """What one trial occupies while it runs: GPUs (its ranks; 0 where trials run on CPUs) and CPUs."""

    gpus: int = 0
    cpus: int = 1

    def describe(self) -> str:
        return f"{self.gpus} GPU(s) and {self.cpus} CPU(s)" if self.gpus else f"{self.cpus} CPU(s)"


@dataclass
class TrialJob:
    """One launch of a stored trial (`tid`), with run_trial's arguments as fields."""

    tid: int
    label: str
    spec: LaunchSpec
    out_dir: Path
    flags: dict
    workload: Any
    slo: dict
    reference: Path | None
    loads: int
    concurrency: list[int]
    record_reference_to: Path | None = None
    accuracy: Any = None
    answers: Path | None = None
    objective: str = "throughput"
    need: Need = field(default_factory=Need)
    attempt: int = 0  # 1: the rerun of a trial whose worker or node was lost
    row: dict = field(default_factory=dict)  # the store row written when it starts
    stage: str = ""
    rep: int = 0
    placement: dict = field(default_factory=dict)  # where it ran (executor, GPUs, CPU share, node), kept in telemetry

    def run(self, on_progress: Callable[[dict], None] | None = None):
        from moelab.study.trial import run_trial

        return run_trial(self.spec, self.out_dir, flags=self.flags, workload=self.workload, slo=self.slo,
                         reference=self.reference, loads=self.loads, concurrency=self.concurrency,
                         record_reference_to=self.record_reference_to, accuracy=self.accuracy,
                         answers=self.answers, objective=self.objective, on_progress=on_progress)


class ExecutorError(Exception):
    """An executor that cannot start (Ray not installed, no cluster at --address): what to do."""


class Lost(Exception):
    """The worker or node running a trial went away mid-trial: the trial is `interrupted`, run again once."""


class Executor(ABC):
    name: ClassVar[str]

    @abstractmethod
    def need(self, spec: LaunchSpec) -> Need:
        """What a trial of `spec` occupies on this executor's machines."""

    @abstractmethod
    def refuse(self, need: Need) -> str | None:
        """Why no machine here can ever run a trial of `need` ("needs 8 GPUs, the largest node has 4"), or None."""

    @abstractmethod
    def fits_now(self, need: Need) -> bool:
        """A trial of `need` may start now (a slot and its resources are free)."""

    @abstractmethod
    def submit(self, job: TrialJob) -> None:
        """Start `job`; it comes back from `wait`."""

    @abstractmethod
    def wait(self, on_event: Callable[[dict], None]) -> tuple[TrialJob, Any]:
        """Block until a job ends: (job, its TrialOutcome, or the exception it raised, or Lost).
        Progress events of running jobs are passed to `on_event` meanwhile, in this thread."""

    @abstractmethod
    def stop(self) -> None:
        """End every running trial now (Ctrl-C, SIGTERM): each server torn down, none left."""

    def close(self) -> None:
        """Give back what the executor holds (a Ray connection)."""

    def describe(self) -> str:
        return self.name
