"""The Qwen3-MoE architecture in plain PyTorch, run on packed tokens with a slot KV cache.

Per layer: RMSNorm -> attention (q/k/v projections, per-head q/k RMSNorm, rotary embedding,
grouped KV heads) -> residual -> RMSNorm -> softmax top-k router -> SiLU-gated experts through
the MoE runner backend -> residual. Tensor names and semantics follow Hugging Face's
Qwen3MoeForCausalLM, so a checkpoint of either loads into the other.

A step runs T packed tokens from B sequences (`StepBatch`): fresh prefills attend causally to
their own tokens; decodes (one token each) attend to their cached keys. On CUDA the decode keys
are read in place by a Triton kernel through the engine's slot table (attention.py), so a pure
decode step has fixed shapes and is replayed from a CUDA graph (graphs.py); elsewhere they are
gathered by slot for PyTorch's attention. Linear layers and the MoE run once over all T tokens,
which is where batching pays.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moelab.engine.config import ModelConfig
from moelab.engine.parallel.layout import Parallelism
from moelab.moe.base import ExpertWeights, MoERunner


def decode_attention(*args: torch.Tensor) -> torch.Tensor:
    """attention.decode_attention, imported on first use (triton is only needed on CUDA)."""
    from moelab.engine.attention import decode_attention as kernel

    return kernel(*args)


@dataclass
class StepBatch:
    """Metadata of one forward step over T packed tokens (see batch.build_step)."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    write_slots: torch.Tensor  # [T] KV cache slot each new token's K/V is written to
    prefills: list[tuple[int, int]]  # (first packed index, length) of each fresh prefill
    decode_rows: torch.Tensor | None  # [Bd] packed index of each decode token; None: every token is one
    last_index: torch.Tensor | None  # [B] packed index of each sequence's last token; None: every token
    # decode keys, one of two ways:
    decode_slots: torch.Tensor | None = None  # [Bd, Lmax] cache slots of each decode sequence, padded
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, Lmax] True where a key is real
    slot_table: torch.Tensor | None = None  # [lanes, width] cache slots per lane (the Triton kernel)
    decode_lanes: torch.Tensor | None = None  # [Bd] lane of each decode sequence in slot_table
    decode_lens: torch.Tensor | None = None  # [Bd] keys each decode token attends to, itself included


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

    Holds no per-request state: the KV cache tensors are passed to `forward`. On rank `rank` of a
    multi-rank launch it holds that rank's part (parallel/layout.py): its attention heads, its
    experts or expert slices; `comm` (set once the ranks have joined) sums the partial outputs
    of attention and of the MoE, and only rank 0 computes logits.
    """

    def __init__(self, cfg: ModelConfig, dense: dict[str, torch.Tensor], experts: list[ExpertWeights],
                 runner: MoERunner, par: Parallelism = Parallelism(), rank: int = 0) -> None:
        self.cfg, self.dense, self.experts, self.runner = cfg, dense, experts, runner
        self.nh = len(par.heads(rank, cfg.num_attention_heads))  # heads of this rank
        self.kvh = len(par.kv_heads(rank, cfg.num_key_value_heads))
        # expert parallelism: the global id of this rank's first expert (None: every expert, sliced)
        self.first_expert = par.experts(rank, cfg.num_experts).start if par.ep > 1 else None
        self.comm = None  # parallel.group.Collectives, for a multi-rank launch
        self.computes_logits = rank == 0
        emb = dense["model.embed_tokens.weight"]
        self.device, self.dtype = emb.device, emb.dtype
        if "lm_head.weight" not in dense:  # tie_word_embeddings
            dense["lm_head.weight"] = emb
        self.cos, self.sin = rope_tables(cfg, self.device)
        # q, k and v in one GEMM: the layer keeps one [ (nh + 2 kvh) * D, H ] weight and the HF names
        # become views of it, so nothing is held twice
        self.qkv: list[torch.Tensor] = []
        nq, nk = self.nh * cfg.head_dim, self.kvh * cfg.head_dim
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}.self_attn."
            w = torch.cat([dense.pop(p + n + "_proj.weight") for n in "qkv"])
            dense[p + "q_proj.weight"], dense[p + "k_proj.weight"], dense[p + "v_proj.weight"] = w.split([nq, nk, nk])
            self.qkv.append(w)
        # Triton kernels for decode attention and the small per-token operations: on CUDA (or under
        # Triton's CPU interpreter, for tests), with triton installed and a head size the kernels
        # take (a power of two, at least 16); elsewhere the same math in plain PyTorch
        D = cfg.head_dim
        self.kernels = ((self.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
                        and D >= 16 and D & (D - 1) == 0 and importlib.util.find_spec("triton") is not None)

    @torch.inference_mode()
    def warm_moe(self, max_tokens: int) -> list[int]:
        """Run the MoE runner on dummy routing at the token counts it names, so that every kernel a
        step of up to `max_tokens` tokens can launch is compiled at startup rather than in the middle
        of serving a request. Returns those token counts."""
        c = self.cfg
        # expert parallelism calls the runner with one (token, expert) pair per row (parallel/moe.py)
        k = c.num_experts_per_tok if self.first_expert is None else 1
        max_rows = max_tokens if self.first_expert is None else max_tokens * c.num_experts_per_tok
        counts = self.runner.warm_token_counts(max_rows, self.experts[0], k)
        E = self.experts[0].shape[0]
        for T in counts:
            x = torch.zeros(T, c.hidden_size, dtype=self.dtype, device=self.device)
            ids = (torch.arange(T * k, device=self.device) % E).view(T, -1)
            w = torch.full(ids.shape, 1.0 / ids.shape[1], dtype=torch.float32, device=self.device)
            self.runner(x, w, ids, self.experts[0])
        return counts

    def new_kv_cache(self, slots: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V), each [slots, KVH, D] in the model dtype."""
        c = self.cfg
        shape = (slots, self.kvh, c.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(c.num_hidden_layers)]

    def route(self, h: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H] -> (topk_weights [T, K] float32, topk_ids [T, K]): softmax over all experts, then top-k."""
        logits = F.linear(h, self.dense[f"model.layers.{layer}.mlp.gate.weight"])  # [T, E]
        if self.kernels:
            from moelab.engine.fused import router_topk

            return router_topk(logits, self.cfg.num_experts_per_tok, self.cfg.norm_topk_prob)
        probs = torch.softmax(logits.float(), dim=-1)
        w, ids = torch.topk(probs, self.cfg.num_experts_per_tok, dim=-1)
        if self.cfg.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids

    def _add_norm(self, delta: torch.Tensor, residual: torch.Tensor | None, w: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + delta), residual + delta); residual None: (rms_norm(delta), delta)."""
        if self.kernels:
            from moelab.engine.fused import add_rms_norm

            return add_rms_norm(delta, residual, w, self.cfg.rms_norm_eps)
        x = delta if residual is None else residual + delta
        return rms_norm(x, w, self.cfg.rms_norm_eps), x

    def _attention(self, x: torch.Tensor, i: int, b: StepBatch, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        c, d, p = self.cfg, self.dense, f"model.layers.{i}.self_attn."
        T, nh, kvh, D = x.shape[0], self.nh, self.kvh, c.head_dim
        qkv = F.linear(x, self.qkv[i])  # [T, (nh + 2 kvh) * D]
        q, k, v = (t.view(T, -1, D) for t in qkv.split([nh * D, kvh * D, kvh * D], dim=1))
        kc, vc = kv
        if self.kernels:  # norms, rotary and the cache write in one launch, in place in qkv
            from moelab.engine.fused import qk_norm_rope

            qk_norm_rope(qkv, nh, kvh, D, d[p + "q_norm.weight"], d[p + "k_norm.weight"], self.cos, self.sin,
                         b.positions, b.write_slots, kc, vc, c.rms_norm_eps)
        else:
            q = rms_norm(q, d[p + "q_norm.weight"], c.rms_norm_eps)
            k = rms_norm(k, d[p + "k_norm.weight"], c.rms_norm_eps)
            cos, sin = self.cos[b.positions], self.sin[b.positions]  # [T, D]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kc[b.write_slots] = k
            vc[b.write_slots] = v
        rep = nh // kvh
        out = torch.empty(T, nh, D, dtype=q.dtype, device=q.device)
        for s, n in b.prefills:  # fresh prompt: causal attention over its own tokens
            qq = q[s:s + n].transpose(0, 1)  # [nh, n, D]
            kk = k[s:s + n].repeat_interleave(rep, dim=1).transpose(0, 1)
            vv = v[s:s + n].repeat_interleave(rep, dim=1).transpose(0, 1)
            out[s:s + n] = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1)
        if b.decode_rows is None:  # a pure decode step (the CUDA graph path)
            out = decode_attention(q, kc, vc, b.slot_table, b.decode_lanes, b.decode_lens)
        elif b.decode_rows.numel() and b.slot_table is not None:
            out[b.decode_rows] = decode_attention(q[b.decode_rows], kc, vc, b.slot_table, b.decode_lanes,
                                                  b.decode_lens)
        elif b.decode_rows.numel():  # one new token per sequence against its cached keys
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

    def _moe(self, h: torch.Tensor, i: int) -> torch.Tensor:
        topw, topi = self.route(h, i)
        if self.first_expert is None:  # every expert (or this rank's slice of each)
            return self.runner(h, topw, topi, self.experts[i])
        from moelab.engine.parallel.moe import local_experts_moe

        return local_experts_moe(self.runner, h, topw, topi, self.experts[i], self.first_expert)

    @torch.inference_mode()
    def forward(self, b: StepBatch, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """One step over packed tokens -> logits [B, V] in float32 for each sequence's last token
        (None on the ranks after 0 of a multi-rank launch)."""
        c, d, comm = self.cfg, self.dense, self.comm
        delta, residual = d["model.embed_tokens.weight"][b.input_ids], None  # [T, H]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            h, residual = self._add_norm(delta, residual, d[p + "input_layernorm.weight"])
            attn = self._attention(h, i, b, kv_cache[i])
            if comm is not None:  # each rank's heads gave a partial o_proj product
                attn = comm.all_reduce(attn)
            h, residual = self._add_norm(attn, residual, d[p + "post_attention_layernorm.weight"])
            delta = self._moe(h, i)
            if comm is not None:  # each rank's experts (or expert slices) gave a partial sum
                delta = comm.all_reduce(delta)
        if not self.computes_logits:
            return None
        if b.last_index is not None:
            delta, residual = delta[b.last_index], residual[b.last_index]
        h, _ = self._add_norm(delta, residual, d["model.norm.weight"])  # [B, H]
        return F.linear(h, d["lm_head.weight"]).float()  # [B, V]
