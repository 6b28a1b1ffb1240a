"""The audit's answer: backend x arch cells with the deciding code, and drift against the matrix.

A cell is decided by the gates (gates.Gate) of one backend value, as pure functions:

    any gate refuses on this arch                  -> refused               x
    else a gate lets it through: an allow-list     -> allowed               ok  (ok* when another
      passes, or an arch test that refuses on                                    gate refuses under
      other archs does not fire here                                             conditions: `when`)
    else some gate refuses under conditions        -> refused, with `when`  x?
    else                                           -> no gate found         -

Drift compares definite cells with the curated support matrix (engines/support_matrix.yaml):
a curated "works" where the source refuses unconditionally, or a curated "fails" where the
source has a gate that lets it through and none that refuses.
"""
from __future__ import annotations

from pydantic import BaseModel, Field

from moelab.audit.values import ARCHS, U

ALLOWED, REFUSED, NO_GATE = "allowed", "refused", "no gate found"


class Finding(BaseModel):
    """One gate of one backend value in the source, evaluated on every arch."""

    flag: str
    value: str
    kind: str  # raise | assert | support | floor | arch_list
    at: str  # file:line (relative to site-packages) of the deciding code
    owner: str = ""  # Class.function it is in
    message: str | None = None
    via: list[str] = Field(default_factory=list)  # the calls that lead there
    formats: list[str] = Field(default_factory=list)  # weight formats the code is specific to
    model: str | None = None  # the model the code is for (per-model code)
    archs: dict[str, str]  # arch -> refused | allowed | conditional
    when: dict[str, list[str]] = Field(default_factory=dict)  # arch -> conditions the audit cannot decide

    def applies(self, fmt: str | None) -> bool:
        return not self.formats or fmt is None or fmt in self.formats


class Cell(BaseModel):
    arch: str
    status: str  # allowed | refused | no gate found
    unconditional: bool = True  # False: refused only under conditions (in `when`)
    at: str | None = None
    message: str | None = None
    when: list[str] = Field(default_factory=list)  # "file:line: condition" of conditional refusals


class Row(BaseModel):
    flag: str
    kind: str
    value: str
    cells: dict[str, Cell]


class Drift(BaseModel):
    flag: str
    kind: str
    value: str
    arch: str
    formats: list[str]
    matrix: str  # works | fails
    matrix_source: str
    source: str  # refused | allowed
    at: str | None
    message: str | None = None
    when: list[str] = Field(default_factory=list)  # allowed, but other gates refuse under these conditions


class PackageInfo(BaseModel):
    name: str
    dist: str | None
    version: str | None
    path: str


class Audit(BaseModel):
    engine: str
    version: str | None
    python: str
    packages: list[PackageInfo]
    missing: list[str] = Field(default_factory=list)  # profile packages this interpreter lacks
    choices_from: str  # where the flag choices came from
    archs: list[str] = Field(default_factory=lambda: list(ARCHS))
    rows: list[Row] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    drift: list[Drift] = Field(default_factory=list)
    files_parsed: int = 0
    seconds: float = 0.0
    # what was read (moelab's audit code and profiles, each package's .py files: path, size,
    # mtime): an audit of unchanged source is the cached one, said as such (`reused_from`)
    fingerprint: str | None = None
    read_at: str | None = None
    reused_from: str | None = None  # the cache file, when this audit was not read again

    def row(self, flag: str, value: str) -> Row | None:
        return next((r for r in self.rows if r.flag == flag and r.value == value), None)


def verdict_word(v) -> str:
    return "conditional" if v is U else REFUSED if v else ALLOWED


def cell(arch: str, findings: list[Finding], fmt: str | None = None) -> Cell:
    """The cell of one backend on one arch from its findings (only those for `fmt` when given;
    without a format, code specific to one format refuses only under that condition)."""
    found = [f for f in findings if f.applies(fmt) and arch in f.archs]
    by = {want: [f for f in found if _state(f, arch, fmt) == want] for want in ("refused", "allowed", "conditional")}
    when = [f"{f.at}: {' and '.join(_when(f, arch, fmt))}" for f in by["conditional"]]
    if by["refused"]:
        f = by["refused"][0]
        return Cell(arch=arch, status=REFUSED, at=f.at, message=f.message)
    if by["allowed"]:
        f = by["allowed"][0]
        return Cell(arch=arch, status=ALLOWED, at=f.at, message=f.message, when=when)
    if by["conditional"]:
        f = by["conditional"][0]
        return Cell(arch=arch, status=REFUSED, unconditional=False, at=f.at, message=f.message, when=when)
    return Cell(arch=arch, status=NO_GATE)


def _state(f: Finding, arch: str, fmt: str | None) -> str:
    s = f.archs[arch]
    if s == "refused" and (f.formats and fmt is None or f.model):
        return "conditional"  # refused only for the formats or the model the code is about
    if s == "allowed" and f.kind in ("raise", "assert") and "refused" not in f.archs.values():
        return "n/a"  # a refusal that happens only under other conditions allows nothing by not firing
    return s


def _when(f: Finding, arch: str, fmt: str | None) -> list[str]:
    out = list(f.when.get(arch, []))
    if f.formats and fmt is None:
        out.append(f"the weights are {' or '.join(f.formats)} ({f.owner or f.at})")
    if f.model:
        out.append(f"the model is the one of {f.model}")
    return out


def rows(flags: dict[str, tuple[str, list[str]]], findings: list[Finding]) -> list[Row]:
    """Every (flag, value) of the catalogue with its cells; `flags` is flag -> (kind, values)."""
    out = []
    for flag, (kind, values) in flags.items():
        for value in values:
            mine = [f for f in findings if f.flag == flag and f.value == value]
            out.append(Row(flag=flag, kind=kind, value=value, cells={a: cell(a, mine) for a in ARCHS}))
    return out


def drift(engine: str, audit_rows: list[Row], findings: list[Finding]) -> list[Drift]:
    """Where the audited source contradicts the curated support matrix (definite cells only)."""
    from moelab.engines.support import rows as matrix_rows

    out = []
    for r in matrix_rows():
        if r.engine != engine:
            continue
        row = next((x for x in audit_rows if x.kind == r.kind and _same(x.value, r.backend)), None)
        if row is None:
            continue
        mine = [f for f in findings if f.flag == row.flag and f.value == row.value]
        formats = None if "any" in r.formats else r.formats
        for arch in ARCHS:
            curated = "works" if arch in r.works or arch in r.caveats else "fails" if arch in r.fails else None
            if curated is None:
                continue
            cells = [cell(arch, mine, fmt) for fmt in (formats or [None])]
            refused = [c for c in cells if c.status == REFUSED and c.unconditional]
            allowed = [c for c in cells if c.status == ALLOWED]
            if curated == "works" and refused and len(refused) == len(cells):
                c = refused[0]
            elif curated == "fails" and allowed and len(allowed) == len(cells):
                c = allowed[0]
            else:
                continue
            out.append(Drift(flag=row.flag, kind=r.kind, value=row.value, arch=arch, formats=r.formats,
                             matrix=curated, matrix_source=r.source, source=c.status, at=c.at, message=c.message,
                             when=sorted({w for x in cells for w in x.when})))
    return out


def _same(value: str, backend: str) -> bool:
    return value.replace("-", "_").lower() == backend.replace("-", "_").lower()
