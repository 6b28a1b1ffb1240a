"""Log-signature rules as data: load them from YAML files beside this package.

Rule file format (one file per engine: `rules/generic.yaml`, `rules/embedded.yaml`,
`rules/vllm.yaml`, `rules/sglang.yaml` ...; `generic` applies to every engine)::

    engine: vllm                     # the engine name this file is for ("generic" = all)
    rules:
      - id: vllm-cuda-oom            # unique, stable: stored with verdicts, cited in tests
        pattern: 'CUDA out of memory'   # Python regex, searched (re.search) in each log line
                                     # after rank/time prefixes are stripped
        cause: gpu_oom               # a spec.Cause value (never a new string)
        kind: root                   # root (default): a root error, the earliest one wins;
                                     # wrapper: a generic "something failed above" line, used
                                     #   only when no root error is found;
                                     # ignore: a known-harmless line (e.g. shutdown noise)
        phase: launch                # optional spec.Phase when the rule knows better than the
                                     # supervisor's phase hint (rarely needed)
        ignore_case: false           # optional
        advice: >-                   # what to do next, in the words of the user's own flags
          Lower --gpu-memory-utilization or --max-num-seqs, or raise --tensor-parallel-size.
        source: sglang#4330          # issue, PR, file or "[gk]" the signature comes from

On each line, `ignore` rules are tried first, then the engine's rules, then the generic ones, and
the first rule that matches decides that line; so an engine file can refine a generic signature. The file lists are small; they are compiled once and cached.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

try:  # Python 3.11+
    import re._parser as _sre  # type: ignore[import-not-found]
    from re._constants import BRANCH, LITERAL, SUBPATTERN  # type: ignore[import-not-found]
except ImportError:  # Python 3.10
    import sre_parse as _sre  # type: ignore[no-redef]
    from sre_constants import BRANCH, LITERAL, SUBPATTERN  # type: ignore[no-redef]

from moelab.spec import Cause, Phase

RULES_DIR = Path(__file__).parent / "rules"
KINDS = ("root", "wrapper", "ignore")


@dataclass(frozen=True)
class Rule:
    id: str
    regex: re.Pattern
    cause: Cause
    kind: str = "root"
    phase: Phase | None = None
    advice: str = ""
    source: str = ""
    engine: str = "generic"
    # One literal (lower case) that every match of each top-level alternative must contain, or
    # None when some alternative has none: a line holding none of them cannot match (a fast skip).
    literals: tuple[str, ...] | None = field(default=None, compare=False)


def required_literals(pattern: str, min_len: int = 3) -> tuple[str, ...] | None:
    """Literals (lower-cased) of which every match of `pattern` contains at least one; None when
    some way to match needs no plain run of `min_len` characters. Each alternative gives its longest
    plain run or, lacking one, the literals of the branches of a group it must pass through.

        >>> required_literals(r"CUDA out of memory\\. Tried|cudaMalloc(?:Async)? failed")
        ('cuda out of memory. tried', 'cudamalloc')
        >>> required_literals(r"(?:couldn.t|failed to) (?:bind|listen)\\b|^(?:sh|bash): \\S+: not found$")
        (': not found', 'couldn', 'failed to')
        >>> required_literals(r"\\) must be <|x") is None
        True
    """
    try:
        parsed = _sre.parse(pattern)
    except re.error:
        return None
    found = _required(list(parsed), min_len)
    return tuple(sorted(found)) if found else None


def _required(seq, min_len: int) -> set[str] | None:
    best, run, through = "", "", None
    for op, av in _flatten(seq):
        if op is LITERAL:
            run += chr(av)
            best = max(best, run, key=len)
            continue
        run = ""
        if through is None and op in (BRANCH, SUBPATTERN):
            # a group the match must pass through: each of its branches has its own literals
            branches = av[1] if op is BRANCH else [av[-1]]
            sets = [_required(list(b), min_len) for b in branches]
            if all(sets):
                through = set().union(*sets)
    if len(best.strip()) >= min_len:
        return {best.lower()}
    return through


def _flatten(seq):
    """The ops of a sequence, with plain groups (no alternation inside) opened in place."""
    for op, av in seq:
        if op is SUBPATTERN and not any(o is BRANCH for o, _ in av[-1]):
            yield from _flatten(list(av[-1]))
        else:
            yield op, av


class RuleError(ValueError):
    """A rule file is malformed; the message names the file, the rule and what to fix."""


def parse_rules(text: str, origin: str = "<string>") -> list[Rule]:
    """Rules from the YAML text of one rule file; raises RuleError naming the bad rule."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise RuleError(f"{origin}: not valid YAML: {e}") from None
    engine = str(doc.get("engine", "generic"))
    out, seen = [], set()
    for i, raw in enumerate(doc.get("rules") or []):
        where = f"{origin}: rule #{i + 1} ({raw.get('id', '?') if isinstance(raw, dict) else raw!r})"
        if not isinstance(raw, dict) or not raw.get("id") or not raw.get("pattern"):
            raise RuleError(f"{where}: every rule needs an `id` and a `pattern`")
        if raw["id"] in seen:
            raise RuleError(f"{where}: duplicate id")
        seen.add(raw["id"])
        try:
            cause = Cause(raw.get("cause", "unknown"))
            phase = Phase(raw["phase"]) if raw.get("phase") else None
        except ValueError as e:
            raise RuleError(f"{where}: {e}; use a value from moelab.spec") from None
        kind = raw.get("kind", "root")
        if kind not in KINDS:
            raise RuleError(f"{where}: kind {kind!r} is not one of {KINDS}")
        try:
            regex = re.compile(raw["pattern"], re.IGNORECASE if raw.get("ignore_case") else 0)
        except re.error as e:
            raise RuleError(f"{where}: bad regex: {e}") from None
        out.append(Rule(id=raw["id"], regex=regex, cause=cause, kind=kind, phase=phase,
                        advice=" ".join(str(raw.get("advice", "")).split()),
                        source=str(raw.get("source", "")), engine=engine,
                        literals=required_literals(raw["pattern"])))
    return out


@lru_cache(maxsize=16)
def load_rules(engine: str | None = None, rules_dir: Path = RULES_DIR) -> tuple[Rule, ...]:
    """The engine's own rules (if it has a file) followed by the generic rules."""
    files = []
    if engine and engine != "generic" and (rules_dir / f"{engine}.yaml").exists():
        files.append(rules_dir / f"{engine}.yaml")
    files.append(rules_dir / "generic.yaml")
    rules: list[Rule] = []
    for f in files:
        rules += parse_rules(f.read_text(), str(f.name))
    # Known-harmless lines are recognised before anything else could misread them.
    return tuple(sorted(rules, key=lambda r: r.kind != "ignore"))


def rule_engines(rules_dir: Path = RULES_DIR) -> list[str]:
    """Engines that have a rule file of their own."""
    return sorted(p.stem for p in rules_dir.glob("*.yaml") if p.stem != "generic")
