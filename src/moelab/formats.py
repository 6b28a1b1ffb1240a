"""Weight formats: the one place that says which format a launch's weights are in.

Engines name their quantization methods (`--quantization modelopt_fp4`, `awq_marlin`, `w8a8_fp8`)
and checkpoints declare theirs (`quantization_config.quant_algo`, hf_quant_config.json); the
support matrix, the memory forecast, the probe's drift limits and the embedded engine all need
the same answer. Formats: bf16 (unquantized), fp8, mxfp8, int8, nvfp4, mxfp4, int4, and unknown
(a quantized checkpoint that does not say its width).

Some methods say nothing about the format by their name (`modelopt`, `compressed-tensors`,
`quark`: the checkpoint decides); `of_quantization` returns None for those, and `of_launch`
falls back to the checkpoint's own format.

    >>> of_launch("awq_marlin"), of_launch("modelopt", "nvfp4"), of_launch(None, "fp8"), of_launch("auto")
    ('int4', 'nvfp4', 'fp8', 'bf16')
    >>> tolerance_class("int4"), tolerance_class("mxfp8"), tolerance_class(None)
    ('nvfp4', 'fp8', 'bf16')
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMATS = ("bf16", "fp8", "mxfp8", "int8", "nvfp4", "mxfp4", "int4", "unknown")  # unknown: quantized, width unsaid

# Quantization method names of SGLang 0.5.23 (its --quantization choices) and vLLM 0.32
# (QUANTIZATION_METHODS), and the embedded engine's own (none, fp8, nvfp4), by format.
_BY_FORMAT = {
    "bf16": ("unquant", "none"),
    "fp8": ("fp8", "modelopt_fp8", "w8a8_fp8", "fbgemm_fp8", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel",
            "deepseek_v4_fp8"),
    "mxfp8": ("mxfp8", "modelopt_mxfp8"),
    "int8": ("w8a8_int8", "experts_int8", "int8_per_channel_weight_only", "mlx_q8", "auto-round-int8"),
    "nvfp4": ("modelopt_fp4", "nvfp4", "nvfp4_online", "petit_nvfp4", "nvfp4_per_token"),
    "mxfp4": ("mxfp4", "gpt_oss_mxfp4", "quark_mxfp4", "mxfp_w4a8"),
    "int4": ("awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "moe_wna16", "bitsandbytes",
             "mlx_q4", "w4afp8", "quark_int4fp8_moe"),
}
QUANTIZATION = {name: fmt for fmt, names in _BY_FORMAT.items() for name in names}
# Methods whose format is the checkpoint's (a name alone does not say), and "no flag" spellings.
FROM_CHECKPOINT = ("auto", "None", "modelopt", "modelopt_mixed", "compressed-tensors", "quark", "auto-round",
                   "torchao", "inc", "online", "fp_quant", "gguf", "modelslim", "humming")


def of_quantization(name: str | None) -> str | None:
    """The format a quantization method name means, or None where the checkpoint decides."""
    if name is None or name in FROM_CHECKPOINT:
        return None
    return QUANTIZATION.get(name)


def of_checkpoint(quant: Mapping[str, Any] | None) -> str:
    """The format a checkpoint declares: a quantization_config (flat) or hf_quant_config.json's
    nested {"quantization": {...}}; bf16 when it declares none. `quant_method` names (awq, gptq,
    fp8 ...) and ModelOpt's `quant_algo` (FP8, NVFP4, MXFP4 ...) are both read."""
    if not quant:
        return "bf16"
    body = quant.get("quantization") if isinstance(quant.get("quantization"), Mapping) else quant
    algo = str(body.get("quant_algo") or "").upper()
    if algo:
        if "MXFP4" in algo:
            return "mxfp4"
        if "MXFP8" in algo:
            return "mxfp8"
        if "FP4" in algo:
            return "nvfp4"
        if "FP8" in algo:
            return "fp8"
        if "INT8" in algo or "W8A8" in algo:
            return "int8"
        if "INT4" in algo or "W4A16" in algo or "AWQ" in algo:
            return "int4"
    method = str(body.get("quant_method") or "").lower()
    if method in QUANTIZATION:
        return QUANTIZATION[method]
    return _bits(body) if method else "bf16"


def _bits(body: Mapping[str, Any]) -> str:
    """compressed-tensors, quark and friends: the weight bit width where the config states one;
    `unknown` where it does not (never bf16: the weights are quantized)."""
    bits = body.get("bits") or body.get("w_bit") or body.get("weight_bits")
    return {4: "int4", 8: "int8"}.get(bits, "unknown") if isinstance(bits, int) else "unknown"


def of_launch(quantization: str | None, checkpoint_format: str | None = None) -> str:
    """A launch's weight format: its --quantization when the name says, else the checkpoint's, else bf16."""
    return of_quantization(quantization) or checkpoint_format or "bf16"


def tolerance_class(fmt: str | None) -> str:
    """The probe's drift class: bf16 (strictest), fp8 (8-bit formats) or nvfp4 (4-bit formats)."""
    if fmt in ("nvfp4", "mxfp4", "int4", "unknown"):
        return "nvfp4"
    if fmt in ("fp8", "mxfp8", "int8"):
        return "fp8"
    return "bf16"


def probe_class(quantization: str | None, checkpoint_format: str | None = None) -> str | None:
    """The probe's drift class for a launch's --quantization (None: unquantized, bf16 limits)."""
    cls = tolerance_class(of_launch(quantization, checkpoint_format))
    if cls == "bf16" and quantization not in (None, "none", "unquant", "auto") and of_quantization(quantization) is None:
        return "nvfp4"  # a method whose format only the checkpoint knows: the loosest limits, never bf16's
    return None if cls == "bf16" else cls
