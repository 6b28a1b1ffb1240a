"""The fused MoE GEMM kernels (Triton): gate+up with SiLU-and-mul fused, and down with the router
weight in its epilogue. Weights are read in their stored format and dequantized in registers:

    FMT 0  bf16/fp16   w [E, N, K]
    FMT 1  fp8 e4m3    w [E, N, K], per-channel scale s [E, N] applied to the accumulator
    FMT 2  fp8 e4m3    w [E, N, K], block scale s [E, N/BSN, K/BSK] applied to the tile (BK <= BSK)
    FMT 3  nvfp4       w [E, N, K/2] uint8, e4m3 scale s [E, N, K/16], fp32 global g applied at the end

For nvfp4 a packed byte holds K-elements 2j (low nibble) and 2j+1 (high). The tile is dequantized
as stored, read as uint32 words of 8 values ([BN, BK/8], K contiguous): each word is decoded with
four shift-and-mask steps (e2m1_words), scaled once, interleaved with tl.join into [BN, BK], and
the transpose goes to one dot (_nvfp4_tile). Decoding byte by byte, as before, took 1.7-1.9x as
long on an H200 at the same tiles (64 tokens: 538 -> 288 us; 1,024 at the default tiles: 1,432 ->
731). (Dotting the low nibbles with A's even columns and the high with its odd columns was 1.4-3.7x
slower: strided A loads and a scale tile reshaped along the dot's K axis.)
Rows of the problem are the sorted (token, slot) pairs of `triton_align`; one program computes a
[BLOCK_M, BLOCK_N] tile for the single expert that owns its M-block.

Three switches per kernel, set by the launch config (`moelab kernels --tune` picks them per token
count; what each gained on an H200 is in docs/LOG.md):
    A8       fp8 weights only: the activation tile goes to fp8 too, as a hi + lo pair of e4m3
             tiles (_split_e4m3), so the dots run on fp8 tensor cores with no weight conversion
             and about bf16's accuracy (relative error 3.4e-3 against 3.2e-3 for bf16
             activations; one e4m3 tile alone gives 4.4e-2). It pays at small M-blocks and loses
             at large token counts, where the per-step rescale of the partial product stalls the
             MMA pipeline.
    SWAP_AB  the dot computes the transposed tile: weight rows on its M axis, token rows on N, so
             an M-block of 16 rows still gets Hopper's wgmma (M >= 64 per warp group); A8 needs it.
    SPLIT_M  an expert's last M-block whose rows fit in its first half computes a half-height
             tile: under uniform routing about a quarter of the rows at BLOCK_M=128 are padding.
"""
from __future__ import annotations

import triton
import triton.language as tl

# Arguments that change with the token count. Triton would otherwise compile a new variant of a
# kernel whenever one of them turns 1 or a multiple of 16 (seen on an H200: a prefill of a new size
# paid ~1 s of compilation in the middle of serving); they only bound loops and masks.
TOKEN_ARGS = ["num_pairs", "num_m"]


# nvfp4 tiles are dequantized to value * scale * 2**-64 (see _nvfp4_tile); the epilogues undo it
NVFP4_TILE_UNSCALE = tl.constexpr(2.0 ** 64)


@triton.jit
def _bf16_pair(v):
    """A uint32 holding two bfloat16 -> (low, high) as float32."""
    return (v << 16).to(tl.float32, bitcast=True), (v & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_words(p):
    """uint32 words of 8 packed e2m1 values (nibble i = element i) -> the 8 values * 2**-126 as
    float32 tensors shaped like p. Nibbles i and i+4 sit 16 bits apart, so one shift-and-mask per
    field moves both into bfloat16 bit positions (sign to bit 15, exponent and mantissa to bits
    8..6), which read as the value * 2**-126 (the code for 0.5 a float32 subnormal, which
    mul.rn.f32 and fma.rn.f32 keep: Triton emits no .ftz) and widen with one shift or mask."""
    v0, v4 = _bf16_pair(((p << 6) & 0x01C001C0) | ((p << 12) & 0x80008000))
    v1, v5 = _bf16_pair(((p << 2) & 0x01C001C0) | ((p << 8) & 0x80008000))
    v2, v6 = _bf16_pair(((p >> 2) & 0x01C001C0) | ((p << 4) & 0x80008000))
    v3, v7 = _bf16_pair(((p >> 6) & 0x01C001C0) | (p & 0x80008000))
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _nvfp4_tile(w_base, s_base, offs_n, nmask, k0, K, stride_wn, stride_sn, stride_sk, BK: tl.constexpr):
    """Rows offs_n, K-elements k0..k0+BK of an nvfp4 weight as float32 value * scale * 2**-64: [BN, BK].

    The packed bytes are read as uint32 words of 8 values and decoded by e2m1_words. One multiply
    by the group's scale * 2**62 gives a normal number that bfloat16 holds exactly (at most 6
    significant bits, 2**-74 to 2**-52), whatever the e4m3 scale. The 8 values of a word are then
    interleaved into K order with tl.join, which stays within each thread's registers.
    """
    w8 = k0 // 8 + tl.arange(0, BK // 8)
    words = (w_base + offs_n * stride_wn).to(tl.pointer_type(tl.uint32))  # K/2 bytes per row, K % 16 == 0
    p = tl.load(words[:, None] + w8[None, :], mask=nmask[:, None] & (w8 * 8 < K)[None, :], other=0)  # [BN, BK/8]
    g = k0 // 16 + tl.arange(0, BK // 16)
    s16 = tl.load(s_base + offs_n[:, None] * stride_sn + g[None, :] * stride_sk,
                  mask=nmask[:, None] & (g * 16 < K)[None, :], other=0.0).to(tl.float32) * 4.611686018427388e18
    s = tl.reshape(tl.broadcast_to(s16[:, :, None], (p.shape[0], BK // 16, 2)), (p.shape[0], BK // 8))  # per word
    v0, v1, v2, v3, v4, v5, v6, v7 = e2m1_words(p)
    # element 8w + 4h + 2b + c: join over h, then b, then c, so c ends up the fastest
    w = tl.join(tl.join(tl.join(v0 * s, v4 * s), tl.join(v2 * s, v6 * s)),
                tl.join(tl.join(v1 * s, v5 * s), tl.join(v3 * s, v7 * s)))
    return tl.reshape(w, (p.shape[0], BK))


@triton.jit
def _lo_scale(INTERP: tl.constexpr):
    """How far the residual v - hi is scaled up before its own e4m3 cast: |v - hi| is at most half
    an e4m3 step (2**-4 of |v|) when rounding to nearest. Triton's interpreter rounds to nearest
    without carrying into the exponent (125.7 -> 64), so under it the casts truncate, the residual
    can reach a whole step, and the scale is 8."""
    if INTERP:
        return 8.0
    else:
        return 16.0


@triton.jit
def _split_e4m3(a, AXIS: tl.constexpr, INTERP: tl.constexpr):
    """a ~ (hi + lo / _lo_scale) * sa, with hi and lo float8e4nv and sa = amax / 448 per row
    (reduced along AXIS, the tile's K axis). Padding rows (all zero) give zeros."""
    v = a.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(v), axis=AXIS), 1e-30)
    inv = 448.0 / amax
    if AXIS == 0:
        v = v * inv[None, :]
    else:
        v = v * inv[:, None]
    if INTERP:
        hi = v.to(tl.float8e4nv, fp_downcast_rounding="rtz")
        lo = ((v - hi.to(tl.float32)) * _lo_scale(INTERP)).to(tl.float8e4nv, fp_downcast_rounding="rtz")
        hi, lo = hi.to(tl.float32), lo.to(tl.float32)
    else:
        hi = v.to(tl.float8e4nv, fp_downcast_rounding="rtne")
        lo = ((v - hi.to(tl.float32)) * _lo_scale(INTERP)).to(tl.float8e4nv, fp_downcast_rounding="rtne")
    return hi, lo, amax / 448.0


@triton.jit
def _block_scales(s_base, offs_n, nmask, k0, stride_sn, stride_sk, BSN: tl.constexpr, BSK: tl.constexpr):
    """fp8 block scales of rows offs_n at K offset k0 (the tile lies inside one K block)."""
    return tl.load(s_base + (offs_n // BSN) * stride_sn + (k0 // BSK) * stride_sk, mask=nmask, other=0.0)


@triton.jit
def _tile_dot(acc, a_rows, a_mask, w_base, s_base, offs_n, nmask, k0, K,
              stride_wn, stride_wk, stride_sn, stride_sk,
              FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, BK: tl.constexpr,
              DOT_F32: tl.constexpr, SWAP: tl.constexpr, A8: tl.constexpr = False):
    """acc [BM, BN] += A[rows, k0:k0+BK] @ dequant(W[offs_n, k0:k0+BK])^T, or with SWAP the
    transposed product acc [BN, BM] += dequant(W) @ A^T; A8 (fp8 weights): see the module docstring.
    DOT_F32 runs the dot in float32 (Triton's CPU interpreter computes bf16 dots wrongly)."""
    offs_k = k0 + tl.arange(0, BK)
    km = offs_k < K
    if SWAP:
        a = tl.load(a_rows[None, :] + offs_k[:, None], mask=a_mask[None, :] & km[:, None], other=0.0)  # [BK, BM]
    else:
        a = tl.load(a_rows[:, None] + offs_k[None, :], mask=a_mask[:, None] & km[None, :], other=0.0)  # [BM, BK]
    if DOT_F32:
        a = a.to(tl.float32)
    if FMT == 3:
        w = _nvfp4_tile(w_base, s_base, offs_n, nmask, k0, K, stride_wn, stride_sn, stride_sk, BK).to(a.dtype)
        if SWAP:
            acc = tl.dot(w, a, acc)
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    elif A8:
        # each row's K-slice, scaled by 448 / its amax, is hi = e4m3(v) plus lo = e4m3((v - hi) * L);
        # two dots share the weight tile and hi + lo / L carries about 8 significant bits
        hi, lo, sa = _split_e4m3(a, 0 if SWAP else 1, DOT_F32)
        if SWAP:
            w = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                        mask=nmask[:, None] & km[None, :], other=0.0)  # [BN, BK]
            if DOT_F32:
                w = w.to(tl.float32)
            part = tl.dot(w, hi, tl.dot(w, lo) * (1.0 / _lo_scale(DOT_F32)))
            scale = sa[None, :]
            if FMT == 2:
                scale = scale * tl.load(s_base + (offs_n // BSN) * stride_sn + (k0 // BSK) * stride_sk,
                                        mask=nmask, other=0.0)[:, None]
        else:
            b = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                        mask=km[:, None] & nmask[None, :], other=0.0)  # [BK, BN]
            if DOT_F32:
                b = b.to(tl.float32)
            part = tl.dot(hi, b, tl.dot(lo, b) * (1.0 / _lo_scale(DOT_F32)))
            scale = sa[:, None]
            if FMT == 2:
                scale = scale * tl.load(s_base + (offs_n // BSN) * stride_sn + (k0 // BSK) * stride_sk,
                                        mask=nmask, other=0.0)[None, :]
        acc += part * scale
    elif SWAP:
        w = tl.load(w_base + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                    mask=nmask[:, None] & km[None, :], other=0.0)  # [BN, BK]
        if FMT == 2:
            s = _block_scales(s_base, offs_n, nmask, k0, stride_sn, stride_sk, BSN, BSK)
            w = (w.to(tl.float32) * s[:, None]).to(a.dtype)
        else:
            w = w.to(a.dtype)
        acc = tl.dot(w, a, acc)
    else:
        b = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=km[:, None] & nmask[None, :], other=0.0)  # [BK, BN]
        if FMT == 2:
            s = _block_scales(s_base, offs_n, nmask, k0, stride_sn, stride_sk, BSN, BSK)
            b = (b.to(tl.float32) * s[None, :]).to(a.dtype)
        else:
            b = b.to(a.dtype)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def stacked_rows(pid_n, I, BLOCK_N: tl.constexpr):
    """N-tile pid_n of w13 as 2*BLOCK_N rows: BLOCK_N gate rows n, then the up rows I + n.
    Returns (r = arange(2*BLOCK_N), the rows, the mask n < I)."""
    r = tl.arange(0, 2 * BLOCK_N)
    offs_n = pid_n * BLOCK_N + r % BLOCK_N
    return r, offs_n + (r // BLOCK_N) * I, offs_n < I


@triton.jit
def _pid_mn(num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped program order: GROUP_M M-blocks share each weight N-tile while it is in L2."""
    pid = tl.program_id(0)
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _program_block(expert_ids_ptr, w_ptr, s_ptr, num_m, num_n, stride_we, stride_se,
                   BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (first sorted row, N-tile, expert, expert's weights, expert's scales)."""
    pid_m, pid_n = _pid_mn(num_m, num_n, GROUP_M)
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    return pid_m * BLOCK_M, pid_n, e, w_ptr + e * stride_we, s_ptr + e * stride_se


@triton.jit
def _block_rows(sorted_ptr, row0, num_pairs, BLOCK_M: tl.constexpr):
    """The M-block's sorted rows, their (token, slot) pairs, and which rows are pairs, not padding."""
    offs_m = row0 + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m)
    return offs_m, pair, pair < num_pairs


@triton.jit
def _up_block(x_ptr, w_base, s_base, g_ptr, out_ptr, sorted_ptr, e, row0, pid_n, num_pairs, I, H, TOPK,
              stride_xm, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
              FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, DOT_F32: tl.constexpr, SWAP: tl.constexpr, A8: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] output tile of moe_up_kernel, sorted rows row0.. of expert e."""
    offs_m, pair, valid = _block_rows(sorted_ptr, row0, num_pairs, BLOCK_M)
    a_rows = x_ptr + (pair // TOPK).to(tl.int64) * stride_xm
    _, rows, nmask = stacked_rows(pid_n, I, BLOCK_N)
    if FMT == 3:
        # nvfp4 keeps two [BLOCK_N, BLOCK_K] tiles: its dequantized tile lives in registers, and a
        # stacked one at the same BLOCK_N took 1.8x longer on an H200 (64 tokens)
        if SWAP:
            acc_g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros_like(acc_g)
        gate_rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        gmask = gate_rows < I
        for k0 in range(0, H, BLOCK_K):
            acc_g = _tile_dot(acc_g, a_rows, valid, w_base, s_base, gate_rows, gmask, k0, H,
                              stride_wn, stride_wk, stride_sn, stride_sk, FMT, BSN, BSK, BLOCK_K, DOT_F32, SWAP, A8)
            acc_u = _tile_dot(acc_u, a_rows, valid, w_base, s_base, gate_rows + I, gmask, k0, H,
                              stride_wn, stride_wk, stride_sn, stride_sk, FMT, BSN, BSK, BLOCK_K, DOT_F32, SWAP, A8)
        gate = acc_g * (tl.load(g_ptr + e * 2) * NVFP4_TILE_UNSCALE)  # global scales of gate and up
        up = acc_u * (tl.load(g_ptr + e * 2 + 1) * NVFP4_TILE_UNSCALE)
    elif SWAP:
        acc = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            acc = _tile_dot(acc, a_rows, valid, w_base, s_base, rows, nmask, k0, H,
                            stride_wn, stride_wk, stride_sn, stride_sk, FMT, BSN, BSK, BLOCK_K, DOT_F32, SWAP, A8)
        if FMT == 1:
            acc *= tl.load(s_base + rows * stride_sn, mask=nmask, other=0.0)[:, None]
        gate, up = tl.split(tl.permute(tl.reshape(acc, (2, BLOCK_N, BLOCK_M)), (1, 2, 0)))
    else:
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            acc = _tile_dot(acc, a_rows, valid, w_base, s_base, rows, nmask, k0, H,
                            stride_wn, stride_wk, stride_sn, stride_sk, FMT, BSN, BSK, BLOCK_K, DOT_F32, SWAP, A8)
        if FMT == 1:
            acc *= tl.load(s_base + rows * stride_sn, mask=nmask, other=0.0)[None, :]
        gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
    h = (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty)  # SiLU(gate) * up, in fp32
    offs_o = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SWAP:
        out = out_ptr + offs_m.to(tl.int64)[None, :] * stride_om + offs_o[:, None]
        tl.store(out, h, mask=(offs_o < I)[:, None])
    else:
        out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_o[None, :]
        tl.store(out, h, mask=(offs_o < I)[None, :])


@triton.jit
def _half_block(sorted_ptr, row0, num_pairs, BLOCK_M: tl.constexpr, SPLIT_M: tl.constexpr):
    """Whether this M-block's real rows all sit in its first half (an expert's last block: the
    rows of a segment come first, the sentinels after), so a BLOCK_M/2 tile covers them."""
    if SPLIT_M:
        return tl.load(sorted_ptr + row0 + BLOCK_M // 2) >= num_pairs
    else:
        return False


@triton.jit(do_not_specialize=TOKEN_ARGS)
def moe_up_kernel(x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                  num_pairs, I, H, TOPK, num_m, stride_xm, stride_om,
                  stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                  FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, DOT_F32: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SWAP_AB: tl.constexpr = False, SPLIT_M: tl.constexpr = False, A8: tl.constexpr = False):
    """out[row, n] = silu(x[tok] . gate_e[n]) * (x[tok] . up_e[n]) for the sorted rows; out [maxlen, I].

    bf16 and fp8: the weight tile stacks BLOCK_N gate rows over the BLOCK_N matching up rows (rows
    n and I + n of w13), so each K step loads the activation tile once and runs one
    [BLOCK_M, 2*BLOCK_N] dot (SWAP_AB: [2*BLOCK_N, BLOCK_M]). SWAP_AB, SPLIT_M, A8: see the module
    docstring. The act rows SPLIT_M leaves unwritten are padding, which the down kernel never reads.
    """
    row0, pid_n, e, w_base, s_base = _program_block(expert_ids_ptr, w_ptr, s_ptr, num_m, tl.cdiv(I, BLOCK_N),
                                                    stride_we, stride_se, BLOCK_M, GROUP_M)
    if row0 >= tl.load(total_ptr):
        return
    if _half_block(sorted_ptr, row0, num_pairs, BLOCK_M, SPLIT_M):
        _up_block(x_ptr, w_base, s_base, g_ptr, out_ptr, sorted_ptr, e, row0, pid_n, num_pairs, I, H, TOPK,
                  stride_xm, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
                  FMT, BSN, BSK, DOT_F32, SWAP_AB, A8, BLOCK_M // 2, BLOCK_N, BLOCK_K)
    else:
        _up_block(x_ptr, w_base, s_base, g_ptr, out_ptr, sorted_ptr, e, row0, pid_n, num_pairs, I, H, TOPK,
                  stride_xm, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
                  FMT, BSN, BSK, DOT_F32, SWAP_AB, A8, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _down_block(a_ptr, w_base, s_base, g_ptr, out_ptr, tw_ptr, sorted_ptr, e, row0, pid_n, num_pairs, H, I,
                stride_am, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
                FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, DOT_F32: tl.constexpr, SWAP: tl.constexpr, A8: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] output tile of moe_down_kernel, sorted rows row0.. of expert e."""
    offs_m, pair, valid = _block_rows(sorted_ptr, row0, num_pairs, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    a_rows = a_ptr + offs_m.to(tl.int64) * stride_am
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        acc = _tile_dot(acc, a_rows, valid, w_base, s_base, offs_n, nmask, k0, I,
                        stride_wn, stride_wk, stride_sn, stride_sk, FMT, BSN, BSK, BLOCK_K, DOT_F32, SWAP, A8)
    if FMT == 3:
        acc *= tl.load(g_ptr + e) * NVFP4_TILE_UNSCALE
    tw = tl.load(tw_ptr + pair, mask=valid, other=0.0).to(tl.float32)  # router weight
    if SWAP:
        if FMT == 1:
            acc *= tl.load(s_base + offs_n * stride_sn, mask=nmask, other=0.0)[:, None]
        acc *= tw[None, :]
        out = out_ptr + pair.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[None, :] & nmask[:, None])
    else:
        if FMT == 1:
            acc *= tl.load(s_base + offs_n * stride_sn, mask=nmask, other=0.0)[None, :]
        acc *= tw[:, None]
        out = out_ptr + pair.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & nmask[None, :])


@triton.jit(do_not_specialize=TOKEN_ARGS)
def moe_down_kernel(a_ptr, w_ptr, s_ptr, g_ptr, out_ptr, tw_ptr, sorted_ptr, expert_ids_ptr, total_ptr,
                    num_pairs, H, I, num_m, stride_am, stride_om,
                    stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
                    FMT: tl.constexpr, BSN: tl.constexpr, BSK: tl.constexpr, DOT_F32: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    SWAP_AB: tl.constexpr = False, SPLIT_M: tl.constexpr = False, A8: tl.constexpr = False):
    """out[pair, n] = topk_w[pair] * (act[row] . down_e[n]); act [maxlen, I] sorted, out [T*K, H].
    SWAP_AB, SPLIT_M and A8 as in moe_up_kernel."""
    row0, pid_n, e, w_base, s_base = _program_block(expert_ids_ptr, w_ptr, s_ptr, num_m, tl.cdiv(H, BLOCK_N),
                                                    stride_we, stride_se, BLOCK_M, GROUP_M)
    if row0 >= tl.load(total_ptr):
        return
    if _half_block(sorted_ptr, row0, num_pairs, BLOCK_M, SPLIT_M):
        _down_block(a_ptr, w_base, s_base, g_ptr, out_ptr, tw_ptr, sorted_ptr, e, row0, pid_n, num_pairs, H, I,
                    stride_am, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
                    FMT, BSN, BSK, DOT_F32, SWAP_AB, A8, BLOCK_M // 2, BLOCK_N, BLOCK_K)
    else:
        _down_block(a_ptr, w_base, s_base, g_ptr, out_ptr, tw_ptr, sorted_ptr, e, row0, pid_n, num_pairs, H, I,
                    stride_am, stride_om, stride_wn, stride_wk, stride_sn, stride_sk,
                    FMT, BSN, BSK, DOT_F32, SWAP_AB, A8, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit(do_not_specialize=["num_tokens"])
def moe_sum_kernel(y_ptr, out_ptr, num_tokens, H, TOPK: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum_k y[t*TOPK + k]: the top-k combine, in fp32 and in slot order (deterministic).

    Every slot's row is one contiguous, vectorised load, all issued before the first add, so it
    streams at about the copy bandwidth, where torch's strided sum over [T, K, H] does not.
    """
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in tl.static_range(TOPK):
        acc += tl.load(y_ptr + (t * TOPK + k) * H + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty), mask=m)
