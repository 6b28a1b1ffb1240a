"""The study file: what to search, on which engine, under which workload, SLOs and time budget.

A study file is YAML validated by pydantic once, at load, with errors that name the key and say
what would be valid. Flags keep the engine's own spelling (`--moe-runner-backend`), never renamed.

    engine: embedded
    model: tiny
    base: {--max-running-requests: 8}          # the known-good baseline
    axes:
      --moe-runner-backend: [reference, grouped, triton]
      --max-running-requests: {low: 2, high: 16, step: 2}   # numeric range
    workload: {concurrency: [1, 4], input_len: 32, output_len: 16, num_prompts: 12}
    slo: {ttft_ms: 2000}
    reference: {--moe-runner-backend: reference}
    budget: {time_s: 600}
    strategy: staged
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moelab.load.workload import SLO

FlagValue = Union[str, int, float, bool, None]  # True: a bare switch; None/False: leave the flag out
STRATEGIES = ("grid", "one-factor", "staged", "bisect")


class StudyError(ValueError):
    """A study file that cannot be run; the message says what was wrong and what to do."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Range(_Strict):
    """A numeric axis: low..high in steps (inclusive); `log` without a step: eight points spaced
    evenly on a log scale (powers of two for 1..128)."""

    low: float
    high: float
    step: float | None = None
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> "Range":
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        if self.step is not None and self.step <= 0:
            raise ValueError("step must be positive")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self

    @property
    def integer(self) -> bool:
        return float(self.low).is_integer() and float(self.high).is_integer() and \
            (self.step is None or float(self.step).is_integer())

    def values(self) -> list[FlagValue]:
        """Grid points: every step, or five points when no step is given (eight log-spaced ones with
        `log`); each rounded to the step's own decimals (0.57, never 0.5700000000000001).

        >>> Range(low=0.3, high=0.5, step=0.05).values()
        [0.3, 0.35, 0.4, 0.45, 0.5]
        >>> Range(low=1, high=128, log=True).values()
        [1, 2, 4, 8, 16, 32, 64, 128]
        """
        if self.log and not self.step:
            r = self.high / self.low
            return list(dict.fromkeys(self.snap(self.low * r ** (i / 7)) for i in range(8)))
        step = self.step or (self.high - self.low) / 4 or 1
        n = int(round((self.high - self.low) / step + 1e-9))
        return list(dict.fromkeys(self.snap(self.low + i * step) for i in range(n + 1)))

    def snap(self, v: float) -> FlagValue:
        """`v` on this axis's grid: rounded to the step and to its number of decimals."""
        if self.integer:
            return int(round(v))
        if self.log and not self.step:
            return float(f"{min(max(v, self.low), self.high):.3g}")
        step = self.step or (self.high - self.low) / 4 or 1
        decimals = max(0, -math.floor(math.log10(abs(step)))) + 2
        if self.step:
            v = self.low + round((v - self.low) / self.step) * self.step
        return round(min(max(v, self.low), self.high), decimals)


class LoadPlan(_Strict):
    """A study's `workload:`: its load points (one per concurrency). `point` makes the load
    generator's own Workload for one of them, so a load point is defined in one place."""

    concurrency: list[int] = Field(default_factory=lambda: [4])  # one load point per value: a curve
    input_len: int = Field(32, gt=0)
    output_len: int = Field(16, gt=0)
    num_prompts: int = Field(16, gt=0)
    # requests per point = rounds x concurrency (overrides num_prompts); 2 at least, or a point cannot
    # hold its concurrency (the load generator marks it invalid)
    rounds: int | None = Field(None, ge=2)
    seed: int = 0

    def prompts_at(self, concurrency: int) -> int:
        return self.rounds * concurrency if self.rounds else self.num_prompts

    def point(self, concurrency: int, repeat: int, slo: SLO, weight_format: str | None):
        """The load generator's Workload for the point at `concurrency`, repeat `repeat` (a new seed)."""
        from moelab.load import Workload

        return Workload(concurrency=concurrency, input_len=self.input_len, output_len=self.output_len,
                        num_prompts=self.prompts_at(concurrency), seed=self.seed + repeat, slo=slo,
                        weight_format=weight_format, max_loop_lag_ms=50.0)

    @field_validator("concurrency", mode="before")
    @classmethod
    def _listify(cls, v):
        return [v] if isinstance(v, int) else v

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v):
        if not v or any(c <= 0 for c in v):
            raise ValueError("concurrency must be one or more positive integers, e.g. [1, 4]")
        return v


class Budget(_Strict):
    time_s: float = Field(3600, gt=0)  # no new trial starts after this
    trials: int = Field(200, gt=0)


class Staged(_Strict):
    bench_in_screen: bool = True  # benchmark a survivor in the launch that screened it (saves a launch)
    # factorial: every combination of the categorical axes; one-factor: the base, then each value
    # alone, then every combination of the best `keep` values per axis; auto: factorial while it
    # has at most `max_factorial` combinations
    screen: Literal["auto", "factorial", "one-factor"] = "auto"
    max_factorial: int = Field(24, gt=0)
    keep: int = Field(2, gt=0)  # values per axis carried from a one-factor screen into its combinations
    survivors: int = Field(2, gt=0)  # best survivors whose numeric knobs are tuned
    tune_trials: int = Field(10, ge=0)  # launches per survivor for its numeric knobs (equal budgets)
    # a launch-time failure that launches and words cannot attribute: launch each suspect alone
    isolate: bool = True
    finalists: int = Field(2, gt=0)
    repeats: int = Field(3, ge=2)  # measurements per finalist for the confidence interval
    # separate launches per finalist, each with `repeats` load runs: the interval then covers
    # boot-to-boot variance (one interval over launch means), not only repeats on one server
    final_launches: int = Field(2, ge=1)


class Accuracy(_Strict):
    """The accuracy gate: after the probe, `n` items of `task` at `concurrency`, paired with the
    reference configuration's answers (moelab.evaluate's rule: paired difference >= -delta, delta
    the larger of `delta` and the noise of n items at `confidence`). Without a reference the gate
    is `min` alone. A configuration below the gate is never recommended."""

    task: str = "digits"  # a bundled task, a .jsonl of prompt/answer, or lm-eval:NAME
    n: int | None = Field(200, gt=0)
    delta: float = Field(0.0, ge=0, le=1)  # an allowed loss on top of the statistical one
    min: float | None = Field(None, ge=0, le=1)  # an absolute floor on accuracy
    concurrency: int = Field(8, gt=0)
    confidence: float = Field(0.95, gt=0.5, lt=1)


class Launch(_Strict):
    timeout_s: float = Field(300, gt=0)
    memory_limit_gib: float | None = Field(None, gt=0)


class StudyFile(_Strict):
    name: str = "study"
    engine: str = "embedded"
    model: str | None = None  # embedded: a preset (tiny, small) or a directory; others: the model path
    command: list[str] = Field(default_factory=list)  # command engine: the server line with {port}
    base: dict[str, FlagValue] = Field(default_factory=dict)
    axes: dict[str, Union[list[FlagValue], Range]] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    workload: LoadPlan = Field(default_factory=LoadPlan)
    slo: SLO = Field(default_factory=SLO)
    reference: dict[str, FlagValue] | None = None  # flags over base for the probe's reference config
    accuracy: Accuracy | None = None  # a task accuracy gate after the probe (see Accuracy)
    budget: Budget = Field(default_factory=Budget)
    strategy: Literal["grid", "one-factor", "staged", "bisect"] = "staged"
    # what ranks configurations: output tokens/s at the highest workload concurrency (the SLO a
    # filter), goodput there (requests/s meeting every SLO limit), or the highest concurrency whose
    # requests meet the SLO at p90, searched on each launch between the workload's lowest and
    # highest concurrency (load/capacity.py)
    objective: Literal["throughput", "goodput", "max_concurrency_at_slo"] = "throughput"
    staged: Staged = Field(default_factory=Staged)
    launch: Launch = Field(default_factory=Launch)
    bisect: dict[str, FlagValue] | None = None  # bisect: the failing combination (flags over base)

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v):
        from moelab.engines import ENGINES

        if v not in ENGINES:
            import difflib

            near = difflib.get_close_matches(v, ENGINES.names(), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"engine {v!r} is not one moelab knows: {hint}use one of {', '.join(ENGINES.names())}")
        return v

    @field_validator("base", "axes", "reference", "bisect")
    @classmethod
    def _flag_names(cls, v):
        for k in v or {}:
            if not k.startswith("-"):
                raise ValueError(f"{k!r} is not a flag: write it as the engine does, e.g. --{k.lstrip('-')}")
        return v

    @field_validator("axes")
    @classmethod
    def _non_empty(cls, v):
        for k, vals in v.items():
            if isinstance(vals, list) and not vals:
                raise ValueError(f"axis {k} has no values")
        return v

    @model_validator(mode="after")
    def _per_strategy(self) -> "StudyFile":
        from moelab.engines import ENGINES

        if ENGINES.create(self.engine).needs_command and not self.command:
            raise ValueError(f"engine: {self.engine} needs `command:` (the server line, with {{port}})")
        if self.strategy == "bisect" and not self.bisect:
            raise ValueError("strategy: bisect needs `bisect:` (the failing flags, over base)")
        if self.strategy != "bisect" and not self.axes:
            raise ValueError(f"strategy: {self.strategy} needs at least one axis under `axes:`")
        if self.objective != "throughput" and not any(v is not None for v in self.slo.model_dump().values()):
            raise ValueError(f"objective: {self.objective} is measured against the SLO: give `slo:` "
                             "(ttft_ms, itl_ms, tpot_ms or e2e_ms)")
        return self

    def categorical(self) -> dict[str, list[FlagValue]]:
        return {k: v for k, v in self.axes.items() if isinstance(v, list)}

    def numeric(self) -> dict[str, Range]:
        return {k: v for k, v in self.axes.items() if isinstance(v, Range)}

    def axis_values(self, flag: str) -> list[FlagValue]:
        v = self.axes[flag]
        return v.values() if isinstance(v, Range) else list(v)


def _where(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_study(doc: object, source: str = "<study>") -> StudyFile:
    """Validate a parsed YAML document; StudyError names every problem and its key."""
    if not isinstance(doc, dict):
        raise StudyError(f"{source}: a study file is a YAML mapping (engine:, axes:, ...), got {type(doc).__name__}")
    try:
        return StudyFile.model_validate(doc)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                known = ", ".join(StudyFile.model_fields) if len(err["loc"]) == 1 else "see the docs"
                msg = f"unknown key (known keys: {known})"
            lines.append(f"  {_where(err['loc'])}: {msg}")
        raise StudyError(f"{source} is not a valid study file:\n" + "\n".join(lines)) from None


def load_study(path: Path) -> StudyFile:
    path = Path(path)
    if not path.exists():
        raise StudyError(f"no study file at {path}: give the path of a YAML study (see examples/*.yaml)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise StudyError(f"{path} is not valid YAML: {e}") from None
    return parse_study(doc, str(path))
