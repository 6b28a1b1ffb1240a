"""SGLang adapter: argv in SGLang's own words, its log signatures on real (and source-built) logs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moelab.diagnose.classify import classify
from moelab.diagnose.ruleset import load_rules
from moelab.engines import ENGINES
from moelab.engines.sglang import _strip_prefix
from moelab.spec import LaunchSpec

LOGS = Path(__file__).parent / "logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.fixture
def fake_sglang_env(tmp_path, monkeypatch):
    """A python whose package metadata says sglang 0.5.23 is installed (nothing is imported)."""
    d = tmp_path / "sglang-0.5.23.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MOELAB_SGLANG_PYTHON", sys.executable)
    from moelab.engines import sglang

    sglang._version_in.cache_clear()
    yield
    sglang._version_in.cache_clear()


def test_command_in_sglangs_words(fake_sglang_env):
    a = ENGINES.create("sglang")
    assert a.version() == "0.5.23"
    spec = LaunchSpec(engine="sglang", args=["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "2"])
    argv, env = a.command(spec, 30000)
    assert argv == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "2",
                    "--host", "127.0.0.1", "--port", "30000"]
    argv, _ = a.command(LaunchSpec(engine="sglang", args=["--model-path", "/m", "--port=31000"]), 30000)
    assert "--port=31000" in argv and "30000" not in argv  # the user's own --port wins


def test_not_installed_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("MOELAB_SGLANG_PYTHON", raising=False)
    a = ENGINES.create("sglang")
    if a.version() is not None:
        pytest.skip("sglang is installed here")
    with pytest.raises(FileNotFoundError, match="sglang is not installed"):
        a.command(LaunchSpec(engine="sglang", args=["--model-path", "/m"]), 1)
    assert a.flag_catalogue().origin == "bundled"


def test_prefixes_and_model_path():
    assert _strip_prefix(["sglang", "serve", "--model-path", "m"]) == ["--model-path", "m"]
    assert _strip_prefix(["/usr/bin/python3", "-m", "sglang.launch_server", "--tp", "2"]) == ["--tp", "2"]
    assert ENGINES.create("sglang").model_path(["--model", "/x", "--tp", "2"]) == "/x"  # --model is an alias


def test_preflight_rejects_unknown_flags_before_launch():
    a = ENGINES.create("sglang")
    v = a.flag_check(LaunchSpec(engine="sglang", args=["--model-path", "m", "--moe-runner-backend", "trtllm"]))
    assert v is not None and v.cause.value == "bad_args" and v.phase.value == "preflight"
    assert a.flag_check(LaunchSpec(engine="sglang", args=["--model-path", "m", "--tp", "8"])) is None


def test_phase_markers_on_a_real_launch_log():
    a = ENGINES.create("sglang")
    phases = [p for p in map(a.phase_of, lines("sglang-8741-phases.log")) if p]
    assert phases[0] == "loading_weights" and phases[-1] == "kv_cache"


@pytest.mark.parametrize("log,cause,rule", [
    ("sglang-4330-not-enough-memory.log", "gpu_oom", "sglang-not-enough-memory"),
    ("sglang-7691-profiled-negative.log", "gpu_oom", "sglang-profiled-negative"),
    ("sglang-28019-smem-sm121.log", "kernel_resource_limit", "smem-out-of-resources"),
    ("sglang-0.5.23-nvfp4-on-sm90.log", "unsupported_arch", "sglang-nvfp4-platform"),
    ("sglang-0.5.23-trtllm-mha-on-sm89.log", "unsupported_arch", "sglang-attention-arch"),
])
def test_sglang_logs_classify(log, cause, rule):
    v = classify(lines(log), exit_code=1, engine="sglang")
    assert (v.cause.value, v.detail["rule"]) == (cause, rule)
    assert v.evidence[0].kind == "log" and v.evidence[0].line


def test_rank_prefix_is_kept_as_evidence():
    v = classify(lines("sglang-7691-profiled-negative.log"), exit_code=1, engine="sglang")
    assert v.detail["rank"] == "DP0"  # "[2025-07-02 07:41:59 DP0 TP0]": the first rank tag


def test_sigquit_wrapper_is_not_the_cause():
    # The real excerpt of sglang#9393 starts with the wrapper and stops inside the traceback:
    # the wrapper alone must not produce a cause.
    v = classify(lines("sglang-9393-sigquit-before-root.log"), exit_code=1, engine="sglang")
    assert v.cause.value == "unknown"
    assert any("sglang-sigquit" in (e.source or "") for e in v.evidence)
    # With a root error after it (the failing line of sglang#28019), the root decides.
    both = lines("sglang-9393-sigquit-before-root.log") + lines("sglang-28019-smem-sm121.log")[1:]
    assert classify(both, exit_code=1, engine="sglang").cause.value == "kernel_resource_limit"


def test_every_sglang_rule_fires_on_a_log_here():
    own = [r for r in load_rules("sglang") if r.engine == "sglang"]
    text = [ln for f in LOGS.glob("sglang-*.log") for ln in f.read_text().splitlines()]
    for r in own:
        assert r.source and any(r.regex.search(ln) for ln in text), r.id


CASES = [
    ["--model-path", "m", "--tp", "8", "--quantization", "modelopt_fp4", "--moe-runner-backend", "flashinfer_trtllm"],
    ["--model-path", "m", "--moe-runner-backend", "flashinfer_trtlm"],
    ["--model-path", "m", "--tp-sise", "2"],
    ["--model", "m", "--mem-frac", "0.8", "--disable-custom-all-reduce"],
    ["--model-path", "m", "--moe", "triton"],
    ["--model-path", "m", "--attention-backend", "cutlass_mla"],
    ["--model-path", "m", "--fp4-gemm-backend", "flashinfer_cudnn", "--kv-cache-dtype", "fp8_e4m3"],
    ["--model-path", "m", "--quantization", "nvfp4"],
]


@pytest.mark.skipif(not __import__("os").environ.get("MOELAB_SGLANG_PYTHON"),
                    reason="set MOELAB_SGLANG_PYTHON to a python that can import sglang (GPU not needed)")
def test_catalogue_agrees_with_sglangs_real_parser():
    """Differential test: the same command lines through SGLang's own ServerArgs parser."""
    import json
    import os
    import subprocess

    code = ("import argparse, json, sys\nfrom sglang.srt.server_args import ServerArgs\n"
            "out = []\nfor argv in json.loads(sys.argv[1]):\n    p = argparse.ArgumentParser(exit_on_error=False)\n"
            "    ServerArgs.add_cli_args(p)\n    try:\n        p.parse_args(argv); out.append(True)\n"
            "    except (argparse.ArgumentError, SystemExit):\n        out.append(False)\nprint(json.dumps(out))")
    r = subprocess.run([os.environ["MOELAB_SGLANG_PYTHON"], "-c", code, json.dumps(CASES)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    real = json.loads(r.stdout.strip().splitlines()[-1])
    from moelab.engines.flags import bundled, validate

    ours = [not validate(argv, bundled("sglang")) for argv in CASES]
    assert ours == real
