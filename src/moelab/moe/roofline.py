"""Roofline arithmetic for one MoE layer call (pure Python, no torch): bytes, FLOPs, bound.

Weight bytes count only the experts the routing actually touched; activation bytes are the ideal
fully fused ones (x read once, out written once). FLOPs are 6*T*K*H*I (gate+up 4, down 2).
Bytes per weight element: bf16 2, fp8 1 (+ scales), nvfp4 0.5 + 1/16 (e4m3 scale per 16 values).
"""
from __future__ import annotations

SHAPES: dict[str, tuple[int, int, int, int]] = {  # name -> (E, K, H, I) per shard
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "deepseek-v3": (256, 8, 7168, 2048),
    "qwen3.5-397b-a17b-tp8": (512, 10, 4096, 128),
}


def parse_shape(text: str) -> tuple[str, tuple[int, int, int, int]]:
    """A preset name or 'E,K,H,I' -> (label, (E, K, H, I)); ValueError says what is accepted."""
    if text in SHAPES:
        return text, SHAPES[text]
    parts = text.split(",")
    try:
        E, K, H, I = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--shape {text!r} is neither a preset ({', '.join(SHAPES)}) nor E,K,H,I "
                         "(four integers, e.g. 128,8,2048,768)") from None
    if min(E, K, H, I) < 1 or K > E:
        raise ValueError(f"--shape {text!r}: all of E,K,H,I must be positive and top-k K <= E")
    return f"E{E}-K{K}-H{H}-I{I}", (E, K, H, I)


def weight_bytes_per_expert(H: int, I: int, fmt: str) -> float:
    n = 3 * H * I
    return {"bf16": 2.0 * n, "fp8": 1.0 * n, "nvfp4": n * (0.5 + 1 / 16)}[fmt]


def expected_active(E: int, K: int, T: int) -> float:
    """Distinct experts touched by T tokens under uniform independent routing."""
    return E * (1 - (1 - K / E) ** T)


def layer_cost(T: int, K: int, H: int, I: int, fmt: str, experts_touched: float,
               act_bytes: int = 2) -> tuple[float, float]:
    """(bytes, flops) of one layer call."""
    b = experts_touched * weight_bytes_per_expert(H, I, fmt) + 2 * T * H * act_bytes
    return b, 6.0 * T * K * H * I


def roofline_us(bytes_: float, flops: float, bw_bytes_s: float | None, flops_s: float | None) -> float | None:
    """max(bytes/BW, flops/P) in microseconds; None when the ceilings are unknown (no GPU)."""
    if not bw_bytes_s or not flops_s:
        return None
    return max(bytes_ / bw_bytes_s, flops / flops_s) * 1e6


def decode_step_cost(mc: dict, fmt: str, batch: int, context: float, act_bytes: int = 2) -> tuple[float, float]:
    """(bytes, flops) of one decode step of a Qwen3-MoE model (`mc`: its config.json fields):
    `batch` sequences, one token each, attending to `context` cached keys on average.

    Bytes: per layer the attention and router weights, the experts the batch touches (expected
    under uniform routing) and the K/V read; then the lm_head. Embedding rows, norms and
    activations are under 0.1 % at these sizes and are left out.
    """
    H, L, V = mc["hidden_size"], mc["num_hidden_layers"], mc["vocab_size"]
    nh, kvh, D = mc["num_attention_heads"], mc["num_key_value_heads"], mc["head_dim"]
    E, K, I = mc["num_experts"], mc["num_experts_per_tok"], mc["moe_intermediate_size"]
    attn = H * D * (2 * nh + 2 * kvh)  # q, o: nh*D x H; k, v: kvh*D x H
    kv = batch * context * 2 * kvh * D * act_bytes
    layer = (attn + E * H) * act_bytes + expected_active(E, K, batch) * weight_bytes_per_expert(H, I, fmt) + kv
    flops = 2 * batch * (L * (attn + E * H + K * 3 * H * I + 2 * nh * D * context) + V * H)
    return L * layer + V * H * act_bytes, flops
