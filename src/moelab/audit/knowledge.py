"""Three kinds of knowledge about each backend choice of a command line, side by side.

    curated   the support matrix (engines/support_matrix.yaml): issue threads, with sources
    source    the installed engine's own source: the cached `moelab audit` of that version
    launches  this machine's verdicts from the store: launched trials that used the backend here

Launches win where they disagree, then a refusal in the source (the installed code will raise),
then the curated matrix; a source that merely lets a backend through proves nothing about it
running. Every disagreement is kept and shown: the source saying yes while a launch died is the
finding a user needs.

    weigh(engine, "0.5.23", "sm_120", [("--moe-runner-backend", "moe_runner", "flashinfer_trtllm",
          <Support no>)], trials, fmt="nvfp4")
    # -> [Knowledge(decision="no", decided_by="launches",
    #               disagreements=["the source lets it through (flashinfer/jit/fused_moe.py:385) but
    #                               a launch died: unsupported_arch (trial 4)"])]
"""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from moelab.audit.matrix import ALLOWED, REFUSED, Audit, Cell, cell
from moelab.engines.support import Support

# Launch causes that speak about the backend on this arch (an OOM or a taken port does not).
BACKEND_CAUSES = {"unsupported_arch", "kernel_resource_limit", "illegal_memory_access", "jit_compile_error",
                  "numerical_nan", "garbage_output", "native_crash"}


def default_store() -> Path:
    """$MOELAB_STORE, else the store in moelab's cache directory (~/.cache/moelab/store.db)."""
    from moelab.engines.flags import cache_dir

    return Path(os.environ.get("MOELAB_STORE") or cache_dir().parent / "store.db")


class Trial(BaseModel):
    """A launched trial as the store keeps it, reduced to what the weighing reads."""

    id: int
    arch: str
    values: dict[str, str]  # canonical flag -> value
    cause: str


class Launches(BaseModel):
    status: str = "none"  # works | fails | mixed | none
    ok: list[int] = Field(default_factory=list)  # trial ids
    failed: dict[str, list[int]] = Field(default_factory=dict)  # cause -> trial ids
    other: int = 0  # launches that ended for reasons that say nothing about the backend
    store: str | None = None


class Knowledge(BaseModel):
    flag: str
    kind: str
    backend: str
    arch: str
    format: str
    curated: Support
    source: Cell | None = None
    source_of: str  # which audit, or why there is none
    launches: Launches
    decision: str  # yes | no | caveat | unknown
    decided_by: str  # launches | source | curated | none
    disagreements: list[str] = Field(default_factory=list)


def launches(trials: list[Trial], flag: str, backend: str, arch: str, store: str | None) -> Launches:
    out = Launches(store=store)
    for t in trials:
        if t.arch != arch or _norm(t.values.get(flag, "")) != _norm(backend):
            continue
        if t.cause == "ok":
            out.ok.append(t.id)
        elif t.cause in BACKEND_CAUSES:
            out.failed.setdefault(t.cause, []).append(t.id)
        else:
            out.other += 1
    out.status = ("mixed" if out.ok and out.failed else "works" if out.ok else "fails" if out.failed else "none")
    return out


def one(flag: str, kind: str, backend: str, arch: str, fmt: str, curated: Support, audit: Audit | None,
        source_of: str, trials: list[Trial], store: str | None) -> Knowledge:
    src = None
    if audit is not None:
        row = next((r for r in audit.rows if r.flag == flag and _norm(r.value) == _norm(backend)), None)
        if row is not None and arch in audit.archs:
            mine = [f for f in audit.findings if f.flag == row.flag and f.value == row.value]
            src = cell(arch, mine, fmt)
    seen = launches(trials, flag, backend, arch, store)
    decision, by = _decide(curated, src, seen)
    return Knowledge(flag=flag, kind=kind, backend=backend, arch=arch, format=fmt, curated=curated, source=src,
                     source_of=source_of, launches=seen, decision=decision, decided_by=by,
                     disagreements=_disagreements(curated, src, seen))


def _decide(curated: Support, src: Cell | None, seen: Launches) -> tuple[str, str]:
    if seen.status != "none":
        return {"works": "yes", "fails": "no", "mixed": "caveat"}[seen.status], "launches"
    if src is not None and src.status == REFUSED and src.unconditional:
        return "no", "source"
    if curated.status != "unknown":
        return curated.status, "curated"
    return "unknown", "none"


def _disagreements(curated: Support, src: Cell | None, seen: Launches) -> list[str]:
    out = []
    died = ", ".join(f"{c} (trial {', '.join(map(str, ids))})" for c, ids in seen.failed.items())
    ran = f"trial {', '.join(map(str, seen.ok))}"
    src_yes = src is not None and src.status == ALLOWED
    src_no = src is not None and src.status == REFUSED and src.unconditional
    if seen.failed and not seen.ok:
        if src_yes:
            out.append(f"the source lets it through ({src.at}) but a launch died: {died}")
        if curated.status == "yes":
            out.append(f"the curated matrix says it works ({curated.source}) but a launch died: {died}")
    if seen.ok and not seen.failed:
        if src_no:
            out.append(f"the source refuses it ({src.at}) but it launched here: {ran}")
        if curated.status == "no":
            out.append(f"the curated matrix says it fails ({curated.source}) but it launched here: {ran}")
    if src_no and curated.status == "yes":
        out.append(f"the source refuses it ({src.at}) where the curated matrix says it works ({curated.source})")
    if src_yes and curated.status == "no":
        out.append(f"the source lets it through ({src.at}) where the curated matrix says it fails ({curated.source})")
    return out


def as_support(k: Knowledge) -> Support:
    """The decision in the shape `check`'s verdict reads, its note saying which knowledge decided."""
    c = k.curated
    if k.decided_by == "curated" or k.decided_by == "none":
        note, source = c.note, c.source
    elif k.decided_by == "source":
        note, source = f"the installed source refuses it: {k.source.message or ''}".strip(), k.source.at
    else:
        parts = [f"launched here: {', '.join(map(str, k.launches.ok))}"] if k.launches.ok else []
        parts += [f"{cause} in trial {', '.join(map(str, ids))}" for cause, ids in k.launches.failed.items()]
        note, source = "launches on this machine: " + "; ".join(parts), f"store {k.launches.store}"
    return Support(status=k.decision, engine=c.engine, kind=c.kind, backend=c.backend, arch=c.arch,
                   format=c.format, note=note, source=source)


def trials_from(store: Path, engine: str, parse) -> list[Trial]:
    """The launched trials of one engine in a store; `parse(args) -> {flag: value}`."""
    from moelab.store import Store

    if not store.exists():
        return []
    with Store(store) as st:
        rows = st.trials()
    out = []
    for r in rows:
        verdict = r.get("verdict") or {}
        if r.get("engine") != engine or r["status"] not in ("done", "reused") or verdict.get("phase") == "preflight":
            continue
        arch = (r.get("fingerprint") or {}).get("sm") or "cpu"
        values = {k: v for k, v in parse(r.get("args") or []).items() if isinstance(v, str)}
        out.append(Trial(id=r["id"], arch=arch, values=values, cause=r.get("cause") or "unknown"))
    return out


def _norm(v: str) -> str:
    return v.replace("-", "_").lower()


def weigh(rep, store: Path) -> list[Knowledge]:
    """Knowledge for each backend choice of a `check` report (engines.check.CheckReport), and
    the report's support entries replaced by the decisions (launches winning)."""
    from moelab.audit.profile import load
    from moelab.audit.run import cached
    from moelab.engines import ENGINES
    from moelab.engines.flags import parse_args
    from moelab.engines import ENGINES
    from moelab.engines.support import lookup
    from moelab.formats import of_launch

    adapter = ENGINES.create(rep.engine)
    name = adapter.source_profile()
    if name is None:
        return []
    profile = load(name)
    cat = adapter.flag_catalogue()
    values = parse_args(rep.args, cat).values
    version = rep.catalogue.get("version")
    audit = cached(rep.engine, version)
    source_of = (f"`moelab audit` of {audit.engine} {audit.version} ({audit.python})" if audit else
                 f"not audited: run `moelab audit --engine {rep.engine}` (with --python for another environment)")
    trials = trials_from(store, rep.engine, lambda args: parse_args(args, cat).values)
    fmt = (rep.verdict.detail or {}).get("format") or "bf16"
    arch = rep.hardware.arch
    same_kind = {}  # kind -> every flag that sets it (--attention-backend, --attention-config.backend ...)
    for flag, kind in [*ENGINES.create(rep.engine).kind_flags.items(), *((f, s.kind) for f, s in profile.flags.items())]:
        same_kind.setdefault(kind, []).append(flag)
    out, support = [], []
    wanted = [(s.kind, s.backend, s) for s in rep.support if s.kind in same_kind]
    quant = values.get(next((f for f, s in profile.flags.items() if s.kind == "quantization"), ""))
    if isinstance(quant, str) and quant not in ("auto", "None"):
        wanted.append(("quantization", quant, lookup(rep.engine, "quantization", quant, arch, of_launch(quant))))
    for kind, backend, curated in wanted:
        flag = next(f for f, s in profile.flags.items() if s.kind == kind) if any(
            s.kind == kind for s in profile.flags.values()) else same_kind[kind][0]
        k = one(flag, kind, backend, arch, fmt, curated, audit, source_of,
                _merge_flags(trials, same_kind[kind], flag), str(store) if store.exists() else None)
        out.append(k)
        if kind != "quantization" or k.decision in ("no", "caveat") or k.disagreements:
            support.append(as_support(k))
    rep.support = [s for s in rep.support if s.kind not in same_kind] + support
    return out


def _merge_flags(trials: list[Trial], flags: list[str], to: str) -> list[Trial]:
    """Trials with any of a kind's flags (vLLM's --attention-config.backend) read as `to`."""
    out = []
    for t in trials:
        v = next((t.values[f] for f in flags if f in t.values), None)
        out.append(t.model_copy(update={"values": {to: v}}) if v is not None else t)
    return out
