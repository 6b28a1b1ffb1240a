"""From per-prompt answers (and optionally the reference's) to one probe Verdict.

Pure. The rules, in order:
  1. any non-finite logprob anywhere                                  -> numerical_nan
  2. absolute collapse: half the prompts (at least 2) collapse into the same repeated token, or
     every prompt gets the very same answer, or half are empty, or half are mostly U+FFFD
                                                                        -> garbage_output
  3. with a reference: more prompts fail the comparison than the format tolerates
                                                                        -> garbage_output
  4. otherwise ok (per-prompt symptoms stay in the evidence as warnings).
A healthy random-weight model answers different prompts differently, so rule 2 does not fire on
it even when some of its answers loop; a broken kernel that emits `!!!!` for everything does.
"""
from __future__ import annotations

import math

from pydantic import BaseModel, Field

from moelab.probe.checks import Answer, Symptoms, most_common_collapse, symptoms
from moelab.probe.compare import Comparison, Tolerance, compare, tolerance_for
from moelab.spec import Cause, Evidence, Phase, Verdict


class PromptResult(BaseModel):
    """One prompt of the set: what came back, what the checks saw, how it compares."""

    id: str
    kind: str = ""
    answer: Answer
    symptoms: Symptoms
    comparison: Comparison | None = None
    error: str | None = None  # the request itself failed (HTTP error, bad JSON)


class ProbeReport(BaseModel):
    verdict: Verdict
    model: str
    base_url: str
    weight_format: str
    reference_used: bool
    reference_path: str | None = None
    prompts: list[PromptResult] = Field(default_factory=list)
    elapsed_s: float = 0.0
    note: str = ""


_ADVICE = {
    Cause.numerical_nan: ("The server returns NaN/Inf logprobs: a kernel or quantization path overflows. "
                          "Try another --moe-runner-backend or --attention-backend, or a wider --dtype."),
    Cause.garbage_output: ("The server answers with degenerate or wrong text. Try the reference "
                           "--moe-runner-backend, another --quantization, or check the weights."),
}


def judge(results: list[PromptResult], *, weight_format: str | None = None,
          reference: dict[str, Answer] | None = None) -> Verdict:
    """Fill each result's comparison (when a reference answer exists) and return the verdict."""
    tol: Tolerance = tolerance_for(weight_format)
    ev: list[Evidence] = []
    answered = [r for r in results if r.error is None]
    for r in results:
        if r.error:
            ev.append(Evidence(kind="probe", text=f"{r.id}: request failed: {r.error}"))
    if not answered:
        return Verdict(cause=Cause.garbage_output, phase=Phase.probe, evidence=ev or [
            Evidence(kind="probe", text="no prompt was answered")], advice=_ADVICE[Cause.garbage_output])

    nan = [r for r in answered if r.symptoms.nonfinite]
    if nan:
        ev += [Evidence(kind="probe", text=f"{r.id}: non-finite logprob in answer {r.answer.text[:40]!r}") for r in nan]
        return Verdict(cause=Cause.numerical_nan, phase=Phase.probe, evidence=ev, advice=_ADVICE[Cause.numerical_nan],
                       detail={"nan_prompts": len(nan), "prompts": len(answered)})

    n = len(answered)
    half = max(2, math.ceil(n / 2)) if n > 1 else 1
    fl = [r.symptoms for r in answered]
    tok, shared = most_common_collapse(fl)
    texts = {r.answer.text for r in answered}
    empty = sum(f.empty for f in fl)
    fffd = sum(f.replacement_fraction >= 0.5 for f in fl)
    garbage: list[str] = []
    if tok is not None and shared >= half:
        garbage.append(f"{shared} of {n} answers are the one token {tok!r} repeated")
    if n >= 3 and len(texts) == 1:
        garbage.append(f"all {n} prompts got the same answer {next(iter(texts))[:40]!r}")
    if empty >= half:
        garbage.append(f"{empty} of {n} answers are empty")
    if fffd >= half:
        garbage.append(f"{fffd} of {n} answers are mostly replacement characters (U+FFFD)")

    failed: list[PromptResult] = []
    if reference is not None:
        for r in answered:
            ref = reference.get(r.id)
            if ref is not None:
                r.comparison = compare(r.answer, ref, tol)
                if not r.comparison.passed:
                    failed.append(r)
        compared = sum(1 for r in answered if r.comparison is not None)
        if compared and len(failed) / compared > tol.max_failed_fraction:
            garbage.append(f"{len(failed)} of {compared} prompts differ from the reference beyond the "
                           f"{weight_format or 'bf16'} tolerance")
    ev += [Evidence(kind="probe", text=f"{r.id}: {r.comparison.reason}") for r in failed if r.comparison]
    ev += [Evidence(kind="probe", text=f"{r.id}: warning: {', '.join(r.symptoms.names)}")
           for r in answered if r.symptoms.names]
    detail = {"prompts": n, "compared": sum(1 for r in answered if r.comparison is not None),
              "failed_comparisons": len(failed), "tolerance": tol.model_dump()}
    if garbage:
        ev = [Evidence(kind="probe", text=g) for g in garbage] + ev
        return Verdict(cause=Cause.garbage_output, phase=Phase.probe, evidence=ev,
                       advice=_ADVICE[Cause.garbage_output], detail=detail)
    return Verdict(cause=Cause.ok, phase=Phase.probe, evidence=ev, detail=detail)


def make_result(pid: str, kind: str, answer: Answer | None, error: str | None = None) -> PromptResult:
    a = answer or Answer()
    return PromptResult(id=pid, kind=kind, answer=a, symptoms=symptoms(a), error=error)
