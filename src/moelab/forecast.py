"""Memory forecast before launch: will the weights and a KV cache fit on these GPUs, and the host?

Reads a model directory without loading a tensor: config.json (text fields may be nested under
`text_config`), the quantization config (hf_quant_config.json or config.json's
`quantization_config`), and each *.safetensors header (8-byte little-endian length + JSON, parsed
here). A model name that is not a local path falls back to a bundled config of a well-known model
(engines/known_models.yaml), and the forecast says so. Pure arithmetic otherwise.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

KNOWN = Path(__file__).parent / "engines" / "known_models.yaml"
# Bytes per weight element by format. NVFP4: 4-bit values + one e4m3 scale per 16 (notes §5).
BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0 + 1 / 128, "mxfp8": 1.0 + 1 / 32,
         "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "int4": 0.5 + 1 / 64, "int8": 1.0 + 1 / 128,
         "unknown": 2.0}  # unknown: quantized to a width the config does not state; sized as bf16 (an upper bound)
_EXPERT = re.compile(r"\.experts\.(\d+\.|w13|w2|gate_up|down)")  # routed experts (not shared_expert)
GiB = 2**30
# Host RAM per engine process (python + torch + engine imports). Calibrated on vLLM CPU, whose 3
# processes peaked at 2,665 MiB with a 9 MB model and 1 GiB KV, 8,004 MiB with 6 GiB KV
# (research/feasibility-vllm-cpu.md §3): 3 x 0.55 GiB + KV. A GPU rank adds a CUDA context [gk].
PROCESS_RAM = 0.55 * GiB
CUDA_CONTEXT_RAM = 1.0 * GiB


class ModelInfo(BaseModel):
    name: str
    source: str  # "local directory", or where a bundled config comes from
    model_type: str = ""
    hidden_size: int
    num_layers: int
    attention_layers: int  # layers with a KV cache (hybrid models: only full attention)
    num_kv_heads: int
    num_attention_heads: int = 0
    head_dim: int
    moe_intermediate_size: int = 0  # per expert
    num_experts: int = 0
    experts_per_tok: int = 0
    max_position: int | None = None
    quant_format: str = "bf16"  # format of the routed experts
    quant_source: str = "none"
    weight_bytes: int
    expert_bytes: int
    weight_bytes_source: str  # "safetensors headers" or "estimated from config"
    largest_file: int = 0


def _merged_config(raw: dict) -> dict:
    text = raw.get("text_config") or {}
    return {**raw, **text}  # Qwen3.5 and VL models nest the language model's fields


def _quant(raw: dict, model_dir: Path | None) -> tuple[str, str]:
    """(format, where it was found) from hf_quant_config.json or quantization_config."""
    from moelab.formats import of_checkpoint

    q, where = raw.get("quantization_config"), "config.json quantization_config"
    if model_dir and (model_dir / "hf_quant_config.json").exists():
        q = json.loads((model_dir / "hf_quant_config.json").read_text())
        where = "hf_quant_config.json"
    return (of_checkpoint(q), where) if q else ("bf16", "none")


def read_safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file: {name: {dtype, shape, data_offsets}}."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 * 2**20:
            raise ValueError(f"{path}: header length {n} is implausible; the file is corrupt")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def _estimate_bytes(c: dict, fmt: str) -> tuple[int, int]:
    """(total, routed-expert) bytes from config fields when there are no weight files."""
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    expert_params = layers * c.get("num_experts", 0) * 3 * h * c.get("moe_intermediate_size", 0)
    if c.get("total_params"):
        rest = c["total_params"] - expert_params
    else:  # attention + shared expert + embeddings; every layer counted as full attention
        hd = c.get("head_dim") or h // c["num_attention_heads"]
        attn = h * hd * (2 * c["num_attention_heads"] + 2 * c.get("num_key_value_heads", c["num_attention_heads"]))
        shared = 3 * h * c.get("shared_expert_intermediate_size", 0)
        rest = layers * (attn + shared) + 2 * c.get("vocab_size", 0) * h
    expert = int(expert_params * BYTES[fmt])
    return expert + int(rest * BYTES["bf16"]), expert


def _attention_layers(c: dict) -> int:
    if c.get("layer_types"):
        return sum(1 for t in c["layer_types"] if "full" in t or t == "attention")
    if c.get("full_attention_interval"):
        return c["num_hidden_layers"] // c["full_attention_interval"]
    return c["num_hidden_layers"]


def _info(name: str, source: str, raw: dict, model_dir: Path | None) -> ModelInfo:
    c = _merged_config(raw)
    fmt, qsrc = _quant(raw, model_dir)
    files = sorted(model_dir.glob("*.safetensors")) if model_dir else []
    if files:
        total = expert = largest = 0
        for f in files:
            for tname, t in read_safetensors_header(f).items():
                size = t["data_offsets"][1] - t["data_offsets"][0]
                total += size
                expert += size if _EXPERT.search(tname) else 0
            largest = max(largest, f.stat().st_size)
        wsrc = f"safetensors headers ({len(files)} files)"
    else:
        total, expert = _estimate_bytes(c, fmt)
        largest, wsrc = 0, "estimated from config (experts in " + fmt + ", the rest bf16)"
    return ModelInfo(
        name=name, source=source, model_type=str(c.get("model_type", "")), hidden_size=c["hidden_size"],
        num_layers=c["num_hidden_layers"], attention_layers=_attention_layers(c),
        num_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        num_attention_heads=c["num_attention_heads"], moe_intermediate_size=c.get("moe_intermediate_size") or 0,
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        num_experts=c.get("num_experts") or c.get("num_local_experts") or 0,
        experts_per_tok=c.get("num_experts_per_tok", 0), max_position=c.get("max_position_embeddings"),
        quant_format=fmt, quant_source=qsrc, weight_bytes=total, expert_bytes=expert,
        weight_bytes_source=wsrc, largest_file=largest)


def known_models() -> dict[str, dict]:
    return yaml.safe_load(KNOWN.read_text())


def load_model(path_or_name: str) -> ModelInfo:
    """ModelInfo from a local directory, else from a bundled config of a well-known model name."""
    p = Path(path_or_name).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.exists():
            raise FileNotFoundError(f"{p} has no config.json: not a Hugging Face style model directory")
        return _info(p.name, "local directory", json.loads(cfg.read_text()), p)
    base = path_or_name.rstrip("/").split("/")[-1]
    fmt = next((f for f in ("nvfp4", "fp8", "mxfp4") if base.lower().endswith("-" + f)), None)
    stem = base[: -len(fmt) - 1] if fmt else base
    known = known_models()
    if stem not in known:
        raise FileNotFoundError(f"model {path_or_name!r} is not a local directory and not a well-known model "
                                f"name; known: {', '.join(known)}")
    raw = dict(known[stem])
    src = raw.pop("source")
    if fmt:
        raw["quantization_config"] = {"quant_algo": fmt.upper()}
    info = _info(base, f"bundled config for {stem} (not found locally; {src})", raw, None)
    if fmt:
        info.quant_source = f"model name suffix -{fmt.upper()}"
    return info


class Forecast(BaseModel):
    fits: bool
    problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    weight_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_token_total: int
    memory_fraction: float
    memory_fraction_source: str
    gpu_memory: int | None
    kv_room_per_gpu: int | None = None
    kv_tokens: int | None = None
    host_ram_loading: int
    host_limit: int | None = None


def kv_dtype_bytes(kv_dtype: str | None) -> float:
    if kv_dtype and ("fp8" in kv_dtype or "int8" in kv_dtype):
        return 1.0
    if kv_dtype and "fp4" in kv_dtype:
        return BYTES["nvfp4"]
    return 4.0 if kv_dtype in ("float32", "fp32") else 2.0


def forecast(m: ModelInfo, *, engine: str, tp: int = 1, dp: int = 1, ep: bool = False,
             gpu_memory: int | None = None, n_gpus: int | None = None, mem_fraction: float | None = None,
             fraction_default: float = 0.9, fraction_flag: str = "--mem-fraction-static",
             kv_dtype: str | None = None, context_len: int | None = None,
             host_limit: int | None = None, cpu_kv_bytes: int | None = None,
             dense_bytes_per_rank: int | None = None, dtype_bytes: float | None = None,
             refuses_short_kv: bool = False) -> Forecast:
    """Per-GPU weights, KV bytes per token and tokens that fit, host RAM while loading.

    Experts are split over tp (or tp*dp with expert parallelism); everything else over tp, unless
    the engine says what each rank holds of it (`dense_bytes_per_rank`: the embedded engine keeps
    its embeddings, norms, router and LM head whole on every rank).
    gpu_memory None means CPU serving (vLLM's CPU build): weights and KV live in host RAM.
    `dtype_bytes` (4 for --dtype float32) is the width the engine casts unquantized weights to;
    None keeps the checkpoint's 16-bit width.
    """
    problems, notes = [], []
    ranks = tp * dp
    if n_gpus is not None and gpu_memory is not None and ranks > n_gpus:
        problems.append(f"needs tp x dp = {ranks} GPUs, only {n_gpus} given")
    widen = dtype_bytes / 2.0 if dtype_bytes else 1.0  # checkpoints store unquantized tensors in 16 bits
    expert_bytes = m.expert_bytes * (widen if m.quant_format == "bf16" else 1.0)
    dense_total = (m.weight_bytes - m.expert_bytes) * widen
    if widen != 1.0:
        notes.append(f"unquantized weights cast to {dtype_bytes:g} bytes per value (--dtype)")
    dense = dense_total / tp if dense_bytes_per_rank is None else dense_bytes_per_rank
    w = int(dense + expert_bytes / (ranks if ep else tp))
    b = kv_dtype_bytes(kv_dtype)
    kv_total = int(2 * m.attention_layers * m.num_kv_heads * m.head_dim * b)
    heads_per_gpu = max(1, -(-m.num_kv_heads // tp))  # KV heads are replicated once tp > n_kv
    kv_gpu = int(2 * m.attention_layers * heads_per_gpu * m.head_dim * b)
    frac = mem_fraction if mem_fraction is not None else fraction_default
    fsrc = fraction_flag if mem_fraction is not None else f"{fraction_flag} not given; {engine} default {frac} assumed"
    ctx = context_len or m.max_position
    if m.attention_layers < m.num_layers:
        notes.append(f"hybrid model: KV only for {m.attention_layers} of {m.num_layers} layers; the per-request "
                     "linear-attention (DeltaNet/Mamba) state is not included")
    f = Forecast(fits=True, weight_bytes_per_gpu=w, kv_bytes_per_token_per_gpu=kv_gpu,
                 kv_bytes_per_token_total=kv_total, memory_fraction=frac, memory_fraction_source=fsrc,
                 gpu_memory=gpu_memory, host_limit=host_limit, host_ram_loading=0)
    if gpu_memory is not None:
        budget = frac * gpu_memory
        if w > gpu_memory:
            problems.append(f"weights need {w / GiB:.1f} GiB per GPU but a GPU has {gpu_memory / GiB:.1f} GiB: "
                            f"use more GPUs (tensor/expert parallelism) or a smaller weight format")
        elif w >= budget:
            problems.append(f"weights need {w / GiB:.1f} GiB per GPU, {fraction_flag} {frac} allows "
                            f"{budget / GiB:.1f} GiB of {gpu_memory / GiB:.1f} GiB: no room for the KV cache")
        else:
            f.kv_room_per_gpu = int(budget - w)
            f.kv_tokens = f.kv_room_per_gpu // max(kv_gpu, 1)
            if ctx and f.kv_tokens < ctx:
                msg = (f"KV cache room {f.kv_room_per_gpu / GiB:.1f} GiB per GPU holds {f.kv_tokens:,} tokens, "
                       f"less than one {ctx:,}-token sequence")
                # an engine that refuses to start when one max-length sequence does not fit (vLLM)
                # fails here; the others cap the context
                (problems if refuses_short_kv else notes).append(msg)
        f.host_ram_loading = int(ranks * (PROCESS_RAM + CUDA_CONTEXT_RAM + m.largest_file) + PROCESS_RAM)
        notes.append("host RAM while loading: per rank one process + CUDA context + one staged shard")
    else:
        kv = cpu_kv_bytes if cpu_kv_bytes is not None else 4 * GiB
        f.kv_room_per_gpu, f.kv_tokens = None, kv // max(kv_total, 1)
        f.host_ram_loading = int(m.weight_bytes + kv + 3 * PROCESS_RAM)
        notes.append(f"CPU serving: weights + {kv / GiB:.1f} GiB KV (VLLM_CPU_KVCACHE_SPACE) + 3 processes in host RAM")
    if host_limit is not None and f.host_ram_loading > host_limit:
        problems.append(f"host RAM needed while loading is about {f.host_ram_loading / GiB:.1f} GiB, "
                        f"the memory limit is {host_limit / GiB:.1f} GiB")
    f.problems, f.notes, f.fits = problems, notes, not problems
    return f
