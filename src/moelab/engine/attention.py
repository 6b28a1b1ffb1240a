"""Decode attention over the slot KV cache in one Triton launch, for CUDA (and CUDA graphs).

Each decode token attends to the first `length` keys of its sequence, whose cache slots are row
`lane` of a slot table the engine keeps on the GPU (written once when the sequence is admitted).
Nothing about the step's shape reaches the host: lanes and lengths are tensors, so the same
launch serves any mix of context lengths and can be captured in a CUDA graph.

One program per (sequence, KV head): the `rep` query heads sharing that KV head form the rows of
the tile (padded to 16 for the tensor cores), and the keys are streamed in blocks with an online
softmax, so cached K/V are read once per KV head and never gathered or repeated.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, lanes_ptr, lens_ptr, sm_scale,
                             stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh,
                             stride_ob, stride_oh, stride_tl,
                             REP: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                             F32: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)  # KV head
    lane = tl.load(lanes_ptr + b).to(tl.int64)
    n_keys = tl.load(lens_ptr + b).to(tl.int32)
    r = tl.arange(0, ROWS)
    d = tl.arange(0, D)
    rm = r < REP
    q = tl.load(q_ptr + b * stride_qb + (h * REP + r)[:, None] * stride_qh + d[None, :], mask=rm[:, None], other=0.0)
    if F32:
        q = q.to(tl.float32)
    m_i = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, D), dtype=tl.float32)
    scale = sm_scale * 1.4426950408889634  # exp2 domain
    for n0 in range(0, n_keys, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < n_keys
        slot = tl.load(table_ptr + lane * stride_tl + n, mask=nm, other=0).to(tl.int64)
        k = tl.load(k_ptr + slot[:, None] * stride_ks + h * stride_kh + d[None, :], mask=nm[:, None], other=0.0)
        v = tl.load(v_ptr + slot[:, None] * stride_vs + h * stride_vh + d[None, :], mask=nm[:, None], other=0.0)
        if F32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(nm[None, :], s * scale, float("-inf"))  # [ROWS, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if F32:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + (h * REP + r)[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rm[:, None])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                     lanes: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """q [B, nh, D]; caches [slots, kvh, D]; table [lanes, width] slot ids; lanes, lens [B] -> [B, nh, D].

    Token b attends to the cache slots table[lanes[b], :lens[b]] (its own key included)."""
    B, nh, D = q.shape
    kvh = k_cache.shape[1]
    rep = nh // kvh
    out = torch.empty_like(q)
    if B == 0:
        return out
    # float32 models (CPU-sized tests on a GPU) keep exact float32 dots instead of TF32; so does
    # Triton's CPU interpreter, which computes bf16 dots wrongly
    f32 = q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    kw = {} if os.environ.get("TRITON_INTERPRET") == "1" else {"num_warps": 4, "num_stages": 2}
    _decode_attention_kernel[(B, kvh)](
        q, k_cache, v_cache, out, table, lanes, lens, D ** -0.5,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1), table.stride(0),
        REP=rep, ROWS=max(16, triton.next_power_of_2(rep)), D=D, BLOCK_N=64, F32=f32, **kw)
    return out
