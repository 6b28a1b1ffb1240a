"""Model weights: a seeded random preset, and Hugging Face style directories written and read.

A directory is config.json (`architectures: ["Qwen3MoeForCausalLM"]`, `model_type: "qwen3_moe"`),
*.safetensors with HF Qwen3-MoE tensor names (sharded with model.safetensors.index.json past
`shard_bytes`), tokenizer.json. Experts go through `moelab.moe.modelopt`, so an fp8/NVFP4
ModelOpt checkpoint (config.json `quantization_config` or hf_quant_config.json) loads the same way
as a bf16 one. A preset written out loads back through exactly the code a real checkpoint uses.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from moelab.engine.config import ModelConfig
from moelab.engine.tokenizer import write_tokenizer_json
from moelab.moe.base import ExpertWeights
from moelab.moe.modelopt import experts_from_checkpoint, experts_to_checkpoint, format_from_config, quantization_config

Progress = Callable[[int, int], None]  # (layers done, layers total)


class ModelLoadError(RuntimeError):
    """The model directory is missing something or holds something that does not fit config.json."""


def dense_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every non-expert tensor by HF name with its shape (lm_head included even when tied)."""
    H, D, V = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
                                     "lm_head.weight": (V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
              p + "self_attn.q_proj.weight": (cfg.num_attention_heads * D, H),
              p + "self_attn.k_proj.weight": (cfg.num_key_value_heads * D, H),
              p + "self_attn.v_proj.weight": (cfg.num_key_value_heads * D, H),
              p + "self_attn.o_proj.weight": (H, cfg.num_attention_heads * D),
              p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,),
              p + "mlp.gate.weight": (cfg.num_experts, H)}
    return s


def random_weights(cfg: ModelConfig, seed: int, dtype: torch.dtype, device: torch.device,
                   progress: Progress | None = None) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Seeded random weights: (dense {name: tensor}, per layer [w13 [E, 2I, H], w2 [E, H, I]]).

    Norms are ones, the embedding is N(0, 1), every projection N(0, 1/fan_in) so activations and
    logits keep unit scale; unembedding rows outside printable ASCII are shrunk (see below). The same seed on the same device type gives the same weights.
    """
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        fan_in = shape[-1]
        return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * fan_in ** -0.5).to(dtype)

    dense: dict[str, torch.Tensor] = {}
    for name, shape in dense_shapes(cfg).items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.endswith("norm.weight"):
            dense[name] = torch.ones(shape, dtype=dtype, device=device)
        elif name == "model.embed_tokens.weight":
            dense[name] = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
        else:
            dense[name] = randn(*shape)
    # Shrink the unembedding rows of every token but printable ASCII, so the random model mostly
    # writes readable characters instead of stray UTF-8 bytes (and rarely stops on EOS by chance).
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    keep = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=device)
    keep[32:127] = True
    keep[10] = True
    dense[head] = torch.where(keep[:, None], dense[head], dense[head] * 0.25)
    E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    experts = []
    for i in range(cfg.num_hidden_layers):
        experts.append([randn(E, 2 * I, H), randn(E, H, I)])
        if progress:
            progress(i + 1, cfg.num_hidden_layers)
    return dense, experts


def _own(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor with storage of its own: safetensors refuses slices of a shared buffer (the
    model's q/k/v weights are views of one fused qkv tensor)."""
    t = t.detach().contiguous().cpu()
    return t.clone() if t.untyped_storage().nbytes() != t.nbytes else t


def save_checkpoint(out: Path, cfg: ModelConfig, dense: Mapping[str, torch.Tensor], experts: list[ExpertWeights],
                    shard_bytes: int = 4 << 30) -> list[Path]:
    """Write config.json, tokenizer files and safetensors shards; returns every file written."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: _own(v) for k, v in dense.items() if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    for i, w in enumerate(experts):
        tensors |= experts_to_checkpoint(w, f"model.layers.{i}.mlp.experts")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k in sorted(tensors):
        if size and size + tensors[k].nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = tensors[k]
        size += tensors[k].nbytes
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{j + 1:05d}-of-{n:05d}.safetensors" for j in range(n)]
    for name, shard in zip(names, shards):
        save_file(shard, str(out / name), metadata={"format": "pt"})
    if n > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                 "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    hf = cfg.to_hf()
    fmt = experts[0].fmt if experts else "bf16"
    if fmt != "bf16":
        hf["quantization_config"] = quantization_config(fmt, getattr(experts[0], "block", None))
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    write_tokenizer_json(out)
    written = [out / name for name in names] + [out / "config.json", out / "tokenizer.json", out / "tokenizer_config.json"]
    if n > 1:
        written.append(out / "model.safetensors.index.json")
    return written


class _Tensors(Mapping):
    """Lazy {name: tensor} over every safetensors file of a directory."""

    def __init__(self, files: list[Path], device: str) -> None:
        from safetensors import safe_open

        self._where: dict[str, object] = {}
        for f in files:
            h = safe_open(str(f), framework="pt", device=device)
            for k in h.keys():
                self._where[k] = h

    def __getitem__(self, k: str) -> torch.Tensor:
        return self._where[k].get_tensor(k)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def read_config(model_dir: Path) -> tuple[ModelConfig, dict | None]:
    """(model config, quantization config or None) from config.json / hf_quant_config.json."""
    p = model_dir / "config.json"
    if not p.exists():
        raise ModelLoadError(f"{model_dir} has no config.json; a model directory needs config.json + *.safetensors")
    try:
        raw = json.loads(p.read_text())
        cfg = ModelConfig.from_hf(raw)
    except (ValueError, TypeError, KeyError) as e:
        raise ModelLoadError(f"{p} is not a usable Qwen3-MoE config: {e}") from None
    quant = raw.get("quantization_config")
    if quant is None and (model_dir / "hf_quant_config.json").exists():
        quant = json.loads((model_dir / "hf_quant_config.json").read_text())
    return cfg, quant


def load_checkpoint(model_dir: Path, dtype: torch.dtype, device: torch.device, progress: Progress | None = None
                    ) -> tuple[ModelConfig, dict[str, torch.Tensor], list[ExpertWeights]]:
    """Read a HF-style Qwen3-MoE directory. Raises ModelLoadError with one plain sentence."""
    from safetensors import SafetensorError

    cfg, quant = read_config(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} has config.json but no *.safetensors weight files")
    try:
        fmt = format_from_config(quant)
        t = _Tensors(files, "cpu")
        dense: dict[str, torch.Tensor] = {}
        for name, shape in dense_shapes(cfg).items():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            if name not in t:
                raise ModelLoadError(f"{model_dir} lacks tensor {name!r} (is it a Qwen3-MoE checkpoint?)")
            x = t[name]
            if tuple(x.shape) != shape:
                raise ModelLoadError(f"tensor {name!r} has shape {tuple(x.shape)}; config.json implies {shape}")
            dense[name] = _fresh(x, dtype, device)
        experts: list[ExpertWeights] = []
        for i in range(cfg.num_hidden_layers):
            w = experts_from_checkpoint(t, f"model.layers.{i}.mlp.experts", cfg.num_experts, quant)
            E, H, I = w.shape
            if (E, H, I) != (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size):
                raise ModelLoadError(f"layer {i} experts have (E, H, I) = {(E, H, I)}; config.json implies "
                                     f"{(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)}")
            experts.append(_to(w, dtype, device, fmt))
            if progress:
                progress(i + 1, cfg.num_hidden_layers)
    except ModelLoadError:
        raise
    except (KeyError, ValueError, OSError, RuntimeError, SafetensorError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ModelLoadError(f"cannot read the weights in {model_dir}: {msg}") from None
    return cfg, dense, experts


def _fresh(x: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`x` copied into an allocation of torch's own, never a view of the safetensors buffer.

    safetensors hands out CPU tensors at the file's data offsets, 8-byte aligned (torch's own
    allocations are 64-byte aligned). MKL's sgemm takes alignment-dependent code paths on CPUs
    where it does not use AVX-512 (AMD EPYC; `MKL_ENABLE_INSTRUCTIONS=SSE4_2` on Intel), and there
    a misaligned lm_head changed logprobs in the 7th digit against the same preset built in memory.
    A fresh copy makes a saved-and-loaded model compute bit for bit like the preset it came from.
    """
    return x.to(device=device, dtype=dtype, copy=True, memory_format=torch.contiguous_format)


def _to(w: ExpertWeights, dtype: torch.dtype, device: torch.device, fmt: str) -> ExpertWeights:
    """Move experts to the device; unquantized experts also take the model dtype."""
    from moelab.moe.bf16 import Bf16Experts

    if fmt == "bf16":
        return Bf16Experts(w.w13.to(device=device, dtype=dtype), w.w2.to(device=device, dtype=dtype))
    for k, v in vars(w).items():
        if isinstance(v, torch.Tensor):
            setattr(w, k, v.to(device))
    return w
