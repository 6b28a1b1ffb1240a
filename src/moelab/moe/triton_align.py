"""Token/expert alignment for the fused MoE kernel: one Triton launch up to 4,096 pairs, else a
memset and two launches (count, then offsets + scatter).

The T*K (token, slot) pairs are counting-sorted by expert and each expert's segment is padded to a
multiple of BLOCK_M, so every BLOCK_M rows of the sorted list belong to one expert:
    sorted_ids  [maxlen]      pair index t*K+k, or the sentinel T*K on padding rows
    expert_ids  [maxlen/BM]   expert of each M-block
    total       [1]           padded length actually used (blocks past it exit at once)
No host synchronisation, so the whole MoE layer can be captured in a CUDA graph. The order of pairs
inside one expert comes from atomics and may vary; results do not depend on it.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N", "MAXLEN"])
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, sorted_ptr, N, MAXLEN, BLOCK: tl.constexpr):
    """Rank of each pair inside its expert, and the sentinel N on every sorted row (the scatter,
    a later launch, overwrites the real ones); the grid covers max(N, MAXLEN)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(sorted_ptr + offs, tl.full((BLOCK,), N, tl.int32), mask=offs < MAXLEN)
    m = offs < N
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    r = tl.atomic_add(counts_ptr + e, 1, mask=m)  # old value = rank of this pair inside its expert
    tl.store(rank_ptr + offs, r, mask=m)


@triton.jit
def _segments(counts_ptr, E, BM: tl.constexpr, EB: tl.constexpr):
    """Each expert's segment padded to a multiple of BM: (experts, their mask, padded sizes, ends)."""
    e = tl.arange(0, EB)
    em = e < E
    padded = (tl.load(counts_ptr + e, mask=em, other=0) + BM - 1) // BM * BM
    return e, em, padded, tl.cumsum(padded, 0)


@triton.jit
def _store_block_experts(expert_ids_ptr, b, ends, em, E, NUM_BLOCKS, BM: tl.constexpr):
    """expert of block b = number of experts whose padded segment ends at or before b*BM."""
    before = (ends[None, :] <= (b * BM)[:, None]) & em[None, :]  # [BB, EB]
    tl.store(expert_ids_ptr + b, tl.minimum(tl.sum(before.to(tl.int32), 1), E - 1), mask=b < NUM_BLOCKS)


@triton.jit(do_not_specialize=["NUM_BLOCKS"])
def _offsets_kernel(counts_ptr, starts_ptr, expert_ids_ptr, total_ptr, E, NUM_BLOCKS,
                    BM: tl.constexpr, EB: tl.constexpr, BB: tl.constexpr):
    e, em, padded, ends = _segments(counts_ptr, E, BM, EB)
    tl.store(starts_ptr + e, ends - padded, mask=em)
    tl.store(total_ptr, tl.sum(padded, 0))
    for b0 in range(0, NUM_BLOCKS, BB):
        _store_block_experts(expert_ids_ptr, b0 + tl.arange(0, BB), ends, em, E, NUM_BLOCKS, BM)


@triton.jit(do_not_specialize=["N", "NUM_BLOCKS"])
def _offsets_scatter_kernel(ids_ptr, counts_ptr, rank_ptr, expert_ids_ptr, total_ptr, sorted_ptr, E, N,
                            NUM_BLOCKS, BM: tl.constexpr, EB: tl.constexpr, BLOCK: tl.constexpr,
                            BB: tl.constexpr):
    """Every program derives the expert offsets from the counts itself (E values), writes its share
    of the block->expert map and scatters its BLOCK pairs: one launch instead of two."""
    pid = tl.program_id(0)
    _, em, padded, ends = _segments(counts_ptr, E, BM, EB)
    if pid == 0:
        tl.store(total_ptr, tl.sum(padded, 0))
    for b0 in range(pid * BB, NUM_BLOCKS, tl.num_programs(0) * BB):
        _store_block_experts(expert_ids_ptr, b0 + tl.arange(0, BB), ends, em, E, NUM_BLOCKS, BM)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    ex = tl.load(ids_ptr + offs, mask=m, other=0)
    r = tl.load(rank_ptr + offs, mask=m, other=0)
    start = tl.gather(ends - padded, ex, 0)  # segment start of each pair's expert
    tl.store(sorted_ptr + start + r, offs, mask=m)


@triton.jit(do_not_specialize=["N", "MAXLEN", "NUM_BLOCKS"])
def _align_one_program_kernel(ids_ptr, counts_ptr, rank_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                              E, N, MAXLEN, NUM_BLOCKS, BM: tl.constexpr, EB: tl.constexpr,
                              BLOCK: tl.constexpr, BB: tl.constexpr):
    """The same three steps in one program (one launch, no memset) for small T*K: decode latency.

    Barriers order the phases; global writes of one program are visible to its own threads after one.
    """
    e = tl.arange(0, EB)
    tl.store(counts_ptr + e, tl.zeros((EB,), dtype=tl.int32), mask=e < E)
    for i0 in range(0, MAXLEN, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        tl.store(sorted_ptr + i, tl.full((BLOCK,), N, tl.int32), mask=i < MAXLEN)  # sentinel first
    tl.debug_barrier()
    for i0 in range(0, N, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < N
        ex = tl.load(ids_ptr + offs, mask=m, other=0)
        tl.store(rank_ptr + offs, tl.atomic_add(counts_ptr + ex, 1, mask=m), mask=m)
    tl.debug_barrier()
    _offsets_kernel(counts_ptr, starts_ptr, expert_ids_ptr, total_ptr, E, NUM_BLOCKS, BM, EB, BB)
    tl.debug_barrier()
    for i0 in range(0, N, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < N
        ex = tl.load(ids_ptr + offs, mask=m, other=0)
        r = tl.load(rank_ptr + offs, mask=m, other=0)
        st = tl.load(starts_ptr + ex, mask=m, other=0)
        tl.store(sorted_ptr + st + r, offs, mask=m)


ONE_PROGRAM_MAX_PAIRS = 4096


def _warps(n: int) -> dict[str, int]:
    """num_warps, except under Triton's CPU interpreter, which takes no launch options."""
    return {} if os.environ.get("TRITON_INTERPRET") == "1" else {"num_warps": n}


def max_padded_len(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: at most min(pairs, E) experts get a partial block."""
    n = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return triton.cdiv(n, block_m) * block_m


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, K] -> (sorted_ids [maxlen] int32, expert_ids [maxlen/BM] int32, total [1] int32)."""
    ids = topk_ids.reshape(-1).to(torch.int32)
    n = ids.numel()
    dev = ids.device
    maxlen = max_padded_len(n, num_experts, block_m)
    num_blocks = maxlen // block_m
    eb = triton.next_power_of_2(num_experts)
    counts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    rank = torch.empty(n, dtype=torch.int32, device=dev)
    starts = torch.empty(num_experts, dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(maxlen, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    if n <= ONE_PROGRAM_MAX_PAIRS:
        _align_one_program_kernel[(1,)](ids, counts, rank, starts, sorted_ids, expert_ids, total, num_experts, n,
                                        maxlen, num_blocks, BM=block_m, EB=eb, BLOCK=1024, BB=64,
                                        **_warps(8))
        return sorted_ids, expert_ids, total
    counts.zero_()
    blk = 1024
    _count_kernel[(triton.cdiv(max(n, maxlen), blk),)](ids, counts, rank, sorted_ids, n, maxlen, BLOCK=blk)
    _offsets_scatter_kernel[(triton.cdiv(n, 256),)](ids, counts, rank, expert_ids, total, sorted_ids, num_experts, n,
                                                    num_blocks, BM=block_m, EB=eb, BLOCK=256, BB=16)
    return sorted_ids, expert_ids, total
