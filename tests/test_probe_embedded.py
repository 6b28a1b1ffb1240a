"""Tier 3: probe and bench against the embedded engine (`moelab serve --preset tiny`) on CPU.

The tiny preset is a seeded random-weight model: it answers different prompts differently and
sometimes loops, which is exactly the healthy-but-weak case the absolute checks must not condemn.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from moelab.load import Workload, run_load
from moelab.probe import record_reference, run_probe

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


@pytest.fixture
def engine(free_port):
    proc = subprocess.Popen([sys.executable, "-m", "moelab.cli", "serve", "--preset", "tiny", "--port", str(free_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{free_port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except Exception:
                if proc.poll() is not None:
                    pytest.fail(f"moelab serve exited {proc.returncode}: {proc.stderr.read()[-500:]}")
                if time.monotonic() > deadline:
                    pytest.fail("moelab serve --preset tiny not ready in 120 s")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_probe_and_bench_on_the_embedded_engine(engine, tmp_path):
    ref = tmp_path / "ref.json"
    rec = record_reference(engine, None, ref, timeout_s=60)
    assert rec.verdict.ok, rec.verdict.evidence
    assert rec.model == "moelab-tiny" and len(json.loads(ref.read_text())["answers"]) == 8
    # the long prompt was sized from max_model_len and accepted
    assert next(r for r in rec.prompts if r.id == "long").error is None
    again = run_probe(engine, reference=ref, timeout_s=60)
    assert again.verdict.ok and again.reference_used
    assert sum(r.comparison.identical for r in again.prompts) >= 6  # greedy and seeded: reproducible
    r = run_load(engine, Workload(concurrency=4, num_prompts=16, input_len=32, output_len=8), reference=ref)
    assert r.valid, r.invalid_reasons
    assert r.metrics.completed == 16 and all(s.output_tokens == 8 for s in r.samples if s.kind == "load")
    assert r.metrics.ttft_ms.p50 > 0 and r.metrics.itl_ms.n > 0
    assert r.correctness is not None and r.correctness.ok, r.correctness.evidence
