"""CUDA graphs of the pure decode step: one captured forward per batch-size bucket, replayed.

A decode step of the small preset launches some hundred kernels whose GPU work is about 1 ms at
32 sequences, while PyTorch's eager dispatch of them takes several ms of host time: the engine
was host bound. A graph replays them all with one launch. Its inputs live in fixed buffers
(`inputs`, one row per field) that each step overwrites with one host-to-device copy; a batch is
padded up to the next captured size with rows that write their K/V to a scratch cache slot and
attend only to it, so padding never touches a real sequence's cache.

Only steps without prefills are captured (prefill shapes vary with every prompt), and only when
every kernel of the step is free of host synchronisation: the Triton decode attention
(attention.py) and a MoE runner that declares `graph_safe`.
"""
from __future__ import annotations

import torch

from moelab.engine.model import Qwen3Moe, StepBatch
from moelab.engine.scheduler import Sequence

_IDS, _POS, _WRITE, _LANE, _LEN = range(5)


def default_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_bs (and max_bs itself): padding wastes < 8 rows."""
    sizes = [s for s in (1, 2, 4) if s < max_bs] + list(range(8, max_bs + 1, 8))
    return sorted(set(sizes + [max_bs]))


class DecodeGraphs:
    def __init__(self, model: Qwen3Moe, kv_cache: list, slot_table: torch.Tensor, scratch_slot: int,
                 scratch_lane: int, sizes: list[int]) -> None:
        self.sizes = sorted(sizes)
        n, dev = self.sizes[-1], model.device
        self.pad = torch.tensor([0, 0, scratch_slot, scratch_lane, 1], dtype=torch.long)[:, None]  # a padding row
        self.inputs = self.pad.expand(5, n).contiguous().to(dev)  # [field, row]
        self.staging = torch.empty(5, n, dtype=torch.long, pin_memory=True)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        pool = None
        side = torch.cuda.Stream(dev)
        for bs in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            batch = self._batch(bs, slot_table)
            # one eager run first: Triton compiles its kernels and the allocator settles outside capture
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                model.forward(batch, kv_cache)
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = model.forward(batch, kv_cache)
            pool = graph.pool()
            self.graphs[bs] = (graph, logits)
        torch.cuda.synchronize(dev)

    def _batch(self, bs: int, slot_table: torch.Tensor) -> StepBatch:
        i = self.inputs
        return StepBatch(input_ids=i[_IDS, :bs], positions=i[_POS, :bs], write_slots=i[_WRITE, :bs], prefills=[],
                         decode_rows=None, last_index=None, slot_table=slot_table, decode_lanes=i[_LANE, :bs],
                         decode_lens=i[_LEN, :bs])

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def run(self, decode: list[Sequence]) -> torch.Tensor | None:
        """Replay the smallest graph that holds these sequences -> logits [B, V] (a view: read before the next run)."""
        B = len(decode)
        bs = next(s for s in self.sizes if s >= B)
        last = [s.length - 1 for s in decode]
        host = self.staging
        host[:, :B] = torch.tensor([[s.output_ids[-1] for s in decode], last,
                                    [s.slots[p] for s, p in zip(decode, last)], [s.lane for s in decode],
                                    [p + 1 for p in last]], dtype=torch.long)
        host[:, B:bs] = self.pad
        # the copy is queued before the replay on the same stream; the caller's sampling syncs on
        # the logits, so the staging buffer is free again before the next step writes it
        self.inputs[:, :bs].copy_(host[:, :bs], non_blocking=True)
        graph, logits = self.graphs[bs]
        graph.replay()
        return None if logits is None else logits[:B]  # None: a rank after 0 computes no logits
