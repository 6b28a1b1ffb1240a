"""The trial folder and what it holds: server.log, telemetry.jsonl, verdict.json, repro.sh.

repro.sh relaunches the exact command with its environment, secrets masked, ready to attach to an
upstream bug report. What is secret is decided in `moelab.secrets` (names like HF_TOKEN or
--api-key, values that look like keys, the API key moelab sends); the trial's `Secrets` mask
everything this module writes and the LaunchResult it returns.
"""
from __future__ import annotations

import json
import os
import re
import shlex
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, Field

from moelab.engines.effective import Effective
from moelab.secrets import MASK, Secrets, secret_name
from moelab.spec import LaunchSpec, Verdict

# Environment a serving engine's behaviour depends on, copied into repro.sh from moelab's own env.
_RELEVANT = re.compile(r"^(CUDA_|NCCL_|VLLM_|SGLANG_|SGL_|FLASHINFER_|TORCH_|PYTORCH_|TRITON_|HF_|"
                       r"OMP_|MOELAB_|LD_LIBRARY_PATH$|PATH$|PYTHONPATH$)")


class LaunchResult(BaseModel):
    verdict: Verdict
    url: str | None = None
    model: str | None = None
    timings: dict[str, float | None] = Field(default_factory=dict)  # seconds: ready, death, teardown ...
    telemetry: dict = Field(default_factory=dict)  # Sampler.summary() plus the cgroup note
    paths: dict[str, str] = Field(default_factory=dict)  # log, telemetry, verdict, repro, dir
    command: list[str] = Field(default_factory=list)  # masked
    effective: Effective | None = None  # what the engine's log says it ran, beside what was asked

    @property
    def ok(self) -> bool:
        return self.verdict.ok


def repro_env(spec_env: dict[str, str], adapter_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _RELEVANT.match(k) and not k.startswith("MOELAB_TRIAL")}
    env.update(adapter_env)
    env.update(spec_env)
    return {k: (MASK if secret_name(k) else v) for k, v in sorted(env.items())}


def write_repro(path: Path, argv: list[str], env: dict[str, str], spec: LaunchSpec, secrets: Secrets) -> None:
    lines = ["#!/bin/sh", f"# moelab launch repro ({spec.engine} engine), written "
             f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}",
             "# Secrets are masked as *** : put your own back before running."]
    if spec.memory_limit_bytes:
        lines.append(f"# moelab ran it in a memory cgroup limited to {spec.memory_limit_bytes / 2**20:.0f} MiB "
                     f"(moelab launch --memory-limit {spec.memory_limit_bytes // 2**20}M)")
    lines.append(f"cd {shlex.quote(os.getcwd())}")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in secrets.env(env).items()]
    lines.append("exec " + " ".join(shlex.quote(a) for a in secrets.argv(argv)))
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)


def prepare(d: Path, spec: LaunchSpec, argv: list[str], adapter_env: dict[str, str],
            api_key: str | None = None) -> tuple[dict[str, str], Secrets]:
    """(the server's full environment, the trial's secrets); writes repro.sh into `d`."""
    env = {**os.environ, **adapter_env, **spec.env, "PYTHONUNBUFFERED": "1"}
    shown = repro_env(spec.env, adapter_env)
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = shown["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
    if spec.cpus is not None and "OMP_NUM_THREADS" not in spec.env:  # intra-op threads fit the CPU share
        env["OMP_NUM_THREADS"] = str(len(spec.cpus))
    env.update(spec.marks)
    secrets = Secrets.gather(env={**adapter_env, **spec.env}, argv=argv, extra=[api_key])
    write_repro(d / "repro.sh", argv, shown, spec, secrets)
    return env, secrets


def write_verdict(path: Path, result: LaunchResult, secrets: Secrets) -> None:
    path.write_text(json.dumps(secrets.data(result.model_dump(mode="json")), indent=2) + "\n")


def new_trial_dir(out: Path | None) -> Path:
    """`out` itself (created), or ./moelab-runs/<UTC time> when no --out was given."""
    if out is None:
        out = Path("moelab-runs") / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    out.mkdir(parents=True, exist_ok=True)
    return out


def effective_evidence(eff: Effective | None) -> list:
    """One evidence line per setting the engine replaced or refused: the verdict says so."""
    from moelab.spec import Evidence

    return [Evidence(kind="effective", text=f"{s.name.replace('_', ' ')} {s.flag or ''}: {s.describe()}",
                     line=s.line, source=s.source) for s in (eff.changed if eff else [])]


def finish(d: Path, v: Verdict, notes: list[str], *, url: str | None, model: str | None, timings: dict,
           telemetry: dict, launched: bool, argv: list[str], secrets: Secrets,
           effective: Effective | None = None) -> LaunchResult:
    """The LaunchResult of a trial, with verdict.json written; secrets masked in both."""
    v = Verdict.model_validate(secrets.data({**v.model_dump(mode="json"),
                                             "evidence": [*v.model_dump(mode="json")["evidence"],
                                                          *(e.model_dump() for e in effective_evidence(effective))],
                                             "detail": {**v.detail, "notes": list(notes)}}))
    paths = {"dir": str(d)}
    if launched:
        paths.update(log=str(d / "server.log"), telemetry=str(d / "telemetry.jsonl"), repro=str(d / "repro.sh"))
    paths["verdict"] = str(d / "verdict.json")
    res = LaunchResult(verdict=v, url=url, model=model, telemetry=telemetry, paths=paths,
                       timings={k: round(t, 3) for k, t in timings.items() if t is not None},
                       command=secrets.argv(argv),
                       effective=Effective.model_validate(secrets.data(effective.model_dump())) if effective else None)
    write_verdict(d / "verdict.json", res, secrets)
    return res
