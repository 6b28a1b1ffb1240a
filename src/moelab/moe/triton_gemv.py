"""Decode-size MoE kernels (Triton): two launches per layer (or one, fused), no alignment, no top-k sum.

At a few tokens the tiled path (triton_kernels.py) is latency-bound: alignment launches, M-blocks
that are mostly padding, a [T*K, H] buffer and a torch sum. Here:
    moe_gemv_up_kernel    act[p] = silu(x[t] . gate_e) * (x[t] . up_e)   per pair p = t*K+k, e = topk_ids[p]
    moe_gemv_down_kernel  out[t] = sum_k topk_w[t, k] * (act[t*K+k] . down_e)   slots summed in-program
                          (WIDE: all K slots' tiles in one load, see _wide_down)
Each program computes a block of rows with FMAs, not tl.dot (one activation row would fill a
sixteenth of an MMA): it loads the weight tile [rows, BLOCK_K] along K (coalesced), dequantizes it
in registers (format codes as in triton_kernels.py), multiplies by the broadcast activation slice
and accumulates elementwise in fp32, reducing the rows once after the K loop. The pair (up) or
token (down) index varies fastest in program order, so programs that share an expert read each
weight tile at about the same time and L2 serves the repeats. The K loops are software-pipelined
through tl.range(num_stages=STAGES): Triton pipelines only loads that feed a tl.dot unless a loop
asks. The down kernel adds the top-k slots in a fixed order, so results are deterministic.
    moe_fused_kernel      both in one launch, split along I, partial sums added atomically (see there)
"""
from __future__ import annotations

import triton
import triton.language as tl

from moelab.moe.triton_kernels import e2m1_words, stacked_rows

# nvfp4 values are read as float32 * 2**-126 (see _row_products); activations are scaled by 2**64
# so that products stay normal floats, and 2**62 restores the result.
_NVFP4_ACT_SCALE = tl.constexpr(2.0 ** 64)
_NVFP4_UNSCALE = tl.constexpr(2.0 ** 62)


@triton.jit
def _act(a_ptr, k0, K, FMT: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """The activation slice a[k0:k0+BK] in fp32: [BK], or [BK/8, 8] * 2**64 for nvfp4 (per packed word)."""
    if FMT == 3:
        offs = k0 + tl.arange(0, BK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    else:
        offs = k0 + tl.arange(0, BK)
    if EVEN_K:
        a = tl.load(a_ptr + offs).to(tl.float32)
    else:
        a = tl.load(a_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    if FMT == 3:
        a *= _NVFP4_ACT_SCALE
    return a


@triton.jit
def _word_products(p, x):
    """Per uint32 word of 8 nvfp4 values, the sum of value * activation: p [..., W] words, x
    [..., W, 2, 2, 2] the activations (element 8w + 4h + 2b + c at [w, h, b, c]), its leading dims
    broadcastable to p's. Returns [..., W] in fp32 (values * 2**-126: see e2m1_words)."""
    x_c0, x_c1 = tl.split(x)
    x_00, x_10 = tl.split(x_c0)
    x_01, x_11 = tl.split(x_c1)
    x0, x4 = tl.split(x_00)
    x2, x6 = tl.split(x_10)
    x1, x5 = tl.split(x_01)
    x3, x7 = tl.split(x_11)
    v0, v1, v2, v3, v4, v5, v6, v7 = e2m1_words(p)
    part = v0 * x0
    part = tl.fma(v1, x1, part)
    part = tl.fma(v2, x2, part)
    part = tl.fma(v3, x3, part)
    part = tl.fma(v4, x4, part)
    part = tl.fma(v5, x5, part)
    part = tl.fma(v6, x6, part)
    return tl.fma(v7, x7, part)


@triton.jit
def _row_products(acc, a, w_base, s_base, rows, rmask, k0, K,
                  stride_wn, stride_wk, stride_sn, stride_sk,
                  FMT: tl.constexpr, TILE_SCALE: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr,
                  BK: tl.constexpr, EVEN_K: tl.constexpr):
    """acc += dequant(W[rows, k0:k0+BK]) * a, elementwise, with a from _act: acc [R, BK].

    TILE_SCALE multiplies the tile by s[row // BSN, k0 // BSK] (fp8 block scales, BK <= BSK; a
    per-channel scale is the same with BSN = BSK = 1 and stride_sk = 0). EVEN_K (K % BK == 0)
    drops the K mask, which would otherwise cap the vector width of the loads.
    nvfp4: acc is [R, BK/16], one entry per e4m3 scale group. The tile is loaded as uint32 words of 8
    values (nibble i = element 8w+i) and decoded by e2m1_words to the value * 2**-126 (hence the
    activations' 2**64). A word's 8 products are summed with FMAs and each group's scale is applied once.
    """
    if FMT == 3:
        w8 = k0 // 8 + tl.arange(0, BK // 8)
        g = k0 // 16 + tl.arange(0, BK // 16)
        words = (w_base + rows * stride_wn).to(tl.pointer_type(tl.uint32))  # K/2 bytes per row, K % 16 == 0
        if EVEN_K:
            p = tl.load(words[:, None] + w8[None, :], mask=rmask[:, None], other=0)  # [R, BK/8]
            s = tl.load(s_base + rows[:, None] * stride_sn + g[None, :] * stride_sk, mask=rmask[:, None], other=0.0)
        else:
            p = tl.load(words[:, None] + w8[None, :], mask=rmask[:, None] & (w8 * 8 < K)[None, :], other=0)
            s = tl.load(s_base + rows[:, None] * stride_sn + g[None, :] * stride_sk,
                        mask=rmask[:, None] & (g * 16 < K)[None, :], other=0.0)
        part = _word_products(p, tl.reshape(a, (1, BK // 8, 2, 2, 2)))  # [R, BK/8]
        part = tl.sum(tl.reshape(part, (part.shape[0], BK // 16, 2)), 2)  # [R, BK/16]
        acc = tl.fma(part, s.to(tl.float32), acc)
    else:
        offs_k = k0 + tl.arange(0, BK)
        ptrs = w_base + rows[:, None] * stride_wn + offs_k[None, :] * stride_wk
        if EVEN_K:
            b = tl.load(ptrs, mask=rmask[:, None], other=0.0).to(tl.float32)
        else:
            b = tl.load(ptrs, mask=rmask[:, None] & (offs_k < K)[None, :], other=0.0).to(tl.float32)
        if TILE_SCALE:
            b *= tl.load(s_base + (rows // BSN) * stride_sn + (k0 // BSK) * stride_sk, mask=rmask, other=0.0)[:, None]
        acc = tl.fma(b, a[None, :], acc)
    return acc


@triton.jit(do_not_specialize=["num_pairs"])
def moe_gemv_up_kernel(x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, ids_ptr,
                       num_pairs, I, H, TOPK, stride_xm, stride_om,
                       stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                       FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr):
    """out[p, n] = silu(x[p // TOPK] . gate_e[n]) * (x[p // TOPK] . up_e[n]), e = ids[p]; out [T*K, I].

    The tile stacks BLOCK_N gate rows over the BLOCK_N matching up rows (rows n and I + n of w13),
    so one load stream and one accumulator serve both, and the small per-row loads (nvfp4's group
    scales) are wide enough for the pipeliner's async copies.
    """
    pid = tl.program_id(0)
    pair = pid % num_pairs
    pid_n = pid // num_pairs
    e = tl.load(ids_ptr + pair).to(tl.int64)
    h = _silu_mul_rows(x_ptr + (pair // TOPK).to(tl.int64) * stride_xm, w_ptr + e * stride_we,
                       s_ptr + e * stride_se, g_ptr + e * 2, pid_n, I, H, stride_wn, stride_wk, stride_sn, stride_sk,
                       FMT, BSN, BSK, BLOCK_N, BLOCK_K, EVEN_K, STAGES)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + pair.to(tl.int64) * stride_om + offs_n, h.to(out_ptr.dtype.element_ty), mask=offs_n < I)


@triton.jit
def _silu_mul_rows(a_ptr, w_base, s_base, g_base, pid_n, I, H, stride_wn, stride_wk, stride_sn, stride_sk,
                   FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr):
    """silu(a . gate[n]) * (a . up[n]) in fp32 for the BLOCK_N intermediate rows n of N-tile pid_n
    (zero past I); g_base points at the expert's two nvfp4 global scales (gate, up)."""
    r, rows, nmask = stacked_rows(pid_n, I, BLOCK_N)
    if FMT == 3:
        acc = tl.zeros((2 * BLOCK_N, BLOCK_K // 16), dtype=tl.float32)
    else:
        acc = tl.zeros((2 * BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        a = _act(a_ptr, k0, H, FMT, BLOCK_K, EVEN_K)
        acc = _row_products(acc, a, w_base, s_base, rows, nmask, k0, H, stride_wn, stride_wk,
                            stride_sn, stride_sk, FMT, FMT == 2, BSN, BSK, BLOCK_K, EVEN_K)
    gu = tl.sum(acc, 1)
    if FMT == 1:  # the expert is fixed per program: per-channel scales once, after the reduction
        gu *= tl.load(s_base + rows * stride_sn, mask=nmask, other=0.0)
    if FMT == 3:
        gu *= tl.load(g_base + r // BLOCK_N) * _NVFP4_UNSCALE  # global scales of gate and up
    gate, up = tl.split(tl.permute(tl.reshape(gu, (2, BLOCK_N)), (1, 0)))
    return gate * tl.sigmoid(gate) * up


@triton.jit(do_not_specialize=["num_tokens"])
def moe_gemv_down_kernel(a_ptr, w_ptr, s_ptr, g_ptr, out_ptr, tw_ptr, ids_ptr,
                         num_tokens, H, I, stride_am, stride_om,
                         stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                         TOPK: tl.constexpr, TOPK_P2: tl.constexpr, FMT: tl.constexpr,
                         BSN: tl.constexpr, BSK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         EVEN_K: tl.constexpr, STAGES: tl.constexpr, WIDE: tl.constexpr = False):
    """out[t, n] = sum_k tw[t, k] * (act[t*TOPK+k] . down_e[n]), e = ids[t, k]; act [T*K, I], out [T, H].

    One flat loop over (slot, K-block) keeps the weight stream pipelined across the slots; the
    router weight (and nvfp4's global scale) multiplies the activation slice and a per-channel
    scale the tile, so all slots share one accumulator. The token's expert ids and router weights
    are loaded once, before the loop, so no weight address in it waits on a load. Without WIDE each
    of the H/BLOCK_N programs walks all TOPK slots one after another, so only one slot's tile is in
    flight at a time; WIDE loads every slot's tile at once (_wide_down), which is what a one-token
    decode needs to stream at the memory's rate (timings: docs/LOG.md).
    """
    pid = tl.program_id(0)
    t = pid % num_tokens
    pid_n = pid // num_tokens
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    slots = tl.arange(0, TOPK_P2)
    smask = slots < TOPK
    ids = tl.load(ids_ptr + t * TOPK + slots, mask=smask, other=0).to(tl.int64)
    coef = tl.load(tw_ptr + t * TOPK + slots, mask=smask, other=0.0)
    if FMT == 3:
        coef *= tl.load(g_ptr + ids, mask=smask, other=0.0)
    if WIDE:  # every slot's tile in one load
        out = _wide_down(a_ptr, w_ptr, s_ptr, ids, coef, smask, t, offs_n, nmask, I, stride_am,
                         stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                         TOPK, TOPK_P2, FMT, BSN, BSK, BLOCK_N, BLOCK_K, EVEN_K, STAGES)
        tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=nmask)
        return
    if FMT == 3:
        acc = tl.zeros((BLOCK_N, BLOCK_K // 16), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    num_k = tl.cdiv(I, BLOCK_K)
    for it in tl.range(0, TOPK * num_k, num_stages=STAGES):
        slot = it // num_k
        k0 = (it - slot * num_k) * BLOCK_K
        pair = t * TOPK + slot
        sel = slots == slot
        e = tl.sum(tl.where(sel, ids, 0))
        c = tl.sum(tl.where(sel, coef, 0.0))
        a = _act(a_ptr + pair.to(tl.int64) * stride_am, k0, I, FMT, BLOCK_K, EVEN_K) * c
        acc = _row_products(acc, a, w_ptr + e * stride_we,
                            s_ptr + e * stride_se, offs_n, nmask, k0, I, stride_wn, stride_wk,
                            stride_sn, stride_sk, FMT, (FMT == 1) | (FMT == 2), BSN, BSK, BLOCK_K, EVEN_K)
    out = tl.sum(acc, 1)
    if FMT == 3:
        out *= _NVFP4_UNSCALE
    tl.store(out_ptr + t.to(tl.int64) * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def _wide_down(a_ptr, w_ptr, s_ptr, ids, coef, smask, t, offs_n, nmask, I, stride_am,
               stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
               TOPK: tl.constexpr, TOPK_P2: tl.constexpr, FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, STAGES: tl.constexpr):
    """sum_k coef[k] * (act[t*TOPK+k] . down_ids[k][n]) for rows offs_n, with the K loop over
    [TOPK_P2, BLOCK_N, BLOCK_K] tiles: all slots' weights in flight at once, in place of one slot
    after another. fp32 sums per (slot, row, K lane), reduced over K and then over the slots in a
    fixed order, so the result is deterministic like the slot-walking loop's (not bit-identical to
    it: the additions are grouped differently)."""
    s3 = tl.arange(0, TOPK_P2)[:, None, None]
    m3 = smask[:, None, None] & nmask[None, :, None]
    w_rows = w_ptr + ids[:, None, None] * stride_we + offs_n[None, :, None] * stride_wn  # [S, N, 1]
    a_rows = a_ptr + (t * TOPK + s3).to(tl.int64) * stride_am  # [S, 1, 1]
    c3 = coef[:, None, None]
    if FMT == 3:
        c3 = c3 * _NVFP4_ACT_SCALE
        acc = tl.zeros((TOPK_P2, BLOCK_N, BLOCK_K // 16), dtype=tl.float32)  # one per scale group
    else:
        acc = tl.zeros((TOPK_P2, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.range(0, I, BLOCK_K, num_stages=STAGES):
        k3 = k0 + tl.arange(0, BLOCK_K)[None, None, :]
        if EVEN_K:
            a = tl.load(a_rows + k3, mask=smask[:, None, None], other=0.0).to(tl.float32)
        else:
            a = tl.load(a_rows + k3, mask=smask[:, None, None] & (k3 < I), other=0.0).to(tl.float32)
        if FMT == 3:  # as _row_products: uint32 words of 8 values, FMAs per word, a scale per group
            w8 = k0 // 8 + tl.arange(0, BLOCK_K // 8)[None, None, :]
            g = k0 // 16 + tl.arange(0, BLOCK_K // 16)[None, None, :]
            p = tl.load(w_rows.to(tl.pointer_type(tl.uint32)) + w8, mask=m3 & (w8 * 8 < I), other=0)  # [S, N, BK/8]
            sc = tl.load(s_ptr + ids[:, None, None] * stride_se + offs_n[None, :, None] * stride_sn + g * stride_sk,
                         mask=m3 & (g * 16 < I), other=0.0).to(tl.float32)  # [S, N, BK/16]
            part = _word_products(p, tl.reshape(a * c3, (TOPK_P2, 1, BLOCK_K // 8, 2, 2, 2)))  # [S, N, BK/8]
            part = tl.sum(tl.reshape(part, (TOPK_P2, BLOCK_N, BLOCK_K // 16, 2)), 3)
            acc = tl.fma(part, sc, acc)
        else:
            if EVEN_K:
                b = tl.load(w_rows + k3 * stride_wk, mask=m3, other=0.0).to(tl.float32)
            else:
                b = tl.load(w_rows + k3 * stride_wk, mask=m3 & (k3 < I), other=0.0).to(tl.float32)
            if FMT == 2:  # fp8 block scales of the tile (BLOCK_K <= BSK)
                b *= tl.load(s_ptr + ids[:, None, None] * stride_se + (offs_n[None, :, None] // BSN) * stride_sn
                             + (k0 // BSK) * stride_sk, mask=m3, other=0.0)
            acc = tl.fma(b, a * c3, acc)
    out = tl.sum(acc, 2)  # [S, N]
    if FMT == 1:  # per-channel scales, once per (slot, row)
        out *= tl.load(s_ptr + ids[:, None] * stride_se + offs_n[None, :] * stride_sn,
                       mask=smask[:, None] & nmask[None, :], other=0.0)
    if FMT == 3:
        out *= _NVFP4_UNSCALE
    return tl.sum(out, 0)


@triton.jit(do_not_specialize=["num_pairs"])
def moe_fused_kernel(x_ptr, w13_ptr, s13_ptr, g13_ptr, w2_ptr, s2_ptr, g2_ptr, out_ptr, acc_ptr, cnt_ptr,
                     tw_ptr, ids_ptr, num_pairs, I, H, TOPK, stride_xm, stride_om,
                     stride_ue, stride_un, stride_uk, stride_use, stride_usn, stride_usk,
                     stride_de, stride_dn, stride_dk, stride_dse, stride_dsn, stride_dsk,
                     FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, BLOCK_I: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, EVEN_K: tl.constexpr, EVEN_I: tl.constexpr,
                     STAGES: tl.constexpr):
    """The whole layer in one launch: out[t] = sum_k tw[t, k] * down_e(silu(x[t] . gate_e) * (x[t] . up_e)).

    A program owns one pair p = t*TOPK+k and BLOCK_I intermediate rows i of its expert: it computes
    those rows of the activation (as moe_gemv_up_kernel does), rounds them to the activation dtype
    like the two-launch path, and multiplies them by the matching BLOCK_I columns of down, adding its
    [H] partial sum into the fp32 workspace row acc[t] with relaxed atomics. Every weight byte is
    read once and the activation never leaves registers. The last of a token's TOPK * cdiv(I,
    BLOCK_I) programs (a per-token counter, taken with acq_rel after a barrier, so every partial sum
    of the token is visible to it) converts acc[t] to out[t] and leaves acc[t] and the counter at
    zero for the next call: the workspace must start zeroed and serve one stream at a time.
    The order of the atomic adds varies, so results are not bit-reproducible (fp32 sums of TOPK *
    cdiv(I, BLOCK_I) terms before one rounding to the output dtype).
    It saves the second launch but, at one token, not time: each program reads a BLOCK_I-wide strip
    of every down row (32 bytes at BLOCK_I=32 in fp8), which streams far below the memory's rate.
    It wins where decoding, not streaming, bounds both paths (nvfp4 at 2-4 tokens); the tuner
    decides per token count (timings: docs/LOG.md).
    """
    pid = tl.program_id(0)
    pair = pid % num_pairs
    pid_i = pid // num_pairs
    t = (pair // TOPK).to(tl.int64)
    e = tl.load(ids_ptr + pair).to(tl.int64)
    h = _silu_mul_rows(x_ptr + t * stride_xm, w13_ptr + e * stride_ue, s13_ptr + e * stride_use, g13_ptr + e * 2,
                       pid_i, I, H, stride_un, stride_uk, stride_usn, stride_usk,
                       FMT, BSN, BSK, BLOCK_I, BLOCK_K, EVEN_K, STAGES)
    coef = tl.load(tw_ptr + pair)
    if FMT == 3:
        coef *= tl.load(g2_ptr + e)
    a = h.to(out_ptr.dtype.element_ty).to(tl.float32) * coef  # rows past I are zero
    if FMT == 3:
        a = tl.reshape(a, (BLOCK_I // 8, 8)) * _NVFP4_ACT_SCALE  # as _act lays it out
    i0 = pid_i * BLOCK_I
    w_base = w2_ptr + e * stride_de
    s_base = s2_ptr + e * stride_dse
    row = acc_ptr + t * H
    for n0 in tl.range(0, H, BLOCK_H, num_stages=STAGES):
        rows = n0 + tl.arange(0, BLOCK_H)
        rmask = rows < H
        if FMT == 3:
            part = tl.zeros((BLOCK_H, BLOCK_I // 16), dtype=tl.float32)
        else:
            part = tl.zeros((BLOCK_H, BLOCK_I), dtype=tl.float32)
        part = _row_products(part, a, w_base, s_base, rows, rmask, i0, I, stride_dn, stride_dk,
                             stride_dsn, stride_dsk, FMT, FMT == 2, BSN, BSK, BLOCK_I, EVEN_I)
        y = tl.sum(part, 1)
        if FMT == 1:
            y *= tl.load(s_base + rows * stride_dsn, mask=rmask, other=0.0)
        if FMT == 3:
            y *= _NVFP4_UNSCALE
        tl.atomic_add(row + rows, y, mask=rmask, sem="relaxed")
    tl.debug_barrier()  # every thread's adds precede the counter's release
    if tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel") == TOPK * tl.cdiv(I, BLOCK_I) - 1:
        for n0 in range(0, H, BLOCK_H):
            rows = n0 + tl.arange(0, BLOCK_H)
            rmask = rows < H
            y = tl.load(row + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + t * stride_om + rows, y.to(out_ptr.dtype.element_ty), mask=rmask)
            tl.store(row + rows, tl.zeros((BLOCK_H,), dtype=tl.float32), mask=rmask)
        tl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed")
