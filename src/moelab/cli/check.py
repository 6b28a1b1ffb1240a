"""`moelab check [--gpu sm_120 --gpu-memory 96GB --gpus 8] -- ENGINE COMMAND LINE`.

Says, before anything runs, what the engine's flag catalogue, the support matrix and the memory
forecast make of a command line, each with its source, and for each backend choice the curated
matrix, the installed source (`moelab audit`) and this machine's launches (--store) side by side,
launches winning where they disagree. Exit 1 when something will fail.
Without --gpu the hardware is this machine's (NVML), or `cpu` when it has no GPU.
"""
from __future__ import annotations

import re

import typer

from moelab.cli.app import app

_SIZE = re.compile(r"(?i)\s*([\d.]+)\s*(gib|gb|g|mib|mb|m|tib|tb|t)?\s*")


def parse_size(text: str) -> int:
    """'96GB' -> 96e9 bytes, '80GiB' -> 80 * 2**30; a bare number is GiB."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a memory size; write e.g. 96GB or 80GiB")
    unit = (m.group(2) or "gib").lower()
    mult = {"gib": 2**30, "g": 2**30, "gb": 10**9, "mib": 2**20, "m": 2**20, "mb": 10**6,
            "tib": 2**40, "t": 2**40, "tb": 10**12}[unit]
    return int(float(m.group(1)) * mult)


def _hardware(gpu: str | None, gpu_memory: str | None, gpus: int | None, host_memory: str | None):
    from moelab import hw
    from moelab.engines.check import Hardware

    host_limit = parse_size(host_memory) if host_memory else None
    if gpu or gpu_memory or gpus:
        if not (gpu and gpu_memory):
            raise ValueError("describe the target GPUs with both --gpu (e.g. sm_120) and --gpu-memory (e.g. 96GB)")
        if gpu != "cpu" and gpu not in hw.KNOWN_ARCHES:
            raise ValueError(f"--gpu {gpu!r} is not an NVIDIA architecture moelab knows; use one of "
                             f"{', '.join(hw.KNOWN_ARCHES)} (or cpu)")
        return Hardware(arch=gpu, gpu_memory=parse_size(gpu_memory), gpus=gpus or 1,
                        source="given on the command line", host_limit=host_limit)
    from moelab.engines.check import this_machine

    return this_machine(host_limit)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[OPTIONS] -- ENGINE COMMAND LINE")
def check(
    ctx: typer.Context,
    gpu: str = typer.Option(None, "--gpu", help="Target GPU arch, e.g. sm_120 (default: this machine's)."),
    gpu_memory: str = typer.Option(None, "--gpu-memory", help="Memory per GPU, e.g. 96GB or 80GiB."),
    gpus: int = typer.Option(None, "--gpus", help="Number of GPUs on the target machine."),
    host_memory: str = typer.Option(None, "--host-memory", help="Host RAM limit to check loading against."),
    store: str = typer.Option(None, "--store", help="Results store whose launches weigh in "
                                                    "(default: $MOELAB_STORE or ~/.cache/moelab/store.db)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Check an engine command line (after --) against flags, support matrix and memory forecast.

    Example: moelab check --gpu sm_120 --gpu-memory 96GB --gpus 8 -- python -m sglang.launch_server
    --model-path Qwen3.5-397B-A17B-NVFP4 --tp 8 --moe-runner-backend flashinfer_trtllm
    (vllm serve MODEL ... works the same way; without --gpu the GPUs are this machine's.)
    """
    from moelab.cli.output import emit_json, fail
    from moelab.engines.check import check_command, split_command

    argv = list(ctx.args)
    if not argv:
        fail("no engine command line given", "moelab check [--gpu sm_120 --gpu-memory 96GB --gpus 8] -- "
             "python -m sglang.launch_server --model-path M ...")
    try:
        engine, env, args = split_command(argv)
        hwd = _hardware(gpu, gpu_memory, gpus, host_memory)
    except ValueError as e:
        fail(str(e))
    rep = check_command(engine, args, hwd, env)
    from pathlib import Path

    from moelab.audit.knowledge import default_store, weigh
    from moelab.engines.check import decide

    rep.knowledge = weigh(rep, Path(store) if store else default_store())  # launches win over source and matrix
    rep.verdict = decide(rep)
    if json_out:
        emit_json(rep)
    else:
        _print(rep)
    raise typer.Exit(0 if rep.verdict.ok else 1)


def gib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _print(rep) -> None:
    from moelab.cli.output import console

    say = lambda t="": console.print(t, soft_wrap=True, markup=False, highlight=False)  # noqa: E731
    c, h = rep.catalogue, rep.hardware
    origin = {"bundled": "bundled with moelab; the engine is not installed here",
              "cache": "cached from the installed engine", "installed": "read from the installed engine"}[c["origin"]]
    say(f"engine    {rep.engine}; flags: {rep.engine} {c['version']} catalogue ({origin})")
    gpus = f"{h.gpus} x {h.arch}, {gib(h.gpu_memory)} each" if h.arch != "cpu" else "CPU only"
    say(f"hardware  {gpus} ({h.source})")
    say("flags     " + ("all known to this version" if not rep.flag_problems else "PROBLEMS"))
    for p in rep.flag_problems:
        say(f"  x {p.message[:300]}")
    for p in rep.parallel_problems:
        say(f"parallel  x {p}")
    from moelab.audit.render import knowledge_lines

    for line in knowledge_lines(rep.knowledge):
        say(line)
    for s in rep.support:
        mark = {"yes": "ok", "no": "x ", "caveat": "! ", "unknown": "? "}[s.status]
        say(f"support   {mark} {s.kind} {s.backend} on {s.arch} ({s.format})" + (f": {s.note}" if s.note else ""))
        if s.source:
            say(f"            source: {s.source}")
    if rep.model:
        m = rep.model
        say(f"model     {m.name}: {m.source}")
        say(f"          {m.num_experts} experts top-{m.experts_per_tok}, {m.attention_layers}/{m.num_layers} layers "
            f"with KV, weights {gib(m.weight_bytes)} ({m.quant_format}; {m.weight_bytes_source})")
    elif rep.model_error:
        say(f"model     ? {rep.model_error}")
    if rep.forecast:
        fc = rep.forecast
        if fc.gpu_memory is not None:
            say(f"memory    weights {gib(fc.weight_bytes_per_gpu)} per GPU, KV {fc.kv_bytes_per_token_per_gpu:,} B/token "
                f"per GPU ({fc.kv_bytes_per_token_total:,} B/token in all)")
            if fc.kv_tokens is not None:
                say(f"          KV cache room {gib(fc.kv_room_per_gpu)} per GPU -> {fc.kv_tokens:,} tokens at "
                    f"{fc.memory_fraction} ({fc.memory_fraction_source})")
        else:
            say(f"memory    weights {gib(fc.weight_bytes_per_gpu)} in host RAM, KV {fc.kv_bytes_per_token_total:,} B/token"
                f" -> {fc.kv_tokens:,} tokens in the CPU KV cache")
        for n in fc.notes:
            say(f"          note: {n}")
        say(f"          host RAM while loading about {gib(fc.host_ram_loading)}"
            + (f" (limit {gib(fc.host_limit)})" if fc.host_limit else ""))
        for p in fc.problems:
            say(f"  x {p}")
    v = rep.verdict
    say(f"verdict   {v.cause.value}" + (f": {v.advice}" if v.advice else ""))
