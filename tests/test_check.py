"""`moelab check` and the support matrix: the README's worked example, bad input, every row sourced."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from moelab.engines import ENGINES, support
from moelab.engines.check import Hardware, check_command, split_command

MOELAB = [sys.executable, "-c", "from moelab.cli import main; main()"]
WORKED = ("python -m sglang.launch_server --model-path Qwen3.5-397B-A17B-NVFP4 --tp 8 --quantization modelopt_fp4 "
          "--attention-backend triton --moe-runner-backend flashinfer_trtllm --fp4-gemm-backend flashinfer_cudnn "
          "--disable-custom-all-reduce").split()
RTX6000 = ["--gpu", "sm_120", "--gpu-memory", "96GB", "--gpus", "8"]


def run(*args, env=None):
    import os

    # No installed SGLang here: the bundled catalogue answers. A private cache dir keeps it hermetic.
    return subprocess.run([*MOELAB, "check", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_worked_example_trtllm_runner_on_sm120():
    out = run(*RTX6000, "--json", "--", *WORKED)
    assert out.returncode == 1, out.stderr
    d = json.loads(out.stdout)
    assert d["verdict"]["cause"] == "unsupported_arch" and d["verdict"]["phase"] == "preflight"
    assert d["catalogue"]["origin"] == "bundled" and not d["flag_problems"]
    bad = [s for s in d["support"] if s["status"] == "no"]
    assert [(s["kind"], s["backend"]) for s in bad] == [("moe_runner", "flashinfer_trtllm")]
    assert "SM100" in bad[0]["note"] and "fi#2045" in bad[0]["source"]
    assert "flashinfer_cutlass" in d["verdict"]["advice"]
    assert "bundled config" in d["model"]["source"] and d["forecast"]["fits"]
    ok = {s["backend"] for s in d["support"] if s["status"] == "yes"}
    assert ok == {"flashinfer_cudnn", "triton"}
    text = run(*RTX6000, "--", *WORKED)
    assert text.returncode == 1 and "unsupported_arch" in text.stdout and "bundled with moelab" in text.stdout


def test_worked_example_fixed_passes():
    fixed = [("flashinfer_cutlass" if a == "flashinfer_trtllm" else a) for a in WORKED]
    out = run(*RTX6000, "--json", "--", *fixed)
    d = json.loads(out.stdout)
    assert out.returncode == 0, d["verdict"]
    assert d["verdict"]["cause"] == "ok"
    assert any(s["status"] == "caveat" for s in d["support"])  # fi#2723 recorded, not fatal


def test_flag_typo_is_bad_args_with_nearest_spelling():
    argv = [("--moe-runner-backend" if a == "--moe-runner-backend" else a) for a in WORKED]
    argv[argv.index("flashinfer_trtllm")] = "flashinfer_cutlas"
    d = json.loads(run(*RTX6000, "--json", "--", *argv).stdout)
    assert d["verdict"]["cause"] == "bad_args"
    assert d["flag_problems"][0]["suggestion"] == "flashinfer_cutlass"


def test_forecast_failure_is_gpu_oom_with_numbers():
    argv = ["vllm", "serve", "Qwen/Qwen3-235B-A22B", "--tensor-parallel-size", "2"]
    out = run("--gpu", "sm_90", "--gpu-memory", "80GiB", "--gpus", "2", "--json", "--", *argv)
    d = json.loads(out.stdout)
    assert out.returncode == 1 and d["verdict"]["cause"] == "gpu_oom"
    assert "GiB per GPU" in d["forecast"]["problems"][0]


def test_vllm_on_this_cpu_machine_and_missing_path(tmp_path):
    out = run("--json", "--", "VLLM_CPU_KVCACHE_SPACE=1", "vllm", "serve", str(tmp_path / "nope"), "--moe-backend", "triton")
    d = json.loads(out.stdout)
    if d["hardware"]["arch"] != "cpu":
        pytest.skip("this machine has a GPU")
    assert d["env"] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert d["verdict"]["cause"] == "unsupported_arch"  # triton MoE on CPU (measured, feasibility §5)
    assert any(e["kind"] == "model" for e in d["verdict"]["evidence"])
    out = run("--json", "--", "vllm", "serve", str(tmp_path / "nope"))
    assert json.loads(out.stdout)["verdict"]["cause"] == "model_load_error"


def test_help_shows_the_engine_command_line_and_an_example():
    out = run("--help", env={"COLUMNS": "200"})
    assert out.returncode == 0 and "-- ENGINE COMMAND LINE" in out.stdout and "Example: moelab check" in out.stdout


@pytest.mark.parametrize("args,msg", [
    ([], "no engine command line"),
    (["--", "llama-server", "-m", "x"], "cannot tell the engine"),
    (["--gpu", "sm_120", "--", "vllm", "serve", "m"], "both --gpu"),
    (["--gpu", "hopper", "--gpu-memory", "80GB", "--", "vllm", "serve", "m"], "not an NVIDIA architecture"),
    (["--gpu", "sm_999", "--gpu-memory", "80GB", "--", "vllm", "serve", "m"], "sm_90, sm_100"),
    (["--gpu", "sm_90", "--gpu-memory", "lots", "--", "vllm", "serve", "m"], "as a memory size"),
])
def test_bad_input_is_a_clear_error(args, msg):
    out = run(*args)
    assert out.returncode == 2 and msg in out.stderr


H100x2 = ["--gpu", "sm_90", "--gpu-memory", "80GB", "--gpus", "2"]
QWEN = ["vllm", "serve", "Qwen/Qwen3-30B-A3B"]


@pytest.mark.parametrize("extra,cause,text", [
    # 32 attention heads and 4 KV heads: tp 3 divides neither (and needs 3 GPUs of the 2 given)
    (["--tensor-parallel-size", "3"], "bad_args", "32 attention heads do not divide by --tensor-parallel-size 3"),
    (["--tensor-parallel-size", "4"], "bad_args", "--tensor-parallel-size 4 needs 4 GPUs, the machine has 2"),
    (["--max-num-seqs", "abc"], "bad_args", "argument --max-num-seqs: invalid int value: 'abc'"),
    (["--gpu-memory-utilization", "1.5"], "bad_args", "it must be in (0, 1]"),
    # float32 doubles the weights too, not only the KV: 56.8 GiB of bf16 weights no longer fit one GPU
    (["--dtype", "float32"], "gpu_oom", "weights need 113.6 GiB per GPU"),
    (["--tensor-parallel-size", "2", "--enable-expert-parallel"], "ok", None),
])
def test_check_refuses_what_the_engine_would(extra, cause, text):
    out = run(*H100x2, "--json", "--", *QWEN, *extra)
    d = json.loads(out.stdout)
    assert d["verdict"]["cause"] == cause, d["verdict"]
    if text:
        assert any(text in e["text"] for e in d["verdict"]["evidence"]), d["verdict"]["evidence"]
    if cause == "bad_args":
        assert d["verdict"]["cause"] != "gpu_oom" and out.returncode == 1


def test_expert_parallel_must_divide_the_experts():
    hw = Hardware(arch="sm_90", gpu_memory=80 * 10**9, gpus=8, source="test")
    rep = check_command("sglang", ["--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "8", "--ep-size", "3"], hw)
    assert rep.verdict.cause.value == "bad_args"
    assert rep.parallel_problems == ["128 routed experts do not divide by the expert-parallel size 3"]


def test_split_command():
    assert split_command(["A=1", "vllm", "serve", "m", "-tp", "2"]) == ("vllm", {"A": "1"}, ["m", "-tp", "2"])
    assert split_command(["python3", "-m", "sglang.launch_server", "--model-path", "m"])[0] == "sglang"
    assert split_command(["sglang", "serve", "--model-path", "m"])[2] == ["--model-path", "m"]


def test_check_command_is_pure_on_plain_data():
    hw = Hardware(arch="sm_100", gpu_memory=180 * 10**9, gpus=8, source="test")
    rep = check_command("sglang", WORKED[3:], hw)
    assert rep.verdict.ok  # the trtllm runner is right at home on B200


# --- the matrix itself --------------------------------------------------------------------------
def test_every_row_has_a_source_and_known_archs():
    data = yaml.safe_load(support.MATRIX.read_text())
    archs = set(data["archs"]) | {"cpu"}
    for r in support.rows():
        assert r.source.strip(), r
        assert set(r.works) | set(r.fails) | set(r.caveats) <= archs, r
        assert not set(r.works) & set(r.fails), r
        assert r.fails == [] or r.why_not, r  # a "no" always says why
        assert r.kind in {k for e in ("sglang", "vllm") for k in ENGINES.create(e).kind_flags.values()}


def test_matrix_backends_exist_in_the_engines_catalogues():
    from moelab.engines.flags import bundled

    choices = {"sglang": {"moe_runner": "--moe-runner-backend", "fp4_gemm": "--fp4-gemm-backend",
                          "fp8_gemm": "--fp8-gemm-backend", "attention": "--attention-backend"},
               "vllm": {"moe_runner": "--moe-backend"}}
    for r in support.rows():
        flag = choices.get(r.engine, {}).get(r.kind)
        if flag:
            assert r.backend in bundled(r.engine).flags[flag].choices, (r.engine, r.backend)


@pytest.mark.parametrize("engine,kind,backend,arch,fmt,status", [
    ("sglang", "moe_runner", "flashinfer_trtllm", "sm_100", "nvfp4", "yes"),
    ("sglang", "moe_runner", "flashinfer_trtllm", "sm_120", "nvfp4", "no"),
    ("sglang", "moe_runner", "marlin", "sm_80", "nvfp4", "yes"),
    ("sglang", "moe_runner", "flashinfer_cutlass", "sm_90", "nvfp4", "no"),
    ("sglang", "moe_runner", "flashinfer_cutlass", "sm_90", "fp8", "yes"),
    ("sglang", "moe_runner", "triton", "sm_120", "bf16", "caveat"),
    ("sglang", "attention", "fa3", "sm_120", "bf16", "no"),
    ("vllm", "moe_runner", "flashinfer-cutlass", "sm_120", "nvfp4", "yes"),  # vLLM normalises - to _
    ("vllm", "moe_runner", "triton", "cpu", "bf16", "no"),
    ("vllm", "moe_runner", "flashinfer_b12x", "sm_120", "nvfp4", "caveat"),
    ("sglang", "moe_runner", "deep_gemm", "sm_86", "nvfp4", "unknown"),  # no row: never a guess
])
def test_lookup(engine, kind, backend, arch, fmt, status):
    assert support.lookup(engine, kind, backend, arch, fmt).status == status
