"""torch.distributed for the ranks of one launch: rendezvous, groups, and bounded waits.

Rank 0 holds a TCPStore; every rank connects to it when it starts. Startup work whose length
differs between ranks (imports, loading, kernel compilation) is synchronised through the store
(`store_barrier`), which has no collective timeout to trip over; only then are the process groups
made (`Collectives`), with `--dist-timeout` on every collective, so that a rank that stops
answering fails the others' next collective within that time instead of never. A peer that
dies closes its sockets, and gloo fails the pending collective at once.

Backends: the process group is gloo on CPU and NCCL on CUDA. Rank 0's commands go down its own
sockets to each rank (star.py), as SGLang keeps a CPU channel beside NCCL for its broadcasts. The
all-reduces of CPU ranks go the same way by default (moelab's custom all-reduce, one round trip);
`--disable-custom-all-reduce` sends them through gloo instead; on CUDA they are NCCL's.
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from moelab.engine.parallel import plan as P
from moelab.engine.parallel.star import Star


class CollectiveError(RuntimeError):
    """A collective that failed or timed out on this rank; `op` names it, `timed_out` says which."""

    def __init__(self, op: str, rank: int, cause: BaseException) -> None:
        self.op, self.rank, self.cause = op, rank, cause
        self.text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        self.timed_out = isinstance(cause, TimeoutError) or "timed out" in self.text.lower()
        super().__init__(f"{op} on rank {rank}: {self.text}")


def backend_for(device: str) -> str:
    """The collective backend for a device: NCCL on CUDA, gloo elsewhere."""
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, rank: int, ranks: int) -> str:
    """Rank r of a multi-rank CUDA launch runs on GPU r (of those CUDA_VISIBLE_DEVICES shows)."""
    return f"cuda:{rank}" if device == "cuda" and ranks > 1 else device


def open_store(host: str, port: int, ranks: int, leader: bool, timeout_s: float) -> dist.TCPStore:
    """The launch's TCPStore; the leader's binds `port` (0: any free port, read back from `.port`)."""
    return dist.TCPStore(host, port, ranks, is_master=leader, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def store_barrier(store: dist.TCPStore, name: str, ranks: int, poll_s: float = 0.01) -> None:
    """Wait until every rank has arrived at `name`. No timeout of its own: a rank that dies is
    seen by rank 0's watchdog, and rank 0's death ends the others (see ranks.py)."""
    key = f"barrier/{name}"
    store.add(key, 1)
    while store.add(key, 0) < ranks:
        time.sleep(poll_s)


class Collectives:
    """This rank's process groups, made once every rank has loaded (all ranks call it together)."""

    def __init__(self, rank: int, ranks: int, store: dist.TCPStore, device: str, timeout_s: float,
                 custom_all_reduce: bool = True) -> None:
        self.rank, self.ranks, self.timeout_s = rank, ranks, timeout_s
        self.backend = backend_for(device)
        self.custom = custom_all_reduce and self.backend == "gloo"  # CUDA tensors go through NCCL
        if self.backend == "nccl" and torch.device(device).index is not None:
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(self.backend, store=dist.PrefixStore("moelab", store), rank=rank,
                                world_size=ranks, timeout=timedelta(seconds=timeout_s))
        self.star = Star(rank, ranks, store, timeout_s)
        self._header = torch.zeros(P.HEADER, dtype=torch.long)

    @property
    def all_reduce_name(self) -> str:
        return "moelab's custom all-reduce (sockets to rank 0)" if self.custom else f"torch.distributed ({self.backend})"

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place; returns it."""
        try:
            if self.custom:
                return self.star.all_reduce(t)
            dist.all_reduce(t)
        except (RuntimeError, OSError) as e:
            raise CollectiveError("all_reduce", self.rank, e) from e
        return t

    def send(self, cmd: P.Command) -> None:
        """Rank 0: a command to every rank."""
        try:
            self.star.send(*P.encode(cmd))
        except OSError as e:
            raise CollectiveError("command", self.rank, e) from e

    def receive(self) -> P.Command:
        """Every other rank: the next command from rank 0."""
        try:
            self.star.recv_into(self._header)
            payload = torch.empty(P.payload_size(self._header), dtype=torch.long)
            self.star.recv_into(payload)
        except OSError as e:
            raise CollectiveError("command", self.rank, e) from e
        return P.decode(self._header, payload)

    def close(self) -> None:
        self.star.close()
        if dist.is_initialized():
            dist.destroy_process_group()
