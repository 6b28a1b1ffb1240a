"""Cut a rank's part out of whole weights (the layout in layout.py), so every rank holds exactly
the numbers a one-rank launch holds, split.

    q_proj [nh*D, H]   rows of the rank's query heads      o_proj [H, nh*D]  the matching columns
    k/v_proj [kvh*D, H] rows of the rank's KV heads         experts           ExpertWeights.select
                                                                              / slice_intermediate
Everything else (embeddings, norms, router, LM head) is left whole. Slices are copies with their
own storage, so the whole tensors can be freed once a layer is cut.
"""
from __future__ import annotations

import torch

from moelab.engine.config import ModelConfig
from moelab.engine.parallel.layout import Parallelism
from moelab.moe.base import ExpertWeights


def _rows(t: torch.Tensor, heads: range, D: int) -> torch.Tensor:
    return t[heads.start * D:heads.stop * D].clone()


def shard_dense(dense: dict[str, torch.Tensor], cfg: ModelConfig, par: Parallelism, rank: int
                ) -> dict[str, torch.Tensor]:
    """The rank's dense tensors (HF names, shapes cut along heads); the input dict is not changed."""
    if par.tp == 1:
        return dense
    D = cfg.head_dim
    q = par.heads(rank, cfg.num_attention_heads)
    kv = par.kv_heads(rank, cfg.num_key_value_heads)
    out = dict(dense)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        out[p + "q_proj.weight"] = _rows(dense[p + "q_proj.weight"], q, D)
        out[p + "k_proj.weight"] = _rows(dense[p + "k_proj.weight"], kv, D)
        out[p + "v_proj.weight"] = _rows(dense[p + "v_proj.weight"], kv, D)
        out[p + "o_proj.weight"] = dense[p + "o_proj.weight"][:, q.start * D:q.stop * D].contiguous()
    return out


def shard_experts(w: ExpertWeights, par: Parallelism, rank: int) -> ExpertWeights:
    """The rank's experts of one layer: whole experts of its group (--ep-size), then its slice of
    their intermediate dimension (the ranks within a group)."""
    E, _, I = w.shape
    if par.ep > 1:
        e = par.experts(rank, E)
        w = w.select(e.start, len(e))
    if par.moe_tp > 1:
        i = par.intermediate(rank, I)
        w = w.slice_intermediate(i.start, i.stop)
    return w
