"""Fused Triton kernels for the small per-token operations of a layer (CUDA, and Triton's CPU
interpreter for tests).

In eager PyTorch these are some forty elementwise launches per layer (each RMSNorm alone is
seven: cast, square, mean, add, rsqrt, multiply, cast back), and a decode step is mostly launch
latency: on an H200 the small preset's step at 32 sequences spent about as long in them as in
the MoE. Here each is one launch, with the rounding of the PyTorch code it replaces (model.py):
values are rounded to the model dtype wherever PyTorch rounds them, so both paths give the same
tokens up to float32 summation order.

    add_rms_norm   residual += delta (rounded), out = w * rmsnorm(residual)   one program per row
    qk_norm_rope   per-head q/k RMSNorm, rotary embedding, in place in the fused qkv buffer, and the
                   new K/V written to their cache slots                       one program per (token, head)
    router_topk    softmax over the experts, top-k, optional renormalisation   one program per token
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _warps(n: int) -> dict:
    return {} if _interpreting() else {"num_warps": n}


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, N, eps, stride_x, stride_r, stride_o,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=m, other=0.0)
    if HAS_RES:  # the residual sum, rounded to the model dtype as PyTorch's add rounds it
        x = (x.to(tl.float32) + tl.load(r_ptr + row * stride_r + offs, mask=m, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(r_ptr + row * stride_r + offs, x, mask=m)
    xf = x.to(tl.float32)
    rs = 1.0 / tl.sqrt_rn(tl.sum(xf * xf, 0) / N + eps)
    y = (xf * rs).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (w * y).to(out_ptr.dtype.element_ty), mask=m)


def add_rms_norm(delta: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(w * rmsnorm(residual + delta), residual + delta); the residual tensor is updated in place.
    With residual None: (w * rmsnorm(delta), delta)."""
    T, N = delta.shape
    out = torch.empty_like(delta)
    res = residual if residual is not None else delta
    if T:
        _add_rms_norm_kernel[(T,)](delta, res, w, out, N, eps, delta.stride(0), res.stride(0), out.stride(0),
                                   HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(N), **_warps(4))
    return out, res


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, kc_ptr, vc_ptr, eps,
                         stride_t, stride_c, stride_ks, stride_kh, stride_vs, stride_vh,
                         NH: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)  # 0..NH-1: query heads, NH..NH+KVH-1: key heads
    half = tl.arange(0, D // 2)
    base = qkv_ptr + t * stride_t + h * D
    x1 = tl.load(base + half)
    x2 = tl.load(base + D // 2 + half)
    dt = x1.dtype
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    rs = 1.0 / tl.sqrt_rn((tl.sum(x1f * x1f, 0) + tl.sum(x2f * x2f, 0)) / D + eps)
    if h < NH:
        w1, w2 = tl.load(qw_ptr + half).to(tl.float32), tl.load(qw_ptr + D // 2 + half).to(tl.float32)
    else:
        w1, w2 = tl.load(kw_ptr + half).to(tl.float32), tl.load(kw_ptr + D // 2 + half).to(tl.float32)
    y1 = (w1 * (x1f * rs).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    y2 = (w2 * (x2f * rs).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    p = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + p * stride_c + half)  # rotate-half tables repeat their frequencies: one half
    s = tl.load(sin_ptr + p * stride_c + half)
    o1 = (y1 * c - y2 * s).to(dt)
    o2 = (y2 * c + y1 * s).to(dt)
    tl.store(base + half, o1)
    tl.store(base + D // 2 + half, o2)
    if h >= NH:  # a key head: it and its value head go to the cache slot of this token
        slot = tl.load(slot_ptr + t).to(tl.int64)
        kv = h - NH
        tl.store(kc_ptr + slot * stride_ks + kv * stride_kh + half, o1)
        tl.store(kc_ptr + slot * stride_ks + kv * stride_kh + D // 2 + half, o2)
        vbase = qkv_ptr + t * stride_t + (NH + KVH + kv) * D
        vd = tl.arange(0, D)
        tl.store(vc_ptr + slot * stride_vs + kv * stride_vh + vd, tl.load(vbase + vd))


def qk_norm_rope(qkv: torch.Tensor, nh: int, kvh: int, D: int, qw: torch.Tensor, kw: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, write_slots: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, eps: float) -> None:
    """qkv [T, (nh + 2 kvh) * D], rows contiguous: q and k heads normalised and rotated in place; the
    new K and V rows written to k_cache/v_cache [slots, kvh, D] at write_slots [T]."""
    T = qkv.shape[0]
    if T:
        _qk_norm_rope_kernel[(T, nh + kvh)](qkv, qw, kw, cos, sin, positions, write_slots, k_cache, v_cache, eps,
                                            qkv.stride(0), cos.stride(0), k_cache.stride(0), k_cache.stride(1),
                                            v_cache.stride(0), v_cache.stride(1), NH=nh, KVH=kvh, D=D, **_warps(1))


@triton.jit
def _router_topk_kernel(logits_ptr, w_ptr, ids_ptr, E, stride_l, K: tl.constexpr, KB: tl.constexpr,
                        EB: tl.constexpr, NORM: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, EB)
    m = e < E
    x = tl.load(logits_ptr + t * stride_l + e, mask=m, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = p / tl.sum(p, 0)
    p = tl.where(m, p, -1.0)
    kk = tl.arange(0, KB)
    vals = tl.zeros((KB,), dtype=tl.float32)
    idx = tl.zeros((KB,), dtype=tl.int64)
    for k in tl.static_range(K):  # descending, the lowest expert id first among equal weights
        best = tl.max(p, 0)
        i = tl.min(tl.where(p == best, e, EB), 0)
        vals = tl.where(kk == k, best, vals)
        idx = tl.where(kk == k, i, idx)
        p = tl.where(e == i, -1.0, p)
    if NORM:
        vals = vals / tl.sum(tl.where(kk < K, vals, 0.0), 0)
    tl.store(w_ptr + t * K + kk, vals, mask=kk < K)
    tl.store(ids_ptr + t * K + kk, idx, mask=kk < K)


def router_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64), like softmax + topk."""
    T, E = logits.shape
    w = torch.empty(T, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, k, dtype=torch.int64, device=logits.device)
    if T:
        _router_topk_kernel[(T,)](logits, w, ids, E, logits.stride(0), K=k, KB=triton.next_power_of_2(k),
                                  EB=triton.next_power_of_2(E), NORM=normalize, **_warps(4))
    return w, ids
