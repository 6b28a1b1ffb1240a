"""The memory forecast of one rank of the embedded engine, before any weight is made.

moelab's forecast (moelab/forecast.py) splits the experts and the KV cache for every engine; this
module describes the embedded model to it: the bytes of every tensor at the model dtype (experts
at their weight format), and the dense bytes a rank holds under the layout of parallel/layout.py.
Worked example, tiny preset in float32 at --tp-size 2: each rank holds the embeddings, norms,
router and LM head whole, 2 of the 4 query heads and 1 of the 2 KV heads of q/k/v/o, half of the
experts' bytes, and a KV cache of 2 layers x 2 (K, V) x 1 head x 16 dims x 4 bytes = 256 B a token.
"""
from __future__ import annotations

import math

from moelab.engine.checkpoint import dense_shapes
from moelab.engine.config import ModelConfig, ServerConfig
from moelab.engine.parallel.layout import Parallelism
from moelab.forecast import BYTES, Forecast, ModelInfo, forecast

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _rank_dense_params(mc: ModelConfig, par: Parallelism) -> int:
    """Dense parameters on rank 0 (every rank holds as many): q/k/v/o of its heads, the rest whole."""
    heads, kv = len(par.heads(0, mc.num_attention_heads)), len(par.kv_heads(0, mc.num_key_value_heads))
    attn = mc.hidden_size * mc.head_dim * (2 * heads + 2 * kv)  # q, o by query heads; k, v by KV heads
    split = mc.hidden_size * mc.head_dim * (2 * mc.num_attention_heads + 2 * mc.num_key_value_heads)
    return _dense_params(mc) - mc.num_hidden_layers * (split - attn)


def _dense_params(mc: ModelConfig) -> int:
    return sum(math.prod(s) for k, s in dense_shapes(mc).items()
               if not (k == "lm_head.weight" and mc.tie_word_embeddings))


def model_info(mc: ModelConfig, dtype: str, fmt: str, name: str) -> ModelInfo:
    """The model as the forecast reads it (bytes at the model dtype, experts at their format)."""
    b = _DTYPE_BYTES[dtype]
    dense = _dense_params(mc) * b
    experts = mc.num_hidden_layers * mc.num_experts * 3 * mc.hidden_size * mc.moe_intermediate_size
    expert_bytes = int(experts * (b if fmt == "bf16" else BYTES[fmt]))
    info = ModelInfo(name=name, source="embedded engine model config", model_type="qwen3_moe",
                     hidden_size=mc.hidden_size, num_layers=mc.num_hidden_layers,
                     attention_layers=mc.num_hidden_layers, num_kv_heads=mc.num_key_value_heads,
                     head_dim=mc.head_dim, num_experts=mc.num_experts, experts_per_tok=mc.num_experts_per_tok,
                     max_position=mc.max_position_embeddings, quant_format=fmt, weight_bytes=dense + expert_bytes,
                     expert_bytes=expert_bytes, weight_bytes_source=f"config ({dtype}, experts {fmt})")
    return info


def rank_forecast(cfg: ServerConfig, mc: ModelConfig, dtype: str, fmt: str) -> Forecast:
    """Weights and KV bytes per token of each rank at this launch's --tp-size / --ep-size."""
    par = cfg.parallelism
    return forecast(model_info(mc, dtype, fmt, cfg.model_name), engine="embedded", tp=par.tp, ep=par.ep > 1,
                    kv_dtype=dtype, dense_bytes_per_rank=_rank_dense_params(mc, par) * _DTYPE_BYTES[dtype])
