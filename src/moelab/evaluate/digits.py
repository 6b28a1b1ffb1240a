"""The bundled exact-answer tasks of the trained `digits` preset: add, sort and reverse digits.

One generator per task, each a pure function of a `random.Random`, shared by the preset's training
script (scripts/train_preset.py, an endless stream) and the shipped held-out item files
(`evaluate/tasks/digits-*.jsonl`, made by `held_out`). A prompt names its task in a word, so the
router has something to specialise on:

    >>> import random
    >>> r = random.Random(0)
    >>> [make(t, r) for t in TASKS]
    [('add 964+494=', '1458'), ('sort 048764=', '044678'), ('rev 593824=', '428395')]

The answer is followed by the end-of-text token in training, so a greedy model stops by itself.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator

MAX_ANSWER_CHARS = 8  # longest answer of any task (sort / rev of 8 digits)


def _digits(r: random.Random) -> str:
    return "".join(r.choice("0123456789") for _ in range(r.randint(3, 8)))


def add(r: random.Random) -> tuple[str, str]:
    """Two three-digit numbers: the digits of each place stand at fixed offsets, the carry still
    runs through all of them (999+1xx ends in 1xxx)."""
    a, b = r.randint(100, 999), r.randint(100, 999)
    return f"add {a}+{b}=", str(a + b)


def sort(r: random.Random) -> tuple[str, str]:
    s = _digits(r)
    return f"sort {s}=", "".join(sorted(s))


def rev(r: random.Random) -> tuple[str, str]:
    s = _digits(r)
    return f"rev {s}=", s[::-1]


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {"add": add, "sort": sort, "rev": rev}


def make(task: str, r: random.Random) -> tuple[str, str]:
    """(prompt, answer) of one item of `task`."""
    return TASKS[task](r)


def held_out(task: str, n: int, seed: int) -> list[tuple[str, str]]:
    """n distinct items of `task` from their own seed: the evaluation set the training stream avoids."""
    r, seen, out = random.Random(f"held-out/{task}/{seed}"), set(), []
    while len(out) < n:
        p, a = make(task, r)
        if p not in seen:
            seen.add(p)
            out.append((p, a))
    return out


def stream(seed: int, avoid: set[str], weights: dict[str, float] | None = None) -> Iterator[tuple[str, str, str]]:
    """Endless (task, prompt, answer) for training, never a prompt in `avoid`; tasks drawn with
    `weights` (default: equally)."""
    r = random.Random(f"train/{seed}")
    names = list(TASKS)
    w = [(weights or {}).get(t, 1.0) for t in names]
    while True:
        task = r.choices(names, w)[0]
        p, a = make(task, r)
        if p not in avoid:
            yield task, p, a
