"""Tier 1: load statistics and validity as pure functions on hand-made raw samples."""
from __future__ import annotations

import math

import pytest

from moelab.load import SLO, Sample, Workload, parse_points, parse_slo, summarize, validity
from moelab.load.stats import achieved_concurrency, percentile


def sample(start, ttft_s, n, itl_s, **kw) -> Sample:
    arr = [start + ttft_s + i * itl_s for i in range(n)]
    return Sample(start=start, scheduled=kw.pop("scheduled", start), arrivals=arr, end=arr[-1] + 0.001,
                  output_tokens=n, prompt_tokens=10, **kw)


def test_percentile_matches_linear_interpolation():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5 and percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([], 50) is None
    assert abs(percentile(list(range(101)), 99) - 99.0) < 1e-9


def test_summarize_recovers_the_schedule():
    ss = [sample(i * 0.1, 0.020, 11, 0.005) for i in range(10)]
    m = summarize(ss, SLO(ttft_ms=25, itl_ms=6))
    assert abs(m.ttft_ms.p50 - 20) < 1e-6 and abs(m.itl_ms.p99 - 5) < 1e-6 and m.itl_ms.n == 100
    assert abs(m.tpot_ms.mean - (50 + 1) / 10) < 1e-6  # end is 1 ms after the last token
    assert m.completed == 10 and m.failed == 0
    span = ss[-1].end - ss[0].start
    assert math.isclose(m.output_throughput, 110 / span) and math.isclose(m.total_throughput, 210 / span)
    assert math.isclose(m.goodput, 10 / span) and m.slo_attainment == 1.0
    assert summarize(ss, SLO(ttft_ms=19)).slo_attainment == 0.0
    assert summarize(ss, SLO()).goodput is None


def test_failed_and_probe_samples_are_kept_apart():
    ss = [sample(0, 0.01, 5, 0.001), Sample(start=0, end=0.5, error="http_500"),
          sample(0, 0.5, 5, 0.1, kind="probe")]
    m = summarize(ss, SLO())
    assert m.completed == 1 and m.failed == 1 and m.errors == {"http_500": 1} and m.ttft_ms.n == 1


def test_validity_reasons():
    w = Workload(concurrency=2, num_prompts=8)
    ok = [sample(i * 0.05, 0.019, 5, 0.02) for i in range(8)]  # 0.1 s each, one every 0.05 s: two in flight
    assert abs(achieved_concurrency(ok) - 1.8) < 0.3
    assert validity(ok, w, [0.1, 0.2], True) == []
    assert "stopped answering" in validity(ok, w, [], False)[0]
    bad = ok + [Sample(start=0.1, end=0.2, error="disconnect")]
    assert any("1 of 9 requests failed (disconnect: 1)" in r for r in validity(bad, w, [], True))
    assert any("event loop lagged" in r for r in validity(ok, w, [50.0] * 10, True))  # loop stamps: > 10 ms
    kern = [s.model_copy(update={"kernel_stamps": True}) for s in ok]
    assert validity(kern, w, [20.0] * 10, True) == []  # kernel stamps: only a stall (> 50 ms) counts
    assert any("event loop lagged" in r for r in validity(kern, w, [80.0] * 10, True))
    serial = [sample(i * 0.2, 0.01, 5, 0.02) for i in range(8)]  # never two at once
    assert any("achieved concurrency" in r for r in validity(serial, w, [], True))
    assert any("cannot hold concurrency" in r for r in validity(ok[:3], w, [], True))


def test_validity_rate_lateness():
    w = Workload(request_rate=10, num_prompts=4)
    on_time = [sample(i * 0.1, 0.01, 3, 0.01) for i in range(4)]
    assert validity(on_time, w, [], True) == []
    late = [sample(i * 0.1 + 0.05, 0.01, 3, 0.01, scheduled=i * 0.1) for i in range(4)]
    assert any("requested rate was not delivered" in r for r in validity(late, w, [], True))


def test_parsers_and_workload_validation():
    assert parse_points("1, 4,16", "concurrency") == [1, 4, 16]
    assert parse_points("2,inf", "request-rate")[-1] == math.inf
    for bad, kind in (("1,x", "concurrency"), ("2.5", "concurrency"), ("inf", "concurrency"), ("0", "request-rate")):
        with pytest.raises(ValueError):
            parse_points(bad, kind)
    assert parse_slo("ttft_ms=500, itl_ms=50") == SLO(ttft_ms=500, itl_ms=50)
    with pytest.raises(ValueError, match="ttft_ms, itl_ms"):
        parse_slo("p99=3")
    with pytest.raises(ValueError, match="exactly one"):
        Workload(concurrency=1, request_rate=2)
    with pytest.raises(ValueError, match="exactly one"):
        Workload()
    assert Workload(request_rate=math.inf).label == "rate=inf"
