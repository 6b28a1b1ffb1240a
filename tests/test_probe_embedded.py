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


def _serve(free_port, preset):
    proc = subprocess.Popen([sys.executable, "-m", "moelab.cli", "serve", "--preset", preset, "--port", str(free_port)],
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
                    pytest.fail(f"moelab serve --preset {preset} not ready in 120 s")
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


@pytest.fixture
def engine(free_port):
    yield from _serve(free_port, "tiny")


@pytest.fixture
def short_context(free_port):
    yield from _serve(free_port, "digits")  # max_position_embeddings 64: shorter than most probe prompts


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


def test_probe_fits_its_prompts_to_a_short_context(short_context, tmp_path):
    """The digits preset's context is 64 tokens; the bundled prompts are up to 240 bytes. The refusal
    states its limit, the probe fits the prompt to it, records what it sent, and replays exactly that."""
    ref = tmp_path / "ref.json"
    rec = record_reference(short_context, None, ref, timeout_s=60)
    assert rec.verdict.ok, rec.verdict.evidence
    assert all(r.error is None for r in rec.prompts), [r.error for r in rec.prompts if r.error]
    sent = json.loads(ref.read_text())["prompts"]
    fitted = [p for p in sent if p.get("fitted_to_context") == 64]
    assert len(fitted) >= 5 and all(len(p["prompt"]) + p["max_tokens"] <= 64 for p in fitted)
    again = run_probe(short_context, reference=ref, timeout_s=60)
    assert again.verdict.ok and sum(r.comparison.identical for r in again.prompts) == len(sent)


def test_load_lengths_are_calibrated_on_a_short_context(short_context):
    """32 words do not fit 64 byte-tokens: the calibration falls back to a short sample, so the
    load's prompts have the requested length in this model's tokens and every request completes."""
    r = run_load(short_context, Workload(concurrency=2, num_prompts=6, input_len=16, output_len=8))
    assert r.metrics.completed == 6 and r.metrics.failed == 0
    assert "usage.prompt_tokens" in r.prompt_len_source
    lens = [x.prompt_tokens for x in r.samples if x.kind == "load"]
    assert lens and all(8 <= n <= 32 for n in lens), lens
