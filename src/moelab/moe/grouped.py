"""The grouped MoE runner: tokens sorted by expert, one grouped GEMM per projection.

On CUDA with bf16 weights it calls `torch._grouped_mm` (CUTLASS grouped GEMM inside libtorch, no
host sync); elsewhere it loops over the experts' contiguous segments. It is the torch baseline
that the fused triton kernel is measured against. Quantized formats are dequantized to the
activation dtype first (on the GPU path the whole layer; on the expert loop only the experts that
received tokens: this backend is the simple baseline, not fast).
"""
from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from moelab.moe.base import ExpertWeights, MoERunner


def _use_grouped_mm(x: torch.Tensor, w_dtype: torch.dtype) -> bool:
    return (x.is_cuda and hasattr(torch, "_grouped_mm") and x.dtype == torch.bfloat16
            and w_dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9)


class GroupedRunner(MoERunner):
    name: ClassVar[str] = "grouped"
    formats: ClassVar[tuple[str, ...]] = ("bf16", "fp8", "nvfp4")

    def __call__(self, x, topk_weights, topk_ids, w: ExpertWeights):
        T, H = x.shape
        K = topk_ids.shape[1]
        E, _, I = w.shape
        dense = w.fmt == "bf16" and w.w13.dtype == x.dtype  # else dequantized to x's dtype first
        flat = topk_ids.reshape(-1)  # [T*K] expert of each (token, slot) pair
        order = torch.argsort(flat, stable=True)  # pair indices sorted by expert
        xs = x[order // K]  # [T*K, H] gathered activations, expert-contiguous
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int32))
        if _use_grouped_mm(x, w.w13.dtype if dense else x.dtype):
            w13, w2 = (w.w13, w.w2) if dense else w.dequantize(x.dtype)  # [E, 2I, H], [E, H, I]
            offs = torch.cumsum(counts, 0, dtype=torch.int32)  # [E] segment ends
            h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)  # [T*K, 2I]
            a = F.silu(h[:, :I]) * h[:, I:]
            y = torch._grouped_mm(a.contiguous(), w2.transpose(1, 2), offs=offs)  # [T*K, H]
        else:
            sizes = counts.tolist()  # host sync: fine off the GPU fast path
            routed = [e for e, n in enumerate(sizes) if n]
            # a quantized layer: only the experts that received tokens are dequantized, in that order
            w13, w2 = (w.w13, w.w2) if dense else w.take(routed).dequantize(x.dtype)
            y = torch.empty(T * K, H, dtype=x.dtype, device=x.device)
            start = 0
            for i, e in enumerate(routed):
                n, j = sizes[e], e if dense else i
                seg = xs[start:start + n]
                h = (seg.float() @ w13[j].float().t())  # [n, 2I]
                a = F.silu(h[:, :I]) * h[:, I:]
                y[start:start + n] = (a @ w2[j].float().t()).to(x.dtype)
                start += n
        # weight each pair, put pairs back in (token, slot) order, sum over the K slots
        y = y.float() * topk_weights.reshape(-1)[order].float().unsqueeze(1)
        out = torch.empty_like(y)
        out[order] = y
        return out.view(T, K, H).sum(dim=1).to(x.dtype)
