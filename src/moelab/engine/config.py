"""The embedded engine's configuration: the model (Hugging Face Qwen3-MoE field names) and the server.

One `ServerConfig` flows from `moelab serve`'s flags to the engine; it is validated once, at
construction, and raises `ConfigError(flag, message)` so the CLI can print the argparse-style line
`moelab serve: error: argument --flag: message` and exit 2. `auto` values (device, dtype, MoE runner
backend) are resolved in exactly one logged function, `resolve()`. This module imports torch only
inside `resolve()`, so validating flags stays cheap.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab.engine.parallel.layout import Parallelism

log = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "fp8", "nvfp4")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A flag value that cannot work; `flag` names it, the message says what would work."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"argument {flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class ModelConfig:
    """Qwen3-MoE hyper-parameters, spelled as in the Hugging Face config.json."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    intermediate_size: int = 0  # dense MLP size; unused (every layer is MoE) but HF expects it
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    torch_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in 1..{self.num_experts}")

    @property
    def eos_ids(self) -> tuple[int, ...]:
        e = self.eos_token_id
        return () if e is None else tuple(e) if isinstance(e, (list, tuple)) else (e,)

    @property
    def num_params(self) -> int:
        """Parameter count (experts included; lm_head counted unless tied)."""
        H, D, V, I = self.hidden_size, self.head_dim, self.vocab_size, self.moe_intermediate_size
        attn = H * D * (2 * self.num_attention_heads + 2 * self.num_key_value_heads) + 2 * D + 2 * H
        moe = self.num_experts * (3 * H * I + H)
        return self.num_hidden_layers * (attn + moe) + V * H * (1 if self.tie_word_embeddings else 2) + H

    def to_hf(self) -> dict[str, Any]:
        """config.json body that HF transformers' Qwen3MoeForCausalLM reads."""
        d = dataclasses.asdict(self)
        d.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_act="silu",
                 attention_bias=False, attention_dropout=0.0, decoder_sparse_step=1, mlp_only_layers=[],
                 output_router_logits=False, router_aux_loss_coef=0.001, use_sliding_window=False,
                 sliding_window=None, initializer_range=0.02, use_cache=True, rope_scaling=None)
        return d

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "ModelConfig":
        if d.get("model_type") not in (None, "qwen3_moe"):
            raise ValueError(f"model_type is {d.get('model_type')!r}; the embedded engine runs qwen3_moe only")
        if d.get("mlp_only_layers") or d.get("decoder_sparse_step", 1) != 1:
            raise ValueError("dense (mlp_only_layers / decoder_sparse_step) layers are not supported")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "head_dim" not in kw:
            kw["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in kw and f.default is dataclasses.MISSING]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        return cls(**kw)


# Byte-level tokenizer ids: 0..255 are bytes, then the three Qwen chat specials (see tokenizer.py).
_BYTE_VOCAB = 259
_EOS = [256, 258]  # <|endoftext|>, <|im_end|>

PRESETS: dict[str, ModelConfig] = {
    # Seconds on a 2-core CPU: every code path of the real architecture, at toy size.
    "tiny": ModelConfig(vocab_size=_BYTE_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=32, intermediate_size=128, max_position_embeddings=512,
                        rope_theta=10_000.0, bos_token_id=None, eos_token_id=_EOS, torch_dtype="float32"),
    # Qwen3-30B-A3B layer shapes with 4 layers: for GPU kernel and serving work.
    "small": ModelConfig(vocab_size=151936, hidden_size=2048, num_hidden_layers=4, num_attention_heads=32,
                         num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                         moe_intermediate_size=768, intermediate_size=6144, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=_EOS, torch_dtype="bfloat16"),
}

# Trained presets: Hugging Face style directories shipped in the package, loaded like --model-path.
# digits: adds, sorts and reverses digits (scripts/train_preset.py; `moelab eval --task digits`).
TRAINED_PRESETS: dict[str, Path] = {"digits": Path(__file__).resolve().parent / "presets" / "digits"}
PRESET_NAMES = (*PRESETS, *TRAINED_PRESETS)


@dataclass(frozen=True)
class ServerConfig:
    """Everything `moelab serve` was told, validated at construction (flag names as SGLang spells them)."""

    model_path: str | None = None
    preset: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    moe_runner_backend: str = "auto"
    quantization: str = "none"
    dtype: str = "auto"
    device: str = "auto"
    max_running_requests: int = 32
    max_total_tokens: int | None = None  # KV cache capacity in tokens; default: enough for every slot
    max_queued_requests: int = 256
    seed: int = 0
    save: str | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None  # largest decode batch replayed from a graph; default max_running
    api_key: str | None = field(default=None, repr=False)  # clients must send it as a bearer token
    tp_size: int | None = None  # ranks; default: --ep-size (1 when neither is given)
    ep_size: int = 1  # expert groups among the ranks (whole experts per group)
    dist_timeout: float = 60.0  # seconds any collective may wait before it fails
    nccl_port: int | None = None  # rank 0's rendezvous port (default: a free one)
    disable_custom_all_reduce: bool = False  # CPU ranks: gloo's all-reduce instead of moelab's (parallel/star.py)
    backends: tuple[str, ...] = field(default=("reference", "grouped"), compare=False)

    def __post_init__(self) -> None:
        if (self.model_path is None) == (self.preset is None):
            raise ConfigError("--model-path", "give exactly one of --model-path DIR or --preset "
                              f"{{{','.join(PRESET_NAMES)}}}")
        if self.preset is not None and self.preset not in PRESET_NAMES:
            raise ConfigError("--preset", f"invalid choice: {self.preset!r} (choose from {', '.join(PRESET_NAMES)})")
        if self.model_path is not None and not Path(self.model_path).is_dir():
            raise ConfigError("--model-path", f"{self.model_path!r} is not a directory; give a Hugging Face "
                              "style directory (config.json + *.safetensors) or use --preset tiny")
        for flag, value, choices in (("--moe-runner-backend", self.moe_runner_backend, ("auto", *self.backends)),
                                     ("--quantization", self.quantization, QUANTIZATIONS),
                                     ("--dtype", self.dtype, DTYPES), ("--device", self.device, DEVICES)):
            if value not in choices:
                raise ConfigError(flag, f"invalid choice: {value!r} (choose from {', '.join(choices)})")
        if not 0 < self.port < 65536:
            raise ConfigError("--port", f"{self.port} is not a TCP port (1..65535)")
        for flag, value in (("--max-running-requests", self.max_running_requests),
                            ("--max-queued-requests", self.max_queued_requests)):
            if value < 1:
                raise ConfigError(flag, f"must be at least 1, got {value}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ConfigError("--cuda-graph-max-bs", f"must be at least 1, got {self.cuda_graph_max_bs}")
        if self.max_total_tokens is not None and self.max_total_tokens < 16:
            raise ConfigError("--max-total-tokens", f"must be at least 16, got {self.max_total_tokens}")
        for flag, value in (("--tp-size", self.tp_size), ("--ep-size", self.ep_size)):
            if value is not None and value < 1:
                raise ConfigError(flag, f"must be at least 1, got {value}")
        if self.tp_size is not None and self.tp_size % self.ep_size:
            raise ConfigError("--ep-size", f"{self.ep_size} must divide --tp-size {self.tp_size} (the ranks form "
                              "--ep-size groups of whole experts)")
        if self.dist_timeout < 2:
            raise ConfigError("--dist-timeout", f"must be at least 2 seconds (rank 0 sends a heartbeat every "
                              f"0.5 s), got {self.dist_timeout:g}")
        if self.nccl_port is not None and not 0 < self.nccl_port < 65536:
            raise ConfigError("--nccl-port", f"{self.nccl_port} is not a TCP port (1..65535)")
        if self.save and self.parallelism.ranks > 1:
            raise ConfigError("--save", "writes the whole model from one process; leave --tp-size/--ep-size out")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return f"moelab-{self.preset}" if self.preset else Path(self.model_path).resolve().name

    @property
    def parallelism(self) -> Parallelism:
        """Ranks and expert groups; --ep-size alone also sets the rank count."""
        return Parallelism(tp=self.tp_size or self.ep_size, ep=self.ep_size)

    @property
    def model_dir(self) -> Path | None:
        """Where the weights load from: --model-path, a trained preset's shipped directory, or None
        for a seeded random preset."""
        return Path(self.model_path) if self.model_path else TRAINED_PRESETS.get(self.preset or "")

    @property
    def weight_format(self) -> str:
        """The MoE runner's name for the requested expert format (none -> bf16, i.e. unquantized)."""
        from moelab.formats import of_launch

        return of_launch(self.quantization)


@dataclass(frozen=True)
class Resolved:
    """What `auto` became on this machine, and why."""

    device: str  # "cpu" | "cuda" | "cuda:N"
    dtype: str  # torch dtype name
    backend: str
    backend_reason: str
    weight_format: str
    notes: tuple[str, ...] = ()


def resolve(cfg: ServerConfig, checkpoint_format: str = "bf16") -> Resolved:
    """Resolve device, dtype, weight format and MoE runner backend; the only place `auto` is decided.

    `checkpoint_format` is the expert format a loaded checkpoint is stored in (bf16 = unquantized).
    Raises ConfigError for a combination that cannot run here.
    """
    import torch

    from moelab.moe import resolve_runner

    has_cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not has_cuda:
        raise ConfigError("--device", "'cuda' needs a CUDA GPU and this machine has none "
                          "(torch.cuda.is_available() is False); use --device cpu or auto")
    device = "cuda" if cfg.device == "auto" and has_cuda else ("cpu" if cfg.device == "auto" else cfg.device)
    ranks = cfg.parallelism.ranks
    if device == "cuda" and ranks > torch.cuda.device_count():
        raise ConfigError("--tp-size", f"{ranks} ranks need {ranks} GPUs (one each) and {torch.cuda.device_count()} "
                          "are visible; lower --tp-size or set CUDA_VISIBLE_DEVICES")
    # float32 on CPU keeps greedy decoding independent of batch composition; bf16 on GPU.
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    notes: list[str] = []
    fmt = cfg.weight_format
    if checkpoint_format != "bf16":
        if fmt not in ("bf16", checkpoint_format):
            raise ConfigError("--quantization", f"{cfg.quantization!r} cannot apply: the checkpoint is already "
                              f"{checkpoint_format}; use --quantization {checkpoint_format} or none")
        fmt = checkpoint_format
    try:
        backend, reason = resolve_runner(cfg.moe_runner_backend, torch.device(device), fmt)
    except ValueError as e:  # the message already names the flag; say it once, argparse style
        msg = str(e).replace(f"--moe-runner-backend {cfg.moe_runner_backend} ", f"{cfg.moe_runner_backend!r} ", 1)
        raise ConfigError("--moe-runner-backend", msg) from None
    if fmt != "bf16" and backend != "triton":
        notes.append(f"{fmt} experts have no fused kernel on the {backend} backend here: "
                     f"they run dequantized to {dtype} on the fly (correct, not fast)")
    log.info("resolved device=%s dtype=%s format=%s backend=%s (%s)", device, dtype, fmt, backend, reason)
    return Resolved(device=device, dtype=dtype, backend=backend, backend_reason=reason,
                    weight_format=fmt, notes=tuple(notes))
