"""Continuous batching: which sequences run in the next step, and who owns which KV cache slots.

Plain data and plain functions, no torch: a `Sequence` is one request's state; `Scheduler` keeps
the waiting queue and the running set. Each step runs every running sequence's next token plus the
prompts of the sequences admitted at that step, so new requests join between decode steps and
finished ones leave at once.

KV capacity is a pool of `max_total_tokens` token slots. A sequence reserves prompt + max_tokens
slots when it is admitted, so a running sequence can never run out of cache mid-generation and
nothing has to be preempted; a request that does not fit yet waits in FIFO order, and one that
arrives with the queue full is refused (`Overloaded`). A running sequence also holds one of
`max_running` lanes: the row of the GPU slot table that lists its slots for the attention kernel.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class Overloaded(RuntimeError):
    """The waiting queue is full (HTTP 503)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; N >= 0: the chosen token's logprob plus the top N
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass(eq=False)
class Sequence:
    """One request's state from submission to finish. `sink` receives its events (see runtime.py)."""

    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Any = None
    output_ids: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # KV slot of position p is slots[p]
    lane: int = -1  # row of the engine's slot table while running (0 .. max_running-1)
    prefilled: bool = False
    finish_reason: str | None = None
    aborted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # runtime state: generator, detokenizer ...

    @property
    def need(self) -> int:
        """KV slots reserved for the whole life of this sequence."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class Scheduler:
    """Thread-safe: the HTTP side calls add/abort, the engine thread calls schedule/finish."""

    def __init__(self, max_running: int, max_total_tokens: int, max_queued: int,
                 max_prefill_tokens: int = 8192) -> None:
        self.max_running, self.max_queued, self.max_prefill_tokens = max_running, max_queued, max_prefill_tokens
        self.capacity = max_total_tokens
        self.free: list[int] = list(range(max_total_tokens - 1, -1, -1))  # pop() hands out low slots first
        self.free_lanes: list[int] = list(range(max_running - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.aborted = 0  # sequences dropped because their client went away
        self.cv = threading.Condition()

    def add(self, seq: Sequence) -> None:
        if seq.need > self.capacity:
            raise ValueError(f"the request needs {seq.need} KV cache tokens (prompt {len(seq.prompt_ids)} + "
                             f"max_tokens {seq.params.max_tokens}) but the server holds {self.capacity} "
                             "(--max-total-tokens); lower max_tokens or shorten the prompt")
        with self.cv:
            if len(self.waiting) >= self.max_queued:
                raise Overloaded(f"{len(self.waiting)} requests are already waiting (--max-queued-requests "
                                 f"{self.max_queued}); retry later")
            self.waiting.append(seq)
            self.cv.notify()

    def abort(self, seq: Sequence) -> None:
        with self.cv:
            seq.aborted = True
            self.cv.notify()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def wait_for_work(self, timeout: float) -> None:
        with self.cv:
            if not self.has_work():
                self.cv.wait(timeout)

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """(sequences to prefill now, sequences to decode now); reserves slots for the admitted ones."""
        with self.cv:
            for seq in [s for s in self.running if s.aborted]:
                self._release(seq)
                self.aborted += 1
            while self.waiting and self.waiting[0].aborted:
                self.waiting.popleft()
                self.aborted += 1
            decode = list(self.running)
            prefill: list[Sequence] = []
            budget = self.max_prefill_tokens
            while (self.waiting and len(self.running) < self.max_running and len(self.free) >= self.waiting[0].need
                   and (not prefill or len(self.waiting[0].prompt_ids) <= budget)):
                seq = self.waiting.popleft()
                if seq.aborted:
                    self.aborted += 1
                    continue
                seq.slots = [self.free.pop() for _ in range(seq.need)]
                seq.lane = self.free_lanes.pop()
                budget -= len(seq.prompt_ids)
                self.running.append(seq)
                prefill.append(seq)
            return prefill, decode

    def finish(self, seq: Sequence, reason: str) -> None:
        with self.cv:
            seq.finish_reason = reason
            self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.free.extend(reversed(seq.slots))
            self.free_lanes.append(seq.lane)
            seq.slots, seq.lane = [], -1

    def stats(self) -> dict[str, int]:
        with self.cv:
            return {"running": len(self.running), "waiting": len(self.waiting), "aborted": self.aborted,
                    "kv_tokens_free": len(self.free), "kv_tokens_total": self.capacity}
