"""What the audit needs to know about one engine or library's source, as typed data.

The scanner (moelab.audit) is generic: it knows Python and torch, nothing about SGLang or vLLM.
Everything engine-specific — which packages make up an engine, which flags choose a backend,
which names hold a flag's value, which helpers report the GPU's capability — is a profile,
one YAML file per engine or library in moelab/engines/sources/, loaded through the engine
adapter (`EngineAdapter.source_profile()`).

A worked example: SGLang's profile says `--moe-runner-backend` is held in names ending in
`moe_runner_backend` or `runner_backend`, so in

    elif runner_backend.is_hpc_ops():
        major, minor = torch.cuda.get_device_capability()
        if major != 9:
            raise ValueError("--moe-runner-backend hpc_ops requires an SM90 (Hopper) GPU")

the scanner knows the `elif` selects `hpc_ops` and that the raise refuses every arch but sm_90.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

SOURCES = Path(__file__).parent.parent / "engines" / "sources"


class FlagSource(BaseModel):
    """How one backend flag shows up in the source."""

    kind: str  # the support matrix's kind: moe_runner, fp4_gemm, fp8_gemm, attention, quantization
    holders: list[str]  # names (variables, attributes, getters) that hold the flag's value
    # Module-level dicts `{"value": ConfigClass}` that turn a value into the class implementing it.
    registries: list[str] = Field(default_factory=list)
    # An Enum whose members are the flag's choices and whose values name the implementing class
    # ("package.module.Class"); used where the engine's --help lists no choices.
    class_enum: str | None = None


class Profile(BaseModel):
    """One engine's or library's source knowledge (engines/sources/<name>.yaml)."""

    name: str
    packages: list[str]  # top-level import names
    libraries: list[str] = Field(default_factory=list)  # other profiles this one dispatches to
    scan: list[str] = Field(default_factory=list)  # subpackages searched for backend references
    flags: dict[str, FlagSource] = Field(default_factory=dict)
    # Helpers that return the GPU capability: as (major, minor), or as the int major*10+minor.
    capability: list[str] = Field(default_factory=list)
    capability_int: list[str] = Field(default_factory=list)
    # Classes whose constructor builds a capability: DeviceCapability(8, 0).
    capability_types: list[str] = Field(default_factory=list)
    # `accessor().NAME` is the fact named NAME in these dicts, each mapping NAME -> a probe
    # function of `probe_module`: SGLang's get_platform().is_sm100 -> is_sm100_supported().
    facts: list["FactTable"] = Field(default_factory=list)
    # A module-level object whose methods are those of a class: vLLM's current_platform.
    receivers: dict[str, str] = Field(default_factory=dict)
    # Methods of an implementing class that say whether it runs on this GPU (no arguments) ...
    support_methods: list[str] = Field(default_factory=list)
    # ... or whether it runs on a given capability (one argument, the capability).
    capability_predicates: list[str] = Field(default_factory=list)
    # Classmethods of a registry class giving the lowest capability (major*10+minor) it runs on.
    min_capability: list[str] = Field(default_factory=list)
    # Decorators listing the capabilities (major*10+minor) a function runs on.
    arch_lists: list[str] = Field(default_factory=list)
    # Decorators naming a function's check functions: positional dict {backend: check}, and
    # keyword `common_check`.
    requirement_links: list[str] = Field(default_factory=list)
    # Calls that build a kernel only for some major versions: {function: keyword with the list}.
    arch_major_calls: dict[str, str] = Field(default_factory=dict)
    # Helpers assumed true (or false) on a current CUDA machine, e.g. version checks.
    assume: dict[str, bool] = Field(default_factory=dict)
    # Modules whose code runs for one model only: a gate there refuses only for that model.
    model_code: list[str] = Field(default_factory=list)


class FactTable(BaseModel):
    accessor: str
    tables: list[str]  # "module.DICT_NAME"
    probe_module: str


Profile.model_rebuild()


@lru_cache(maxsize=None)
def load(name: str) -> Profile:
    """The profile engines/sources/<name>.yaml."""
    path = SOURCES / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no source profile {path}")
    return Profile.model_validate({"name": name, **yaml.safe_load(path.read_text())})


def with_libraries(name: str) -> list[Profile]:
    """An engine's profile followed by those of the libraries it dispatches to (once each)."""
    out, todo = [], [name]
    while todo:
        p = load(todo.pop(0))
        if p.name not in {q.name for q in out}:
            out.append(p)
            todo += p.libraries
    return out
