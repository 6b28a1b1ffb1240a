"""Pure lookups in the support matrix (support_matrix.yaml): does backend B run on arch A for format F?

`check_flags` turns a parsed command line (canonical flag -> value) into findings, each with the
row's source. The matrix itself is data; nothing here touches a GPU.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

MATRIX = Path(__file__).with_name("support_matrix.yaml")

# A backend kind only matters for some formats: an FP4 GEMM backend is unused by a bf16 model.
KIND_FORMATS = {"fp4_gemm": {"nvfp4"}, "fp8_gemm": {"fp8"}}


class SupportRow(BaseModel):
    engine: str
    kind: str
    backend: str
    formats: list[str]
    works: list[str] = Field(default_factory=list)  # ("yes"/"no" would be YAML 1.1 booleans)
    fails: list[str] = Field(default_factory=list)
    caveats: dict[str, str] = Field(default_factory=dict)
    why_not: str = ""
    source: str


class Support(BaseModel):
    """The answer for one (engine, kind, backend, arch, format)."""

    status: str  # "yes", "no", "caveat", "unknown"
    engine: str
    kind: str
    backend: str
    arch: str
    format: str
    note: str = ""
    source: str | None = None


@lru_cache(maxsize=1)
def rows() -> tuple[SupportRow, ...]:
    data = yaml.safe_load(MATRIX.read_text())
    return tuple(SupportRow.model_validate(r) for r in data["rows"])


def lookup(engine: str, kind: str, backend: str, arch: str, fmt: str) -> Support:
    """Support status; "unknown" when no row covers this combination (never a guess)."""
    base = dict(engine=engine, kind=kind, backend=backend, arch=arch, format=fmt)
    norm = backend.replace("-", "_") if engine == "vllm" and kind == "moe_runner" else backend
    for r in rows():
        if (r.engine, r.kind, r.backend) != (engine, kind, norm):
            continue
        if fmt not in r.formats and "any" not in r.formats:
            continue
        if arch in r.caveats:
            return Support(status="caveat", note=r.caveats[arch], source=r.source, **base)
        if arch in r.works:
            return Support(status="yes", source=r.source, **base)
        if arch in r.fails:
            return Support(status="no", note=r.why_not, source=r.source, **base)
        return Support(status="unknown", note=f"no data for {arch}", source=r.source, **base)
    return Support(status="unknown", note="no row in the support matrix", **base)


def check_flags(engine: str, kind_flags: dict[str, str], values: dict, arch: str, fmt: str) -> list[Support]:
    """Every backend flag on the command line (`kind_flags`: the adapter's flag -> backend kind),
    looked up for this arch and format."""
    out = []
    for flag, kind in kind_flags.items():
        v = values.get(flag)
        if not isinstance(v, str) or v in ("auto", "None"):
            continue
        if kind in KIND_FORMATS and fmt not in KIND_FORMATS[kind]:
            continue
        out.append(lookup(engine, kind, v, arch, fmt))
    return out
