"""The effective configuration: what the engine says it ran, beside what its flags asked for.

Engines replace requested values without failing: vLLM's CPU platform takes `--attention-backend
FLASH_ATTN` and logs only "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."; an `auto`
resolves to a backend nobody asked for (vllm#31085: NVFP4 on SM120 landing on Marlin). So a trial
keeps, per setting, the requested value, what the engine's own log says it used, and the log line
that says so. Where no line says, the setting is "not reported by the engine", never a guess.

The signatures are data, in each engine's rule file (`diagnose/rules/<engine>.yaml`, section
`effective:`, every one with its source):

    effective:
      flags:                         # which of the engine's own flags requests each setting
        moe_runner: --moe-backend
        cuda_graph: {switch: --enforce-eager, means: "off"}   # a switch that requests a value
      aliases:                       # the log's name for a flag value, per setting
        moe_runner: {vllm_cutlass: cutlass}
      signatures:
        - id: vllm-moe-backend-chosen
          pattern: "Using '?(?P<moe_runner>\\w+)'? (?:\\w+ )*MoE backend out of potential backends"
          map: {moe_runner: {...}}   # optional: a logged value -> the setting's value (null: says nothing)
          refused: false             # true: the groups name a value the engine would not use
          source: vllm fused_moe oracle; tests/logs/vllm-31085-nvfp4-b12x-sm120.log

Named groups of a pattern are setting names (`SETTINGS`). The first line that reports a setting
decides it. A logged `auto` (or a value mapped to null) reports nothing. An engine without a
section of its own (`command`) is read with whichever engine's signatures match its log best.

    >>> e = read(["INFO [cuda.py:378] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN']."],
    ...          ["serve", "m", "--attention-backend", "TRITON_ATTN"], "vllm")
    >>> e.get("attention").describe()
    'asked TRITON_ATTN, ran FLASH_ATTN'
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from moelab.spec import LaunchSpec

RULES_DIR = Path(__file__).parent.parent / "diagnose" / "rules"
# What a study compares across MoE bring-ups, in this order everywhere (store, report, --json).
SETTINGS = ("moe_runner", "fp4_gemm", "fp8_gemm", "attention", "quantization", "kv_cache_dtype", "cuda_graph")
NOT_REPORTED = "not reported by the engine"


def norm(value: object) -> str:
    """A value as compared: lower case, `-` as `_`, quotes dropped (`'FLASH-ATTN'` -> `flash_attn`)."""
    return str(value).strip().strip("'\"").lower().replace("-", "_")


class Setting(BaseModel):
    """One setting of a launch: the value asked for, the value the engine reported, and where it said so."""

    name: str  # one of SETTINGS
    flag: str | None = None  # the engine's flag that requests it (None: the engine has none)
    requested: str | None = None  # as given on the command line; None: not given
    ran: str | None = None  # as the engine logged it; None: the log does not say
    refused: str | None = None  # a value the engine said it could not use
    line: int | None = None  # 1-based line of the log that said it
    text: str | None = None  # that line
    source: str | None = None  # the signature's id

    @property
    def status(self) -> str:
        """as asked | replaced | resolved (nothing or auto asked, the engine chose) | refused (it would not
        use the value and did not say what it used instead) | not reported"""
        asked = self.requested is not None and norm(self.requested) != "auto"
        if self.ran is None:
            if self.refused is not None and (not asked or norm(self.refused) == norm(self.requested)):
                return "refused"
            return "not reported"
        if not asked:
            return "resolved"
        return "as asked" if norm(self.ran) == norm(self.requested) else "replaced"

    @property
    def changed(self) -> bool:
        """The engine did not run what was asked (replaced it, or refused it)."""
        return self.status in ("replaced", "refused")

    def describe(self) -> str:
        """`asked flashinfer_trtllm, ran flashinfer_cutlass`, in the words a report and a verdict use."""
        asked = self.requested if self.requested is not None else "nothing"
        if self.status == "not reported":
            return f"asked {asked}, ran: {NOT_REPORTED}" if self.requested is not None else NOT_REPORTED
        if self.status == "refused":
            return f"asked {self.refused}: the engine refused it; ran: {NOT_REPORTED}"
        if self.status == "resolved":
            return f"{'auto' if self.requested is not None else 'not asked'}: ran {self.ran}"
        return f"asked {asked}, ran {self.ran}"


class Effective(BaseModel):
    """The effective configuration of one launch (every setting in SETTINGS, in order)."""

    signatures: str | None = None  # whose signatures read the log (an engine name); None: none matched
    settings: list[Setting] = Field(default_factory=list)

    def get(self, name: str) -> Setting | None:
        return next((s for s in self.settings if s.name == name), None)

    @property
    def changed(self) -> list[Setting]:
        return [s for s in self.settings if s.changed]

    @property
    def reported(self) -> list[Setting]:
        return [s for s in self.settings if s.ran is not None]

    def lines(self) -> list[str]:
        """One line per setting the launch asked for or the engine reported: what the verdict shows."""
        return [f"{s.name.replace('_', ' ')}: {s.describe()}" + (f" [{s.flag}]" if s.flag and s.requested else "")
                for s in self.settings if s.requested is not None or s.ran is not None or s.refused is not None]


@dataclass(frozen=True)
class Signature:
    id: str
    regex: re.Pattern
    groups: tuple[str, ...]
    maps: dict[str, dict[str, str | None]] = field(default_factory=dict)
    refused: bool = False
    source: str = ""


@dataclass(frozen=True)
class Section:
    engine: str
    flags: dict[str, tuple[tuple[str, ...], str | None]]  # setting -> (flag names, value a switch means)
    aliases: dict[str, dict[str, str]]
    signatures: tuple[Signature, ...]


class SignatureError(ValueError):
    """An `effective:` section that cannot be used; the message names the file and the entry."""


def parse_section(doc: dict, origin: str) -> Section | None:
    """The `effective:` section of one parsed rule file, or None when it has none."""
    sec = (doc or {}).get("effective")
    if not sec:
        return None
    flags: dict[str, tuple[tuple[str, ...], str | None]] = {}
    for name, f in (sec.get("flags") or {}).items():
        if name not in SETTINGS:
            raise SignatureError(f"{origin}: effective.flags: {name!r} is not a setting ({', '.join(SETTINGS)})")
        if isinstance(f, dict):
            flags[name] = ((f["switch"],) if isinstance(f["switch"], str) else tuple(f["switch"]), str(f["means"]))
        else:
            flags[name] = ((f,) if isinstance(f, str) else tuple(f), None)
    sigs = []
    for i, raw in enumerate(sec.get("signatures") or []):
        where = f"{origin}: effective signature #{i + 1} ({raw.get('id', '?')})"
        try:
            rx = re.compile(raw["pattern"])
        except (KeyError, re.error) as e:
            raise SignatureError(f"{where}: needs a valid `pattern` ({e})") from None
        groups = tuple(rx.groupindex)
        bad = [g for g in groups if g not in SETTINGS]
        if not raw.get("id") or not groups or bad:
            raise SignatureError(f"{where}: needs an `id` and named groups that are settings "
                                 f"({', '.join(SETTINGS)}); got {', '.join(groups) or 'none'}")
        maps = {k: {norm(a): (None if b is None else str(b)) for a, b in m.items()}
                for k, m in (raw.get("map") or {}).items()}
        sigs.append(Signature(raw["id"], rx, groups, maps, bool(raw.get("refused")), str(raw.get("source", ""))))
    aliases = {k: {norm(a): norm(b) for a, b in m.items()} for k, m in (sec.get("aliases") or {}).items()}
    return Section(str(doc.get("engine")), flags, aliases, tuple(sigs))


@lru_cache(maxsize=16)
def section(engine: str, rules_dir: Path = RULES_DIR) -> Section | None:
    """The engine's `effective:` section from its rule file, or None when it has none."""
    p = rules_dir / f"{engine}.yaml"
    if not p.exists():
        return None
    return parse_section(yaml.safe_load(p.read_text()) or {}, p.name)


def sections(rules_dir: Path = RULES_DIR) -> list[Section]:
    return [s for p in sorted(rules_dir.glob("*.yaml")) if (s := section(p.stem, rules_dir)) is not None]


def requested(args: list[str], sec: Section) -> dict[str, tuple[str, str | None]]:
    """setting -> (the flag named, the value asked) for each setting the section has a flag for."""
    spec = LaunchSpec(args=list(args))
    out: dict[str, tuple[str, str | None]] = {}
    for name, (names, means) in sec.flags.items():
        if means is not None:  # a switch: present means `means`
            hit = next((n for n in names if n in args), None)
            out[name] = (hit or names[0], means if hit else None)
        else:
            hit = next(((n, v) for n in names if (v := spec.flag(n)) is not None), None)
            out[name] = hit or (names[0], None)
    return out


def _matches(lines: list[str], sec: Section) -> list[tuple[int, str, Signature, re.Match]]:
    out = []
    for i, ln in enumerate(lines, 1):
        for sig in sec.signatures:
            m = sig.regex.search(ln)
            if m:
                out.append((i, ln, sig, m))
    return out


def read_with(lines: list[str], args: list[str], sec: Section | None) -> Effective:
    """The effective configuration from `lines` with one section's signatures (pure)."""
    if sec is None:
        return Effective(settings=[Setting(name=n) for n in SETTINGS])
    asked = requested(args, sec)
    found: dict[str, dict] = {}
    for i, ln, sig, m in _matches(lines, sec):
        for g in sig.groups:
            raw = m.group(g)
            if raw is None:
                continue
            value: str | None = raw.strip("'\"")
            mp = sig.maps.get(g, {})
            if norm(raw) in mp:
                value = mp[norm(raw)]
            elif "*" in mp:
                value = mp["*"]
            if value is None or norm(value) == "auto":
                continue  # the line says nothing about what ran
            slot = found.setdefault(g, {})
            key = "refused" if sig.refused else "ran"
            if key not in slot:  # the first line that says it decides
                slot[key] = value
                slot.setdefault("at", (i, ln, sig.id))
    settings = []
    for n in SETTINGS:
        flag, req = asked.get(n, (None, None))
        f = found.get(n, {})
        at = f.get("at", (None, None, None))
        ran = f.get("ran")
        aliases = sec.aliases.get(n, {})
        if ran is not None and norm(ran) in aliases and req is not None and aliases[norm(ran)] == norm(req):
            ran = req  # the log's name for the same value (vLLM's VLLM_CUTLASS is --moe-backend cutlass)
        settings.append(Setting(name=n, flag=flag, requested=req, ran=ran, refused=f.get("refused"),
                                line=at[0], text=at[1], source=at[2]))
    return Effective(signatures=sec.engine if found else None, settings=settings)


def read(lines: list[str], args: list[str], engine: str, rules_dir: Path = RULES_DIR) -> Effective:
    """The effective configuration of a launch of `engine` with `args`, from its log lines. An engine
    without signatures of its own is read with the section whose signatures match most lines."""
    own = section(engine, rules_dir)
    if own is not None:
        return read_with(lines, args, own)
    best, hits = None, 0
    for sec in sections(rules_dir):
        n = len(_matches(lines, sec))
        if n > hits:
            best, hits = sec, n
    return read_with(lines, args, best)


def identity(flags: dict, effective: dict | None) -> dict:
    """The configuration a trial really measured: its flags, with every setting the engine reported
    put in as the value it ran (under the flag that requests it). Two trials with the same identity
    measured the same thing (`auto` that ran triton is `triton`); a setting the engine did not report
    keeps its requested value, so nothing unreported is ever merged.

        >>> identity({"--moe-runner-backend": "auto"}, {"settings": [{"name": "moe_runner",
        ...     "flag": "--moe-runner-backend", "requested": "auto", "ran": "triton"}]})
        {'--moe-runner-backend': 'triton'}
    """
    out = {k: (norm(v) if isinstance(v, str) else v) for k, v in (flags or {}).items()}
    for s in (effective or {}).get("settings") or []:
        if s.get("ran") is not None and s.get("flag"):
            out[s["flag"]] = norm(s["ran"])
        elif s.get("ran") is not None:
            out[f"<{s['name']}>"] = norm(s["ran"])  # reported without a flag: still part of what ran
    return out
