"""`run_audit(engine, python)`: read an installed engine's source and build its Audit.

The steps, each in its own module: locate the packages of the engine and its libraries through
the target interpreter (source.py), read the flag choices from the engine's catalogue, bind
flag values to the source's names and enums (refs.py), walk the functions that test them
(walk.py), follow and evaluate the gates (gates.py, evaluate.py), and decide the cells and the
drift (matrix.py). The result is cached per engine version (`cached`), which is what
`moelab check` reads: it never parses source itself.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from moelab.audit.values import ARCHS
from moelab.audit.gates import Auditor
from moelab.audit.matrix import Audit, Finding, PackageInfo, drift, rows, verdict_word
from moelab.audit.profile import Profile, with_libraries
from moelab.audit.refs import Flag, References, norm
from moelab.audit.source import SourceIndex, locate

_ENUM_CLASS = re.compile(r"\bclass \w+\([^)]*Enum")


class AuditError(Exception):
    """What was wrong and what to do (the CLI prints it)."""


def cache_path(engine: str, version: str | None) -> Path:
    from moelab.engines.flags import cache_dir

    v = re.sub(r"[^A-Za-z0-9._-]", "_", (version or "unknown").split("+")[0])
    return cache_dir().parent / "audit" / f"{engine}-{v}.json"


def cached(engine: str, version: str | None) -> Audit | None:
    """The last audit of this engine version on this machine, if any."""
    p = cache_path(engine, version)
    try:
        return Audit.model_validate_json(p.read_text()) if p.exists() else None
    except ValueError:
        return None  # an audit written by another moelab version: audit again


def fingerprint(python: str, packages) -> str:
    """What an audit read, cheaply: moelab's audit code, source profiles, bundled flag catalogues
    and support matrix (the drift is against it), and every .py file of the packages located for
    `python` (relative path, size, mtime). Stat only, nothing parsed."""
    import hashlib

    from moelab.audit.profile import SOURCES

    engines = SOURCES.parent
    h = hashlib.sha256(python.encode())
    ours = [*Path(__file__).parent.glob("*.py"), *SOURCES.glob("*.yaml"), *(engines / "catalogues").glob("*.json"),
            engines / "support_matrix.yaml"]
    for p in sorted(ours):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    for pkg in sorted(packages, key=lambda p: p.name):
        h.update(f"\0{pkg.name}\0{pkg.dist}\0{pkg.version}\0{pkg.path}".encode())
        root = Path(pkg.path)
        for f in sorted(root.rglob("*.py")):
            try:
                st = f.stat()
            except OSError:
                continue
            h.update(f"\0{f.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]


def run_audit(engine: str, python: str | None = None, fresh: bool = False) -> Audit:
    """The audit of `engine` as installed for `python`: read from its source, or the cached audit
    when that source, moelab's audit code and its profiles are unchanged since (unless `fresh`)."""
    from moelab.engines import ENGINES

    t0 = time.perf_counter()
    if engine not in ENGINES:
        raise AuditError(f"unknown engine {engine!r}; the audit reads sglang or vllm")
    adapter = ENGINES.create(engine)
    profile_name = adapter.source_profile()
    if profile_name is None:
        raise AuditError(f"the {engine} engine has no source to audit (moelab audit reads sglang and vllm)")
    python = python or adapter.engine_python()
    if python is None:
        raise AuditError(f"{engine} is not installed here",)
    profiles = with_libraries(profile_name)
    try:
        found = locate(python, [p for pr in profiles for p in pr.packages])
    except RuntimeError as e:
        raise AuditError(str(e)) from None
    main = profiles[0].packages[0]
    if main not in found:
        raise AuditError(f"{python} has no {main} package installed")
    version = found[main].version
    fp = fingerprint(python, found.values())
    before = None if fresh else cached(engine, version)
    if before is not None and before.fingerprint == fp:
        before.reused_from = str(cache_path(engine, version))
        return before
    index = SourceIndex({name: p.path for name, p in found.items()})
    flags, others, choices_from = _flags(adapter, profiles[0], version, index)
    scan = profiles[0].scan or profiles[0].packages
    refs = References.build(flags, [m for s in scan for m in index.modules_under(s, _ENUM_CLASS)], others)
    modules = [m for s in scan for m in index.modules_under(s, refs.needles())]
    auditor = Auditor(index, profiles, refs, modules)
    findings = _findings(auditor, refs)
    audit_rows = rows({f.name: (f.source.kind, list(f.choices.values())) for f in flags.values()}, findings)
    audit = Audit(engine=engine, version=version, python=python, choices_from=choices_from,
                  packages=[PackageInfo(name=p.name, dist=p.dist, version=p.version, path=str(p.path))
                            for p in found.values()],
                  missing=[p for pr in profiles for p in pr.packages if p not in found],
                  rows=audit_rows, findings=findings, drift=drift(engine, audit_rows, findings),
                  files_parsed=index.parsed, fingerprint=fp,
                  read_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    audit.seconds = round(time.perf_counter() - t0, 2)
    path = cache_path(engine, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(audit.model_dump_json(indent=1))
    return audit


def _flags(adapter, profile: Profile, version: str | None,
           index: SourceIndex) -> tuple[dict[str, Flag], dict[str, frozenset[str]], str]:
    """Each audited flag with its choices (the engine's catalogue, else the source's registry or
    enum), and the catalogue's other flags with theirs."""
    cat = adapter.flag_catalogue()
    same = (cat.version or "").split("+")[0] == (version or "").split("+")[0]
    origin = f"{adapter.name} {cat.version} flag catalogue ({cat.origin})"
    if not same:
        origin += f"; the audited source is {version}, so a choice may be missing or extra"
    out = {}
    for name, fs in profile.flags.items():
        info = cat.flags.get(name)
        choices = [c for c in (info.choices or []) if c != "auto"] if info else []
        if not choices:
            choices = _source_choices(fs, index)
        out[name] = Flag(name, fs, {norm(c): c for c in choices})
    others = {f.name: frozenset(norm(c) for c in f.choices) for f in cat.flags.values()
              if f.choices and f.name not in profile.flags}
    return out, others, origin


def _source_choices(fs, index: SourceIndex) -> list[str]:
    """Choices from the source where --help lists none: registry keys or the class enum's members."""
    import ast

    got: list[str] = []
    for reg in fs.registries:
        mod, _, var = reg.rpartition(".")
        m = index.module(mod)
        got += [k.value for k, _ in (m.dict_entries.get(var, []) if m else [])
                if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    if fs.class_enum:
        sym = index.resolve_dotted(fs.class_enum)
        if sym is not None and isinstance(sym.node, ast.ClassDef):
            got += [s.targets[0].id for s in sym.node.body
                    if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)]
    return list(dict.fromkeys(got))


def _findings(auditor: Auditor, refs: References) -> list[Finding]:
    seen, out = set(), []
    cands = sorted(auditor.candidates(), key=lambda c: c.depth)
    for c in cands:
        for flag in sorted(c.selects):
            choices = refs.flags[flag].choices
            for value in [choices[v] for v in sorted(c.selects[flag]) if v in choices]:
                key = (flag, value, c.point.where)
                if key in seen:
                    continue
                g = auditor.gate(c, flag, value)
                if g is None:
                    continue
                seen.add(key)
                fmts = [] if refs.flags[flag].source.kind == "quantization" else sorted(c.formats)  # it names its format
                out.append(Finding(flag=flag, value=value, kind=c.point.kind, at=c.point.where, owner=c.point.owner,
                                   message=c.point.message, via=list(c.via), formats=fmts,
                                   model=c.model(auditor.model_code),
                                   archs={a: verdict_word(v) for a, v in g.archs.items()},
                                   when={a: w for a, w in g.when.items() if a in ARCHS}))
    return out
