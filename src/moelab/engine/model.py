"""The Qwen3-MoE architecture in plain PyTorch, run on packed tokens with a slot KV cache.

Per layer: RMSNorm -> attention (q/k/v projections, per-head q/k RMSNorm, rotary embedding,
grouped KV heads) -> residual -> RMSNorm -> softmax top-k router -> SiLU-gated experts through
the MoE runner backend -> residual. Tensor names and semantics follow Hugging Face's
Qwen3MoeForCausalLM, so a checkpoint of either loads into the other.

A step runs T packed tokens from B sequences (`StepBatch`): fresh prefills attend causally to
their own tokens; decodes (one token each) attend to their cached keys, gathered from the cache
by slot. Linear layers and the MoE run once over all T tokens, which is where batching pays.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moelab.engine.config import ModelConfig
from moelab.moe.base import ExpertWeights, MoERunner


@dataclass
class StepBatch:
    """Metadata of one forward step over T packed tokens (see kvcache.build_step)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    write_slots: torch.Tensor  # [T] KV cache slot each new token's K/V is written to
    prefills: list[tuple[int, int]]  # (first packed index, length) of each fresh prefill
    decode_rows: torch.Tensor  # [Bd] packed index of each decode token
    decode_slots: torch.Tensor  # [Bd, Lmax] cache slots of each decode sequence, padded
    decode_mask: torch.Tensor  # [Bd, 1, 1, Lmax] True where a key is real (broadcast over heads)
    last_index: torch.Tensor  # [B] packed index of each sequence's last token (its logits row)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Qwen3RMSNorm: normalise in float32, scale in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope_tables(cfg: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_pos, D] in float32 (rotate-half layout: frequencies repeated twice)."""
    D = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))  # [D/2]
    t = torch.arange(cfg.max_position_embeddings, dtype=torch.float32, device=device)
    ang = torch.outer(t, inv)  # [P, D/2]
    emb = torch.cat([ang, ang], dim=-1)  # [P, D]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D] -> x rotated, in x.dtype."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(x.dtype)


class Qwen3Moe:
    """Weights (HF names for dense tensors, one ExpertWeights per layer) plus the forward pass.

    Holds no per-request state: the KV cache tensors are passed to `forward`.
    """

    def __init__(self, cfg: ModelConfig, dense: dict[str, torch.Tensor], experts: list[ExpertWeights],
                 runner: MoERunner) -> None:
        self.cfg, self.dense, self.experts, self.runner = cfg, dense, experts, runner
        emb = dense["model.embed_tokens.weight"]
        self.device, self.dtype = emb.device, emb.dtype
        if "lm_head.weight" not in dense:  # tie_word_embeddings
            dense["lm_head.weight"] = emb
        self.cos, self.sin = rope_tables(cfg, self.device)

    def new_kv_cache(self, slots: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V), each [slots, KVH, D] in the model dtype."""
        c = self.cfg
        shape = (slots, c.num_key_value_heads, c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(c.num_hidden_layers)]

    def route(self, h: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H] -> (topk_weights [T, K] float32, topk_ids [T, K]): softmax over all experts, then top-k."""
        logits = F.linear(h, self.dense[f"model.layers.{layer}.mlp.gate.weight"])  # [T, E]
        probs = torch.softmax(logits.float(), dim=-1)
        w, ids = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
        if self.cfg.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids

    def _attention(self, x: torch.Tensor, i: int, b: StepBatch, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        c, d, p = self.cfg, self.dense, f"model.layers.{i}.self_attn."
        T, nh, kvh, D = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = F.linear(x, d[p + "q_proj.weight"]).view(T, nh, D)
        k = F.linear(x, d[p + "k_proj.weight"]).view(T, kvh, D)
        v = F.linear(x, d[p + "v_proj.weight"]).view(T, kvh, D)
        q, k = rms_norm(q, d[p + "q_norm.weight"], c.rms_norm_eps), rms_norm(k, d[p + "k_norm.weight"], c.rms_norm_eps)
        cos, sin = self.cos[b.positions], self.sin[b.positions]  # [T, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kc, vc = kv
        kc[b.write_slots] = k
        vc[b.write_slots] = v
        rep = nh // kvh
        out = torch.empty_like(q)  # [T, nh, D]
        for s, n in b.prefills:  # fresh prompt: causal attention over its own tokens
            qq = q[s:s + n].transpose(0, 1)  # [nh, n, D]
            kk = k[s:s + n].repeat_interleave(rep, dim=1).transpose(0, 1)
            vv = v[s:s + n].repeat_interleave(rep, dim=1).transpose(0, 1)
            out[s:s + n] = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1)
        if b.decode_rows.numel():  # one new token per sequence against its cached keys
            # The `rep` query heads sharing a KV head take the place of the query-length axis, so the
            # cached K/V are gathered once and never repeated per head (no causal mask is needed: a
            # decode token sees every cached position).
            Bd = b.decode_rows.numel()
            qd = q[b.decode_rows].view(Bd, kvh, rep, D)  # [Bd, kvh, rep, D]
            kd = kc[b.decode_slots].transpose(1, 2)  # [Bd, kvh, Lmax, D]
            vd = vc[b.decode_slots].transpose(1, 2)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=b.decode_mask)  # [Bd, kvh, rep, D]
            out[b.decode_rows] = od.reshape(Bd, nh, D)
        return F.linear(out.reshape(T, nh * D), d[p + "o_proj.weight"])

    @torch.inference_mode()
    def forward(self, b: StepBatch, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One step over packed tokens -> logits [B, V] in float32 for each sequence's last token."""
        c, d = self.cfg, self.dense
        x = d["model.embed_tokens.weight"][b.input_ids]  # [T, H]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            x = x + self._attention(rms_norm(x, d[p + "input_layernorm.weight"], c.rms_norm_eps), i, b, kv_cache[i])
            h = rms_norm(x, d[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            topw, topi = self.route(h, i)
            x = x + self.runner(h, topw, topi, self.experts[i])
        x = rms_norm(x[b.last_index], d["model.norm.weight"], c.rms_norm_eps)  # [B, H]
        return F.linear(x, d["lm_head.weight"]).float()  # [B, V]
