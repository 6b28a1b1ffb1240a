"""Compare one greedy answer with the reference configuration's answer to the same prompt.

Pure functions. Two healthy configurations (another MoE backend, fp8 instead of bf16) do not give
bit-identical logits, so greedy answers may part where two candidate tokens are nearly tied. A
divergence is therefore judged by *where* and *why* it happens: at a near-tie of the reference
(its logprob for the token the candidate chose is within `tie_margin` of its own choice) it is
legitimate; early, at a clear reference preference, it is not. On the shared prefix the chosen
tokens' logprobs must agree within the format's drift tolerance.
"""
from __future__ import annotations

from pydantic import BaseModel

from moelab.probe.checks import Answer


class Tolerance(BaseModel):
    """How far a configuration in this weight format may differ from a bf16-ish reference."""

    mean_drift: float  # mean |logprob - ref logprob| over the shared prefix
    max_drift: float  # worst single position on the shared prefix
    tie_margin: float  # a divergence where the reference's top-2 are this close is legitimate
    min_prefix: float  # an unexplained divergence before this fraction of the answer fails it
    max_failed_fraction: float  # share of prompts that may fail before the server is condemned


# bf16 < fp8 < nvfp4: coarser weights legitimately move logits further (research notes: fp8
# per-tensor and nvfp4 block scales change logits by ~0.1 and ~0.5 nats on small models).
TOLERANCES: dict[str, Tolerance] = {
    "bf16": Tolerance(mean_drift=0.1, max_drift=0.6, tie_margin=0.25, min_prefix=0.5, max_failed_fraction=0.25),
    "fp8": Tolerance(mean_drift=0.3, max_drift=1.2, tie_margin=0.6, min_prefix=0.3, max_failed_fraction=0.34),
    "nvfp4": Tolerance(mean_drift=0.6, max_drift=2.5, tie_margin=1.2, min_prefix=0.2, max_failed_fraction=0.5),
}


def tolerance_for(weight_format: str | None) -> Tolerance:
    """Tolerance by weight format; unknown or None means bf16 (the strictest)."""
    from moelab.formats import FORMATS, QUANTIZATION, tolerance_class

    fmt = (weight_format or "bf16").lower()
    aliases = {"bfloat16": "bf16", "fp16": "bf16", "float16": "bf16", "float32": "bf16", "fp4": "nvfp4",
               "fp8-e4m3": "fp8", "fp8e4m3": "fp8"}
    fmt = aliases.get(fmt) or QUANTIZATION.get(fmt) or fmt  # a format, or an engine's quantization name
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {weight_format!r}; use one of {', '.join(FORMATS)} "
                         "(or an engine's --quantization name)")
    return TOLERANCES[tolerance_class(fmt)]


class Comparison(BaseModel):
    """How one answer relates to its reference answer."""

    identical: bool
    agreement: float  # share of positions (over the longer answer) with the same token
    first_divergence: int | None  # token index where the answers part, None if they never do
    shared_prefix: int
    mean_drift: float | None  # over the shared prefix, where both served logprobs
    max_drift: float | None
    top1_agreement: float | None  # share of shared-prefix positions whose top-1 tokens agree
    tie_gap: float | None  # reference logprob(choice) - logprob(candidate's token) at the divergence
    passed: bool
    reason: str


def _top1(top: dict[str, float]) -> str | None:
    return max(top, key=top.get) if top else None  # type: ignore[arg-type]


def compare(cand: Answer, ref: Answer, tol: Tolerance) -> Comparison:
    a, b = cand.tokens, ref.tokens
    n = min(len(a), len(b))
    div = next((i for i in range(n) if a[i] != b[i]), None)
    if div is None and len(a) != len(b):
        div = n  # one stopped earlier (EOS) than the other
    shared = n if div is None else div
    longest = max(len(a), len(b), 1)
    agreement = sum(1 for i in range(n) if a[i] == b[i]) / longest
    drifts = [abs(x - y) for x, y in zip(cand.token_logprobs[:shared], ref.token_logprobs[:shared])
              if x is not None and y is not None]
    mean_d = sum(drifts) / len(drifts) if drifts else None
    max_d = max(drifts) if drifts else None
    pairs = [(x, y) for x, y in zip(cand.top_logprobs[:shared], ref.top_logprobs[:shared]) if x and y]
    top1 = sum(1 for x, y in pairs if _top1(x) == _top1(y)) / len(pairs) if pairs else None

    gap = None
    if div is not None and div < n and div < len(ref.top_logprobs) and div < len(ref.token_logprobs):
        ref_choice = ref.token_logprobs[div]
        alts = ref.top_logprobs[div]
        if ref_choice is not None and alts:
            # the candidate's token missing from the reference's top-k: its logprob is at most the
            # smallest listed one, so the gap is at least this (a lower bound)
            other = alts.get(a[div], min(alts.values()))
            gap = ref_choice - other

    reasons = []
    if mean_d is not None and mean_d > tol.mean_drift:
        reasons.append(f"mean logprob drift {mean_d:.3f} > {tol.mean_drift}")
    if max_d is not None and max_d > tol.max_drift:
        reasons.append(f"max logprob drift {max_d:.3f} > {tol.max_drift}")
    if div is not None and div < tol.min_prefix * len(b):
        near_tie = gap is not None and gap <= tol.tie_margin
        if not near_tie:
            why = f"reference preferred its token by {gap:.3f} nats" if gap is not None else "no logprobs to explain it"
            reasons.append(f"diverges at token {div} of {len(b)} ({why})")
    passed = not reasons
    reason = "; ".join(reasons) if reasons else ("identical" if div is None else
                                                  f"parts at token {div} of {len(b)}, within tolerance")
    return Comparison(identical=div is None, agreement=agreement, first_divergence=div, shared_prefix=shared,
                      mean_drift=mean_d, max_drift=max_d, top1_agreement=top1, tie_gap=gap,
                      passed=passed, reason=reason)
