"""Capacity under an SLO on one running server: the highest concurrency (or request rate) whose
requests still meet every SLO limit at its percentile, with the load points that decided it.

    moelab bench --url URL --slo ttft_ms=300,tpot_ms=50 --find max-concurrency

It brackets first, doubling the load from the start value until a point breaks the SLO (or the
limit is reached), then bisects between the highest point that met it and the lowest that broke
it: to one request for concurrency, to `rel_tol` of the rate for request rates. This is the search
`vllm bench sweep serve_sla` and vLLM's tuning recipes run on one server. A point whose measurement
is not valid (the client could not hold the load, requests failed) counts as breaking the SLO,
with that reason: a number it did not measure cannot be met. Where noise makes a higher point pass
after a lower one broke, the lowest break bounds the answer and the report says so.

The decisions are pure (`breaks`, `next_value`, `answer`); `find` drives `run_load`.

    >>> next_value({1: True, 2: True, 4: True, 8: False}, "concurrency", 1, 1024)
    6
    >>> next_value({1: True, 2: True, 4: True, 8: False, 6: True, 7: False}, "concurrency", 1, 1024) is None
    True
"""
from __future__ import annotations

import math

from pydantic import BaseModel, Field

from moelab.load.stats import itls, percentile, tpot, ttft
from moelab.load.workload import SLO, Workload

MODES = {"max-concurrency": "concurrency", "max-rate": "request_rate"}


def measured(samples, slo: SLO, pct: float) -> dict[str, float | None]:
    """The SLO's quantities at percentile `pct` over the point's completed load requests: TTFT, TPOT
    and E2E per request, ITL over every gap between tokens (as `moelab bench` reports it)."""
    ok = [s for s in samples if s.kind == "load" and s.ok]
    per = {"ttft_ms": [v for s in ok if (v := ttft(s)) is not None],
           "tpot_ms": [v for s in ok if (v := tpot(s)) is not None],
           "e2e_ms": [(s.end - s.start) * 1e3 for s in ok],
           "itl_ms": [g for s in ok for g in itls(s)]}
    return {k: percentile(per[k], pct) for k, lim in slo.model_dump().items() if lim is not None}


def breaks(result, slo: SLO, pct: float) -> list[str]:
    """Why one load point does not meet the SLO at `pct`, in words; empty when it does (pure)."""
    out = [f"not a valid measurement: {r}" for r in result.invalid_reasons]
    if result.metrics.failed:
        out.append(f"{result.metrics.failed} requests failed")
    got = measured(result.samples, slo, pct)
    for k, lim in slo.model_dump().items():
        if lim is None:
            continue
        v = got.get(k)
        if v is None:
            out.append(f"no {k[:-3].upper()} measured")
        elif v > lim:
            out.append(f"p{pct:g} {k[:-3].upper()} {v:.1f} ms > {lim:g} ms")
    return out


def _bounds(history: dict[float, bool]) -> tuple[float | None, float | None]:
    """(highest value that met the SLO below the lowest break, lowest break)."""
    fails = [v for v, ok in history.items() if not ok]
    hi = min(fails) if fails else None
    passes = [v for v, ok in history.items() if ok and (hi is None or v < hi)]
    return (max(passes) if passes else None), hi


def next_value(history: dict[float, bool], by: str, start: float, limit: float,
               rel_tol: float = 0.1) -> float | None:
    """The next load to try given {value: met the SLO}, or None when the search is done (pure).
    Concurrency values are whole numbers; rates are rounded to three significant digits."""
    if not history:
        return start
    lo, hi = _bounds(history)
    integer = by == "concurrency"
    if lo is None:  # even the lowest load tried breaks it: go lower
        nxt = math.floor(hi / 2) if integer else float(f"{hi / 2:.3g}")
        floor = 1 if integer else start / 64
        return nxt if nxt >= floor and nxt not in history else None
    if hi is None:  # everything tried met it: double, up to the limit
        nxt = min(lo * 2, limit)
        return (int(nxt) if integer else nxt) if nxt > lo and nxt not in history else None
    if integer:
        return None if hi - lo <= 1 else (int(lo) + int(hi)) // 2
    if (hi - lo) / hi <= rel_tol:
        return None
    nxt = float(f"{(lo + hi) / 2:.3g}")
    return None if nxt in history else nxt


class Step(BaseModel):
    value: float
    met: bool
    why: list[str] = Field(default_factory=list)  # the SLO limits it broke
    at_pct: dict[str, float | None] = Field(default_factory=dict)  # the SLO's quantities at the percentile
    goodput: float | None = None  # requests/s that met the SLO (per request)
    output_tps: float = 0.0


class Capacity(BaseModel):
    mode: str  # max-concurrency | max-rate
    slo: SLO
    percentile: float
    answer: float | None  # the highest load that met the SLO; None: not even the lowest tried
    at_limit: bool = False  # the answer is the search's limit: the server may take more
    goodput: float | None = None  # at the answer
    output_tps: float | None = None
    broke_next: Step | None = None  # the lowest load that broke it
    non_monotone: list[float] = Field(default_factory=list)  # loads that met it above a lower break
    steps: list[Step] = Field(default_factory=list)  # in the order tried


def answer(mode: str, slo: SLO, pct: float, steps: list[Step], limit: float) -> Capacity:
    """The search's result from its steps (pure)."""
    lo, hi = _bounds({s.value: s.met for s in steps})
    by_v = {s.value: s for s in steps}
    best = by_v.get(lo) if lo is not None else None
    return Capacity(mode=mode, slo=slo, percentile=pct, answer=lo, at_limit=lo is not None and hi is None and lo >= limit,
                    goodput=best.goodput if best else None, output_tps=best.output_tps if best else None,
                    broke_next=by_v.get(hi) if hi is not None else None,
                    non_monotone=sorted(s.value for s in steps if s.met and hi is not None and s.value > hi),
                    steps=steps)


def find(url: str, workload: Workload, slo: SLO, mode: str, *, pct: float = 90.0, start: float | None = None,
         limit: float | None = None, rel_tol: float = 0.1, rounds: int = 4, model: str | None = None,
         api_key: str | None = None, progress: bool = False, on_point=None, reference=None) -> tuple[Capacity, list]:
    """Search one running server; (the capacity, every LoadResult in the order run). Each concurrency
    point sends at least `rounds` x concurrency requests; each rate point at least `rounds` seconds
    of arrivals."""
    from moelab.load.run import alive, run_load

    by = MODES[mode]
    start = start or 1
    limit = limit or (1024 if by == "concurrency" else 1000.0)
    history: dict[float, bool] = {}
    steps, results = [], []
    w0 = workload.model_copy(update={"slo": slo})
    while (v := next_value(history, by, start, limit, rel_tol)) is not None:
        n = max(workload.num_prompts, int(math.ceil(rounds * v)))
        upd = {"concurrency": int(v), "request_rate": None} if by == "concurrency" else \
            {"request_rate": float(v), "concurrency": None}
        w = Workload.model_validate({**w0.model_dump(), **upd, "num_prompts": n})
        res = run_load(url, w, model=model, api_key=api_key, progress=progress, reference=reference)
        why = breaks(res, slo, pct)
        history[v] = not why
        st = Step(value=v, met=not why, why=why, at_pct=measured(res.samples, slo, pct),
                  goodput=res.metrics.goodput, output_tps=res.metrics.output_throughput)
        steps.append(st)
        results.append(res)
        if on_point:
            on_point(st, res)
        if not alive(url, api_key=api_key):  # every later number would be wrong
            break
    return answer(mode, slo, pct, steps, limit), results
