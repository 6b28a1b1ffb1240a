"""Tier 2: `run_load` / `moelab bench` against real small servers that stream, die, error or lie."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

from moelab.load import SLO, Workload, run_load, sweep  # noqa: E402
from moelab.probe import ServerUnreachable, record_reference  # noqa: E402
from moelab.spec import Cause  # noqa: E402

pytestmark = pytest.mark.process


def test_healthy_stream_measures_the_schedule():
    with serve("healthy", "--ttft-ms", "30", "--itl-ms", "10") as url:
        r = run_load(url, Workload(concurrency=2, num_prompts=6, input_len=16, output_len=8, slo=SLO(ttft_ms=5000)))
    m = r.metrics
    assert r.valid, r.invalid_reasons
    assert m.completed == 6 and m.failed == 0 and all(s.output_tokens == 8 for s in r.samples)
    # generous bounds: the machine is shared, but a client that mis-stamps by 10 ms fails this
    assert 29 <= m.ttft_ms.p50 < 40 and 9 <= m.itl_ms.p50 < 12, (m.ttft_ms, m.itl_ms)
    assert m.goodput is not None and m.goodput > 0 and r.prompt_len_source.startswith("server usage")
    assert abs(r.delivered["concurrency"] - 2) < 0.3
    assert r.correctness is None  # no probe prompts asked for, no reference


def test_server_dying_mid_run_marks_the_run_invalid():
    with serve("die", "--die-after", "3", "--itl-ms", "2") as url:
        r = run_load(url, Workload(concurrency=2, num_prompts=8, input_len=8, output_len=10))
    assert not r.valid
    assert any("stopped answering" in x for x in r.invalid_reasons)
    assert "disconnect" in r.metrics.errors


def test_http_errors_mark_the_run_invalid():
    with serve("error") as url:
        r = run_load(url, Workload(concurrency=2, num_prompts=8, input_len=8, output_len=4))
    assert not r.valid and r.metrics.errors.get("http_500", 0) >= 3
    assert any("requests failed" in x for x in r.invalid_reasons)


def test_probe_prompts_under_load_catch_nan_and_divergence(tmp_path):
    with serve("nan") as url:
        r = run_load(url, Workload(concurrency=4, num_prompts=16, input_len=8, output_len=4, probe_every=2))
    assert r.valid, r.invalid_reasons
    assert r.correctness is not None and r.correctness.cause is Cause.numerical_nan
    assert sum(s.kind == "probe" for s in r.samples) == 8
    ref = tmp_path / "ref.json"
    with serve("healthy") as url:
        assert record_reference(url, None, ref, timeout_s=10).verdict.ok
        same = run_load(url, Workload(concurrency=4, num_prompts=16, input_len=8, output_len=4), reference=ref)
    assert same.correctness is not None and same.correctness.ok and same.workload.probe_every == 8
    with serve("drift") as url:
        drift = run_load(url, Workload(concurrency=4, num_prompts=32, input_len=8, output_len=4), reference=ref)
    assert drift.correctness.cause is Cause.garbage_output


def test_rate_sweep_and_dataset(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hello there", "output_len": 3}\n\n{"prompt": "second one"}\n')
    with serve("healthy") as url:
        res = sweep(url, Workload(request_rate=20, num_prompts=10, dataset=data, output_len=5), [20, math.inf],
                    by="request_rate")
    assert [r.workload.label for r in res] == ["rate=20/s", "rate=inf"]
    assert all(r.valid for r in res), [r.invalid_reasons for r in res]
    assert sorted({s.output_tokens for s in res[0].samples}) == [3, 5]
    assert 8 < res[0].delivered["request_rate"] < 40  # Poisson at 20/s over 10 requests


def test_unreachable_server(free_port):
    with pytest.raises(ServerUnreachable):
        run_load(f"http://127.0.0.1:{free_port}", Workload(concurrency=1, num_prompts=1))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moelab.cli", *args], capture_output=True, text=True, timeout=90)


def test_bench_cli(tmp_path, free_port):
    with serve("healthy", "--itl-ms", "2") as url:
        # requests long enough (about 0.1 s) that a loaded 2-core machine's scheduling gaps stay under the
        # validity check's 10 % (4 tokens at 1 ms each made a 5 ms gap half of a request)
        ok = _cli("bench", "--url", url, "--concurrency", "1,2", "--num-prompts", "4", "--input-len", "8",
                  "--output-len", "48", "--slo", "ttft_ms=1000", "--json")
        table = _cli("bench", "--url", url, "--concurrency", "2", "--num-prompts", "6", "--output-len", "48")
    doc = json.loads(ok.stdout)
    assert ok.returncode == 0, [p["invalid_reasons"] for p in doc["points"]]
    assert doc["ok"] and len(doc["points"]) == 2 and doc["points"][0]["samples"][0]["arrivals"]
    assert table.returncode == 0 and "TTFT" in table.stdout, table.stdout and "c=2" in table.stdout
    with serve("die", "--die-after", "2") as url:
        dead = _cli("bench", "--url", url, "--concurrency", "2", "--num-prompts", "6", "--output-len", "6")
    assert dead.returncode == 1 and "invalid" in dead.stdout
    assert _cli("bench", "--url", f"http://127.0.0.1:{free_port}").returncode == 2
    both = _cli("bench", "--url", "http://x", "--concurrency", "1", "--request-rate", "2")
    assert both.returncode == 2 and "not both" in both.stderr
    bad = _cli("bench", "--url", "http://x", "--concurrency", "0")
    assert bad.returncode == 2 and "whole number" in bad.stderr
