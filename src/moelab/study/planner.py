"""Pure planners: which flag combinations to try, in which order. No processes, no sockets.

A `Candidate` is a set of changes over the study's known-good base flags. Strategies:
  grid        every combination of every axis (numeric ranges expanded to their grid points)
  one_factor  the baseline, then one axis changed at a time, the way engineers do it by hand
  screen      every combination of the categorical axes (stage 1 of `staged`)
  ddmin       delta debugging for `bisect`: the smallest subset of changes that still fails
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

from moelab.study.spec import FlagValue, StudyFile


@dataclass(frozen=True)
class Candidate:
    changes: tuple[tuple[str, FlagValue], ...]  # (flag, value) over the base, in axis order
    stage: str = "grid"
    rep: int = 0  # repeat index (finalists are measured several times)
    note: str = ""

    @property
    def label(self) -> str:
        return " ".join(f"{k.lstrip('-')}={_show(v)}" for k, v in self.changes) or "baseline"

    def flags(self, base: dict[str, FlagValue]) -> dict[str, FlagValue]:
        return merge(base, dict(self.changes))


def _show(v: FlagValue) -> str:
    return "on" if v is True else "off" if v in (None, False) else str(v)


def merge(base: dict[str, FlagValue], changes: dict[str, FlagValue]) -> dict[str, FlagValue]:
    out = dict(base)
    out.update(changes)
    return out


def to_args(flags: dict[str, FlagValue]) -> list[str]:
    """Engine argv from flags: True is a bare switch, None/False leave the flag out."""
    args: list[str] = []
    for k, v in flags.items():
        if v is True:
            args.append(k)
        elif v is not None and v is not False:
            args += [k, str(v)]
    return args


def grid(study: StudyFile) -> list[Candidate]:
    names = list(study.axes)
    combos = itertools.product(*(study.axis_values(n) for n in names))
    return [Candidate(tuple(zip(names, c)), "grid") for c in combos]


def one_factor(study: StudyFile) -> list[Candidate]:
    out = [Candidate((), "one-factor", note="baseline")]
    for name in study.axes:
        for v in study.axis_values(name):
            if study.base.get(name) != v:
                out.append(Candidate(((name, v),), "one-factor"))
    return out


def screen(study: StudyFile) -> list[Candidate]:
    """Stage 1 of `staged`: every combination of the categorical axes, numeric knobs at base."""
    cat = study.categorical()
    names = list(cat)
    if not names:
        return [Candidate((), "screen", note="baseline")]
    return [Candidate(tuple(zip(names, c)), "screen") for c in itertools.product(*(cat[n] for n in names))]


def _split(items: list, n: int) -> list[list]:
    k, m = divmod(len(items), n)
    return [items[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]


def ddmin(changes: list[tuple[str, FlagValue]], fails: Callable[[list[tuple[str, FlagValue]]], bool]
          ) -> list[tuple[str, FlagValue]]:
    """Zeller's delta debugging: a 1-minimal subset of `changes` for which `fails` is still true.

    `fails(subset)` runs (or looks up) the base config plus that subset. The whole set must fail;
    removing any single change from the result makes it pass.
    """
    n = 2
    cur = list(changes)
    while len(cur) >= 2:
        parts = _split(cur, min(n, len(cur)))
        reduced = False
        for p in parts:  # a failing part alone: recurse into it
            if fails(p):
                cur, n, reduced = p, 2, True
                break
        if not reduced:
            for p in parts:  # a failing complement: drop that part
                comp = [c for c in cur if c not in p]
                if comp and fails(comp):
                    cur, n, reduced = comp, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(cur):
                break
            n = min(len(cur), 2 * n)
    return cur


@dataclass
class Blame:
    """A flag value a failed trial's own evidence names: every candidate with it fails alike."""

    flag: str
    value: FlagValue
    cause: str
    trial_id: int
    evidence: str = ""
    hits: list[int] = field(default_factory=list)


def blame(changes: tuple[tuple[str, FlagValue], ...], cause: str, evidence: list[str], trial_id: int) -> Blame | None:
    """The single changed flag whose name AND value appear in the failure's evidence, if any.

    Only for causes that are a property of one argument on this machine (the engine refused it,
    or the backend cannot run on this architecture); a crash under load is never generalised.
    """
    if cause not in ("bad_args", "unsupported_arch"):
        return None
    named = [(k, v) for k, v in changes
             if any(k in e and str(v) in e for e in evidence)]
    if len(named) != 1:
        return None
    line = next(e for e in evidence if named[0][0] in e)
    return Blame(named[0][0], named[0][1], cause, trial_id, line)
