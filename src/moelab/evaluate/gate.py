"""The accuracy stage: a task at one or more concurrencies, each run judged by the paired rule.

`evaluate` runs a task (bundled name, .jsonl file, `lm-eval:NAME`, or a `Task`) against a live
server at each concurrency and pairs every run with `reference` (a saved `TaskRun`: the reference
configuration's answers to the same items) or, without one, every later run with the first, so an
accuracy that falls only under load shows. This is what a study calls after the probe:

    ref = load_answers(Path("ref.json"))                     # or a TaskRun kept from the reference trial
    report = evaluate(url, "digits", n=300, concurrency=(1, 16), reference=ref, min_delta=0.0)
    report.passed                                            # every decision passed, no request failed
    report.points[-1].run.accuracy, report.points[-1].decision.rule

It raises TaskError / ValueError (bad task, n, levels, a reference of other items), ServerUnreachable
(nothing answers at url) and LmEvalError before or instead of a report; once runs exist, a failing
server shows as errors and wrong answers in them, not as an exception.
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field, computed_field

from moelab.evaluate.decide import Decision, decide
from moelab.evaluate.lm_eval import PREFIX, LmEvalTask, parse_spec, run_lm_eval
from moelab.evaluate.run import TaskRun, check_covers, pair, public_url, run_task
from moelab.evaluate.tasks import Task, load_task
from moelab.probe.http import discover_model


class Point(BaseModel):
    """A run and, when there was something to pair it with, its decision."""

    run: TaskRun
    compared_with: str | None = None  # "reference ref.json" | "concurrency 1"
    decision: Decision | None = None


class EvalReport(BaseModel):
    task: str
    source: str
    model: str
    url: str
    confidence: float
    min_delta: float
    points: list[Point] = Field(default_factory=list)

    @computed_field
    @property
    def passed(self) -> bool:
        """No decision failed and no request failed."""
        return all((p.decision is None or p.decision.passed) and not p.run.errors for p in self.points)


def resolve_task(spec: str | Task | LmEvalTask, n: int | None) -> Task | LmEvalTask:
    """A task spec with its first n items (all when None)."""
    if isinstance(spec, str):
        spec = parse_spec(spec) if spec.startswith(PREFIX) else load_task(spec)
    return spec.head(n)


def evaluate(url: str, task: str | Task | LmEvalTask, *, model: str | None = None, n: int | None = None,
             concurrency: Sequence[int] = (1,), reference: TaskRun | None = None,
             reference_label: str = "reference", confidence: float = 0.95, min_delta: float = 0.0,
             chat: bool = False, timeout_s: float = 60.0) -> EvalReport:
    """Run `task` at each concurrency; judge each run against `reference` or the first run."""
    t = resolve_task(task, n)
    if not concurrency or min(concurrency) < 1:
        raise ValueError(f"concurrency must be one or more positive integers, got {list(concurrency)}")
    decide([(True, True)], confidence, min_delta)  # checks the levels before any request is sent
    if reference is not None and isinstance(t, Task):
        check_covers(reference, t)
    model = model or discover_model(url)[0]
    report = EvalReport(task=t.name, source=t.source, model=model, url=public_url(url), confidence=confidence,
                        min_delta=min_delta)
    for c in concurrency:
        if isinstance(t, Task):
            run = run_task(url, t, model=model, concurrency=c, chat=chat, timeout_s=timeout_s)
        else:
            run = run_lm_eval(url, t, model=model, concurrency=c, chat=chat, timeout_s=timeout_s)
        if reference is not None:
            base, label = reference, reference_label
        elif report.points:
            base, label = report.points[0].run, f"concurrency {report.points[0].run.concurrency}"
        else:
            base = label = None
        dec = decide(pair(base, run), confidence, min_delta) if base is not None else None
        report.points.append(Point(run=run, compared_with=label, decision=dec))
    return report
