"""`moelab serve`: the embedded OpenAI-compatible Qwen3-MoE engine (flags in SGLang's words).

Flag checks that fail print one argparse-style line, `moelab serve: error: argument --flag: ...`,
and exit 2 before anything heavy happens; a model that cannot be loaded exits 1 with one line.
With --json the same refusal is also one JSON document on stdout, `{"error": ..., "exit_code": 2}`.
torch and the engine are imported inside the command, so `moelab --help` stays light.
"""
from __future__ import annotations

import sys
from typing import Optional

import typer

from moelab.cli.app import app
from moelab.moe import RUNNERS  # names only; backends import torch when created


def _die(msg: str, code: int, json_out: bool = False) -> "typer.Exit":
    print(f"moelab serve: error: {msg}", file=sys.stderr, flush=True)
    if json_out:
        from moelab.cli.output import emit_json

        emit_json({"error": f"moelab serve: error: {msg}", "exit_code": code})
    return typer.Exit(code)


@app.command()
def serve(
    model_path: Optional[str] = typer.Option(None, "--model-path", help="Hugging Face style Qwen3-MoE directory (config.json + *.safetensors)."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A built-in model instead of a directory: tiny (seeded random, CPU, seconds), small (seeded random, Qwen3-30B-A3B layer shapes, 4 layers) or digits (trained: adds, sorts and reverses digits; `moelab eval --task digits`)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model id in /v1/models and responses."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback unless you say otherwise)."),
    port: int = typer.Option(30000, "--port", help="TCP port."),
    moe_runner_backend: str = typer.Option("auto", "--moe-runner-backend", help=f"auto or one of: {', '.join(RUNNERS.names())} (auto: triton on CUDA, else grouped)."),
    quantization: str = typer.Option("none", "--quantization", help="Expert weight format, quantized at load: none, fp8 or nvfp4."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    max_running_requests: int = typer.Option(64, "--max-running-requests", help="Sequences decoded together at most."),
    max_total_tokens: Optional[int] = typer.Option(None, "--max-total-tokens", help="KV cache capacity in tokens (default: max-running-requests x context)."),
    max_queued_requests: int = typer.Option(256, "--max-queued-requests", help="Waiting requests beyond which new ones get 503."),
    disable_cuda_graph: bool = typer.Option(False, "--disable-cuda-graph", help="Run decode steps eagerly instead of replaying CUDA graphs (CUDA only)."),
    cuda_graph_max_bs: Optional[int] = typer.Option(None, "--cuda-graph-max-bs", help="Largest decode batch captured in a CUDA graph (default: --max-running-requests)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Clients must send this key (Authorization: Bearer KEY) on every route but /health."),
    tp_size: Optional[int] = typer.Option(None, "--tp-size", "--tp", "--tensor-parallel-size", help="Ranks (processes; one GPU each on CUDA): attention heads split over them, experts too (default: --ep-size, else 1)."),
    ep_size: int = typer.Option(1, "--ep-size", "--ep", "--expert-parallel-size", help="Expert groups among the ranks: each holds whole experts instead of a slice of every expert; divides --tp-size."),
    dist_timeout: float = typer.Option(60.0, "--dist-timeout", help="Seconds a collective may wait for the other ranks before it fails (multi-rank)."),
    nccl_port: Optional[int] = typer.Option(None, "--nccl-port", help="Port of rank 0's rendezvous store (default: a free one)."),
    disable_custom_all_reduce: bool = typer.Option(False, "--disable-custom-all-reduce", help="All-reduce through torch.distributed (gloo) instead of moelab's socket all-reduce between CPU ranks; on CUDA it is NCCL either way."),
    seed: int = typer.Option(0, "--seed", help="Seed of the preset weights and of requests without their own seed."),
    save: Optional[str] = typer.Option(None, "--save", help="Write the model as a Hugging Face style directory here and exit (no serving)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout (startup summary when ready, or what --save wrote)."),
) -> None:
    """Serve a small Qwen3-MoE model over an OpenAI-compatible API (continuous batching)."""
    from moelab.engine.config import ConfigError, ServerConfig

    try:
        cfg = ServerConfig(model_path=model_path, preset=preset, served_model_name=served_model_name, host=host,
                           port=port, moe_runner_backend=moe_runner_backend, quantization=quantization, dtype=dtype,
                           device=device, max_running_requests=max_running_requests, max_total_tokens=max_total_tokens,
                           max_queued_requests=max_queued_requests, seed=seed, save=save,
                           disable_cuda_graph=disable_cuda_graph, cuda_graph_max_bs=cuda_graph_max_bs,
                           tp_size=tp_size, ep_size=ep_size, dist_timeout=dist_timeout, nccl_port=nccl_port,
                           disable_custom_all_reduce=disable_custom_all_reduce, api_key=api_key, backends=tuple(RUNNERS.names()))
    except ConfigError as e:
        raise _die(str(e), 2, json_out) from None
    run_server(cfg, json_out)


def run_server(cfg, json_out: bool) -> None:
    import asyncio

    from moelab.cli.output import emit_json
    from moelab.engine.build import build_engine
    from moelab.engine.checkpoint import ModelLoadError
    from moelab.engine.config import ConfigError

    try:
        engine, info = build_engine(cfg)
    except ConfigError as e:
        raise _die(str(e), 2, json_out) from None
    except ModelLoadError as e:
        raise _die(f"cannot load the model: {e}", 1, json_out) from None
    if cfg.save:
        if json_out:
            emit_json({"saved": cfg.save, "files": info["saved"], "model": info["model_config"]})
        else:
            shards = sum(1 for f in info["saved"] if f.endswith(".safetensors"))
            print(f"wrote {cfg.save}: {len(info['saved'])} files ({shards} safetensors shard(s), config.json, "
                  "tokenizer.json, tokenizer_config.json)")
        return
    from moelab.engine.server import serve as serve_http

    url = f"http://{cfg.host}:{cfg.port}"
    ready = (lambda: emit_json({"ready": True, "url": url, **info})) if json_out else None
    try:
        asyncio.run(serve_http(engine, cfg.model_name, info, cfg.host, cfg.port, on_ready=ready, api_key=cfg.api_key))
    except OSError as e:  # bind failures: port in use, address not available
        engine.stop()
        raise _die(f"cannot listen on {cfg.host}:{cfg.port}: {e}", 1, json_out) from None
    # Stopped on a signal: the listener is closed, the engine and its ranks are stopped and every
    # line is written. Leave without the interpreter's own teardown (about a second of freeing torch
    # and the KV cache on a 2-core CPU, at the end of every launch of a study).
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
