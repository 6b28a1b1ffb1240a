"""Plain data that flows between moelab's stages: launch specs and verdicts.

Every arrow in the flow (planner -> launch -> probe -> load -> verdict -> store) carries one of
these models. Decisions are pure functions over them; processes and sockets live at the edges.
The cause and phase strings are a fixed vocabulary shared by the store, the JSON output and the
report (see docs/DESIGN.md); never invent new ones at a call site.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Phase(str, Enum):
    preflight = "preflight"
    launch = "launch"
    probe = "probe"
    load = "load"
    teardown = "teardown"


class Cause(str, Enum):
    ok = "ok"
    bad_args = "bad_args"
    unsupported_arch = "unsupported_arch"
    kernel_resource_limit = "kernel_resource_limit"
    host_oom = "host_oom"
    gpu_oom = "gpu_oom"
    illegal_memory_access = "illegal_memory_access"
    jit_compile_error = "jit_compile_error"
    collective_error = "collective_error"
    numerical_nan = "numerical_nan"
    garbage_output = "garbage_output"
    model_load_error = "model_load_error"
    port_in_use = "port_in_use"
    startup_timeout = "startup_timeout"
    hang = "hang"
    killed_external = "killed_external"
    native_crash = "native_crash"
    orphan_leak = "orphan_leak"
    unknown = "unknown"


class Evidence(BaseModel):
    """One fact that supports a verdict: a log line, an exit status, a cgroup counter ..."""

    model_config = ConfigDict(frozen=True)

    kind: str  # "log", "exit", "cgroup", "kernel_log", "telemetry", "probe", "support", "flags", ...
    text: str
    line: int | None = None  # 1-based line number in the log, for kind == "log"
    source: str | None = None  # rule id, file, URL or issue reference the fact comes from


class Alternative(BaseModel):
    """A second reading of the same evidence: another cause, and how confident it is."""

    cause: Cause
    confidence: float


class Verdict(BaseModel):
    """(phase, cause, evidence[], advice): the answer to "did it work, and if not, why"."""

    cause: Cause
    phase: Phase
    evidence: list[Evidence] = Field(default_factory=list)
    advice: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)  # free-form extras (timings, rule ids)
    confidence: float | None = None  # how sure the deciding evidence makes the cause (None: not judged)
    alternatives: list[Alternative] = Field(default_factory=list)  # ranked second readings

    @property
    def ok(self) -> bool:
        return self.cause is Cause.ok


class LaunchSpec(BaseModel):
    """One server configuration to launch: which engine, with which arguments and environment.

    `args` are the engine's own arguments, verbatim (flag names are never renamed). For the
    `command` engine `args` is the whole command line and may hold `{host}` and `{port}`.
    """

    engine: str = "embedded"
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None  # None: pick a free port at launch time
    gpus: list[int] | None = None  # CUDA_VISIBLE_DEVICES for the server; None = inherit
    memory_limit_bytes: int | None = None  # host memory cgroup limit for the whole tree
    timeout_s: float = 300.0  # readiness deadline
    # the key moelab sends as a bearer token (never stored, printed or hashed: excluded from dumps)
    api_key: str | None = Field(None, exclude=True, repr=False)

    def flag(self, name: str) -> str | None:
        """Value of `--name X` or `--name=X` in args (last one wins), else None."""
        value = None
        for i, a in enumerate(self.args):
            if a == name and i + 1 < len(self.args):
                value = self.args[i + 1]
            elif a.startswith(name + "="):
                value = a.split("=", 1)[1]
        return value
