"""The engine loop: schedule -> build the packed step -> forward -> sample -> hand out events.

It runs in one background thread (torch releases the GIL inside its ops, so the HTTP event loop
stays responsive). `step()` is also callable directly, which is how warm-up and tests drive it.
Events go back through `deliver(list of (sequence, Event))`, called once per step, so a step
with 16 sequences costs the HTTP side one wake-up rather than 16.
"""
from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from moelab.engine.batch import build_step
from moelab.engine.detok import TextStream
from moelab.engine.model import Qwen3Moe
from moelab.engine.sampling import sample
from moelab.engine.scheduler import Scheduler, Sequence


@dataclass
class Event:
    index: int  # choice index within its request
    text: str  # new text since the previous event
    tokens: list = field(default_factory=list)  # [(token id, logprob|None, [(id, logprob)]|None, offset)]
    finish_reason: str | None = None  # "stop" | "length" | "abort"; set on the last event


def phase(name: str, text: str = "") -> None:
    """The startup log line a supervisor parses: `moelab.engine phase=<name> <free text>`."""
    print(f"moelab.engine phase={name} {text}".rstrip(), file=sys.stderr, flush=True)


class Engine:
    def __init__(self, model: Qwen3Moe, tokenizer, scheduler: Scheduler, seed: int = 0) -> None:
        self.model, self.tok, self.sched = model, tokenizer, scheduler
        self.eos = model.cfg.eos_ids
        self.context_len = model.cfg.max_position_embeddings
        # one slot past the pool: the scratch slot that padding rows of a CUDA graph write to
        self.scratch_slot = scheduler.capacity
        self.kv = model.new_kv_cache(scheduler.capacity + 1)
        self.slot_table: torch.Tensor | None = None  # [lanes + 1, width] on CUDA: each lane's cache slots
        if model.kernels:
            width = min(self.context_len, scheduler.capacity)
            self.slot_table = torch.full((scheduler.max_running + 1, width), self.scratch_slot, dtype=torch.int32,
                                         device=model.device)  # the last lane is the padding rows'
        self.graphs = None  # DecodeGraphs once captured
        self.ranks = None  # parallel.ranks.Leader on rank 0 of a multi-rank launch: each step goes to every rank
        self.deliver: Callable[[list[tuple[Sequence, Event]]], None] = lambda evs: None
        self._rng = random.Random(seed)  # seeds the generator of every request that brings no seed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = {"steps": 0, "graph_steps": 0, "decode_steps": 0, "decode_busy_s": 0.0, "prefill_tokens": 0,
                      "decode_tokens": 0, "generated_tokens": 0, "max_batch": 0, "busy_s": 0.0, "finished": 0,
                      "nonfinite_steps": 0, "error": None}
        self.batch_hist: Counter[int] = Counter()  # running sequences per step -> steps
        self.metrics = None  # engine/metrics.EngineMetrics once a server exports them (after warm-up)

    def submit(self, seq: Sequence, stream: bool = False) -> None:
        """Queue a sequence (raises ValueError when it can never fit, Overloaded when the queue is full)."""
        seed = seq.params.seed if seq.params.seed is not None else self._rng.getrandbits(63)
        seq.extra.update(stream=stream, text=TextStream(self.tok, seq.params.stop), logprobs=[], t_submit=time.perf_counter(),
                         generator=torch.Generator(device=self.model.device).manual_seed(seed))
        self.sched.add(seq)

    def step(self) -> int:
        """Run one step; returns the number of sequences in it (0 when there was nothing to do)."""
        t0 = time.perf_counter()
        prefill, decode = self.sched.schedule()
        seqs = prefill + decode
        if not seqs:
            return 0
        if self.ranks is not None:
            self.ranks.send_step(prefill, decode)
        logits = self.forward_step(prefill, decode)  # [B, V]
        if not torch.isfinite(logits).all():
            self.stats["nonfinite_steps"] += 1
            if self.stats["nonfinite_steps"] == 1:
                print(f"moelab.engine non-finite logits in step {self.stats['steps']} "
                      f"(backend {self.model.runner.name})", file=sys.stderr, flush=True)
        choices = sample(logits, seqs, self.eos)
        events = []
        for seq, ch in zip(seqs, choices):
            seq.prefilled = True
            seq.output_ids.append(ch.token)
            ev = self._advance(seq, ch)
            if ev is not None:
                events.append((seq, ev))
        st = self.stats
        st["steps"] += 1
        st["prefill_tokens"] += sum(len(s.prompt_ids) for s in prefill)
        st["decode_tokens"] += len(decode)
        st["generated_tokens"] += len(seqs)
        st["max_batch"] = max(st["max_batch"], len(seqs))
        self.batch_hist[len(seqs)] += 1
        if events:
            self.deliver(events)
        dt = time.perf_counter() - t0
        st["busy_s"] += dt
        if not prefill:  # pure decode steps: what the decode roofline is compared with
            st["decode_steps"] += 1
            st["decode_busy_s"] += dt
        if self.metrics is not None:
            self.metrics.step(dt, decode_only=not prefill)
        return len(seqs)

    def forward_step(self, prefill: list[Sequence], decode: list[Sequence]) -> torch.Tensor | None:
        """The forward of one scheduled step (every rank runs it; logits [B, V] on rank 0 only)."""
        if self.slot_table is not None:
            for seq in prefill:  # a new lane's row: the slots of every position it will have
                n = min(len(seq.slots), self.slot_table.shape[1])
                self.slot_table[seq.lane, :n] = torch.tensor(seq.slots[:n], dtype=torch.int32).to(
                    self.model.device, non_blocking=True)
        if self.graphs is not None and not prefill and len(decode) <= self.graphs.max_batch:
            self.stats["graph_steps"] += 1
            return self.graphs.run(decode)
        return self.model.forward(build_step(prefill, decode, self.model.device, self.slot_table), self.kv)

    def _advance(self, seq: Sequence, ch) -> Event | None:
        """Book one new token; finish the sequence when EOS, a stop string, max_tokens or the context says so."""
        p, n = seq.params, len(seq.output_ids)
        # (token, logprob, top, character offset of the token in the text) -- the offset only when asked
        off = len(self.tok.decode(seq.output_ids[:-1])) if p.logprobs is not None else 0
        entry = (ch.token, ch.logprob, ch.top, off)
        if n == 1 and self.metrics is not None:
            self.metrics.first_token(time.perf_counter() - seq.extra["t_submit"])
        seq.extra["logprobs"].append(entry)
        reason = None
        ids = seq.output_ids
        if ch.token in self.eos and not p.ignore_eos and n >= p.min_tokens:
            reason, ids = "stop", ids[:-1]  # the EOS token is not part of the text
        elif n >= p.max_tokens or seq.length >= self.context_len:
            reason = "length"
        text, hit = seq.extra["text"].push(ids, final=reason is not None)
        if hit and n >= p.min_tokens:
            reason = "stop"
        if reason is not None:
            self.sched.finish(seq, reason)
            self.stats["finished"] += 1
        if reason is None and not seq.extra["stream"]:
            return None  # a non-streaming request only needs its final event
        return Event(seq.extra.get("index", 0), text, [entry], reason)

    def capture_graphs(self, sizes: list[int]) -> None:
        """Capture the decode step for these batch sizes (CUDA, Triton attention, a graph-safe MoE runner)."""
        from moelab.engine.graphs import DecodeGraphs

        assert self.slot_table is not None, "CUDA graphs need the Triton decode attention"
        self.graphs = DecodeGraphs(self.model, self.kv, self.slot_table, self.scratch_slot,
                                   self.slot_table.shape[0] - 1, sizes)

    def abort(self, seq: Sequence) -> None:
        self.sched.abort(seq)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="moelab-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last_log, tokens_at_log = time.monotonic(), 0
        try:
            while not self._stop.is_set():
                if not self.sched.has_work():
                    self.sched.wait_for_work(0.5)
                    if self.ranks is not None:
                        self.ranks.idle()
                    continue
                self.step()
                now = time.monotonic()
                if now - last_log >= 10:  # a heartbeat while busy, so a supervisor sees progress
                    done = self.stats["generated_tokens"]
                    print(f"moelab.engine stats steps={self.stats['steps']} max_batch={self.stats['max_batch']} "
                          f"tok/s={(done - tokens_at_log) / (now - last_log):.1f} {self.sched.stats()}",
                          file=sys.stderr, flush=True)
                    last_log, tokens_at_log = now, done
        except Exception as e:  # the server answers 500 from now on and says why
            if self.ranks is not None:  # the other ranks cannot go on without this one: end the launch
                self.ranks.fail(e)
            self.stats["error"] = f"{type(e).__name__}: {e}"
            print(f"moelab.engine error: {self.stats['error']}", file=sys.stderr, flush=True)
            import traceback

            traceback.print_exc()
            self._fail_all()

    def _fail_all(self) -> None:
        """After a fatal engine error, end every queued and running request (the server answers 500)."""
        with self.sched.cv:
            seqs = list(self.sched.running) + list(self.sched.waiting)
            self.sched.running.clear()
            self.sched.waiting.clear()
        self.deliver([(s, Event(s.extra.get("index", 0), "", [], "error")) for s in seqs])

    def stop(self) -> None:
        self._stop.set()
        with self.sched.cv:
            self.sched.cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.ranks is not None:
            self.ranks.stop(engine_idle=self._thread is None or not self._thread.is_alive())
