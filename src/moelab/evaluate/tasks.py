"""Exact-answer tasks: a JSONL file of prompt/answer items, or a bundled task by name.

One item per line: `{"prompt": "add 12+30=", "answer": "42"}`, with optional `"id"` (default: the
line number) and `"max_tokens"` (default 32). Blank lines are skipped; anything else that is not
such an object is an error naming the file and line. Bundled tasks ship in `evaluate/tasks/`
(the trained `digits` preset's held-out items):

    >>> t = load_task("digits-add")
    >>> t.name, len(t.items), t.items[0].id
    ('digits-add', 200, 'add-000')
    >>> t.items[0].matches(" " + t.items[0].answer + "\\nmore text")
    True

An answer matches when the completion, cut at its first newline and stripped of surrounding
whitespace, equals the expected answer stripped the same way: exact match, no partial credit.
"""
from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field

DEFAULT_MAX_TOKENS = 32


class TaskError(ValueError):
    """The task cannot be read: an unknown name, a missing file, a malformed line."""


def normalise(text: str) -> str:
    """The part of a completion that is compared: up to the first newline, stripped."""
    return text.strip().split("\n", 1)[0].strip()


class Item(BaseModel):
    id: str
    prompt: str
    answer: str
    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1)

    def matches(self, completion: str) -> bool:
        return normalise(completion) == normalise(self.answer)


class Task(BaseModel):
    name: str
    source: str  # the file it was read from
    items: list[Item]

    @property
    def digest(self) -> str:
        """A short hash of the items (ids, prompts, answers): two runs are paired only on one task."""
        h = hashlib.sha256()
        for it in self.items:
            h.update(json.dumps([it.id, it.prompt, it.answer]).encode())
        return h.hexdigest()[:12]

    def head(self, n: int | None) -> "Task":
        """The first n items (all when n is None); TaskError when the task has fewer."""
        if n is None:
            return self
        if not 0 < n <= len(self.items):
            raise TaskError(f"--n {n}: task {self.name} has {len(self.items)} items; give 1..{len(self.items)}")
        return Task(name=self.name, source=self.source, items=self.items[:n])


def _bundled_dir():
    return resources.files("moelab").joinpath("evaluate/tasks")


def bundled_tasks() -> list[str]:
    """Names of the tasks shipped with moelab."""
    return sorted(p.name[:-6] for p in _bundled_dir().iterdir() if p.name.endswith(".jsonl"))


def parse_items(text: str, source: str) -> list[Item]:
    items, seen = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise TaskError(f"{source}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not isinstance(row.get("answer"), str):
            raise TaskError(f"{source}:{n}: each line must be an object with string fields \"prompt\" and "
                            f"\"answer\", got {line[:80]!r}")
        mt = row.get("max_tokens", DEFAULT_MAX_TOKENS)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise TaskError(f"{source}:{n}: \"max_tokens\" must be a positive integer, got {mt!r}")
        item = Item(id=str(row.get("id", n)), prompt=row["prompt"], answer=row["answer"], max_tokens=mt)
        if item.id in seen:
            raise TaskError(f"{source}:{n}: item id {item.id!r} appears twice; ids pair answers across runs")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise TaskError(f"{source} holds no items; write one {{\"prompt\": ..., \"answer\": ...}} object per line")
    return items


def load_task(spec: str) -> Task:
    """A bundled task by name, or a .jsonl file by path. Raises TaskError saying what would work."""
    path = Path(spec)
    if spec.endswith(".jsonl") or path.exists():
        if not path.is_file():
            raise TaskError(f"no such task file: {spec}")
        return Task(name=path.stem, source=str(path), items=parse_items(path.read_text(), str(path)))
    f = _bundled_dir().joinpath(f"{spec}.jsonl")
    if not f.is_file():
        raise TaskError(f"unknown task {spec!r}: give a .jsonl file of prompt/answer lines, or one of "
                        f"{', '.join(bundled_tasks())} (or lm-eval:NAME with lm-evaluation-harness installed)")
    return Task(name=spec, source=f"moelab:evaluate/tasks/{spec}.jsonl", items=parse_items(f.read_text(), spec))
