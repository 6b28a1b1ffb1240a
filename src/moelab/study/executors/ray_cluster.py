"""Trials on a Ray cluster: each a Ray task in a placement group of what it needs, on one node.

The task runs moelab's own supervisor on the node it lands on (launch, diagnose, probe, load,
teardown, the guardian) and returns the TrialOutcome as data; the driver writes the store. The
trial folder stays on that node, its path and the node recorded in the trial's telemetry
(`placement`). Pitfalls handled here:
  - inside a placement group CUDA_VISIBLE_DEVICES is empty unless the task itself asks for GPUs
    (ray#50180): the task asks for exactly its bundle's GPUs and passes Ray's ids on as spec.gpus;
  - one bundle per trial, STRICT_PACK: a TP group never spans nodes;
  - Ray does not reap a server started in its own session, nor a SIGKILLed worker's children
    (ray#42861): the guardian of each trial ends them, and the driver sweeps this machine too;
  - max_retries=0: a lost worker or node is moelab's to handle (`interrupted`, rerun once), and a
    trial no node can hold is refused at once rather than left pending forever.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, ClassVar

from moelab.spec import LaunchSpec
from moelab.study.executors.base import Executor, ExecutorError, Lost, Need, TrialJob

MISSING = ("--executor ray needs Ray, which is not installed here: pip install 'moelab[ray]' "
           "(or pip install 'ray==2.60.*') on this machine and on every node of the cluster")


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ExecutorError(f"{MISSING} ({e})") from None
    return ray


def _remote_trial(job: TrialJob, files: dict[str, bytes]):
    """On the node: write the reference files the trial reads, run it, return what it produced."""
    import ray

    for path, data in files.items():  # the reference answers a probe compares against
        p = Path(path)
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    ids = [int(g) for g in ray.get_gpu_ids()] if job.need.gpus else None
    if ids is not None:  # ray#50180: the ids Ray gave this task, as the server's CUDA_VISIBLE_DEVICES
        job.spec = job.spec.model_copy(update={"gpus": ids})
    ctx = ray.get_runtime_context()
    placed = {"executor": "ray", "node": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
              "worker_pid": os.getpid(), **({"gpus": ids} if ids is not None else {})}
    out = job.run()
    back = {}
    for p in (job.record_reference_to, job.answers):
        if p is not None and Path(p).exists():
            back[str(p)] = Path(p).read_bytes()
    return out, placed, back


def _lost_errors(ray) -> tuple[type, ...]:
    names = ("WorkerCrashedError", "NodeDiedError", "ActorDiedError", "ActorUnavailableError", "LocalRayletDiedError",
             "ObjectLostError", "OwnerDiedError", "ObjectFetchTimedOutError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


class RayExecutor(Executor):
    name: ClassVar[str] = "ray"

    def __init__(self, address: str | None = None, parallel: str | int = "auto") -> None:
        ray = self.ray = _import_ray()
        import moelab

        src = str(Path(moelab.__file__).resolve().parents[1])  # this moelab, for nodes of a local cluster
        paths = [src, *(str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        self.started = not ray.is_initialized()
        kw = dict(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level="WARNING",
                  runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}})
        target = address or os.environ.get("RAY_ADDRESS")
        if target is None:  # a local cluster, for this study only
            kw.update(include_dashboard=False)
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ExecutorError(f"--executor ray: could not reach a Ray cluster at {address or 'a new local one'}: "
                                f"{e}") from None
        self.address = address or ray.get_runtime_context().gcs_address
        self.remote = ray.remote(max_retries=0)(_remote_trial)
        self.lost = _lost_errors(ray)
        self.refresh()
        self.slots = max(1, int(sum(n["cpus"] for n in self.nodes)) if str(parallel) == "auto" else int(parallel))
        self.running: dict = {}  # ObjectRef -> (job, placement group)

    def refresh(self) -> None:
        """The live nodes and what each declares (CPUs, GPUs; fake ones count: Ray schedules on them)."""
        self.nodes = [{"ip": n.get("NodeManagerAddress"), "cpus": n["Resources"].get("CPU", 0),
                       "gpus": int(n["Resources"].get("GPU", 0))} for n in self.ray.nodes() if n.get("Alive")]

    def describe(self) -> str:
        nodes = ", ".join(f"{n['ip']} ({n['cpus']:g} CPUs, {n['gpus']} GPUs)" for n in self.nodes)
        return f"ray at {self.address}, {len(self.nodes)} node(s): {nodes}; up to {self.slots} trials at once"

    def need(self, spec: LaunchSpec) -> Need:
        from moelab.engines import ENGINES

        # a cluster without GPUs runs trials on CPUs (as the local executor does on such a machine)
        gpus = ENGINES.create(spec.engine).gpus_needed(spec.args) if any(n["gpus"] for n in self.nodes) else 0
        return Need(gpus=gpus, cpus=1)

    def refuse(self, need: Need) -> str | None:
        self.refresh()
        most_gpus = max((n["gpus"] for n in self.nodes), default=0)
        if need.gpus > most_gpus:
            return f"needs {need.gpus} GPUs, the largest node has {most_gpus}"
        if not any(n["gpus"] >= need.gpus and n["cpus"] >= need.cpus for n in self.nodes):
            return f"needs {need.describe()} on one node; no node of the cluster has that"
        return None

    def fits_now(self, need: Need) -> bool:
        return len(self.running) < self.slots

    def submit(self, job: TrialJob) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": job.need.cpus, **({"GPU": job.need.gpus} if job.need.gpus else {})}
        pg = placement_group([bundle], strategy="STRICT_PACK", name=f"moelab-trial-{job.tid}")
        files = {str(p): Path(p).read_bytes() for p in (job.reference, job.answers)
                 if p is not None and Path(p).exists()}
        ref = self.remote.options(
            num_cpus=job.need.cpus, num_gpus=job.need.gpus, name=f"moelab-trial-{job.tid}",
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
        ).remote(job, files)
        self.running[ref] = (job, pg)

    def wait(self, on_event: Callable[[dict], None]) -> tuple[TrialJob, object]:
        ray = self.ray
        while True:
            ready, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
            if ready:
                break
        ref = ready[0]
        job, pg = self.running.pop(ref)
        try:
            out, placed, back = ray.get(ref)
            job.placement = placed
            for path, data in back.items():  # the reference the later probes compare against
                p = Path(path)
                if not p.exists() or p.read_bytes() != data:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(data)
            res = out
        except self.lost as e:
            self._sweep([job])
            res = Lost(f"the Ray worker or node running this trial was lost ({type(e).__name__}: "
                       f"{str(e).splitlines()[0][:300] if str(e) else ''}); it runs again once")
        except ray.exceptions.RayTaskError as e:  # moelab itself failed on the node
            res = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
        except ray.exceptions.TaskCancelledError as e:
            res = KeyboardInterrupt(str(e))
        finally:
            ray.util.remove_placement_group(pg)
        return job, res

    def _sweep(self, jobs: list[TrialJob]) -> None:
        """What the guardians have not ended yet on this machine (a local cluster's node)."""
        from moelab.study.runner import sweep

        sweep([j.spec.marks for j in jobs])

    def stop(self, grace_s: float = 20.0) -> None:
        """Ctrl-C / SIGTERM: KeyboardInterrupt in every running trial (its supervisor tears its server
        down), then, after `grace_s`, the worker killed (its guardian ends what is left), then a sweep."""
        ray = self.ray
        refs = list(self.running)
        for ref in refs:
            ray.cancel(ref, force=False)
        deadline = time.monotonic() + grace_s
        left = refs
        while left and time.monotonic() < deadline:
            _, left = ray.wait(left, num_returns=len(left), timeout=0.5)
        for ref in left:
            ray.cancel(ref, force=True)
        self._sweep([job for job, _ in self.running.values()])
        for _, pg in self.running.values():
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass
        self.running.clear()

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
