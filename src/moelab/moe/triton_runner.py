"""The fused Triton MoE runner: align -> gate/up GEMM + SiLU*up -> down GEMM * router weight -> sum.

Five launches per layer on CUDA (three for alignment, two GEMMs) plus the top-k sum, all free of
host synchronisation, so a decode step can be captured in a CUDA graph. Quantized weights are read
in their stored format and dequantized in registers (see triton_kernels.py). Intermediates:
    act  [maxlen, I]   SiLU(gate)*up per sorted row (bf16)
    y    [T*K, H]      router-weighted expert outputs per (token, slot)
"""
from __future__ import annotations

import os
from typing import Any, ClassVar

import torch

from moelab.moe.base import ExpertWeights, MoERunner

_FMT_BF16, _FMT_FP8_CH, _FMT_FP8_BLOCK, _FMT_NVFP4 = 0, 1, 2, 3


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _operands(w: ExpertWeights) -> tuple[int, tuple[int, int], tuple, tuple]:
    """(FMT code, (BSN, BSK), up operands (w, s, g), down operands (w, s, g))."""
    if w.fmt == "bf16":
        return _FMT_BF16, (1, 1), (w.w13, w.w13, w.w13), (w.w2, w.w2, w.w2)
    if w.fmt == "fp8":
        code = _FMT_FP8_CH if w.block is None else _FMT_FP8_BLOCK
        blk = w.block or (1, 1)
        return code, blk, (w.w13, w.w13_scale, w.w13_scale), (w.w2, w.w2_scale, w.w2_scale)
    if w.fmt == "nvfp4":
        return (_FMT_NVFP4, (1, 1), (w.w13, w.w13_scale, w.w13_scale_2),
                (w.w2, w.w2_scale, w.w2_scale_2))
    raise ValueError(f"the triton MoE runner cannot take {w.fmt} weights")


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    s = t.stride()
    return (s[0], s[1], s[2]) if t.dim() == 3 else (s[0], s[1], 0) if t.dim() == 2 else (0, 0, 0)


class TritonRunner(MoERunner):
    name: ClassVar[str] = "triton"
    formats: ClassVar[tuple[str, ...]] = ("bf16", "fp8", "nvfp4")

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config  # a fixed launch config (the tuner sets it); None: tuned file or default

    @classmethod
    def unsupported_reason(cls, device: torch.device, fmt: str) -> str | None:
        why = super().unsupported_reason(device, fmt)
        if why:
            return why
        # The GPU first: on a CPU-only machine "no CUDA" is the reason that matters, whether or
        # not the triton package happens to be installed.
        if device.type != "cuda" and not _interpreting():
            return (f"the triton MoE runner needs a CUDA GPU (device is {device.type}; "
                    "TRITON_INTERPRET=1 runs it slowly on CPU for tests)")
        try:
            import triton  # noqa: F401
        except ImportError:
            return "the triton MoE runner needs the triton package, which is not installed"
        return None

    def __call__(self, x, topk_weights, topk_ids, w: ExpertWeights):
        from moelab.moe.triton_align import align_block_size
        from moelab.moe.triton_configs import get_config
        from moelab.moe.triton_kernels import moe_down_kernel, moe_up_kernel

        T, H = x.shape
        K = topk_ids.shape[1]
        E, _, I = w.shape
        x = x.contiguous()
        fmt, (bsn, bsk), (w13, s13, g13), (w2, s2, g2) = _operands(w)
        cfg = self.config or get_config(T, E, K, H, I, w.fmt)
        bm, up, down = cfg["BLOCK_M"], dict(cfg["up"]), dict(cfg["down"])
        if fmt == _FMT_FP8_BLOCK:  # one k-scale per tile
            up["BLOCK_K"], down["BLOCK_K"] = min(up["BLOCK_K"], bsk), min(down["BLOCK_K"], bsk)
        sorted_ids, expert_ids, total = align_block_size(topk_ids, E, bm)
        num_m = expert_ids.numel()
        n_pairs = T * K
        act = torch.empty(num_m * bm, I, dtype=x.dtype, device=x.device)  # [maxlen, I]
        y = torch.empty(n_pairs, H, dtype=x.dtype, device=x.device)  # [T*K, H]
        tw = topk_weights.reshape(-1).to(torch.float32).contiguous()

        def launch_kwargs(c: dict[str, Any]) -> dict[str, Any]:
            kw = {k: c[k] for k in ("BLOCK_N", "BLOCK_K", "GROUP_M")}
            if not _interpreting():
                kw.update(num_warps=c["num_warps"], num_stages=c["num_stages"])
            return kw

        grid_up = (num_m * triton_cdiv(I, up["BLOCK_N"]),)
        moe_up_kernel[grid_up](
            x, w13, s13, g13, act, sorted_ids, expert_ids, total,
            n_pairs, I, H, K, num_m, x.stride(0), act.stride(0),
            *_strides3(w13), *_strides3(s13),
            FMT=fmt, BSN=bsn, BSK=bsk, DOT_F32=_interpreting(), BLOCK_M=bm, **launch_kwargs(up))
        grid_down = (num_m * triton_cdiv(H, down["BLOCK_N"]),)
        moe_down_kernel[grid_down](
            act, w2, s2, g2, y, tw, sorted_ids, expert_ids, total,
            n_pairs, H, I, num_m, act.stride(0), y.stride(0),
            *_strides3(w2), *_strides3(s2),
            FMT=fmt, BSN=bsn, BSK=bsk, DOT_F32=_interpreting(), BLOCK_M=bm, **launch_kwargs(down))
        if K == 1:
            return y
        return y.view(T, K, H).sum(dim=1)  # top-k combine; fp32 accumulation inside torch's sum


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
