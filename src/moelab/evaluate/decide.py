"""The accuracy gate: a candidate configuration against the reference, paired on the same items.

Pure. Input: one (reference correct, candidate correct) pair per item. Of the n items, the
candidate *lost* b (the reference got them right, the candidate wrong) and *gained* c. The paired
difference is (c - b) / n, the candidate's accuracy minus the reference's. The rule:

    pass  iff  (c - b) / n  >=  -delta,   delta = max(min_delta, (z * sqrt(b + c) + 1) / n)

with z the one-sided normal quantile of the confidence level (1.645 at 95 %). The second term is
McNemar's test with continuity correction, one-sided: a loss smaller than it is what the
disagreements alone produce by chance, so it fails only a candidate that is worse with that
confidence. `min_delta` is a loss the user always tolerates, a floor under delta (vLLM's GSM8K
gate grants 0.08, FlashInfer's 0.005). At 95 % on 40 items where the runs disagree only by losses:

    >>> decide([(True, False)] * 4 + [(True, True)] * 36).passed      # 4 lost: -10.0 % >= -10.7 %
    True
    >>> decide([(True, False)] * 5 + [(True, True)] * 35).passed      # 5 lost: -12.5 % <  -11.7 %
    False
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from pydantic import BaseModel, computed_field


class Decision(BaseModel):
    """A paired comparison and its verdict, with every number the rule used."""

    n: int
    reference_correct: int
    candidate_correct: int
    lost: int  # right in the reference, wrong in the candidate
    gained: int  # wrong in the reference, right in the candidate
    difference: float  # candidate accuracy - reference accuracy = (gained - lost) / n
    delta: float  # the allowed loss
    noise_delta: float  # (z * sqrt(lost + gained) + 1) / n
    min_delta: float
    confidence: float
    z: float
    passed: bool

    @computed_field
    @property
    def reference_accuracy(self) -> float:
        return self.reference_correct / self.n

    @computed_field
    @property
    def candidate_accuracy(self) -> float:
        return self.candidate_correct / self.n

    @computed_field
    @property
    def rule(self) -> str:
        """The rule with its numbers, in one line."""
        op = ">=" if self.passed else "<"
        why = (f"max(min_delta {self.min_delta:.2%}, noise {self.noise_delta:.2%})" if self.min_delta
               else f"noise {self.noise_delta:.2%}")
        return (f"{'pass' if self.passed else 'FAIL'}: paired difference {self.difference:+.2%} {op} -{self.delta:.2%} "
                f"(delta = {why}; noise = (z*sqrt(lost+gained)+1)/n = ({self.z:.3f}*sqrt({self.lost}+{self.gained})+1)"
                f"/{self.n}, z at {self.confidence:.0%} one-sided)")


def decide(pairs: Sequence[tuple[bool, bool]], confidence: float = 0.95, min_delta: float = 0.0) -> Decision:
    """Judge (reference correct, candidate correct) per item. ValueError on no items or bad levels."""
    if not pairs:
        raise ValueError("no paired items to compare")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence {confidence} must be in [0.5, 1), e.g. 0.95")
    if not 0 <= min_delta < 1:
        raise ValueError(f"min_delta {min_delta} must be in [0, 1), e.g. 0.01 for one point")
    n = len(pairs)
    lost = sum(r and not c for r, c in pairs)
    gained = sum(c and not r for r, c in pairs)
    z = NormalDist().inv_cdf(confidence)
    noise = (z * math.sqrt(lost + gained) + 1) / n
    delta = max(min_delta, noise)
    diff = (gained - lost) / n
    return Decision(n=n, reference_correct=sum(r for r, _ in pairs), candidate_correct=sum(c for _, c in pairs),
                    lost=lost, gained=gained, difference=diff, delta=delta, noise_delta=noise, min_delta=min_delta,
                    confidence=confidence, z=z, passed=diff >= -delta - 1e-12)  # an exact tie with min_delta passes
