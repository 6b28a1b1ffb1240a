"""Which part of the model each rank holds: plain arithmetic on the parallel sizes, no torch.

`--tp-size N` makes N ranks. Attention is split by heads: rank r holds query heads
[r*nh/N, (r+1)*nh/N) and the KV heads they read (a KV head is copied to several ranks when N
exceeds the KV head count, as SGLang does). The MoE is split the way SGLang splits it: with
`--ep-size 1` every rank holds a 1/N slice of every expert's intermediate dimension; with
`--ep-size E` the N ranks form E expert groups of N/E ranks, group g holds whole experts
[g*X/E, (g+1)*X/E) and slices them N/E ways. Worked example, tiny preset (4 heads, 2 KV heads,
8 experts, intermediate 32) at --tp-size 2 --ep-size 2:

    rank 0: query heads 0-1, KV head 0, experts 0-3 whole (intermediate 0-32)
    rank 1: query heads 2-3, KV head 1, experts 4-7 whole (intermediate 0-32)

and at --tp-size 2 --ep-size 1: rank 1 holds every expert's intermediate rows 16-32.
Embeddings, norms, the router and the LM head are whole on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallelism:
    """The parallel sizes of one launch (SGLang's meanings; ranks = tp)."""

    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"parallel sizes must be at least 1 (tp {self.tp}, ep {self.ep})")
        if self.tp % self.ep:
            raise ValueError(f"--ep-size {self.ep} must divide --tp-size {self.tp}")

    @property
    def ranks(self) -> int:
        return self.tp

    @property
    def moe_tp(self) -> int:
        """Ranks that share one expert group (each holds a slice of its experts)."""
        return self.tp // self.ep

    def problems(self, heads: int, kv_heads: int, experts: int, intermediate: int, granule: int = 1) -> list[str]:
        """Why a model cannot be split this way (empty: it can). `granule`: the intermediate slice
        must be a multiple of it (the weight format's scale block: 16 for nvfp4, 128 for block fp8)."""
        out = []
        if heads % self.tp:
            out.append(f"the model's {heads} attention heads do not split over {self.tp} ranks")
        if kv_heads % self.tp and self.tp % kv_heads:
            out.append(f"the model's {kv_heads} KV heads neither split over nor divide {self.tp} ranks")
        if experts % self.ep:
            out.append(f"the model's {experts} experts do not split over {self.ep} expert groups")
        if intermediate % (self.moe_tp * granule):
            out.append(f"the experts' intermediate size {intermediate} does not split into {self.moe_tp} equal slices"
                       + (f" of a multiple of {granule} (the weight format's scale groups)" if granule > 1 else ""))
        return out

    def heads(self, rank: int, heads: int) -> range:
        n = heads // self.tp
        return range(rank * n, (rank + 1) * n)

    def kv_heads(self, rank: int, kv_heads: int) -> range:
        if kv_heads >= self.tp:
            n = kv_heads // self.tp
            return range(rank * n, (rank + 1) * n)
        h = rank * kv_heads // self.tp  # fewer KV heads than ranks: each is copied tp/kv_heads times
        return range(h, h + 1)

    def experts(self, rank: int, experts: int) -> range:
        n = experts // self.ep
        g = rank // self.moe_tp
        return range(g * n, (g + 1) * n)

    def intermediate(self, rank: int, size: int) -> range:
        n = size // self.moe_tp
        s = rank % self.moe_tp
        return range(s * n, (s + 1) * n)

    def describe(self) -> str:
        if self.tp == 1:
            return "one rank"
        moe = (f"experts tensor-parallel ({self.tp} slices of every expert)" if self.ep == 1 else
               f"experts in {self.ep} groups of whole experts" + (f", each sliced {self.moe_tp} ways"
                                                                  if self.moe_tp > 1 else ""))
        return f"{self.tp} ranks: attention heads split {self.tp} ways, {moe}"
