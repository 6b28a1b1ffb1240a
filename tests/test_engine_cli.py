"""`moelab serve` as a command: exit codes and one-line refusals, SIGTERM, --json, --save and loading
the saved directory back, quantized formats, and the throughput bench script end to end."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
from test_engine_server import PROMPT, Serve, srv  # noqa: E402,F401  (srv: the shared tiny server fixture)

pytestmark = pytest.mark.embedded


def test_sigterm_exits_zero_quickly_and_json_summary(tmp_path):
    s = Serve("--preset", "tiny", "--json", log=tmp_path / "log")
    t0 = time.monotonic()
    assert s.stop() == 0 and time.monotonic() - t0 < 5
    assert "phase=shutdown" in s.log.read_text()
    summary = json.loads(s.proc.stdout.read())  # --json: one document on stdout
    assert summary["ready"] and summary["url"] == s.url and summary["resolved"]["backend"] == "grouped"


def _serve_rc(*args: str) -> tuple[int, str]:
    if "--device" not in args:
        args = (*args, "--device", "cpu")
    p = subprocess.run([sys.executable, "-m", "moelab.cli", "serve", *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


@pytest.mark.parametrize("args,needle", [
    (["--moe-runner-backend", "triton"], "moelab serve: error: argument --moe-runner-backend: "),
    (["--device", "cuda"], "moelab serve: error: argument --device: 'cuda' needs a CUDA GPU"),
    (["--quantization", "int3"], "moelab serve: error: argument --quantization: invalid choice: 'int3'"),
    (["--no-such-flag"], "No such option"),
    (["--cuda-graph-max-bs", "0"], "moelab serve: error: argument --cuda-graph-max-bs: must be at least 1, got 0"),
])
def test_unsupported_combination_exits_2_with_one_line(args, needle):
    import torch

    if torch.cuda.is_available() and args[0] == "--device":
        pytest.skip("this machine has CUDA, so the combination is supported")
    code, err = _serve_rc("--preset", "tiny", *args)
    assert code == 2 and needle in err
    if needle.startswith("moelab serve"):
        assert len(err.strip().splitlines()) == 1, err


def test_missing_or_corrupt_model_path(tmp_path):
    code, err = _serve_rc("--model-path", str(tmp_path / "absent"))
    assert code == 2 and "is not a directory" in err
    (tmp_path / "config.json").write_text("{broken")
    code, err = _serve_rc("--model-path", str(tmp_path))
    assert code == 1 and err.strip().splitlines()[-1].startswith("moelab serve: error: cannot load the model")


# MKL picks alignment-dependent sgemm kernels where it does not use AVX-512 (AMD EPYC); SSE4_2
# forces that path on an Intel CPU too, so this machine checks what an AMD machine would see.
@pytest.mark.parametrize("mkl", [None, "SSE4_2"])
def test_saved_checkpoint_serves_identical_outputs(srv, tmp_path, mkl):
    env = {"MKL_ENABLE_INSTRUCTIONS": mkl} if mkl else {}
    code, out = _serve_rc("--preset", "tiny", "--save", str(tmp_path / "ckpt"), "--json")
    assert code == 0
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}
    preset = Serve("--preset", "tiny", log=tmp_path / "preset.log", env=env) if mkl else srv
    s = Serve("--model-path", str(tmp_path / "ckpt"), log=tmp_path / "log", env=env)
    try:
        assert "phase=loading_weights layer 2/2" in s.log.read_text()
        for body in ({**PROMPT, "logprobs": 2}, {**PROMPT, "prompt": "Another prompt", "max_tokens": 20}):
            a, b = preset.post("/v1/completions", body)[1], s.post("/v1/completions", body)[1]
            assert a["choices"][0]["text"] == b["choices"][0]["text"]
            assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]  # bit for bit, not "close"
    finally:
        assert s.stop() == 0
        if preset is not srv:
            assert preset.stop() == 0


def test_loaded_weights_own_aligned_storage(tmp_path):
    """The contract behind the test above: every loaded tensor is a fresh allocation of torch's own
    (64-byte aligned), never a view into the safetensors buffer (8-byte aligned)."""
    import torch

    from moelab.engine.checkpoint import load_checkpoint

    assert _serve_rc("--preset", "tiny", "--save", str(tmp_path / "ckpt"))[0] == 0
    _, dense, experts = load_checkpoint(tmp_path / "ckpt", torch.float32, torch.device("cpu"))
    for t in [*dense.values(), *(x for w in experts for x in (w.w13, w.w2))]:
        assert t.data_ptr() % 64 == 0 and t.is_contiguous()


@pytest.mark.slow
def test_fp8_runs_dequantized_and_says_so(srv, tmp_path):
    s = Serve("--preset", "tiny", "--quantization", "fp8", "--moe-runner-backend", "reference", log=tmp_path / "log")
    try:
        log = s.log.read_text()
        assert "phase=quantizing" in log and "run dequantized" in log and "format=fp8" in log
        a = srv.post("/v1/completions", {**PROMPT, "logprobs": 1})[1]["choices"][0]["logprobs"]["token_logprobs"]
        b = s.post("/v1/completions", {**PROMPT, "logprobs": 1})[1]["choices"][0]["logprobs"]["token_logprobs"]
        assert abs(a[0] - b[0]) < 0.1  # fp8 experts stay close to the float32 model
    finally:
        assert s.stop() == 0


@pytest.mark.slow
def test_throughput_bench_runs_and_reports_json():
    bench = Path(__file__).resolve().parent.parent / "bench" / "engine_throughput.py"
    p = subprocess.run([sys.executable, str(bench), "--requests", "8", "--max-tokens", "8", "--concurrency", "1,8"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr + p.stdout
    result = json.loads(p.stdout.strip().splitlines()[-1])
    levels = {str(r["concurrency"]): r for r in result["levels"]}
    assert set(levels) == {"one-at-a-time", "1", "8"}
    assert all(r["output_tokens"] == 64 and r["same_text_as_one_at_a_time"] == 8 for r in levels.values())
    assert levels["8"]["mean_batch"] > 2


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "grouped", "triton"])
def test_cuda_serves_the_saved_tiny_model_like_the_cpu(srv, tmp_path, backend):
    """Same weights (the CPU-written directory) on CUDA: float32 greedy text equals the CPU server's;
    the fused triton runner (bf16) serves finite logprobs."""
    assert _serve_rc("--preset", "tiny", "--save", str(tmp_path / "ckpt"))[0] == 0
    dtype = "bfloat16" if backend == "triton" else "float32"
    s = Serve("--model-path", str(tmp_path / "ckpt"), "--device", "cuda", "--dtype", dtype,
              "--moe-runner-backend", backend, log=tmp_path / "log")
    try:
        assert f"moe_runner_backend={backend}" in s.log.read_text()
        for p in ("The capital of France is", "Mixture of experts", "Hello"):
            body = {**PROMPT, "prompt": p, "max_tokens": 8, "logprobs": 1}
            a, b = srv.post("/v1/completions", body)[1], s.post("/v1/completions", body)[1]
            lp = b["choices"][0]["logprobs"]["token_logprobs"]
            assert len(lp) == 8 and all(x == x and x > -1e9 for x in lp)  # finite
            if dtype == "float32":
                assert b["choices"][0]["text"] == a["choices"][0]["text"]
    finally:
        assert s.stop() == 0


@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager_decode(tmp_path):
    """The same bf16 tiny model on CUDA with the triton runner, decode steps replayed from CUDA graphs
    against --disable-cuda-graph: concurrent greedy requests (padded batches) give the same text."""
    import concurrent.futures

    common = ("--preset", "tiny", "--device", "cuda", "--dtype", "bfloat16", "--moe-runner-backend", "triton",
              "--max-running-requests", "8")
    eager = Serve(*common, "--disable-cuda-graph", log=tmp_path / "eager.log")
    graph = Serve(*common, log=tmp_path / "graph.log")
    try:
        assert "phase=cuda_graph off: --disable-cuda-graph" in eager.log.read_text()
        assert "phase=cuda_graph captured decode batch sizes 1,2,4,8" in graph.log.read_text()
        prompts = ["The capital of France is", "Mixture of experts", "Hello", "1 2 3 4", "abc"]
        out = {}
        for name, s in (("eager", eager), ("graph", graph)):
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # 5 at once: padded to 8
                res = list(pool.map(lambda p, s=s: s.post("/v1/completions", {**PROMPT, "prompt": p,
                                                                                "max_tokens": 24})[1], prompts))
            out[name] = [r["choices"][0]["text"] for r in res]
        assert graph.get("/stats")["graph_steps"] > 0 and eager.get("/stats")["graph_steps"] == 0
        same = sum(a == b for a, b in zip(out["eager"], out["graph"]))
        assert same >= len(prompts) - 1, out  # bf16 matmuls of another batch size may flip one near-tie
    finally:
        assert eager.stop() == 0 and graph.stop() == 0
