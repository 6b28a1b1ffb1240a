"""A task's items against a live OpenAI-compatible server: greedy answers, exact match, per item.

`run_task` sends every item once (greedy, `temperature 0`) at a fixed concurrency and returns a
`TaskRun`: one `ItemResult` per item, in item order. A request that fails (HTTP error, refused
connection mid-run) counts as a wrong answer and keeps its error, since that is what a user of
the server would get. `pair` lines two runs up item by item for `decide`. `save_answers` writes a
run for a later comparison; the file keeps each item's prompt and expected answer, so `pair`
refuses a reference made on other items:

    run = run_task("http://127.0.0.1:30000", load_task("digits-add"), concurrency=8)
    run.accuracy, run.errors, [r.completion for r in run.items if not r.correct][:3]
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ValidationError, computed_field

from moelab.evaluate.tasks import Item, Task
from moelab.probe.http import RequestFailed, ServerUnreachable, discover_model, greedy


class ItemResult(BaseModel):
    id: str
    prompt: str
    expected: str
    completion: str | None  # the text the server returned; None when the request failed
    correct: bool
    error: str | None = None
    seconds: float = 0.0
    logprob: float | None = None  # sum of the answer tokens' logprobs, when the server reports them


class TaskRun(BaseModel):
    """One pass over a task's items at one concurrency."""

    task: str
    task_source: str
    model: str
    url: str  # without any user:password part
    endpoint: Literal["completions", "chat"] = "completions"
    concurrency: int
    items: list[ItemResult]
    wall_s: float = 0.0
    harness: str = "moelab"  # or "lm-eval <version>"

    @computed_field
    @property
    def n(self) -> int:
        return len(self.items)

    @computed_field
    @property
    def correct(self) -> int:
        return sum(r.correct for r in self.items)

    @computed_field
    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.items else 0.0

    @computed_field
    @property
    def errors(self) -> int:
        return sum(r.error is not None for r in self.items)

    @computed_field
    @property
    def mean_logprob(self) -> float | None:
        """Mean over items of the answer's log-likelihood (how sure the model was), where reported."""
        lps = [r.logprob for r in self.items if r.logprob is not None]
        return sum(lps) / len(lps) if lps else None


def public_url(url: str) -> str:
    """The URL without credentials (http://user:key@host:port -> http://host:port)."""
    u = urlsplit(url)
    host = u.hostname or ""
    netloc = f"{host}:{u.port}" if u.port else host
    return urlunsplit((u.scheme, netloc, u.path.rstrip("/"), "", ""))


def _ask(url: str, model: str, item: Item, chat: bool, timeout_s: float) -> ItemResult:
    t0 = time.perf_counter()
    p = {"prompt": item.prompt, "messages": [{"role": "user", "content": item.prompt}], "max_tokens": item.max_tokens}
    text, error, lp = None, None, None
    try:
        ans = greedy(url, model, p, chat=chat, timeout_s=timeout_s, top_k=0)
        text = ans.text
        lps = ans.token_logprobs
        lp = sum(lps) if lps and all(x is not None for x in lps) else None
    except (RequestFailed, ServerUnreachable) as e:
        error = str(e)[:300]
    return ItemResult(id=item.id, prompt=item.prompt, expected=item.answer, completion=text,
                      correct=text is not None and item.matches(text), error=error, seconds=time.perf_counter() - t0,
                      logprob=lp)


def run_task(url: str, task: Task, *, model: str | None = None, concurrency: int = 1, chat: bool = False,
             timeout_s: float = 60.0) -> TaskRun:
    """Every item of `task`, greedy, `concurrency` requests in flight. ServerUnreachable when the
    server does not answer /v1/models at all (nothing was run)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    model = model or discover_model(url)[0]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        items = list(pool.map(lambda it: _ask(url, model, it, chat, timeout_s), task.items))
    return TaskRun(task=task.name, task_source=task.source, model=model, url=public_url(url),
                   endpoint="chat" if chat else "completions", concurrency=concurrency, items=items,
                   wall_s=time.perf_counter() - t0)


def _check(ref: dict[str, ItemResult], reference: TaskRun, item_id: str, prompt: str, expected: str) -> ItemResult:
    r = ref.get(item_id)
    if r is None:
        raise ValueError(f"the reference has no answer for item {item_id!r} (it holds {reference.n} items of "
                         f"task {reference.task}); record it on the same task with at least as many items")
    if (r.prompt, r.expected) != (prompt, expected):
        raise ValueError(f"item {item_id!r} differs between the reference and this task (prompt {r.prompt[:40]!r} "
                         f"against {prompt[:40]!r}): the reference was made on another task")
    return r


def check_covers(reference: TaskRun, task: Task) -> None:
    """ValueError unless `reference` answered every item of `task` (checked before any request)."""
    ref = {r.id: r for r in reference.items}
    for it in task.items:
        _check(ref, reference, it.id, it.prompt, it.answer)


def pair(reference: TaskRun, candidate: TaskRun) -> list[tuple[bool, bool]]:
    """(reference correct, candidate correct) for every candidate item. ValueError when the
    reference lacks an item or answered a different prompt under its id."""
    ref = {r.id: r for r in reference.items}
    return [(_check(ref, reference, c.id, c.prompt, c.expected).correct, c.correct) for c in candidate.items]


def save_answers(run: TaskRun, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run.model_dump_json(indent=1) + "\n")


def load_answers(path: Path) -> TaskRun:
    """A TaskRun written by save_answers (`moelab eval --save`). ValueError saying what is wrong."""
    try:
        return TaskRun.model_validate_json(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read the reference answers {path}: {e.strerror}") from None
    except ValidationError as e:
        raise ValueError(f"{path} is not a moelab eval answers file (write one with `moelab eval --save`): "
                         f"{e.errors()[0]['msg']}") from None
