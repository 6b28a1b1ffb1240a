"""Tier 5: the fused triton MoE runner on CUDA against the reference, and inside a CUDA graph."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moelab.moe import RUNNERS, quantize_experts  # noqa: E402
from moelab.moe.bench import make_inputs, make_weights  # noqa: E402
from moelab.moe.bf16 import Bf16Experts  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt,block", [("bf16", None), ("fp8", None), ("fp8", (128, 128)), ("nvfp4", None)])
@pytest.mark.parametrize("shape", [(128, 8, 2048, 768), (8, 2, 512, 384), (16, 4, 256, 128)])
def test_triton_matches_reference_on_cuda(fmt, block, shape):
    E, K, H, I = shape
    dev = torch.device("cuda")
    w = make_weights(E, H, I, fmt, dev, seed=E + H, block=block)
    ref_w = Bf16Experts(*w.dequantize(torch.float32))
    for T in (1, 3, 64, 300, 1200):  # 1,200 tokens: past 4,096 pairs the alignment takes its multi-launch path
        x, tw, ids = make_inputs(T, E, K, H, 1, dev, seed=T)[0]
        out = RUNNERS.create("triton")(x, tw, ids, w).float()
        ref = RUNNERS.create("reference")(x, tw, ids, ref_w).float()
        g = RUNNERS.create("grouped")(x, tw, ids, w).float()
        assert torch.isfinite(out).all()
        err = ((out - ref).norm() / ref.norm()).item()
        gerr = ((g - ref).norm() / ref.norm()).item()
        print(f"{fmt} {block} E={E} T={T}: triton err {err:.2e}, grouped err {gerr:.2e}")
        assert err < 2e-2 and gerr < 2e-2


_T16 = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "GROUP_M": 1}
_T128 = {"BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3, "GROUP_M": 8}


@pytest.mark.parametrize("fmt,block", [("bf16", None), ("fp8", None), ("fp8", (128, 128)), ("nvfp4", None)])
def test_tile_switches_match_reference_on_cuda(fmt, block):
    """SWAP_AB and A8 at M-blocks of 16, SPLIT_M at 128, against the plain tiles on the same
    inputs: A8's hi/lo fp8 activations must stay as accurate as bf16 activations (within 1.3x of
    the plain tiles' error), where one e4m3 tile would be ~10x worse."""
    from moelab.moe.triton_runner import TritonRunner

    E, K, H, I = 128, 8, 2048, 768
    dev = torch.device("cuda")
    w = make_weights(E, H, I, fmt, dev, seed=7, block=block)
    ref_w = Bf16Experts(*w.dequantize(torch.float32))
    variants = {64: [{}, {"SWAP_AB": True}] + ([{"SWAP_AB": True, "A8": True}, {"A8": True}] if fmt == "fp8" else []),
                2000: [{}, {"SPLIT_M": True}]}
    for T, switches in variants.items():
        x, tw, ids = make_inputs(T, E, K, H, 1, dev, seed=T)[0]
        ref = RUNNERS.create("reference")(x, tw, ids, ref_w).float()
        tile, bm = (_T16, 16) if T == 64 else (_T128, 128)
        errs = []
        for sw in switches:
            cfg = {"BLOCK_M": bm, "up": {**tile, **sw}, "down": {**tile, **sw}}
            out = TritonRunner(cfg)(x, tw, ids, w).float()
            assert torch.isfinite(out).all(), cfg
            errs.append(((out - ref).norm() / ref.norm()).item())
            print(f"{fmt} {block} T={T} {sw}: err {errs[-1]:.2e}")
        assert max(errs) < 1.3 * errs[0] and max(errs) < 2e-2, errs


def test_triton_runs_inside_a_cuda_graph():
    E, K, H, I = 64, 4, 1024, 256
    dev = torch.device("cuda")
    w = quantize_experts(torch.randn(E, 2 * I, H, device=dev) / 32, torch.randn(E, H, I, device=dev) / 16, "bf16")
    runner = RUNNERS.create("triton")
    x, tw, ids = make_inputs(16, E, K, H, 1, dev, seed=0)[0]
    eager = runner(x, tw, ids, w).clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        runner(x, tw, ids, w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = runner(x, tw, ids, w)
    x2, tw2, ids2 = make_inputs(16, E, K, H, 1, dev, seed=1)[0]
    x.copy_(x2), tw.copy_(tw2), ids.copy_(ids2)  # new routing replayed through the same graph
    g.replay()
    torch.cuda.synchronize()
    expect = RUNNERS.create("reference")(x, tw, ids, w).float()
    assert ((out.float() - expect).norm() / expect.norm()).item() < 2e-2
    assert not torch.equal(out, eager)


@pytest.mark.parametrize("path", ["gemv", "fused"])
@pytest.mark.parametrize("fmt,block", [("bf16", None), ("fp8", None), ("fp8", (128, 128)), ("nvfp4", None)])
def test_decode_paths_in_a_cuda_graph_match_reference(fmt, block, path):
    """The decode paths on the Qwen3-30B-A3B shape: captured once per token count, replayed with new
    routing. gemv replays are bit-identical (fixed top-k order); the fused kernel's atomic adds
    vary in order, so its replays agree to rounding, and 200 back-to-back replays (the workspace
    handed from one launch to the next) must all stay that close and leave the workspace zeroed."""
    from moelab.moe.triton_configs import fused_config, gemv_config
    from moelab.moe.triton_runner import TritonRunner, _workspaces

    E, K, H, I = 128, 8, 2048, 768
    dev = torch.device("cuda")
    w = make_weights(E, H, I, fmt, dev, seed=5, block=block)
    ref_w = Bf16Experts(*w.dequantize(torch.float32))
    runner = TritonRunner(gemv_config(fmt) if path == "gemv" else fused_config())
    for T in (1, 4, 8) if path == "gemv" else (1, 4, 16):
        x, tw, ids = make_inputs(T, E, K, H, 1, dev, seed=T)[0]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # compile outside the graph
            runner(x, tw, ids, w)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = runner(x, tw, ids, w)
        x2, tw2, ids2 = make_inputs(T, E, K, H, 1, dev, seed=100 + T)[0]
        x.copy_(x2), tw.copy_(tw2), ids.copy_(ids2)
        g.replay()
        torch.cuda.synchronize()
        first = out.clone()
        ref = RUNNERS.create("reference")(x, tw, ids, ref_w).float()
        err = ((first.float() - ref).norm() / ref.norm()).item()
        print(f"{path} {fmt} {block} T={T}: err {err:.2e}")
        assert torch.isfinite(first).all() and err < 2e-2
        if path == "gemv":
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, first)
            torch.testing.assert_close(runner(x, tw, ids.long(), w), first)
            continue
        outs = []
        for _ in range(200):
            g.replay()
            outs.append(out.clone())
        torch.cuda.synchronize()
        worst = max(((o.float() - first.float()).norm() / first.float().norm()).item() for o in outs)
        assert worst < 1e-2, worst  # a lost or doubled partial sum is off by far more than rounding
        assert all(int(t.count_nonzero()) == 0 for ws in _workspaces.values() for t in ws)
        torch.testing.assert_close(runner(x, tw, ids.long(), w), first, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_tune_saves_configs_that_the_runner_then_uses(fmt, tmp_path, monkeypatch):
    """A quick tune (3 candidates per kernel and path) writes one entry per token count into the
    given directory; get_config then returns it, and the runner with it matches the reference."""
    from moelab.moe import triton_configs as tc
    from moelab.moe.tune import tune

    E, K, H, I = 16, 4, 256, 128
    records = []
    tune({"shape": [E, K, H, I], "format": fmt, "tokens": [2, 64], "config_dir": str(tmp_path),
          "max_candidates": 3}, records.append)
    tuned = [r for r in records if r["kind"] == "tuned"]
    assert [r["tokens"] for r in tuned] == [2, 64] and records[-1]["kind"] == "tune_saved"
    assert all(r["time_us"] <= r["default_us"] for r in tuned)  # never worse than the config in use
    monkeypatch.setenv("MOELAB_MOE_CONFIG_DIR", str(tmp_path))
    tc.load_tuned.cache_clear()
    try:
        dev = torch.device("cuda")
        w = make_weights(E, H, I, fmt, dev, seed=1)
        ref_w = Bf16Experts(*w.dequantize(torch.float32))
        for r in tuned:
            assert tc.get_config(r["tokens"], E, K, H, I, fmt) == r["config"]
            x, tw, ids = make_inputs(r["tokens"], E, K, H, 1, dev, seed=3)[0]
            out = RUNNERS.create("triton")(x, tw, ids, w).float()
            ref = RUNNERS.create("reference")(x, tw, ids, ref_w).float()
            assert ((out - ref).norm() / ref.norm()).item() < 2e-2, r["config"]
    finally:
        tc.load_tuned.cache_clear()
