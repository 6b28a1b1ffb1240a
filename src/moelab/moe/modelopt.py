"""Read and write experts in the ModelOpt checkpoint layout (fp8 and NVFP4), plus its config.

Per expert e the tensors are named `{prefix}.{e}.{gate,up,down}_proj.{weight,weight_scale,
weight_scale_2,input_scale}` (prefix e.g. `model.layers.0.mlp.experts`):
    NVFP4  weight uint8 [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 fp32 [], input_scale fp32 []
    FP8    weight e4m3 [N, K], weight_scale fp32 [] (per tensor) | [N] (per channel) | [N/128, K/128] (block)
    bf16   weight only
Activations stay in bf16 in moelab's kernels (weight-only), so input_scale is written as 1.0 and read
but not used. The config is `quantization_config` in config.json (flat) or hf_quant_config.json (nested).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from moelab.moe.base import ExpertWeights

_PROJ = ("gate_proj", "up_proj", "down_proj")


def format_from_config(quant: Mapping[str, Any] | None) -> str:
    """bf16 | fp8 | nvfp4 from a quantization_config (flat) or hf_quant_config.json (nested) dict."""
    from moelab.formats import of_checkpoint

    fmt = of_checkpoint(quant)
    if fmt not in ("bf16", "fp8", "nvfp4"):
        body = (quant or {}).get("quantization") or quant or {}
        raise ValueError(f"quantization {body.get('quant_algo') or body.get('quant_method')!r} ({fmt}) is not supported "
                         "by moelab's MoE kernels (supported: FP8, NVFP4)")
    return fmt


def quantization_config(fmt: str, block: tuple[int, int] | None = None, *, nested: bool = False,
                        ignore: list[str] | None = None) -> dict[str, Any]:
    """The ModelOpt config dict for `fmt`: flat (config.json quantization_config) or nested
    (hf_quant_config.json) form. bf16 returns {}."""
    if fmt == "bf16":
        return {}
    ignore = ignore if ignore is not None else ["lm_head"]
    body: dict[str, Any] = {"quant_algo": {"fp8": "FP8", "nvfp4": "NVFP4"}[fmt], "kv_cache_quant_algo": None}
    if fmt == "nvfp4":
        body["group_size"] = 16
    if fmt == "fp8" and block is not None:
        body["weight_block_size"] = list(block)
    if nested:
        return {"producer": {"name": "moelab", "version": "0.1.0"},
                "quantization": {**body, "exclude_modules": ignore}}
    return {"quant_method": "modelopt", **body, "ignore": ignore}


def experts_to_checkpoint(w: ExpertWeights, prefix: str) -> dict[str, torch.Tensor]:
    """ExpertWeights -> {name: tensor} with ModelOpt per-expert names (contiguous CPU tensors)."""
    E, H, I = w.shape
    out: dict[str, torch.Tensor] = {}

    def put(e: int, proj: str, **tensors: torch.Tensor) -> None:
        for k, t in tensors.items():
            out[f"{prefix}.{e}.{proj}.{k}"] = t.detach().to("cpu").clone()  # own storage: safetensors refuses shared

    one = torch.tensor(1.0)
    for e in range(E):
        if w.fmt == "bf16":
            put(e, "gate_proj", weight=w.w13[e, :I]), put(e, "up_proj", weight=w.w13[e, I:])
            put(e, "down_proj", weight=w.w2[e])
        elif w.fmt == "fp8":
            if w.block is None:
                s13, s2 = w.w13_scale[e], w.w2_scale[e]  # [2I], [H]
                gs, us = s13[:I], s13[I:]
            else:
                bn = w.block[0]
                gs, us, s2 = w.w13_scale[e, : I // bn], w.w13_scale[e, I // bn:], w.w2_scale[e]
            put(e, "gate_proj", weight=w.w13[e, :I], weight_scale=gs, input_scale=one)
            put(e, "up_proj", weight=w.w13[e, I:], weight_scale=us, input_scale=one)
            put(e, "down_proj", weight=w.w2[e], weight_scale=s2, input_scale=one)
        elif w.fmt == "nvfp4":
            for j, proj in enumerate(("gate_proj", "up_proj")):
                rows = slice(j * I, (j + 1) * I)
                put(e, proj, weight=w.w13[e, rows], weight_scale=w.w13_scale[e, rows],
                    weight_scale_2=w.w13_scale_2[e, j], input_scale=one)
            put(e, "down_proj", weight=w.w2[e], weight_scale=w.w2_scale[e],
                weight_scale_2=w.w2_scale_2[e], input_scale=one)
        else:
            raise ValueError(f"cannot write {w.fmt} experts")
    return out


def experts_from_checkpoint(tensors: Mapping[str, torch.Tensor], prefix: str, num_experts: int,
                            quant: Mapping[str, Any] | None) -> ExpertWeights:
    """{name: tensor} with ModelOpt per-expert names -> ExpertWeights in the format `quant` names."""
    fmt = format_from_config(quant)

    def get(e: int, proj: str, key: str) -> torch.Tensor:
        name = f"{prefix}.{e}.{proj}.{key}"
        if name not in tensors:
            raise KeyError(f"checkpoint has no tensor {name!r} (needed for {fmt} experts)")
        return tensors[name]

    def stack(proj: str, key: str) -> torch.Tensor:
        return torch.stack([get(e, proj, key) for e in range(num_experts)])

    def stack13(key: str) -> torch.Tensor:  # gate rows then up rows: [E, 2I, ...]
        return torch.cat([stack("gate_proj", key), stack("up_proj", key)], dim=1)

    if fmt == "bf16":
        from moelab.moe.bf16 import Bf16Experts

        return Bf16Experts(stack13("weight"), stack("down_proj", "weight"))
    if fmt == "nvfp4":
        from moelab.moe.nvfp4 import Nvfp4Experts

        g13 = torch.stack([stack("gate_proj", "weight_scale_2").reshape(-1),
                           stack("up_proj", "weight_scale_2").reshape(-1)], dim=1)  # [E, 2]
        return Nvfp4Experts(stack13("weight"), stack13("weight_scale"), g13, stack("down_proj", "weight"),
                            stack("down_proj", "weight_scale"), stack("down_proj", "weight_scale_2").reshape(-1))
    from moelab.moe.fp8 import Fp8Experts

    w13, w2 = stack13("weight").to(torch.float8_e4m3fn), stack("down_proj", "weight").to(torch.float8_e4m3fn)
    gs, us, ds = stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale"), stack("down_proj", "weight_scale")
    if gs.dim() == 3:  # block scales [E, N/bn, K/bk]
        bn = w13.shape[1] // 2 // gs.shape[1]
        bk = w13.shape[2] // gs.shape[2]
        return Fp8Experts(w13, torch.cat([gs, us], dim=1), w2, ds, (bn, bk))
    E, two_i, _ = w13.shape
    I, H = two_i // 2, w2.shape[1]
    # per-tensor scalars [E] or [E,1] broadcast to per-channel; per-channel [E, N] or [E, N, 1] kept
    gs, us, ds = (s.reshape(E, -1).float() for s in (gs, us, ds))
    s13 = torch.cat([gs.expand(E, I), us.expand(E, I)], dim=1)
    return Fp8Experts(w13, s13, w2, ds.expand(E, H).contiguous(), None)
