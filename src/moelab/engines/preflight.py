"""What moelab can tell about an engine command line before anything runs.

Three sources, each cited: the engine's flag catalogue (unknown flags and values), the support
matrix (backend x GPU arch x weight format), and the memory forecast (weights, KV cache, host
RAM). `check_command` is a pure function of the command line and the hardware description, so
the planner can prune with it; `moelab check` prints it.
"""
from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field

from moelab.audit.knowledge import Knowledge
from moelab.engines import ENGINES
from moelab.engines.flags import FlagProblem, parse_args
from moelab.engines.support import Support, check_flags, format_of, rows
from moelab.forecast import Forecast, ModelInfo, forecast, load_model
from moelab.spec import Cause, Evidence, Phase, Verdict

GiB = 2**30
# Per engine: canonical flag names the forecast reads (the engine's own words).
FLAGS = {
    "sglang": dict(tp="--tp-size", dp="--dp-size", ep="--ep-size", fraction="--mem-fraction-static",
                   kv="--kv-cache-dtype", ctx="--context-length", quant="--quantization", model="--model-path"),
    "vllm": dict(tp="--tensor-parallel-size", dp="--data-parallel-size", ep="--enable-expert-parallel",
                 fraction="--gpu-memory-utilization", kv="--kv-cache-dtype", ctx="--max-model-len",
                 quant="--quantization", model="--model"),
}


class Hardware(BaseModel):
    arch: str  # "sm_120", or "cpu" where there is no GPU
    gpu_memory: int | None = None  # bytes per GPU
    gpus: int = 0
    source: str  # "this machine (NVML)", "given on the command line", ...
    host_limit: int | None = None


class CheckReport(BaseModel):
    engine: str
    args: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    catalogue: dict
    hardware: Hardware
    flag_problems: list[FlagProblem] = Field(default_factory=list)
    support: list[Support] = Field(default_factory=list)
    model: ModelInfo | None = None
    model_error: str | None = None
    forecast: Forecast | None = None
    verdict: Verdict
    # curated matrix, installed source and this machine's launches per backend choice
    knowledge: list[Knowledge] = Field(default_factory=list)


def split_command(argv: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(engine, leading VAR=value environment, the engine's own arguments) from a command line."""
    env = {}
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        k, v = argv[0].split("=", 1)
        env[k], argv = v, argv[1:]
    if not argv:
        raise ValueError("no engine command line given after --")
    exe = Path(argv[0]).name
    if exe.startswith("python") and argv[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang", env, argv[3:]
    if exe == "sglang":
        return "sglang", env, argv[2:] if argv[1:2] == ["serve"] else argv[1:]
    if exe == "vllm":
        return "vllm", env, argv[2:] if argv[1:2] == ["serve"] else argv[1:]
    if exe.startswith("python") and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        return "vllm", env, argv[3:]
    raise ValueError(f"cannot tell the engine from {' '.join(argv[:3])!r}: expected `vllm serve ...` or "
                     "`python -m sglang.launch_server ...`")


def _num(v, cast=float):
    try:
        return cast(v) if isinstance(v, str) else None
    except ValueError:
        m = re.fullmatch(r"(\d+)([kKmM])", v)  # vLLM accepts --max-model-len 32k
        return cast(int(m.group(1)) * {"k": 1000, "m": 10**6}[m.group(2).lower()]) if m else None


def _kv_dtype(kv, dtype) -> str | None:
    """KV cache dtype: the flag, else ("auto") the model dtype, which matters only for float32."""
    if isinstance(kv, str) and kv != "auto":
        return kv
    return "float32" if dtype in ("float32", "float") else None


def alternatives(engine: str, kind: str, arch: str, fmt: str) -> list[str]:
    """Backends of the same kind the matrix says work on this arch for this format."""
    return [r.backend for r in rows() if (r.engine, r.kind) == (engine, kind) and arch in r.works
            and (fmt in r.formats or "any" in r.formats)]


def check_command(engine: str, args: list[str], hw: Hardware, env: dict[str, str] | None = None) -> CheckReport:
    env = env or {}
    adapter = ENGINES.create(engine)
    cat = adapter.flag_catalogue()
    parsed = parse_args(args, cat)
    f = FLAGS[engine]
    v = parsed.values
    rep = CheckReport(engine=engine, args=args, env=env, hardware=hw, flag_problems=parsed.problems,
                      catalogue={"origin": cat.origin, "version": cat.version, "source": cat.source},
                      verdict=Verdict(cause=Cause.ok, phase=Phase.preflight))
    model_arg = v.get(f["model"]) or (parsed.positionals[0] if engine == "vllm" and parsed.positionals else None)
    if isinstance(model_arg, str):
        try:
            rep.model = load_model(model_arg)
        except (FileNotFoundError, ValueError, KeyError) as e:
            rep.model_error = str(e)
    fmt = format_of(v.get(f["quant"]) if isinstance(v.get(f["quant"]), str) else None,
                    rep.model.quant_format if rep.model else None)
    rep.support = check_flags(engine, v, hw.arch, fmt)
    if hw.arch == "cpu" and engine == "sglang":
        rep.support.append(Support(status="no", engine=engine, kind="device", backend="cuda", arch="cpu", format=fmt,
                                   note="SGLang needs a CUDA GPU; none is visible (give --gpu/--gpu-memory/--gpus "
                                        "to check for another machine)", source="sglang install docs [gk]"))
    if rep.model:
        ep = v.get(f["ep"])
        kv_space = _num(env.get("VLLM_CPU_KVCACHE_SPACE"))
        rep.forecast = forecast(
            rep.model, engine=engine, tp=_num(v.get(f["tp"]), int) or 1, dp=_num(v.get(f["dp"]), int) or 1,
            ep=ep is True or (_num(ep, int) or 1) > 1, gpu_memory=hw.gpu_memory if hw.arch != "cpu" else None,
            n_gpus=hw.gpus, mem_fraction=_num(v.get(f["fraction"])), fraction_default=adapter.memory_fraction_default,
            fraction_flag=adapter.memory_fraction_flag, kv_dtype=_kv_dtype(v.get(f["kv"]), v.get("--dtype")),
            context_len=_num(v.get(f["ctx"]), int), host_limit=hw.host_limit,
            cpu_kv_bytes=int(kv_space * GiB) if kv_space else None)
    rep.verdict = _verdict(rep, fmt)
    return rep


def decide(rep: CheckReport) -> Verdict:
    """The report's verdict again, after its support entries changed (launches weighed in)."""
    return _verdict(rep, rep.verdict.detail.get("format", "bf16"))


def _verdict(rep: CheckReport, fmt: str) -> Verdict:
    ev, cause, advice = [], Cause.ok, []
    src = f"{rep.engine} {rep.catalogue['version']} flag catalogue ({rep.catalogue['origin']})"
    for p in rep.flag_problems:
        ev.append(Evidence(kind="flags", text=p.message, source=src))
    if rep.flag_problems:
        cause = Cause.bad_args
        advice.append("fix the flags above (nearest valid spellings are given)")
    for s in rep.support:
        if s.status in ("no", "caveat"):
            ev.append(Evidence(kind="support", source=s.source,
                               text=f"{s.kind} {s.backend} on {s.arch} ({s.format}): "
                                    f"{'not supported' if s.status == 'no' else 'caveat'}: {s.note}"))
        if s.status == "no":
            cause = cause if cause is not Cause.ok else Cause.unsupported_arch
            alt = alternatives(rep.engine, s.kind, s.arch, s.format)
            if alt:
                advice.append(f"on {s.arch} use one of: {', '.join(alt)} instead of {s.backend}")
    if rep.model_error:
        ev.append(Evidence(kind="model", text=rep.model_error))
        if rep.model_error.startswith(("/", ".", "~")) or "has no config.json" in rep.model_error \
                or re.match(r"model '[/.~]", rep.model_error):
            # A local path that is missing or not a model directory fails at load, every time.
            cause = cause if cause is not Cause.ok else Cause.model_load_error
            advice.append("point the model argument at a local directory with config.json + *.safetensors")
    fc = rep.forecast
    if fc and not fc.fits:
        for p in fc.problems:
            ev.append(Evidence(kind="forecast", text=p, source="moelab memory forecast"))
        if cause is Cause.ok:
            cause = Cause.host_oom if all("host RAM" in p for p in fc.problems) else Cause.gpu_oom
        if any("host RAM" in p for p in fc.problems):
            advice.append("give the launch more host RAM (--memory-limit) or shrink what loads into it"
                          + (" (VLLM_CPU_KVCACHE_SPACE)" if rep.hardware.arch == "cpu" else ""))
        if any("host RAM" not in p for p in fc.problems):
            advice.append("change parallelism, weight format or memory fraction until the forecast fits")
    return Verdict(cause=cause, phase=Phase.preflight, evidence=ev, advice="; ".join(advice),
                   detail={"format": fmt})
