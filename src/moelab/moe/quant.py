"""One entry point that turns dense expert weights into any supported weight format."""
from __future__ import annotations

from typing import Any

import torch

from moelab.moe.base import ExpertWeights

FORMATS = ("bf16", "fp8", "nvfp4")


def quantize_experts(w13: torch.Tensor, w2: torch.Tensor, fmt: str, **opts: Any) -> ExpertWeights:
    """w13 [E, 2I, H], w2 [E, H, I] (any float dtype) -> ExpertWeights in `fmt`.

    opts: bf16 -> dtype (default bfloat16); fp8 -> block=(128, 128) for block scales
    (default per-channel); nvfp4 -> none.
    """
    E, two_i, H = w13.shape
    if w2.shape != (E, H, two_i // 2):
        raise ValueError(f"w2 has shape {tuple(w2.shape)}; with w13 {tuple(w13.shape)} it must be {(E, H, two_i // 2)}")
    if fmt == "bf16":
        from moelab.moe.bf16 import Bf16Experts

        dtype = opts.pop("dtype", torch.bfloat16)
        _no_more(fmt, opts)
        return Bf16Experts(w13.to(dtype).contiguous(), w2.to(dtype).contiguous())
    if fmt == "fp8":
        from moelab.moe.fp8 import Fp8Experts

        block = opts.pop("block", None)
        _no_more(fmt, opts)
        return Fp8Experts.quantize(w13, w2, tuple(block) if block else None)
    if fmt == "nvfp4":
        from moelab.moe.nvfp4 import Nvfp4Experts

        _no_more(fmt, opts)
        return Nvfp4Experts.quantize(w13, w2)
    raise ValueError(f"unknown weight format {fmt!r}; use one of {', '.join(FORMATS)}")


def _no_more(fmt: str, opts: dict) -> None:
    if opts:
        raise ValueError(f"unknown option(s) for {fmt} weights: {', '.join(sorted(opts))}")
