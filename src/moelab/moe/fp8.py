"""FP8 (e4m3) expert weights with per-channel or 128x128 block scales.

The stored value is `w ~= q.float() * scale`, where `q` is float8_e4m3fn and `scale` is float32:
    per-channel: w13_scale [E, 2I],              w2_scale [E, H]
    block:       w13_scale [E, 2I/bn, H/bk],     w2_scale [E, H/bn, I/bk]   (bn = bk = 128 usually)
Kernels multiply the scale in registers; only `dequantize` (the reference path) materialises bf16/fp32.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from moelab.moe.base import ExpertWeights, gate_up_rows, input_columns

E4M3_MAX = 448.0


def quantize_fp8(w: torch.Tensor, block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] -> (q [E, N, K] e4m3, scale). Per output channel when block is None."""
    E, N, K = w.shape
    wf = w.float()
    if block is None:
        amax = wf.abs().amax(dim=2).clamp(min=1e-12)  # [E, N]
        scale = amax / E4M3_MAX
        q = (wf / scale.unsqueeze(2)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return q, scale
    bn, bk = block
    if N % bn or K % bk:
        raise ValueError(f"fp8 block scales {bn}x{bk} need both weight dims divisible by them; got [{N}, {K}] "
                         "(use per-channel fp8 instead)")
    blocks = wf.view(E, N // bn, bn, K // bk, bk)
    amax = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12)  # [E, N/bn, K/bk]
    scale = amax / E4M3_MAX
    q = (blocks / scale[:, :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(E, N, K), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   dtype: torch.dtype) -> torch.Tensor:
    E, N, K = q.shape
    if block is None:
        return (q.float() * scale.unsqueeze(2)).to(dtype)
    bn, bk = block
    full = scale.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)  # [E, N, K]
    return (q.float() * full).to(dtype)


class Fp8Experts(ExpertWeights):
    fmt: ClassVar[str] = "fp8"

    def __init__(self, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 block: tuple[int, int] | None = None) -> None:
        assert w13.dtype == torch.float8_e4m3fn and w2.dtype == torch.float8_e4m3fn
        self.w13, self.w13_scale = w13, w13_scale.float().contiguous()
        self.w2, self.w2_scale = w2, w2_scale.float().contiguous()
        self.block = tuple(block) if block is not None else None

    @classmethod
    def quantize(cls, w13: torch.Tensor, w2: torch.Tensor, block: tuple[int, int] | None = None) -> "Fp8Experts":
        q13, s13 = quantize_fp8(w13, block)
        q2, s2 = quantize_fp8(w2, block)
        return cls(q13, s13, q2, s2, block)

    @property
    def shape(self) -> tuple[int, int, int]:
        E, two_i, H = self.w13.shape
        return E, H, two_i // 2

    @property
    def scheme(self) -> str:
        return "per-channel" if self.block is None else f"block {self.block[0]}x{self.block[1]}"

    def dequantize(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return (dequantize_fp8(self.w13, self.w13_scale, self.block, dtype),
                dequantize_fp8(self.w2, self.w2_scale, self.block, dtype))

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.w13, self.w13_scale, self.w2, self.w2_scale))

    def slice_intermediate(self, start: int, stop: int) -> "Fp8Experts":
        I = self.shape[2]
        # per-channel scales follow w13's rows and w2's output rows (untouched); block scales
        # follow both axes in blocks
        s2 = self.w2_scale if self.block is None else input_columns(self.w2_scale, start, stop, I)
        return Fp8Experts(gate_up_rows(self.w13, start, stop, I), gate_up_rows(self.w13_scale, start, stop, I),
                          input_columns(self.w2, start, stop, I), s2, self.block)
