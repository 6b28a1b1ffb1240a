"""The reference MoE runner: plain PyTorch, float32 accumulation. It is the spec.

Every other backend is checked against this one. It loops over the experts that received
tokens, which is slow but obviously right; only those experts are dequantized.
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from moelab.moe.base import ExpertWeights, MoERunner


class ReferenceRunner(MoERunner):
    name: ClassVar[str] = "reference"
    formats: ClassVar[tuple[str, ...]] = ("bf16", "fp8", "nvfp4")

    def __call__(self, x, topk_weights, topk_ids, w: ExpertWeights):
        T, H = x.shape
        routed = torch.unique(topk_ids).tolist()
        dense = w.fmt == "bf16" and w.w13.dtype == torch.float32  # the layer itself, [E, 2I, H], [E, H, I]
        # else only the routed experts, in float32: [len(routed), 2I, H], [len(routed), H, I]
        w13, w2 = (w.w13, w.w2) if dense else w.take(routed).dequantize(torch.float32)
        I = w2.shape[2]
        xf = x.float()
        out = torch.zeros(T, H, dtype=torch.float32, device=x.device)  # [T, H]
        for i, e in enumerate(routed):
            j = e if dense else i
            tok, slot = (topk_ids == e).nonzero(as_tuple=True)  # token index, k index
            h = xf[tok] @ w13[j].t()  # [n, 2I]
            a = F.silu(h[:, :I]) * h[:, I:]  # [n, I]
            y = a @ w2[j].t()  # [n, H]
            out.index_add_(0, tok, y * topk_weights[tok, slot].float().unsqueeze(1))
        return out.to(x.dtype)
