"""From a validated `ServerConfig` to a warmed-up `Engine`, logging each startup phase.

Phases (one flushed line each, `moelab.engine phase=<name> ...`): start, config, building_weights
or loading_weights (per layer), quantizing (per layer, when a format is asked for), warmup (on
CUDA also the MoE kernels at every launch config a step can pick), cuda_graph (captured sizes, or
why not); the server logs `ready` once it listens.

With --tp-size N every rank runs this same function on its part of the model (parallel/): rank 0
starts the others first, so they load side by side; each rank then joins the process groups, and
rank 0 drives the warm-up steps, which the others run as they arrive.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from moelab.engine.checkpoint import load_checkpoint, random_weights, read_config, save_checkpoint
from moelab.engine.config import PRESETS, ConfigError, ModelConfig, Resolved, ServerConfig, resolve
from moelab.engine.graphs import default_sizes
from moelab.engine.memory import rank_forecast
from moelab.engine.model import Qwen3Moe
from moelab.engine.parallel import faults
from moelab.engine.parallel import plan as P
from moelab.engine.parallel.group import backend_for, rank_device
from moelab.engine.parallel.layout import Parallelism
from moelab.engine.parallel.shard import shard_dense, shard_experts
from moelab.engine.runtime import Engine, phase
from moelab.engine.scheduler import SamplingParams, Scheduler, Sequence
from moelab.engine.tokenizer import load_tokenizer
from moelab.moe import RUNNERS, quantize_experts
from moelab.moe.base import ExpertWeights


def _progress(name: str):
    def report(i: int, n: int) -> None:
        phase(name, f"layer {i}/{n}")

    return report


def load_weights(cfg: ServerConfig, res: Resolved, model_cfg: ModelConfig, device: str = "", rank: int = 0
                 ) -> tuple[dict[str, torch.Tensor], list[ExpertWeights]]:
    """Dense tensors and per-layer experts in the resolved format, on `device` (default the
    resolved one): rank `rank`'s part of them (parallel/shard.py), quantized before they are cut
    so that every rank holds exactly the numbers of a one-rank launch."""
    dtype, device = getattr(torch, res.dtype), torch.device(device or res.device)
    par = cfg.parallelism
    if cfg.model_dir is None:
        phase("building_weights", f"preset={cfg.preset} seed={cfg.seed} layers={model_cfg.num_hidden_layers} "
              f"params={model_cfg.num_params / 1e6:.2f}M ({model_cfg.num_params * dtype.itemsize / 2**20:.1f} MiB)")
        faults.hit(rank, "building_weights")
        dense, raw = random_weights(model_cfg, cfg.seed, dtype, device, _progress("building_weights"))
    else:
        phase("loading_weights", f"path={cfg.model_dir} layers={model_cfg.num_hidden_layers}")
        faults.hit(rank, "loading_weights")
        _, dense, loaded = load_checkpoint(cfg.model_dir, dtype, device, _progress("loading_weights"))
        if all(w.fmt == res.weight_format for w in loaded):
            return shard_dense(dense, model_cfg, par, rank), [_shard(w, par, rank) for w in loaded]
        raw = [list(w.dequantize(dtype)) for w in loaded]
    if res.weight_format != "bf16":
        phase("quantizing", f"format={res.weight_format} layers={len(raw)}")
    experts = []
    for i, (w13, w2) in enumerate(raw):
        if res.weight_format == "bf16":
            experts.append(_shard(quantize_experts(w13, w2, "bf16", dtype=dtype), par, rank))
        else:
            experts.append(_shard(quantize_experts(w13, w2, res.weight_format), par, rank))
            phase("quantizing", f"layer {i + 1}/{len(raw)}")
        raw[i] = None  # free the dense copy as we go: the small preset's experts are GBs
    return shard_dense(dense, model_cfg, par, rank), experts


def _shard(w: ExpertWeights, par: Parallelism, rank: int) -> ExpertWeights:
    try:
        return shard_experts(w, par, rank)
    except ValueError as e:  # e.g. fp8 block scales that a slice would cut through
        raise ConfigError("--tp-size", f"the {w.fmt} experts cannot be split {par.moe_tp} ways: {e}") from None


def check_parallel(par: Parallelism, mc: ModelConfig, fmt: str) -> None:
    """Refuse a --tp-size / --ep-size this model cannot be split into (ConfigError, before any rank starts)."""
    granule = 16 if fmt == "nvfp4" else 1  # nvfp4 scales cover 16 inputs each
    problems = par.problems(mc.num_attention_heads, mc.num_key_value_heads, mc.num_experts,
                            mc.moe_intermediate_size, granule)
    if problems:
        flag = "--ep-size" if all("expert groups" in p for p in problems) else "--tp-size"
        raise ConfigError(flag, f"{'; '.join(problems)}: choose sizes that divide them")


def model_config(cfg: ServerConfig) -> tuple[ModelConfig, str]:
    """(model config, expert format the checkpoint stores) without loading any weights."""
    if cfg.model_dir is None:
        return PRESETS[cfg.preset], "bf16"
    from moelab.moe.modelopt import format_from_config

    mc, quant = read_config(cfg.model_dir)
    return mc, format_from_config(quant)


def build_engine(cfg: ServerConfig, link=None) -> tuple[Engine, dict[str, Any]]:
    """Resolve, load or build, quantize, warm up. Raises ConfigError / ModelLoadError.

    `link` is the rank's parallel.ranks.Follower on ranks 1..N-1 (they return before warming up:
    they run rank 0's steps from then on); on rank 0 of a multi-rank launch it is made here."""
    t0 = time.monotonic()
    # Flag combinations are judged before the first log line, so a refusal is one line only.
    mc, ckpt_fmt = model_config(cfg)
    res = resolve(cfg, ckpt_fmt)
    check_parallel(cfg.parallelism, mc, res.weight_format)
    if cfg.parallelism.ranks > 1 and link is None:
        from moelab.engine.parallel.ranks import Leader

        link = Leader(cfg)  # the other ranks start now and load while this one does
    try:
        return _build(cfg, mc, res, link, t0)
    except BaseException as e:
        if link is not None and link.rank == 0:
            link.abort(e)  # refusals end the other ranks and propagate; any other failure ends the launch
        raise


def _build(cfg: ServerConfig, mc: ModelConfig, res: Resolved, link, t0: float) -> tuple[Engine, dict[str, Any]]:
    par, rank = cfg.parallelism, (link.rank if link is not None else 0)
    device = rank_device(res.device, rank, par.ranks)
    phase("start", f"pid={os.getpid()} model={cfg.model_path or 'preset:' + str(cfg.preset)} torch={torch.__version__}")
    phase("config", f"device={res.device} dtype={res.dtype} format={res.weight_format} "
          f"moe_runner_backend={res.backend} ({res.backend_reason})")
    for note in res.notes:
        phase("config", f"note: {note}")
    if par.ranks > 1:
        phase("config", f"parallel: {par.describe()}; rank {rank} of {par.ranks} on {device}, collectives "
              f"{backend_for(device)} with --dist-timeout {cfg.dist_timeout:g}s")
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        phase("config", f"note: --host {cfg.host} serves beyond this machine's loopback; the API has no key (--api-key sets one)")
    torch.manual_seed(cfg.seed)
    if res.device == "cpu":
        # Small matrices gain nothing from intra-op threads and lose much to their barriers on a
        # busy machine; one thread per 512 hidden units, and a core stays free for the HTTP loop.
        threads = max(1, min(len(os.sched_getaffinity(0)) or 1, mc.hidden_size // 512))  # a packed study's share
        torch.set_num_threads(threads)
        phase("config", f"cpu threads={threads} on cpus {','.join(map(str, sorted(os.sched_getaffinity(0))))}")
    elif res.device.startswith("cuda"):
        # Every decode step has a new key length, and PyTorch's cuDNN attention builds a cuDNN graph
        # per new shape: measured on an H200 with the small preset, 26 ms of host time per
        # scaled_dot_product_attention call (~120 ms a step at 32 sequences, against ~2 ms of GPU
        # work). The flash / memory-efficient kernels take any shape without a per-shape build.
        torch.backends.cuda.enable_cudnn_sdp(False)
    if device.startswith("cuda") and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))  # torch refuses a bare "cuda" here (2.11 does)
    dense, experts = load_weights(cfg, res, mc, device, rank)
    tok = load_tokenizer(cfg.model_dir)
    tok.model_vocab_size = mc.vocab_size
    info: dict[str, Any] = {"model": cfg.model_name, "resolved": asdict(res), "model_config": asdict(mc),
                            "expert_bytes": sum(w.nbytes() for w in experts)}
    if cfg.save:
        phase("saving", f"path={cfg.save}")
        files = save_checkpoint(Path(cfg.save), mc, dense, experts)
        info["saved"] = [str(f) for f in files]
        return None, info  # type: ignore[return-value]
    held = sum(t.nbytes for t in dense.values()) + info["expert_bytes"]  # before the model aliases any
    model = Qwen3Moe(mc, dense, experts, RUNNERS.create(res.backend), par, rank)
    # what the decode attention and the KV cache really are (read back as the effective configuration)
    phase("config", f"attention={'triton' if model.kernels else 'torch_sdpa'} kv_cache_dtype={res.dtype}")
    capacity = cfg.max_total_tokens or cfg.max_running_requests * mc.max_position_embeddings
    engine = Engine(model, tok, Scheduler(cfg.max_running_requests, capacity, cfg.max_queued_requests), cfg.seed)
    kv_held = sum(k.nbytes + v.nbytes for k, v in engine.kv)
    fc = rank_forecast(cfg, mc, res.dtype, res.weight_format)
    info["memory"] = {"weight_bytes_this_rank": held, "kv_bytes_this_rank": kv_held,
                      "forecast_weight_bytes_per_rank": fc.weight_bytes_per_gpu,
                      "forecast_kv_bytes_per_token_per_rank": fc.kv_bytes_per_token_per_gpu}
    if link is not None:
        phase("config", f"rank {rank} holds query heads {_span(par.heads(rank, mc.num_attention_heads))}, KV heads "
              f"{_span(par.kv_heads(rank, mc.num_key_value_heads))}, experts {_span(par.experts(rank, mc.num_experts))}"
              f", intermediate {_span(par.intermediate(rank, mc.moe_intermediate_size))}: weights "
              f"{held / 2**20:.2f} MiB, KV cache {kv_held / 2**20:.2f} MiB on this rank (forecast "
              f"{fc.weight_bytes_per_gpu / 2**20:.2f} MiB, {fc.kv_bytes_per_token_per_gpu} B/token)")
        link.join(model, device)
        if rank == 0:
            phase("config", f"all-reduce: {link.groups.all_reduce_name}")
        info["parallel"] = {"tp": par.tp, "ep": par.ep, "backend": link.groups.backend,
                            "all_reduce": link.groups.all_reduce_name, "dist_timeout_s": cfg.dist_timeout}
        if rank > 0:
            return engine, info
        engine.ranks = link
        info["parallel"]["pids"] = link.pids
    phase("warmup", f"kv_cache_tokens={capacity} max_running_requests={cfg.max_running_requests}")
    faults.hit(rank, "warmup")
    warm(engine)
    if model.device.type == "cuda":
        t1 = time.monotonic()
        # the largest step: a full prefill budget, or one prompt as long as the context
        most = max(engine.sched.max_prefill_tokens, mc.max_position_embeddings)
        if link is not None:  # every rank compiles its own kernels, then they wait for each other
            link.send(P.Command(P.Kind.WARM_MOE, arg=most))
        counts = model.warm_moe(most)
        if link is not None:
            link.barrier("moe_warm")
        phase("warmup", f"MoE runner at {len(counts)} token counts ({','.join(map(str, counts))}) "
              f"in {time.monotonic() - t1:.1f}s")
        if link is not None:  # graphs hold all-reduces: every rank captures them together
            link.send(P.Command(P.Kind.CAPTURE))
    info["cuda_graph_batch_sizes"] = capture_graphs(cfg, engine)
    info.update(kv_cache_tokens=capacity, startup_s=round(time.monotonic() - t0, 2))
    return engine, info


def capture_graphs(cfg: ServerConfig, engine: Engine) -> list[int]:
    """Capture the decode step in CUDA graphs where every kernel allows it; the sizes captured."""
    model = engine.model
    if model.device.type != "cuda":
        phase("cuda_graph", f"off: CUDA graphs need a CUDA device, this is {model.device.type}")
        return []
    why = ("--disable-cuda-graph" if cfg.disable_cuda_graph
           else "the Triton decode attention cannot run (no triton, or a head size it does not take)"
           if not model.kernels
           else f"the {model.runner.name} MoE runner synchronises with the host (use --moe-runner-backend triton)"
           if not model.runner.graph_safe
           else "expert parallelism counts each rank's (token, expert) pairs on the host (--ep-size)"
           if model.first_expert is not None else None)
    if why:
        phase("cuda_graph", f"off: {why}")
        return []
    sizes = default_sizes(min(cfg.cuda_graph_max_bs or cfg.max_running_requests, cfg.max_running_requests))
    t0 = time.monotonic()
    try:
        engine.capture_graphs(sizes)
    except Exception as e:  # SGLang's words, so that diagnose's rule and its advice apply here too
        print(f"moelab.engine error: Capture cuda graph failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    phase("cuda_graph", f"captured decode batch sizes {','.join(map(str, sizes))} in {time.monotonic() - t0:.1f}s")
    return sizes


def _span(r: range) -> str:
    return f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start)


def warm(engine: Engine) -> None:
    """Run two short greedy sequences through prefill and a batched decode, then forget them."""
    for n in (5, 9):  # one at a time into the queue, so even --max-queued-requests 1 warms up
        engine.submit(Sequence(f"warmup-{n}", list(range(1, n + 1)), SamplingParams(max_tokens=3, temperature=0.0)))
        engine.step()
    while engine.step():
        pass
    for k in engine.stats:
        engine.stats[k] = 0 if k != "error" else None
    engine.batch_hist.clear()
