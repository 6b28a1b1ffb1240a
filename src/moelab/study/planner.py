"""Pure planners: which flag combinations to try, in which order. No processes, no sockets.

A `Candidate` is a set of changes over the study's known-good base flags. Strategies:
  grid        every combination of every axis (numeric ranges expanded to their grid points)
  one_factor  the baseline, then one axis changed at a time, the way engineers do it by hand
  screen      the categorical axes for stage 1 of `staged`: every combination while there are few,
              else one factor at a time (`axis_values`, from the best configuration so far), then
              `combine`
  combine     every combination of the best values per axis that a one-factor screen found
  ddmin       delta debugging for `bisect`: the smallest subset of changes that still fails
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

from moelab.study.file import FlagValue, StudyFile


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


def screen_mode(study: StudyFile) -> str:
    """factorial or one-factor: `auto` keeps the factorial while it stays small."""
    mode = study.staged.screen
    if mode != "auto":
        return mode
    n = 1
    for vals in study.categorical().values():
        n *= len(vals)
    return "factorial" if n <= study.staged.max_factorial else "one-factor"


def screen(study: StudyFile) -> list[Candidate]:
    """Stage 1 of `staged`, numeric knobs at base: every combination of the categorical axes
    (factorial), or the base alone (one-factor: the driver then walks the axes, `axis_values`)."""
    cat = study.categorical()
    names = list(cat)
    if not names:
        return [Candidate((), "screen", note="baseline")]
    if screen_mode(study) == "factorial":
        return [Candidate(tuple(zip(names, c)), "screen") for c in itertools.product(*(cat[n] for n in names))]
    return [Candidate(tuple((n, study.base.get(n, cat[n][0])) for n in names), "screen", note="baseline")]


def axis_values(study: StudyFile, center: dict[str, FlagValue], axis: str) -> list[Candidate]:
    """Adaptive one-factor screen: every other value of `axis` with the other categorical axes as in
    `center` (the best configuration measured so far), so that an axis is judged in a configuration
    that works under load, not only beside a base that may crash."""
    names = list(study.categorical())
    return [Candidate(tuple((n, v if n == axis else center[n]) for n in names), "screen")
            for v in study.categorical()[axis] if v != center[axis]]


def combine(study: StudyFile, best_values: dict[str, list[FlagValue]]) -> list[Candidate]:
    """After a one-factor screen: every combination of each axis's best values (best first)."""
    names = list(study.categorical())
    lists = [best_values.get(n) or [study.base.get(n)] for n in names]
    return [Candidate(tuple(zip(names, c)), "screen") for c in itertools.product(*lists)]


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
    """A flag value that a failed launch was attributed to: every candidate with it fails alike.

    `how` says what attributed it: `named` (the error names the flag and its value), `differs` (a
    launch differing only in it came up), `words` (the error's words point to it) or `alone` (a
    one-launch check of it alone over the base failed the same way); `why` says it in words."""

    flag: str
    value: FlagValue
    cause: str
    trial_id: int
    evidence: str = ""
    hits: list[int] = field(default_factory=list)
    how: str = "named"
    why: str = ""


def blame(changes: tuple[tuple[str, FlagValue], ...], cause: str, evidence: list[str], trial_id: int) -> Blame | None:
    """The single changed flag whose name AND value appear in the failure's evidence, if any.

    Only for causes that are a property of the configuration and not of the load (see
    attribute.DETERMINISTIC); a crash under load is never generalised.
    """
    from moelab.study.attribute import DETERMINISTIC

    if cause not in DETERMINISTIC:
        return None
    named = [(k, v) for k, v in changes
             if any(k in e and str(v) in e for e in evidence)]
    if len(named) != 1:
        return None
    line = next(e for e in evidence if named[0][0] in e)
    return Blame(named[0][0], named[0][1], cause, trial_id, line, why="the error names the flag and its value")


@dataclass(frozen=True)
class Step:
    stage: str
    launches: int  # at most
    how: str


def plan(study: StudyFile) -> list[Step]:
    """What the study will launch, stage by stage, at most (pruning and reuse only lower it):
    what `moelab study --dry-run` prints and what the budget is checked against."""
    out = [Step("reference", 1, "the reference configuration, its greedy answers kept for every probe")] \
        if study.reference is not None else []
    if study.strategy == "bisect":
        n = len(study.bisect or {})
        return out + [Step("bisect", n + 2 * n * max(1, n.bit_length()), f"delta debugging over {n} changes "
                                                                            "(the whole set, each alone, then halves)")]
    if study.strategy == "grid":
        n = grid_size(study)
        return out + [Step("grid", n, " x ".join(str(len(study.axis_values(a))) for a in study.axes)
                           + " combinations"), _final_step(study)]
    if study.strategy == "one-factor":
        return out + [Step("one-factor", len(one_factor(study)), "the baseline, then each axis's values alone"),
                      _final_step(study)]
    cat = study.categorical()
    mode = screen_mode(study)
    full = 1
    for vals in cat.values():
        full *= len(vals)
    if mode == "factorial":
        out.append(Step("screen", full, f"every combination of the categorical axes ({full})"))
    else:
        alone = 1 + sum(len(v) - 1 for v in cat.values())
        combos = 1
        for v in cat.values():
            combos *= min(study.staged.keep, len(v))
        out.append(Step("screen", alone, f"one factor at a time ({full} combinations > max_factorial "
                                         f"{study.staged.max_factorial}): the base, then each axis's other values "
                                         "beside the best configuration so far"))
        out.append(Step("combine", combos, f"every combination of each axis's {study.staged.keep} best values"))
    if not study.staged.bench_in_screen:
        n = sum(s.launches for s in out if s.stage in ("screen", "combine"))
        out.append(Step("bench", n, "each screened configuration that came up, measured in a launch of its own"))
    if study.staged.isolate:
        out.append(Step("isolate", 0, "when a launch failure names no flag: each suspect value alone (2 launches "
                                      "per such failure, none in this count)"))
    if study.numeric() and study.staged.tune_trials:
        out.append(Step("tune", study.staged.survivors * study.staged.tune_trials,
                        f"{study.staged.survivors} survivors x {study.staged.tune_trials} launches: "
                        f"{', '.join(study.numeric())} by line search, strongest effect first"))
    return out + [_final_step(study)]


def _final_step(study: StudyFile) -> Step:
    n, k = study.staged.finalists, study.staged.final_launches
    return Step("final", (k + 1) * n, f"the {n} best measured again in {k} fresh launch{'es' if k > 1 else ''} each, "
                                      f"{study.staged.repeats} load runs per launch (once more for a leader measured "
                                      f"only once); runs even past the budget")


def grid_size(study: StudyFile) -> int:
    n = 1
    for a in study.axes:
        n *= len(study.axis_values(a))
    return n
