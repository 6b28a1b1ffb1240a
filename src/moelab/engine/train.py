"""A differentiable copy of the engine's Qwen3-MoE forward, for training a preset on the CPU.

The engine's model (model.py) runs packed tokens against a KV cache under inference mode; this one
runs a padded batch [B, S] with causal attention and keeps the graph for autograd. The math is the
engine's: the same RMSNorm and rotary functions are called, the router is a softmax over all
experts then top-k (renormalised when the config says so), the experts are SiLU-gated with the
engine's fused [E, 2I, H] / [E, H, I] layout. `weights()` hands the tensors over under the Hugging
Face names, so `checkpoint.save_checkpoint` writes a directory `moelab serve --model-path` loads,
and the engine's logits on it equal these (tests/test_train_preset.py checks that).

    >>> import torch
    >>> from moelab.engine.config import PRESETS
    >>> m = TrainableQwen3Moe(PRESETS["tiny"], torch.Generator().manual_seed(0))
    >>> out = m.forward(torch.tensor([[97, 98, 99]]))
    >>> out.logits.shape, out.expert_counts.shape
    (torch.Size([1, 3, 259]), torch.Size([2, 8]))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moelab.engine.checkpoint import dense_shapes
from moelab.engine.config import ModelConfig
from moelab.engine.model import apply_rope, rms_norm, rope_tables


@dataclass
class Output:
    logits: torch.Tensor  # [B, S, V] float32
    balance_loss: torch.Tensor  # scalar: E * sum_e (share of assignments to e) * (mean router prob of e), per layer mean
    expert_counts: torch.Tensor  # [L, E] assignments of the tokens in `mask` to each expert (no grad)


class TrainableQwen3Moe:
    """Parameters under HF names (dense) plus w13 [E, 2I, H], w2 [E, H, I] per layer, all float32."""

    def __init__(self, cfg: ModelConfig, g: torch.Generator) -> None:
        self.cfg = cfg
        L = cfg.num_hidden_layers
        self.p: dict[str, torch.Tensor] = {}
        for name, shape in dense_shapes(cfg).items():
            if name.endswith("norm.weight"):
                t = torch.ones(shape)
            elif name == "model.embed_tokens.weight":
                t = torch.randn(shape, generator=g)
            else:  # N(0, 1/fan_in); the two projections that write into the residual shrink with depth
                t = torch.randn(shape, generator=g) * shape[-1] ** -0.5
                if name.endswith("o_proj.weight"):
                    t /= (2 * L) ** 0.5
            self.p[name] = t
        E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        for i in range(L):
            self.p[f"w13.{i}"] = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
            self.p[f"w2.{i}"] = torch.randn(E, H, I, generator=g) * I ** -0.5 / (2 * L) ** 0.5
        for t in self.p.values():
            t.requires_grad_(True)
        self.cos, self.sin = rope_tables(cfg, torch.device("cpu"))

    def parameters(self) -> list[torch.Tensor]:
        return list(self.p.values())

    def weights(self) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        """(dense tensors by HF name, per layer (w13, w2)), detached copies."""
        dense = {k: v.detach().clone() for k, v in self.p.items() if k.startswith(("model.", "lm_head"))}
        experts = [(self.p[f"w13.{i}"].detach().clone(), self.p[f"w2.{i}"].detach().clone())
                   for i in range(self.cfg.num_hidden_layers)]
        return dense, experts

    def _attention(self, x: torch.Tensor, i: int) -> torch.Tensor:
        c, p, pre = self.cfg, self.p, f"model.layers.{i}.self_attn."
        B, S, _ = x.shape
        nh, kvh, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = rms_norm((x @ p[pre + "q_proj.weight"].t()).view(B, S, nh, D), p[pre + "q_norm.weight"], c.rms_norm_eps)
        k = rms_norm((x @ p[pre + "k_proj.weight"].t()).view(B, S, kvh, D), p[pre + "k_norm.weight"], c.rms_norm_eps)
        v = (x @ p[pre + "v_proj.weight"].t()).view(B, S, kvh, D)
        cos, sin = self.cos[:S], self.sin[:S]  # [S, D]; every sequence starts at position 0
        q = apply_rope(q.reshape(B * S, nh, D), cos.repeat(B, 1), sin.repeat(B, 1)).view(B, S, nh, D)
        k = apply_rope(k.reshape(B * S, kvh, D), cos.repeat(B, 1), sin.repeat(B, 1)).view(B, S, kvh, D)
        rep = nh // kvh
        q, k, v = q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2), v.repeat_interleave(rep, 2).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh, S, D]
        return out.transpose(1, 2).reshape(B, S, nh * D) @ p[pre + "o_proj.weight"].t()

    def _moe(self, h: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [N, H] -> (out [N, H], balance loss, assignments per expert [E])."""
        c = self.cfg
        E, K, I = c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size
        probs = torch.softmax((h @ self.p[f"model.layers.{i}.mlp.gate.weight"].t()).float(), dim=-1)  # [N, E]
        w, ids = torch.topk(probs, K, dim=-1)  # [N, K]
        if c.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        w13, w2 = self.p[f"w13.{i}"], self.p[f"w2.{i}"]
        out = torch.zeros_like(h)
        for e in range(E):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            g = h[tok] @ w13[e].t()  # [n, 2I]
            y = (F.silu(g[:, :I]) * g[:, I:]) @ w2[e].t()  # [n, H]
            out = out.index_add(0, tok, y * w[tok, slot, None])
        counts = torch.bincount(ids.flatten(), minlength=E)  # [E]
        balance = E * ((counts.float() / ids.numel()) * probs.mean(0)).sum()
        return out, balance, counts.detach()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> Output:
        """ids [B, S] -> logits [B, S, V]; `mask` [B, S] marks real tokens (the MoE skips padding)."""
        c, p = self.cfg, self.p
        B, S = ids.shape
        mask = torch.ones(B, S, dtype=torch.bool) if mask is None else mask
        flat = mask.flatten().nonzero(as_tuple=True)[0]  # [N] positions of real tokens
        x = p["model.embed_tokens.weight"][ids]  # [B, S, H]
        balance, counts = [], []
        for i in range(c.num_hidden_layers):
            pre = f"model.layers.{i}."
            x = x + self._attention(rms_norm(x, p[pre + "input_layernorm.weight"], c.rms_norm_eps), i)
            h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], c.rms_norm_eps).reshape(B * S, -1)[flat]
            y, bal, cnt = self._moe(h, i)
            x = x + torch.zeros(B * S, c.hidden_size).index_copy(0, flat, y).view(B, S, -1)
            balance.append(bal)
            counts.append(cnt)
        x = rms_norm(x, p["model.norm.weight"], c.rms_norm_eps)
        return Output(logits=(x @ p["lm_head.weight"].t()).float(), balance_loss=torch.stack(balance).mean(),
                      expert_counts=torch.stack(counts))
