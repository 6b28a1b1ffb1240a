"""Tier 2: moelab's load client against the calibrated stream server (bench/), whose schedule is known."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
from spawn import serve  # noqa: E402

from moelab.load import Workload, run_load  # noqa: E402
from moelab.load.stats import itls, ttft  # noqa: E402

pytestmark = pytest.mark.process
SERVER = ROOT / "bench" / "client_stream_server.py"


def test_client_recovers_the_known_schedule():
    with serve("", "--ttft-ms", "20", "--itl-ms", "2", script=SERVER) as url:
        r = run_load(url, Workload(concurrency=8, num_prompts=24, input_len=8, output_len=100))
    good = [s for s in r.samples if s.ok]
    assert len(good) == 24 and all(s.output_tokens == 100 and len(s.arrivals) == 100 for s in good)
    # p50 of the medians is robust to a shared, busy machine; a client that batches reads
    # (ITL 0) or stamps late (TTFT + several ms) fails these
    assert abs(statistics.median(ttft(s) for s in good) - 20) < 3
    assert abs(statistics.median(g for s in good for g in itls(s)) - 2) < 0.5


def test_burst_mode_counts_every_token():
    with serve("", "--ttft-ms", "1", "--itl-ms", "0", script=SERVER) as url:
        r = run_load(url, Workload(concurrency=4, num_prompts=8, input_len=8, output_len=3000))
    assert r.metrics.completed == 8 and r.metrics.output_throughput > 5000
    assert all(len(s.arrivals) == 3000 and s.output_tokens == 3000 for s in r.samples)


@pytest.mark.slow
def test_client_perf_script_prints_a_final_json_line():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "client_perf.py"), "--quick", "--no-vllm",
                        "--rate", "40"], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    doc = json.loads(lines[-1])
    assert doc["moelab"]["ceiling_tok_s"] > 0 and "ttft_p50_err_ms" in doc["moelab"]["accuracy"]
    assert any(line.startswith("moelab") for line in lines) and "skipped (--no-vllm)" in p.stdout
