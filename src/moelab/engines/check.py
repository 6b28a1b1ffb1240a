"""What moelab can tell about an engine command line before anything runs.

Three sources, each cited: the engine's flag catalogue (unknown flags and values), the support
matrix (backend x GPU arch x weight format), and the memory forecast (weights, KV cache, host
RAM). `check_command` is a pure function of the command line and the hardware description, so
the planner can prune with it; `moelab check` prints it.
"""
from __future__ import annotations

import re
from functools import lru_cache

from pydantic import BaseModel, Field

from moelab.audit.knowledge import Knowledge
from moelab.engines import ENGINES
from moelab.engines.flags import FlagProblem, parse_args
from moelab.engines.support import Support, check_flags, rows
from moelab.formats import of_launch
from moelab.forecast import Forecast, ModelInfo, forecast, load_model
from moelab.spec import Cause, Evidence, Phase, Verdict

GiB = 2**30


class Hardware(BaseModel):
    arch: str  # "sm_120", or "cpu" where there is no GPU
    gpu_memory: int | None = None  # bytes per GPU
    gpus: int = 0
    source: str  # "this machine (NVML)", "given on the command line", ...
    host_limit: int | None = None


@lru_cache(maxsize=1)
def this_machine(host_limit: int | None = None) -> Hardware:
    """This machine as `moelab check` sees it: the first GPU's arch, the smallest GPU memory, the
    GPU count (NVML), the host memory limit (cgroup, else free RAM); `cpu` without a GPU."""
    from moelab import hw

    found, h = hw.gpus(), hw.host()
    limit = host_limit or h.cgroup_memory_limit or h.ram_available
    if not found:
        return Hardware(arch="cpu", source=f"this machine: no GPU ({hw.nvml_status()})", host_limit=limit)
    return Hardware(arch=found[0].sm, gpu_memory=min(g.memory_total for g in found), gpus=len(found),
                    source=f"this machine (NVML): {len(found)} x {found[0].name}", host_limit=limit)


class CheckReport(BaseModel):
    engine: str
    args: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    catalogue: dict
    hardware: Hardware
    flag_problems: list[FlagProblem] = Field(default_factory=list)
    # the model's shape against the parallel sizes, and sizes that need more GPUs than given
    parallel_problems: list[str] = Field(default_factory=list)
    support: list[Support] = Field(default_factory=list)
    model: ModelInfo | None = None
    model_error: str | None = None
    forecast: Forecast | None = None
    verdict: Verdict
    # curated matrix, installed source and this machine's launches per backend choice
    knowledge: list[Knowledge] = Field(default_factory=list)


def split_command(argv: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(engine, leading VAR=value environment, the engine's own arguments) from a command line;
    each adapter recognises its own command line."""
    env = {}
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        k, v = argv[0].split("=", 1)
        env[k], argv = v, argv[1:]
    if not argv:
        raise ValueError("no engine command line given after --")
    for name in ENGINES.names():
        args = ENGINES.create(name).split(list(argv))
        if args is not None:
            return name, env, args
    raise ValueError(f"cannot tell the engine from {' '.join(argv[:3])!r}: expected `vllm serve ...` or "
                     "`python -m sglang.launch_server ...`")


def value_problems(values: dict, rules: dict[str, tuple]) -> list[FlagProblem]:
    """Values the engine's own argparse types or config checks would refuse (`--max-num-seqs abc`,
    `--gpu-memory-utilization 1.5`), in argparse's words where argparse is the one refusing.

    >>> [p.message for p in value_problems({"--max-num-seqs": "abc"}, {"--max-num-seqs": ("int", 1, None, False)})]
    ["argument --max-num-seqs: invalid int value: 'abc'"]
    >>> value_problems({"--gpu-memory-utilization": "1.5"}, {"--gpu-memory-utilization": ("float", 0, 1, True)})[0].message
    'argument --gpu-memory-utilization: 1.5 is out of range: it must be in (0, 1]'
    """
    out = []
    for flag, (kind, low, high, low_open) in rules.items():
        raw = values.get(flag)
        if not isinstance(raw, str):
            continue
        x = _num(raw, int if kind == "int" else float)
        if x is None:
            out.append(FlagProblem(flag=flag, value=raw, message=f"argument {flag}: invalid {kind} value: {raw!r}"))
            continue
        below = low is not None and (x <= low if low_open else x < low)
        if below or (high is not None and x > high):
            span = f"{'(' if low_open else '['}{'-inf' if low is None else low:g}, " \
                   f"{'inf' if high is None else f'{high:g}'}{']' if high is not None else ')'}"
            out.append(FlagProblem(flag=flag, value=raw, message=f"argument {flag}: {raw} is out of range: "
                                                                 f"it must be in {span}"))
    return out


def parallel_problems(m: ModelInfo | None, tp: int, dp: int, ep: int, n_gpus: int | None, roles: dict) -> list[str]:
    """What the engine refuses about the parallel sizes, before any weight loads: more ranks than
    GPUs, and a model shape that the sizes do not divide (attention heads and KV heads by the
    tensor-parallel size, routed experts by the expert-parallel size, each expert's intermediate
    size by the tensor-parallel size when experts are sliced rather than placed)."""
    out = []
    if n_gpus is not None and tp * dp > n_gpus:
        out.append(f"{roles['tp']} {tp}" + (f" x {roles['dp']} {dp}" if dp > 1 else "")
                   + f" needs {tp * dp} GPUs, the machine has {n_gpus}")
    if m is None:
        return out
    if m.num_attention_heads and m.num_attention_heads % tp:
        out.append(f"{m.num_attention_heads} attention heads do not divide by {roles['tp']} {tp}: "
                   f"use a size that divides {m.num_attention_heads}")
    kv = m.num_kv_heads
    if kv and tp > 1 and (tp % kv if tp >= kv else kv % tp):
        out.append(f"{kv} KV heads and {roles['tp']} {tp}: one must divide the other (KV heads are split "
                   "over the ranks, or each replicated on a whole number of them)")
    if m.num_experts and ep > 1 and m.num_experts % ep:
        out.append(f"{m.num_experts} routed experts do not divide by the expert-parallel size {ep}")
    elif m.num_experts and ep <= 1 and m.moe_intermediate_size and m.moe_intermediate_size % tp:
        out.append(f"each expert's intermediate size {m.moe_intermediate_size} does not divide by {roles['tp']} "
                   f"{tp} (experts are sliced over the ranks without expert parallelism)")
    return out


def _fraction(v) -> float | None:
    x = _num(v)
    return x if x is not None and 0 < x <= 1 else None  # out of range: a flag problem, not a forecast


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
    f = adapter.flag_roles
    v = parsed.values
    rep = CheckReport(engine=engine, args=args, env=env, hardware=hw,
                      flag_problems=parsed.problems + value_problems(v, adapter.value_rules),
                      catalogue={"origin": cat.origin, "version": cat.version, "source": cat.source},
                      verdict=Verdict(cause=Cause.ok, phase=Phase.preflight))
    model_arg = v.get(f["model"]) or (parsed.positionals[0] if engine == "vllm" and parsed.positionals else None)
    if isinstance(model_arg, str):
        try:
            rep.model = load_model(model_arg)
        except (FileNotFoundError, ValueError, KeyError) as e:
            rep.model_error = str(e)
    fmt = of_launch(v.get(f["quant"]) if isinstance(v.get(f["quant"]), str) else None,
                    rep.model.quant_format if rep.model else None)
    rep.support = check_flags(engine, adapter.kind_flags, v, hw.arch, fmt)
    if hw.arch == "cpu" and engine == "sglang":
        rep.support.append(Support(status="no", engine=engine, kind="device", backend="cuda", arch="cpu", format=fmt,
                                   note="SGLang needs a CUDA GPU; none is visible (give --gpu/--gpu-memory/--gpus "
                                        "to check for another machine)", source="sglang install docs [gk]"))
    tp, dp = _num(v.get(f["tp"]), int) or 1, _num(v.get(f["dp"]), int) or 1
    ep_val = v.get(f["ep"])
    ep_size = tp * dp if ep_val is True else (_num(ep_val, int) or 1)
    rep.parallel_problems = parallel_problems(rep.model, tp, dp, ep_size, hw.gpus if hw.arch != "cpu" else None, f)
    if rep.model:
        kv_space = _num(env.get("VLLM_CPU_KVCACHE_SPACE"))
        dtype = v.get(f["dtype"])
        rep.forecast = forecast(
            rep.model, engine=engine, tp=tp, dp=dp, ep=ep_size > 1, gpu_memory=hw.gpu_memory if hw.arch != "cpu" else None,
            n_gpus=None if rep.parallel_problems else hw.gpus, mem_fraction=_fraction(v.get(f["fraction"])),
            fraction_default=adapter.memory_fraction_default, fraction_flag=adapter.memory_fraction_flag,
            kv_dtype=_kv_dtype(v.get(f["kv"]), dtype), context_len=_num(v.get(f["ctx"]), int),
            host_limit=hw.host_limit, cpu_kv_bytes=int(kv_space * GiB) if kv_space else None,
            dtype_bytes=4.0 if dtype in ("float32", "float") else None, refuses_short_kv=adapter.refuses_short_kv)
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
    for p in rep.parallel_problems:
        ev.append(Evidence(kind="parallel", text=p, source="the model's config.json and the parallel sizes"))
    if rep.parallel_problems:
        cause = Cause.bad_args
        advice.append("choose parallel sizes that the GPUs and the model's shape allow")
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
