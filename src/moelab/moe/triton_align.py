"""Token/expert alignment for the fused MoE kernel, in three small Triton launches.

The T*K (token, slot) pairs are counting-sorted by expert and each expert's segment is padded to a
multiple of BLOCK_M, so every BLOCK_M rows of the sorted list belong to one expert:
    sorted_ids  [maxlen]      pair index t*K+k, or the sentinel T*K on padding rows
    expert_ids  [maxlen/BM]   expert of each M-block
    total       [1]           padded length actually used (blocks past it exit at once)
No host synchronisation, so the whole MoE layer can be captured in a CUDA graph. The order of pairs
inside one expert comes from atomics and may vary; results do not depend on it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["N"])
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    r = tl.atomic_add(counts_ptr + e, 1, mask=m)  # old value = rank of this pair inside its expert
    tl.store(rank_ptr + offs, r, mask=m)


@triton.jit(do_not_specialize=["N", "MAXLEN", "NUM_BLOCKS"])
def _offsets_kernel(counts_ptr, starts_ptr, expert_ids_ptr, total_ptr, sorted_ptr, E, N, MAXLEN,
                    NUM_BLOCKS, BM: tl.constexpr, EB: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.arange(0, EB)
    em = e < E
    c = tl.load(counts_ptr + e, mask=em, other=0)
    padded = (c + BM - 1) // BM * BM  # [EB]
    ends = tl.cumsum(padded, 0)
    tl.store(starts_ptr + e, ends - padded, mask=em)
    tl.store(total_ptr, tl.sum(padded, 0))
    for b0 in range(0, NUM_BLOCKS, BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        # expert of block b = number of experts whose padded segment ends at or before b*BM
        before = (ends[None, :] <= (b * BM)[:, None]) & em[None, :]  # [BLOCK, EB]
        ex = tl.minimum(tl.sum(before.to(tl.int32), 1), E - 1)
        tl.store(expert_ids_ptr + b, ex, mask=b < NUM_BLOCKS)
    for i0 in range(0, MAXLEN, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        tl.store(sorted_ptr + i, N, mask=i < MAXLEN)  # sentinel on every row first


@triton.jit(do_not_specialize=["N"])
def _scatter_kernel(ids_ptr, rank_ptr, starts_ptr, sorted_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    r = tl.load(rank_ptr + offs, mask=m, other=0)
    s = tl.load(starts_ptr + e, mask=m, other=0)
    tl.store(sorted_ptr + s + r, offs, mask=m)


@triton.jit(do_not_specialize=["N", "MAXLEN", "NUM_BLOCKS"])
def _align_one_program_kernel(ids_ptr, counts_ptr, rank_ptr, starts_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                              E, N, MAXLEN, NUM_BLOCKS, BM: tl.constexpr, EB: tl.constexpr,
                              BLOCK: tl.constexpr):
    """The same three steps in one program (one launch, no memset) for small T*K: decode latency.

    Barriers order the phases; global writes of one program are visible to its own threads after one.
    """
    e = tl.arange(0, EB)
    tl.store(counts_ptr + e, tl.zeros((EB,), dtype=tl.int32), mask=e < E)
    tl.debug_barrier()
    for i0 in range(0, N, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < N
        ex = tl.load(ids_ptr + offs, mask=m, other=0)
        tl.store(rank_ptr + offs, tl.atomic_add(counts_ptr + ex, 1, mask=m), mask=m)
    tl.debug_barrier()
    _offsets_kernel(counts_ptr, starts_ptr, expert_ids_ptr, total_ptr, sorted_ptr, E, N, MAXLEN, NUM_BLOCKS,
                    BM, EB, BLOCK)
    tl.debug_barrier()
    for i0 in range(0, N, BLOCK):
        offs = i0 + tl.arange(0, BLOCK)
        m = offs < N
        ex = tl.load(ids_ptr + offs, mask=m, other=0)
        r = tl.load(rank_ptr + offs, mask=m, other=0)
        st = tl.load(starts_ptr + ex, mask=m, other=0)
        tl.store(sorted_ptr + st + r, offs, mask=m)


ONE_PROGRAM_MAX_PAIRS = 4096


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
                                        maxlen, num_blocks, BM=block_m, EB=eb, BLOCK=256)
        return sorted_ids, expert_ids, total
    counts.zero_()
    blk = 1024
    grid = (triton.cdiv(n, blk),)
    _count_kernel[grid](ids, counts, rank, n, BLOCK=blk)
    _offsets_kernel[(1,)](counts, starts, expert_ids, total, sorted_ids, num_experts, n, maxlen, num_blocks,
                          BM=block_m, EB=eb, BLOCK=64)
    _scatter_kernel[grid](ids, rank, starts, sorted_ids, n, BLOCK=blk)
    return sorted_ids, expert_ids, total
