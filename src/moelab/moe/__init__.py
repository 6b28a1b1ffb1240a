"""MoE runner backends by name, and the one function that resolves `auto`.

One file per backend; creators import lazily so listing names never needs torch.
    reference  plain PyTorch, float32 accumulation: the spec (reference.py)
    grouped    tokens sorted by expert, torch._grouped_mm on CUDA (grouped.py)
    triton     fused Triton kernels with per-GPU tuned launch configs (triton_runner.py)
Weight formats: bf16 (bf16.py), fp8 (fp8.py), nvfp4 (nvfp4.py, ModelOpt layout); `quantize_experts`
builds any of them and `modelopt` reads/writes ModelOpt checkpoints.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from moelab.moe.base import ExpertWeights, MoERunner
from moelab.registry import Registry

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

RUNNERS: Registry[MoERunner] = Registry("MoE runner backend")
FORMATS = ("bf16", "fp8", "nvfp4")


@RUNNERS.register("reference")
def _reference() -> MoERunner:
    from moelab.moe.reference import ReferenceRunner

    return ReferenceRunner()


@RUNNERS.register("grouped")
def _grouped() -> MoERunner:
    from moelab.moe.grouped import GroupedRunner

    return GroupedRunner()


@RUNNERS.register("triton")
def _triton() -> MoERunner:
    from moelab.moe.triton_runner import TritonRunner

    return TritonRunner()


def _runner_class(name: str) -> type[MoERunner]:
    return type(RUNNERS.create(name))


def resolve_runner(requested: str, device: "torch.device", fmt: str) -> tuple[str, str]:
    """The one place `auto` is resolved. Returns (backend name, one-line reason).

    Raises ValueError naming the flag value and what would work when `requested` cannot run
    `fmt` weights on `device` (e.g. triton without CUDA).
    """
    if fmt not in FORMATS:
        raise ValueError(f"--quantization weight format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if requested == "auto":
        name = "triton" if device.type == "cuda" else "grouped"
        why = _runner_class(name).unsupported_reason(device, fmt)
        if why is None:
            reason = (f"auto: triton (fused kernel) on CUDA device {device}" if name == "triton"
                      else f"auto: grouped on {device.type} (the fused triton kernel needs CUDA)")
        else:
            name, reason = "grouped", f"auto: grouped, because {why}"
        log.info("MoE runner backend %s (%s)", name, reason)
        return name, reason
    if requested not in RUNNERS:
        raise ValueError(f"--moe-runner-backend {requested!r} is unknown; choose auto or one of "
                         f"{', '.join(RUNNERS.names())}")
    why = _runner_class(requested).unsupported_reason(device, fmt)
    if why is not None:
        working = [n for n in RUNNERS.names() if _runner_class(n).unsupported_reason(device, fmt) is None]
        raise ValueError(f"--moe-runner-backend {requested} cannot run here: {why}; "
                         f"use --moe-runner-backend auto or one of {', '.join(working)}")
    return requested, f"{requested}: chosen explicitly"


def quantize_experts(w13: "torch.Tensor", w2: "torch.Tensor", fmt: str, **opts: Any) -> ExpertWeights:
    """w13 [E, 2I, H], w2 [E, H, I] -> ExpertWeights in fmt (bf16 | fp8 [block=(128,128)] | nvfp4)."""
    from moelab.moe.quant import quantize_experts as _q

    return _q(w13, w2, fmt, **opts)


__all__ = ["RUNNERS", "FORMATS", "ExpertWeights", "MoERunner", "resolve_runner", "quantize_experts"]
