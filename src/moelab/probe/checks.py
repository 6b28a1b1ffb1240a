"""Absolute checks on one greedy answer: NaN/Inf, empty, one repeated token, U+FFFD, loops.

Pure functions on plain data (an `Answer`), no sockets. These checks cannot know what a model
*should* say, so each one only flags a symptom; `judge.py` decides how many symptoms across the
prompt set condemn a server. A random-weight test model legitimately produces odd text, and even
loops, so a single flagged prompt is evidence, not a verdict.
"""
from __future__ import annotations

import math
from collections import Counter

from pydantic import BaseModel, Field


class Answer(BaseModel):
    """One greedy completion, normalised from the legacy completions or the chat logprobs format."""

    text: str = ""
    tokens: list[str] = Field(default_factory=list)  # [N] generated tokens (strings as served)
    token_logprobs: list[float | None] = Field(default_factory=list)  # [N] logprob of each chosen token
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)  # [N] {token: logprob} top-k
    finish_reason: str | None = None
    raw_nonfinite: bool = False  # the JSON itself carried NaN/Infinity/"nan" somewhere in logprobs


class Symptoms(BaseModel):
    """What the absolute checks saw in one answer."""

    nonfinite: bool = False
    empty: bool = False
    repeated_token: str | None = None  # the single token the whole answer collapsed into
    replacement_fraction: float = 0.0  # share of characters that are U+FFFD
    loop_period: int | None = None  # smallest n-gram period that covers most of the answer

    @property
    def names(self) -> list[str]:
        out = []
        if self.nonfinite:
            out.append("non-finite logprob")
        if self.empty:
            out.append("empty output")
        if self.repeated_token is not None:
            out.append(f"one repeated token {self.repeated_token!r}")
        if self.replacement_fraction >= 0.5:
            out.append(f"{self.replacement_fraction:.0%} replacement characters")
        if self.loop_period is not None:
            out.append(f"repeats a {self.loop_period}-token loop")
        return out


def is_finite(x: object) -> bool:
    """A logprob is fine when it is a finite float; None (no logprob served) is not a NaN."""
    if x is None:
        return True
    if isinstance(x, str):  # some servers serialise NaN as the string "nan" / "NaN" / "inf"
        return x.strip().lower() not in ("nan", "-nan", "inf", "-inf", "infinity", "-infinity")
    try:
        return math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def nonfinite(a: Answer) -> bool:
    if a.raw_nonfinite:
        return True
    if not all(is_finite(x) for x in a.token_logprobs):
        return True
    return any(not is_finite(v) for top in a.top_logprobs for v in top.values())


def repeated_token(a: Answer, min_len: int = 4) -> str | None:
    """The token when every generated token is the same one (the `!!!!` failure), else None."""
    toks = a.tokens or list(a.text)  # no token list served: fall back to characters
    if len(toks) >= min_len and len(set(toks)) == 1:
        return toks[0]
    return None


def loop_period(tokens: list[str], max_period: int = 8, cover: float = 0.8, min_len: int = 12) -> int | None:
    """Smallest period p <= max_period such that the answer's tail repeats with period p over at least
    `cover` of its length; p == 1 is `repeated_token`'s job. Greedy decoding of a weak model can loop
    too, which is why this is only a symptom."""
    n = len(tokens)
    if n < min_len:
        return None
    for p in range(2, max_period + 1):
        # count the longest suffix where tokens[i] == tokens[i - p]
        run = 0
        for i in range(n - 1, p - 1, -1):
            if tokens[i] != tokens[i - p]:
                break
            run += 1
        if (run + p) / n >= cover and len(set(tokens[-p:])) > 1:
            return p
    return None


def symptoms(a: Answer) -> Symptoms:
    text = a.text
    empty = not text.strip() and not any(t.strip() for t in a.tokens)
    rep = None if empty else repeated_token(a)
    frac = text.count("\ufffd") / len(text) if text else 0.0
    period = None if rep else loop_period(a.tokens)
    return Symptoms(nonfinite=nonfinite(a), empty=empty, repeated_token=rep, replacement_fraction=frac,
                 loop_period=period)


def most_common_collapse(found: list[Symptoms]) -> tuple[str | None, int]:
    """The repeated token shared by the most collapsed answers, and how many answers share it."""
    c = Counter(f.repeated_token for f in found if f.repeated_token is not None)
    if not c:
        return None, 0
    tok, n = c.most_common(1)[0]
    return tok, n
