"""Advice fitted to the launch it is about: never suggest the value the launch already used.

A rule's advice is written once for every launch ("switch to --moe-runner-backend flashinfer_cutlass
or triton"); a launch that died with triton must not be told to try triton.

    >>> tailor("Use another MoE runner (--moe-runner-backend flashinfer_cutlass or triton).",
    ...        ["--moe-runner-backend", "triton"])
    'Use another MoE runner (--moe-runner-backend flashinfer_cutlass).'
    >>> tailor("Try --attention-backend triton.", ["--attention-backend=triton"])
    'Try --attention-backend other than triton (this launch used it).'
    >>> tailor("Try --attention-backend triton.", ["--attention-backend", "fa3"])
    'Try --attention-backend triton.'
"""
from __future__ import annotations

import re

# `--flag a`, `--flag a or b`, `--flag a, b or c`: the values a piece of advice suggests for a flag
_VALUE = r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*"  # 0.85 or fa3, never the full stop after it
_SUGGESTION = re.compile(rf"(--[a-z][a-z0-9-]*) ({_VALUE}(?:(?:, | or | and |/){_VALUE})*)")
_SEP = re.compile(r", | or | and |/")


def current(args: list[str], flag: str) -> str | None:
    """The value `args` give `flag` (the last one wins, as in argparse), or None."""
    val = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            val = args[i + 1]
        elif a.startswith(flag + "="):
            val = a.split("=", 1)[1]
    return val


def tailor(advice: str | None, args: list[str]) -> str | None:
    if not advice or not args:
        return advice

    def fix(m: re.Match) -> str:
        flag, text = m.group(1), m.group(2)
        have = current(args, flag)
        values = _SEP.split(text)
        if have is None or have not in values:
            return m.group(0)
        rest = [v for v in values if v != have]
        if not rest:
            return f"{flag} other than {have} (this launch used it)"
        return f"{flag} " + (rest[0] if len(rest) == 1 else ", ".join(rest[:-1]) + " or " + rest[-1])

    return _SUGGESTION.sub(fix, advice)
