"""NVFP4 expert weights in the ModelOpt layout, and its quantizer/dequantizer.

Per expert and projection (N output rows, K inputs):
    weight         uint8 [N, K/2]   two e2m1 codes per byte, element 2j in the low nibble, 2j+1 high
    weight_scale   e4m3  [N, K/16]  one scale per 16 consecutive values along K
    weight_scale_2 fp32  scalar     global scale;  w ~= e2m1 * weight_scale * weight_scale_2
Stacked for the layer: w13 [E, 2I, H/2], w13_scale [E, 2I, H/16], w13_scale_2 [E, 2] (gate, up:
ModelOpt keeps one per projection), w2 [E, H, I/2], w2_scale [E, H, I/16], w2_scale_2 [E].
"""
from __future__ import annotations

from typing import ClassVar

import torch

from moelab.moe.base import ExpertWeights, gate_up_rows, input_columns

E2M1_MAX, E4M3_MAX, GROUP = 6.0, 448.0, 16
# e2m1 magnitudes by 3-bit code; the 4th bit is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def quantize_nvfp4(w: torch.Tensor, global_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] (one projection) -> (packed uint8 [N, K/2], e4m3 [N, K/16], fp32 scalar scale_2)."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"nvfp4 needs the input dim to be a multiple of {GROUP}; got {K}")
    wf = w.float()
    if global_scale is None:  # ModelOpt: scale_2 = amax / (448 * 6)
        global_scale = (wf.abs().amax().clamp(min=1e-12) / (E4M3_MAX * E2M1_MAX))
    g = wf.view(N, K // GROUP, GROUP)
    block = (g.abs().amax(dim=2) / E2M1_MAX / global_scale).clamp(max=E4M3_MAX)  # [N, K/16]
    block_q = block.to(torch.float8_e4m3fn)
    denom = (block_q.float() * global_scale).clamp(min=1e-30).unsqueeze(2)
    v = (g / denom).clamp(-E2M1_MAX, E2M1_MAX)
    mids = torch.tensor(_MIDPOINTS, device=w.device)
    code = torch.bucketize(v.abs(), mids).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)  # [N, K/16, 16]
    code = code.view(N, K)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)  # [N, K/2]
    return packed.contiguous(), block_q, global_scale.reshape(()).float()


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """packed [..., N, K/2], scale [..., N, K/16], scale_2 broadcastable to [..., 1, 1] -> [..., N, K]."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), device=packed.device)
    lo, hi = (packed & 0xF).long(), (packed >> 4).long()
    vals = torch.stack((table[lo], table[hi]), dim=-1).flatten(-2)  # [..., N, K]
    vals = vals.unflatten(-1, (-1, GROUP)) * scale.float().unsqueeze(-1)
    return (vals.flatten(-2) * scale_2).to(dtype)


class Nvfp4Experts(ExpertWeights):
    fmt: ClassVar[str] = "nvfp4"

    def __init__(self, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2) -> None:
        assert w13.dtype == torch.uint8 and w13_scale.dtype == torch.float8_e4m3fn
        self.w13, self.w13_scale, self.w13_scale_2 = w13, w13_scale, w13_scale_2.float().reshape(-1, 2)
        self.w2, self.w2_scale, self.w2_scale_2 = w2, w2_scale, w2_scale_2.float().reshape(-1)

    @classmethod
    def quantize(cls, w13: torch.Tensor, w2: torch.Tensor) -> "Nvfp4Experts":
        E, two_i, H = w13.shape
        I = two_i // 2
        q13, s13, g13, q2, s2, g2 = [], [], [], [], [], []
        for e in range(E):  # per expert and projection, so memory stays bounded on big layers
            parts = [quantize_nvfp4(w13[e, :I]), quantize_nvfp4(w13[e, I:])]
            q13.append(torch.cat([p[0] for p in parts]))
            s13.append(torch.cat([p[1] for p in parts]))
            g13.append(torch.stack([p[2] for p in parts]))
            q, s, g = quantize_nvfp4(w2[e])
            q2.append(q), s2.append(s), g2.append(g)
        return cls(torch.stack(q13), torch.stack(s13), torch.stack(g13),
                   torch.stack(q2), torch.stack(s2), torch.stack(g2))

    @property
    def shape(self) -> tuple[int, int, int]:
        E, two_i, _ = self.w13.shape
        return E, self.w2.shape[1], two_i // 2

    def dequantize(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        E, two_i, _ = self.w13.shape
        I = two_i // 2
        # gate rows use scale_2[:, 0], up rows scale_2[:, 1]
        g = self.w13_scale_2.repeat_interleave(I, dim=1).view(E, two_i, 1)
        w13 = dequantize_nvfp4(self.w13, self.w13_scale, g, dtype)
        w2 = dequantize_nvfp4(self.w2, self.w2_scale, self.w2_scale_2.view(E, 1, 1), dtype)
        return w13, w2

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.w13, self.w13_scale, self.w13_scale_2,
                                      self.w2, self.w2_scale, self.w2_scale_2))

    def slice_intermediate(self, start: int, stop: int) -> "Nvfp4Experts":
        I = self.shape[2]  # the global scales are per expert and projection: every slice keeps them
        return Nvfp4Experts(gate_up_rows(self.w13, start, stop, I), gate_up_rows(self.w13_scale, start, stop, I),
                            self.w13_scale_2, input_columns(self.w2, start, stop, I),
                            input_columns(self.w2_scale, start, stop, I), self.w2_scale_2)
