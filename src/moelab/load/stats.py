"""Metrics and validity from raw samples: pure functions, recomputable from a stored LoadResult.

TTFT = first text event - start; ITL = gaps between text events (several events in one read get
the same stamp, i.e. a gap of 0: they did arrive together); TPOT = (E2E - TTFT) / (tokens - 1);
E2E = end - start. Rates use the wall span from the first send to the last completion.
"""
from __future__ import annotations

import math
from collections import Counter

from pydantic import BaseModel

from moelab.load.client import Sample
from moelab.load.workload import SLO, Workload


class Dist(BaseModel):
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    n: int = 0


class Metrics(BaseModel):
    ttft_ms: Dist
    itl_ms: Dist
    tpot_ms: Dist
    e2e_ms: Dist
    completed: int
    failed: int
    duration_s: float
    request_throughput: float  # completed req/s
    output_throughput: float  # output tok/s
    total_throughput: float  # (input + output) tok/s
    goodput: float | None  # req/s meeting the SLO (None when no SLO was set)
    slo_attainment: float | None
    errors: dict[str, int]
    error_examples: dict[str, str] = {}  # first detail seen per error kind (what the server said)


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist(xs: list[float]) -> Dist:
    if not xs:
        return Dist()
    return Dist(mean=sum(xs) / len(xs), p50=percentile(xs, 50), p90=percentile(xs, 90), p99=percentile(xs, 99), n=len(xs))


def ttft(s: Sample) -> float | None:
    return (s.arrivals[0] - s.start) * 1e3 if s.arrivals else None


def itls(s: Sample) -> list[float]:
    a = s.arrivals
    return [(a[i] - a[i - 1]) * 1e3 for i in range(1, len(a))]


def tpot(s: Sample) -> float | None:
    n = s.output_tokens or 0
    if not s.arrivals or n < 2:
        return None
    return (s.end - s.arrivals[0]) * 1e3 / (n - 1)


def meets(s: Sample, slo: SLO) -> bool:
    if not s.ok:
        return False
    t, p, gaps = ttft(s), tpot(s), itls(s)
    checks = [(slo.ttft_ms, t), (slo.tpot_ms, p), (slo.e2e_ms, (s.end - s.start) * 1e3),
              (slo.itl_ms, sum(gaps) / len(gaps) if gaps else None)]
    return all(bound is None or (v is not None and v <= bound) for bound, v in checks)


def summarize(samples: list[Sample], slo: SLO, input_len: int | None = None) -> Metrics:
    load = [s for s in samples if s.kind == "load"]
    good = [s for s in load if s.ok]
    span = (max(s.end for s in samples) - min(s.start for s in samples)) if samples else 0.0
    span = max(span, 1e-9)
    out_tok = sum(s.output_tokens or 0 for s in good)
    in_tok = sum(s.prompt_tokens if s.prompt_tokens is not None else (input_len or 0) for s in good)
    has_slo = any(v is not None for v in slo.model_dump().values())
    n_good = sum(meets(s, slo) for s in load) if has_slo else None
    return Metrics(
        ttft_ms=dist([v for s in good if (v := ttft(s)) is not None]),
        itl_ms=dist([g for s in good for g in itls(s)]),
        tpot_ms=dist([v for s in good if (v := tpot(s)) is not None]),
        e2e_ms=dist([(s.end - s.start) * 1e3 for s in good]),
        completed=len(good), failed=len(load) - len(good), duration_s=span,
        request_throughput=len(good) / span, output_throughput=out_tok / span, total_throughput=(in_tok + out_tok) / span,
        goodput=(n_good / span) if n_good is not None else None,
        slo_attainment=(n_good / len(load)) if n_good is not None and load else None,
        errors=dict(Counter(s.error for s in samples if s.error)),
        error_examples={k: d for s in reversed(samples) if s.error and (k := s.error) and (d := s.error_detail or "")},
    )


def achieved_concurrency(samples: list[Sample]) -> float:
    """Time-weighted mean number of requests in flight between the first send and the last send
    (after the last send the run drains, which says nothing about the client's ability)."""
    if len(samples) < 2:
        return float(len(samples))
    t0, t1 = min(s.start for s in samples), max(s.start for s in samples)
    if t1 <= t0:
        return float(len(samples))
    busy = sum(max(0.0, min(s.end, t1) - max(s.start, t0)) for s in samples)
    return busy / (t1 - t0)


def validity(samples: list[Sample], w: Workload, loop_lag_ms: list[float], server_alive: bool) -> list[str]:
    """Reasons the run's numbers cannot be trusted; empty means valid."""
    reasons = []
    if not server_alive:
        reasons.append("the server stopped answering /health during or after the run")
    load = [s for s in samples if s.kind == "load"]
    failed = [s for s in samples if s.error]
    if load and not any(s.ok for s in load):
        reasons.append("no request completed")
    if samples and len(failed) / len(samples) > w.max_error_rate:
        kinds = Counter(s.error for s in failed)
        reasons.append(f"{len(failed)} of {len(samples)} requests failed ({', '.join(f'{k}: {v}' for k, v in kinds.items())})")
    lag99 = percentile(loop_lag_ms, 99)
    kernel = bool(samples) and all(s.kernel_stamps for s in samples if s.arrivals)
    limit = w.max_loop_lag_kernel_ms if kernel else w.max_loop_lag_ms
    if lag99 is not None and lag99 > limit:
        reasons.append(f"the client's event loop lagged {lag99:.1f} ms at p99 (> {limit} ms): "
                       "timestamps are late; lower the load or use a faster client machine")
    if w.request_rate is not None and not math.isinf(w.request_rate):
        late = percentile([(s.start - s.scheduled) * 1e3 for s in samples], 90)
        if late is not None and late > w.max_send_lateness_ms:
            reasons.append(f"requests left {late:.1f} ms after their scheduled time at p90 "
                           f"(> {w.max_send_lateness_ms} ms): the requested rate was not delivered")
    if w.concurrency is not None:
        if len(samples) < 2 * w.concurrency:
            reasons.append(f"{len(samples)} requests cannot hold concurrency {w.concurrency}: "
                           f"use --num-prompts >= {2 * w.concurrency}")
        else:
            got = achieved_concurrency(samples)
            # Short requests make any turnaround look big in ratio; only a client that leaves a
            # slot idle for milliseconds per request is really failing to hold the concurrency.
            t0, t1 = min(s.start for s in samples), max(s.start for s in samples)
            gap_ms = (w.concurrency - got) * (t1 - t0) * 1e3 / max(1, len(samples) - w.concurrency)
            if got < w.min_concurrency_ratio * w.concurrency and gap_ms > w.max_slot_gap_ms:
                reasons.append(f"achieved concurrency {got:.2f} < {w.min_concurrency_ratio:.0%} of {w.concurrency} "
                               f"(a slot stood idle {gap_ms:.1f} ms per request)")
    return reasons
