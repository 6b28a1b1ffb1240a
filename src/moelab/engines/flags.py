"""Flag knowledge from the engine itself: its argparse `--help` parsed into flags and choices.

A catalogue is built from the installed engine's help (`vllm serve --help=all`,
`python -m sglang.launch_server --help`), cached per engine version under
`$MOELAB_CACHE/flags/` (default ~/.cache/moelab/flags/), and when the engine is not installed here a
catalogue bundled with moelab (engines/catalogues/) stands in, and says so in `origin`.
`validate` then rejects an unknown flag or value before anything launches, with the nearest
valid spelling, following argparse's own rules (unique-prefix abbreviations are accepted).
"""
from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

BUNDLED_DIR = Path(__file__).parent / "catalogues"
_OPTION_LINE = re.compile(r"^  (-[^\s-]|--[^\s-])")  # an option row in argparse's options section


class FlagInfo(BaseModel):
    name: str  # canonical spelling: the first long option string
    aliases: list[str] = Field(default_factory=list)
    takes_value: bool = True
    nargs: str = "1"  # "1", "?", "*", "+"
    choices: list[str] | None = None


class Catalogue(BaseModel):
    engine: str
    version: str | None
    source: str  # the command whose help this came from
    origin: str = "installed"  # "installed" (parsed now), "cache", or "bundled" (engine absent)
    allow_abbrev: bool = True  # argparse default; both engines keep it
    underscores: bool = False  # vLLM turns --foo_bar into --foo-bar before parsing
    flags: dict[str, FlagInfo] = Field(default_factory=dict)

    def index(self) -> dict[str, FlagInfo]:
        """Every option string (canonical and aliases) -> its flag."""
        out = {}
        for f in self.flags.values():
            for s in [f.name, *f.aliases]:
                out[s] = f
        return out


class FlagProblem(BaseModel):
    flag: str
    value: str | None = None
    message: str
    suggestion: str | None = None  # nearest valid spelling


def _parse_option(opt: str) -> tuple[str, str | None]:
    name, _, meta = opt.strip().partition(" ")
    return name, meta.strip() or None


def parse_help(text: str, engine: str, version: str | None, source: str) -> Catalogue:
    """Turn argparse help text into a catalogue. Only the options sections are read."""
    cat = Catalogue(engine=engine, version=version, source=source, underscores=engine == "vllm")
    for line in text.splitlines():
        if not _OPTION_LINE.match(line):
            continue
        invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        # vLLM prints Literal choices as a Python list: --config-format ['auto', 'hf', 'mistral']
        invocation = re.sub(r"\[((?:'[^']*'(?:, )?)+)\]",
                            lambda m: "{" + ",".join(re.findall(r"'([^']*)'", m.group(1))) + "}", invocation)
        opts = [_parse_option(o) for o in invocation.split(", ")]
        names = [n for n, _ in opts]
        if "--help" in names or "-h" in names:
            continue
        meta = next((m for _, m in opts if m), None)
        canonical = next((n for n in names if n.startswith("--")), names[0])
        info = FlagInfo(name=canonical, aliases=[n for n in names if n != canonical])
        if meta is None:
            info.takes_value, info.nargs = False, "0"
        else:
            m = re.fullmatch(r"\{([^}]*)\}(.*)", meta)
            if m:
                info.choices = m.group(1).split(",")
                rest = m.group(2).strip()
                meta = "X " + rest if rest else "X"  # "{a,b} [{a,b} ...]" is nargs "+"
            if meta.startswith("[") and "..." not in meta:
                info.nargs = "?"
            elif "..." in meta:
                info.nargs = "*" if meta.startswith("[") else "+"
        cat.flags[info.name] = info
    if not cat.flags:
        raise ValueError(f"no flags found in the help output of {source!r}; is it argparse help?")
    return cat


def _resolve(opt: str, cat: Catalogue, index: dict[str, FlagInfo]) -> tuple[FlagInfo | None, str | None]:
    """(flag, None) if argparse would accept `opt`, else (None, nearest valid spelling)."""
    if cat.underscores and opt.startswith("--"):
        opt = opt.replace("_", "-")
    if opt in index:
        return index[opt], None
    if cat.allow_abbrev and opt.startswith("--"):
        hits = {index[s].name for s in index if s.startswith(opt)}
        if len(hits) == 1:
            return index[hits.pop()], None
    near = difflib.get_close_matches(opt, list(index), n=1, cutoff=0.6)
    return None, near[0] if near else None


class ParsedArgs(BaseModel):
    """A command line as argparse would see it: canonical flag -> value(s), and what is wrong."""

    values: dict[str, str | bool | list[str]] = Field(default_factory=dict)
    positionals: list[str] = Field(default_factory=list)
    problems: list[FlagProblem] = Field(default_factory=list)


def _is_value(tok: str) -> bool:
    return not tok.startswith("-") or tok == "-" or re.fullmatch(r"-\d.*", tok) is not None


def parse_args(args: list[str], cat: Catalogue) -> ParsedArgs:
    """Walk `args` with the catalogue's flags, the way argparse would (last occurrence wins)."""
    index, out, i = cat.index(), ParsedArgs(), 0
    while i < len(args):
        a = args[i]
        i += 1
        if _is_value(a):
            out.positionals.append(a)  # vLLM's model tag, or a stray value
            continue
        opt, eq, inline = a.partition("=")
        base = opt.split(".", 1)[0] if cat.underscores else opt  # vLLM: --attention-config.backend X
        flag, near = _resolve(base, cat, index)
        if flag is None:
            hint = f"did you mean {near}?" if near else "not a flag of this engine version"
            out.problems.append(FlagProblem(flag=opt, message=f"unrecognized argument {opt}: {hint}",
                                            suggestion=near))
            continue
        if base != opt:  # a dotted vLLM sub-key always takes one value
            sub = inline if eq else (args[i] if i < len(args) else "")
            i += 0 if eq else 1
            out.values[flag.name + opt[len(base):]] = sub
            continue
        if not flag.takes_value:
            out.values[flag.name] = not flag.name.startswith("--no-") and not opt.startswith("--no-")
            continue
        values: list[str] = [inline] if eq else []
        while not eq and i < len(args) and _is_value(args[i]):
            values.append(args[i])
            i += 1
            if flag.nargs in ("1", "?"):
                break
        if not values and flag.nargs in ("1", "+"):
            out.problems.append(FlagProblem(flag=flag.name, message=f"argument {flag.name}: expected a value"))
        for v in values if flag.choices is not None else []:
            if v in flag.choices or (cat.underscores and v.replace("-", "_") in flag.choices):
                continue
            near_v = difflib.get_close_matches(v, flag.choices, n=1, cutoff=0.5)
            hint = f"did you mean {near_v[0]}? " if near_v else ""
            out.problems.append(FlagProblem(
                flag=flag.name, value=v, suggestion=near_v[0] if near_v else None,
                message=f"argument {flag.name}: invalid choice {v!r}; {hint}choose from {', '.join(flag.choices)}"))
        out.values[flag.name] = values if flag.nargs in ("*", "+") else (values[0] if values else True)
    return out


def validate(args: list[str], cat: Catalogue) -> list[FlagProblem]:
    """Problems argparse would raise on `args` (unknown flag, bad choice, missing value)."""
    return parse_args(args, cat).problems


def cache_dir() -> Path:
    return Path(os.environ.get("MOELAB_CACHE", Path.home() / ".cache" / "moelab")) / "flags"


def bundled(engine: str) -> Catalogue:
    """The newest catalogue shipped with moelab for `engine`."""
    files = sorted(BUNDLED_DIR.glob(f"{engine}-*.json"), key=lambda p: [int(x) if x.isdigit() else 0 for x in
                                                                         re.split(r"[.\-+]", p.stem)[1:]])
    if not files:
        raise FileNotFoundError(f"no bundled flag catalogue for engine {engine!r} in {BUNDLED_DIR}")
    cat = Catalogue.model_validate_json(files[-1].read_text())
    cat.origin = "bundled"
    return cat


def load_or_build(engine: str, version: str | None, help_argv: list[str] | None, timeout_s: float = 120) -> Catalogue:
    """The installed engine's catalogue (cached per version), else the bundled one."""
    if version is None or not help_argv:
        return bundled(engine)
    path = cache_dir() / f"{engine}-{re.sub(r'[^A-Za-z0-9.+_-]', '_', version)}.json"
    if path.exists():
        cat = Catalogue.model_validate_json(path.read_text())
        cat.origin = "cache"
        return cat
    # Help goes to stdout; SGLang/vLLM both print import warnings on stderr, which we ignore.
    out = subprocess.run(help_argv, capture_output=True, text=True, timeout=timeout_s,
                         env={**os.environ, "COLUMNS": "200"})
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(help_argv)} exited {out.returncode}: {out.stderr.strip()[-500:]}")
    cat = parse_help(out.stdout, engine, version, " ".join(help_argv[-3:]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cat.model_dump(mode="json"), indent=1))
    return cat


def flag_verdict(engine: str, cat: Catalogue, args: list[str], env: dict[str, str] | None = None):
    """bad_args Verdict (phase preflight) if the catalogue rejects `args`; None if fine or turned off."""
    from moelab.spec import Cause, Evidence, Phase, Verdict

    if (env or {}).get("MOELAB_NO_FLAG_CHECK", os.environ.get("MOELAB_NO_FLAG_CHECK", "")) in ("1", "true", "yes"):
        return None
    problems = validate(args, cat)
    if not problems:
        return None
    src = f"{engine} {cat.version} flag catalogue ({cat.origin}: {cat.source})"
    fixes = [f"{p.flag} {p.value} -> {p.suggestion}" if p.value else f"{p.flag} -> {p.suggestion}"
             for p in problems if p.suggestion]
    return Verdict(cause=Cause.bad_args, phase=Phase.preflight,
                   evidence=[Evidence(kind="flags", text=p.message, source=src) for p in problems],
                   advice=("Nearest valid spelling: " + "; ".join(fixes) + ". " if fixes else "")
                   + f"Nothing was launched. Check `{engine} --help`; set MOELAB_NO_FLAG_CHECK=1 to let the engine decide.")
