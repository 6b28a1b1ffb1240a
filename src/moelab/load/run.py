"""`run_load` (one load point) and `sweep` (several): schedule, send, measure, judge validity.

Scheduling: fixed concurrency = N workers pulling the next request; a rate = Poisson arrivals
(seeded exponential gaps), each request sent at its scheduled time and its lateness recorded. A
watchdog task measures the client's own event-loop lag. Probe prompts mixed into the load are
answered greedily under the same load and judged like `moelab probe` (against the reference when
given): some kernel bugs only show at higher batch sizes.
"""
from __future__ import annotations

import asyncio
import gc
import json
import math
import random
import time
import urllib.request
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from moelab.load import prompts as P
from moelab.load import server_metrics
from moelab.load.client import Endpoint, Sample, clock_offset, open_socket, send
from moelab.load.stats import Dist, Metrics, achieved_concurrency, dist, summarize, validity
from moelab.load.workload import Workload
from moelab.probe import bundled_prompts, discover_model, judge, load_reference, render
from moelab.probe.checks import Answer
from moelab.probe.http import RequestFailed, parse_answer
from moelab.probe.judge import make_result
from moelab.secrets import auth_headers
from moelab.spec import Verdict


class LoadResult(BaseModel):
    workload: Workload
    base_url: str
    model: str
    samples: list[Sample]  # raw, per request (probe prompts included, kind == "probe")
    metrics: Metrics
    valid: bool
    invalid_reasons: list[str] = Field(default_factory=list)
    loop_lag_ms: Dist
    delivered: dict[str, float] = Field(default_factory=dict)  # achieved rate / concurrency
    prompt_len_source: str = ""
    correctness: Verdict | None = None  # the under-load probe's verdict (None: no probe prompts)
    server: server_metrics.ServerWindow | None = None  # the server's own /metrics over this point
    findings: list[str] = Field(default_factory=list)  # what the server's figures say beside the client's


def alive(base_url: str, timeout_s: float = 5.0, api_key: str | None = None) -> bool:
    """GET /health (or /v1/models for servers without one) answers 200."""
    for path in ("/health", "/v1/models"):
        try:
            req = urllib.request.Request(base_url.rstrip("/") + path, headers=auth_headers(api_key))
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                if r.status == 200:
                    return True
        except Exception:
            continue
    return False


def _requests(w: Workload, model: str, base_url: str, probes: list[dict]) -> tuple[list[tuple], str]:
    """[(kind, path, body, probe_id)] in send order, and the prompt-length source."""
    if w.dataset is not None:
        pairs, source = P.dataset(w.dataset, w.num_prompts, w.output_len, w.seed), f"dataset {w.dataset.name}"
    else:
        texts, source = P.synthetic(w.num_prompts, w.input_len, w.seed, tokenizer=w.tokenizer,
                                    base_url=base_url, model=model)
        pairs = [(t, w.output_len) for t in texts]
    out: list[tuple] = []
    for i, (prompt, n) in enumerate(pairs):
        body = {"model": model, "prompt": prompt, "max_tokens": n, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.0}
        if w.fixed_output:
            body.update(ignore_eos=True, min_tokens=n)
        out.append(("load", "/v1/completions", body, None))
        if probes and w.probe_every and (i + 1) % w.probe_every == 0:
            p = probes[(i // w.probe_every) % len(probes)]
            out.append(("probe", "/v1/completions", {"model": model, "prompt": p["prompt"], "max_tokens": p["max_tokens"],
                        "temperature": 0.0, "top_p": 1.0, "seed": 0, "logprobs": 5}, p["id"]))
    return out, source


async def _lag_watch(lags: list[float], stop: asyncio.Event, tick: float = 0.005) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(tick)
        lags.append(max(0.0, (time.perf_counter() - t - tick) * 1e3))


async def _drive(ep: Endpoint, w: Workload, reqs: list[tuple], on_done: Callable[[], None]) -> tuple[list[Sample], list[float]]:
    samples = [Sample(kind=k, requested_output=b.get("max_tokens")) for k, _, b, _ in reqs]
    lags: list[float] = []
    stop = asyncio.Event()
    watch = asyncio.create_task(_lag_watch(lags, stop))

    off = clock_offset()  # once per run: kernel receive stamps -> perf_counter clock

    async def one(i: int, connecting: asyncio.Task | None = None) -> None:
        _, path, body, _ = reqs[i]
        await send(ep, path, body, samples[i], w.timeout_s, off, connecting)
        on_done()

    t0 = time.perf_counter() + 0.01
    if w.concurrency is not None:
        it = iter(range(len(reqs)))

        async def worker() -> None:
            for i in it:  # a shared iterator: each worker takes the next request when it is free
                samples[i].scheduled = time.perf_counter()
                await one(i)
        await asyncio.gather(*(worker() for _ in range(w.concurrency)))
    else:
        rng = random.Random(w.seed)
        rate = w.request_rate or math.inf
        cap = asyncio.Semaphore(w.max_concurrency) if w.max_concurrency else None
        tasks, due = [], t0
        for i in range(len(reqs)):
            samples[i].scheduled = due
            # connect while waiting for the due time: connecting is the client's own work and
            # must not make the request late (the server sees only the request)
            connecting = asyncio.create_task(open_socket(ep, w.timeout_s)) if cap is None else None
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if cap is not None:
                await cap.acquire()

            async def capped(i: int = i, c: asyncio.Task | None = connecting) -> None:
                try:
                    await one(i, c)
                finally:
                    if cap is not None:
                        cap.release()
            tasks.append(asyncio.create_task(capped()))
            if not math.isinf(rate):
                due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    stop.set()
    await watch
    return samples, lags


def _judge_probes(samples: list[Sample], reqs: list[tuple], ref: dict | None, w: Workload) -> Verdict | None:
    results, ref_answers = [], {}
    for s, (kind, _, _, pid) in zip(samples, reqs):
        if kind != "probe" or s.error:
            continue
        key = f"{pid}@{len(results)}"
        try:
            ans = parse_answer(json.loads(s.body or "{}"), chat=False)
            results.append(make_result(key, "under_load", ans))
        except (RequestFailed, ValueError) as e:
            results.append(make_result(key, "under_load", None, error=str(e)))
        if ref is not None and pid in ref["answers"]:
            ref_answers[key] = Answer.model_validate(ref["answers"][pid])
    if not results:
        return None
    return judge(results, weight_format=w.weight_format, reference=ref_answers if ref is not None else None)


def run_load(base_url: str, workload: Workload, *, model: str | None = None, reference: Path | None = None,
             progress: bool = False, api_key: str | None = None) -> LoadResult:
    """Run one load point. Raises ServerUnreachable if the server does not answer before the run,
    RequestFailed if it refuses (401/403 without the right API key, 404 not an OpenAI API)."""
    found, _ = discover_model(base_url, api_key=api_key)
    model = model or found
    ref = load_reference(reference) if reference is not None else None
    probes = [p for p in (ref["prompts"] if ref else render(bundled_prompts(), None)) if not p.get("long")]
    w = workload
    if ref is not None and w.probe_every == 0:
        w = w.model_copy(update={"probe_every": 8})
    reqs, source = _requests(w, model, base_url, probes)
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from moelab.cli.output import err_console

        bar = Progress(TextColumn(f"[bold]{w.label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=err_console, transient=True)
        task = bar.add_task("requests", total=len(reqs))
        bar.start()
    # The garbage collector would pause the loop for milliseconds in the middle of a stream and
    # shift every timestamp behind the pause; the run's objects are freed by refcounting anyway.
    scraper = server_metrics.Scraper(base_url, w.scrape_s, api_key).start() if w.scrape_s else None
    gc.collect()
    gc_was = gc.isenabled()
    gc.disable()
    t_load = time.monotonic()
    try:
        samples, lags = asyncio.run(_drive(Endpoint(base_url, api_key), w, reqs,
                                           (lambda: bar.advance(task)) if bar else (lambda: None)))
    finally:
        if gc_was:
            gc.enable()
        if bar:
            bar.stop()
        if scraper is not None:
            scraper.mark(t_load, time.monotonic())
    server = scraper.stop() if scraper is not None else None
    up = alive(base_url, api_key=api_key)
    metrics = summarize(samples, w.slo, None if w.dataset else w.input_len)
    reasons = validity(samples, w, lags, up)
    delivered = {"concurrency": achieved_concurrency(samples)}
    starts = sorted(s.start for s in samples)
    if len(starts) > 1 and starts[-1] > starts[0]:
        delivered["request_rate"] = (len(starts) - 1) / (starts[-1] - starts[0])
    tokens = sum(s.output_tokens or 0 for s in samples if s.ok)
    return LoadResult(workload=w, base_url=base_url, model=model, samples=samples, metrics=metrics,
                      valid=not reasons, invalid_reasons=reasons, loop_lag_ms=dist(lags), delivered=delivered,
                      prompt_len_source=source, correctness=_judge_probes(samples, reqs, ref, w), server=server,
                      findings=server_metrics.findings(server, w.label, metrics.ttft_ms.mean, tokens))


def sweep(base_url: str, workload: Workload, points: list[float], *, by: str = "concurrency",
          model: str | None = None, reference: Path | None = None, progress: bool = False,
          api_key: str | None = None) -> list[LoadResult]:
    """One `run_load` per point (`by` = "concurrency" or "request_rate"); stops after a point whose
    server no longer answers, since every later number would be wrong."""
    out = []
    for v in points:
        upd = {"concurrency": int(v), "request_rate": None} if by == "concurrency" else {"request_rate": v, "concurrency": None}
        w = Workload.model_validate({**workload.model_dump(), **upd})
        res = run_load(base_url, w, model=model, reference=reference, progress=progress, api_key=api_key)
        out.append(res)
        if not alive(base_url, api_key=api_key):
            break
    return out
