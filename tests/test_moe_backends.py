"""Every MoE runner backend against the reference, over a grid of shapes and weight formats (CPU).

The triton kernel runs through Triton's interpreter (TRITON_INTERPRET=1) in a child process, so the
interpreter flag never leaks into other tests. A speed report over token counts 1, 2, 4 ... is
printed next to correctness (`pytest -s` shows it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from moelab.moe import RUNNERS, quantize_experts, resolve_runner  # noqa: E402
from moelab.moe.bf16 import Bf16Experts  # noqa: E402

SHAPES = [(8, 2, 64, 32), (16, 4, 128, 48), (4, 1, 32, 16)]  # (E, K, H, I)
FORMATS = [("bf16", {}), ("fp8", {}), ("nvfp4", {})]


def _problem(E, K, H, I, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, generator=g) * I ** -0.5
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    probs = torch.softmax(torch.randn(T, E, generator=g), dim=1)
    tw, ids = torch.topk(probs, K, dim=1)
    return w13, w2, x, tw, ids


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("fmt,opts", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_matches_reference(shape, fmt, opts):
    E, K, H, I = shape
    for T in (1, 5, 33):
        w13, w2, x, tw, ids = _problem(E, K, H, I, T, seed=T)
        w = quantize_experts(w13, w2, fmt, **opts)
        ref = RUNNERS.create("reference")(x, tw, ids, w)
        out = RUNNERS.create("grouped")(x, tw, ids, w)
        assert out.shape == (T, H) and out.dtype == x.dtype
        assert torch.isfinite(out).all()
        assert _rel(out, ref) < 2e-2


def test_reference_is_the_dense_formula():
    E, K, H, I, T = 4, 2, 16, 8, 3
    w13, w2, x, tw, ids = _problem(E, K, H, I, T)
    out = RUNNERS.create("reference")(x.float(), tw, ids, Bf16Experts(w13, w2))
    expect = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            e = ids[t, k]
            h = w13[e] @ x[t].float()
            expect[t] += tw[t, k] * (w2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    assert torch.allclose(out, expect, atol=1e-5)


@pytest.mark.parametrize("fmt,opts,tol", [("bf16", {}, 1e-2), ("fp8", {}, 6e-2), ("fp8", {"block": (128, 128)}, 6e-2),
                                          ("nvfp4", {}, 0.15)])
def test_quantized_weights_stay_close_to_dense(fmt, opts, tol):
    w13, w2, *_ = _problem(2, 1, 256, 128, 1)
    w = quantize_experts(w13, w2, fmt, **opts)
    d13, d2 = w.dequantize(torch.float32)
    assert _rel(d13, w13) < tol and _rel(d2, w2) < tol
    dense_bytes = (w13.numel() + w2.numel()) * 2
    assert w.nbytes() <= dense_bytes * {"bf16": 1, "fp8": 0.52, "nvfp4": 0.3}[fmt]


def test_nvfp4_layout_is_modelopt():
    w13, w2, *_ = _problem(2, 1, 64, 32, 1)
    w = quantize_experts(w13, w2, "nvfp4")
    assert w.w13.dtype == torch.uint8 and w.w13.shape == (2, 64, 32)  # two e2m1 per byte along K
    assert w.w13_scale.dtype == torch.float8_e4m3fn and w.w13_scale.shape == (2, 64, 4)  # one per 16
    assert w.w13_scale_2.shape == (2, 2) and w.w2_scale_2.shape == (2,)  # fp32 global (gate, up) / down


def test_bad_format_and_block_are_refused_clearly():
    w13, w2, *_ = _problem(2, 1, 64, 32, 1)
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        quantize_experts(w13, w2, "int3")
    with pytest.raises(ValueError, match="divisible"):
        quantize_experts(w13, w2, "fp8", block=(128, 128))


def test_resolve_runner_auto_and_refusals():
    cpu = torch.device("cpu")
    assert resolve_runner("auto", cpu, "bf16")[0] == "grouped"
    assert resolve_runner("reference", cpu, "nvfp4") == ("reference", "reference: chosen explicitly")
    with pytest.raises(ValueError, match="--moe-runner-backend triton cannot run here.*CUDA.*grouped"):
        resolve_runner("triton", cpu, "bf16")
    with pytest.raises(ValueError, match="--moe-runner-backend 'fast' is unknown"):
        resolve_runner("fast", cpu, "bf16")
    with pytest.raises(ValueError, match="--quantization"):
        resolve_runner("auto", cpu, "int4")
    if torch.cuda.is_available():
        assert resolve_runner("auto", torch.device("cuda"), "nvfp4")[0] == "triton"


_INTERP = r"""
import json, sys, torch
from moelab.moe import RUNNERS, quantize_experts
from moelab.moe.triton_configs import fused_config, gemv_config, tiled_config
from moelab.moe.triton_runner import TritonRunner, _workspaces
res = []
for c in json.loads(sys.argv[1]):
    E, K, H, I = c["shape"]
    T, fmt, block = c["T"], c["fmt"], c.get("block")
    g = torch.Generator().manual_seed(E * T + H)
    w13 = torch.randn(E, 2 * I, H, generator=g) * H ** -0.5
    w2 = torch.randn(E, H, I, generator=g) * I ** -0.5
    x = torch.randn(T, H, generator=g).to(getattr(torch, c.get("x", "bfloat16")))
    tw, ids = torch.topk(torch.softmax(torch.randn(T, E, generator=g), 1), K, dim=1)
    if "ids" in c:  # fixed routing, as int32 like the model's
        ids = torch.tensor(c["ids"], dtype=torch.int32)
    w = quantize_experts(w13, w2, fmt, **({"block": tuple(block)} if block else {}))
    cfg = {"tiled": lambda: tiled_config(T, E, K, H, I, fmt), "gemv": lambda: gemv_config(fmt), "fused": fused_config,
           None: lambda: None}[c.get("path")]()
    for stage, tile in c.get("tiles", {}).items():
        cfg[stage].update(tile)
    if "fused" in c:
        cfg.update(c["fused"])
    if "block_m" in c:
        cfg["BLOCK_M"] = c["block_m"]
    for _ in range(c.get("calls", 1)):  # the fused path's workspace must come back zeroed each time
        out = TritonRunner(cfg)(x, tw, ids, w)
    ref = RUNNERS.create("reference")(x, tw, ids, w).float()
    res.append({"case": c, "dtype": str(out.dtype).removeprefix("torch."), "finite": bool(torch.isfinite(out).all()),
                "dirty": sum(int(t.count_nonzero()) for ws in _workspaces.values() for t in ws),
                "counts": torch.bincount(ids.flatten().long(), minlength=E).tolist(),
                "err": float((out.float() - ref).norm() / ref.norm())})
print(json.dumps(res))
"""


def _interpret(cases: list[dict], procs: int = 2) -> list[dict]:
    """Every case in Triton's interpreter, in the order given. The interpreter runs on one core, so the
    cases are dealt round-robin to `procs` processes that run at once."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    shares = [cases[i::procs] for i in range(procs) if cases[i::procs]]
    running = [subprocess.Popen([sys.executable, "-c", _INTERP, json.dumps(share)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env) for share in shares]
    outs = []
    try:
        for p in running:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-2000:]
            outs.append(json.loads(out))
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
                p.communicate()
    got = [None] * len(cases)
    for i, share in enumerate(outs):
        got[i::len(shares)] = share
    return got


@pytest.mark.slow
def test_triton_kernel_matches_reference_in_interpreter():
    pytest.importorskip("triton")
    fmts = ("bf16", "fp8", "nvfp4")
    cases = [{"shape": [8, 2, 64, 32], "T": T, "fmt": fmt} for T in (1, 7, 40) for fmt in fmts]
    cases += [{"shape": [16, 4, 128, 48], "T": 9, "fmt": fmt} for fmt in fmts]  # I not a tile multiple
    cases += [{"shape": [2, 1, 256, 128], "T": 5, "fmt": "fp8", "block": [128, 128]}]
    cases = [{**c, "path": "tiled"} for c in cases]  # the default for most of these is gemv, tested below
    for r in _interpret(cases):
        print(f"triton (interpreter) {r['case']}: rel err {r['err']:.2e}")
        assert r["finite"] and r["err"] < 2e-2, r


@pytest.mark.slow
def test_swapped_and_split_tiles_match_reference_in_interpreter():
    """SWAP_AB (weight rows on the dot's M axis) and SPLIT_M (a half-height tile for an M-block whose
    rows fit in its first half) in both tiled kernels, every format. 100 tokens over 8 experts at
    BLOCK_M=32 give expert segments whose last block has 1-16 rows (half tile) and 17-32 (full)."""
    pytest.importorskip("triton")
    both = {"SWAP_AB": True, "SPLIT_M": True}
    cases = []
    for fmt, block, shape in [("bf16", None, [8, 2, 64, 48]), ("fp8", None, [8, 2, 64, 48]),
                              ("fp8", [128, 128], [4, 2, 256, 128]), ("nvfp4", None, [8, 2, 64, 48])]:
        base = {"shape": shape, "fmt": fmt, "block": block, "path": "tiled", "block_m": 32}
        small = {"BLOCK_N": 16, "BLOCK_K": 32}
        cases += [{**base, "T": 100, "tiles": {"up": {**both, **small}, "down": {**both, **small}}},
                  {**base, "T": 100, "tiles": {"up": {"SPLIT_M": True}, "down": {"SWAP_AB": True}}},
                  {**base, "T": 3, "tiles": {"up": both, "down": both}}]
        if fmt == "fp8":
            a8 = {"A8": True, "BLOCK_N": 16, "BLOCK_K": 32}
            cases += [{**base, "T": 100, "tiles": {"up": a8, "down": {**a8, "SWAP_AB": True}}},
                      {**base, "T": 100, "tiles": {"up": {**a8, **both}, "down": {**a8, "SPLIT_M": True}}}]
    for r in _interpret(cases):
        print(f"triton swapped/split (interpreter) {r['case']}: rel err {r['err']:.2e}")
        assert r["finite"] and r["err"] < 2e-2, r
        if r["case"]["T"] == 100:  # both kinds of last block occur
            tails = {c % 32 for c in r["counts"]}
            assert tails & set(range(1, 17)) and tails & {0, *range(17, 32)}, r["counts"]


# (fmt, block, shape): shapes not multiples of the tiles (K tails masked), block fp8 needs 128s
_GEMV_FORMATS = [("bf16", None, [8, 2, 96, 40]), ("fp8", None, [8, 2, 96, 40]),
                 ("fp8", [128, 128], [4, 2, 256, 128]), ("nvfp4", None, [8, 2, 96, 48])]


@pytest.mark.slow
def test_gemv_path_matches_reference_in_interpreter():
    """Every format at 1 and 3 tokens, and with 3 tokens sharing an expert (int32 ids), at the
    default gemv tiles and at small ones (several K blocks, N and K tails). fp32 activations make
    the check tight: the gemv kernels accumulate in fp32 like the reference."""
    pytest.importorskip("triton")
    small = {"up": {"BLOCK_N": 8, "BLOCK_K": 32}, "down": {"BLOCK_N": 16, "BLOCK_K": 16}}
    wide = {"down": {"BLOCK_N": 8, "BLOCK_K": 16, "WIDE": True}}  # every slot in one tile; N and K tails
    wide_nv = {"down": {"BLOCK_N": 8, "BLOCK_K": 32, "WIDE": True}}  # nvfp4: I=48, a K tail of one scale group
    cases = []
    for fmt, block, shape in _GEMV_FORMATS:
        base = {"shape": shape, "fmt": fmt, "block": block, "path": "gemv"}
        cases += [{**base, "T": 1, "x": "float32"}, {**base, "T": 3}, {**base, "T": 3, "tiles": small, "x": "float32"},
                  {**base, "T": 3, "ids": [[1, 3], [3, 0], [2, 3]], "x": "float32"}]
        cases += [{**base, "T": 3, "tiles": wide_nv if fmt == "nvfp4" else wide, "x": "float32"},
                  {**base, "T": 2, "ids": [[1, 3], [3, 1]], "tiles": wide_nv if fmt == "nvfp4" else wide}]
    # top-3: WIDE tiles hold a fourth, masked slot
    cases.append({"shape": [8, 3, 96, 40], "T": 2, "fmt": "fp8", "path": "gemv", "tiles": wide, "x": "float32"})
    cases.append({"shape": [8, 2, 96, 40], "T": 2, "fmt": "bf16"})  # no config: the default for 4 pairs is gemv
    for r in _interpret(cases):
        c = r["case"]
        print(f"triton gemv (interpreter) {c}: rel err {r['err']:.2e}")
        assert r["finite"] and r["dtype"] == c.get("x", "bfloat16"), r
        assert r["err"] < (1e-5 if c.get("x") == "float32" else 2e-2), r


@pytest.mark.slow
def test_fused_path_matches_reference_in_interpreter():
    """The one-launch kernel in every format: 1 and 3 tokens, a shared expert (int32 ids), I-blocks
    that leave a tail, several H blocks; called three times in a row, each answer must match and the
    shared workspace must be left zeroed (the last program of each token clears its row)."""
    pytest.importorskip("triton")
    small = {"BLOCK_I": 16, "BLOCK_K": 32, "BLOCK_H": 32}
    cases = []
    for fmt, block, shape in _GEMV_FORMATS:
        base = {"shape": shape, "fmt": fmt, "block": block, "path": "fused", "calls": 3}
        cases += [{**base, "T": 1, "x": "float32"}, {**base, "T": 3},
                  {**base, "T": 3, "fused": small, "x": "float32"},
                  {**base, "T": 3, "ids": [[1, 3], [3, 0], [2, 3]], "fused": small, "x": "float32"}]
    for r in _interpret(cases):
        c = r["case"]
        print(f"triton fused (interpreter) {c}: rel err {r['err']:.2e}")
        assert r["finite"] and r["dtype"] == c.get("x", "bfloat16") and r["dirty"] == 0, r
        # the activation is rounded to x's dtype between the GEMMs, like the two-launch paths
        assert r["err"] < (1e-5 if c.get("x") == "float32" else 2e-2), r


_ALIGN = r"""
import json, sys, torch
from moelab.moe.triton_align import align_block_size
res = []
for n_tok, E, K, bm in json.loads(sys.argv[1]):
    ids = torch.randint(0, E, (n_tok, K), generator=torch.Generator().manual_seed(n_tok), dtype=torch.int32)
    sorted_ids, expert_ids, total = align_block_size(ids, E, bm)
    res.append({"ids": ids.flatten().tolist(), "sorted": sorted_ids.tolist(), "experts": expert_ids.tolist(),
                "total": int(total)})
print(json.dumps(res))
"""


@pytest.mark.slow
def test_alignment_sorts_pairs_into_expert_blocks_in_interpreter():
    """Both alignment paths: one program (up to 4,096 pairs) and count/offsets/scatter past it.
    Every pair lands once, in a block of its own expert; every other row up to the padded length
    holds the sentinel; blocks past `total` are never read."""
    pytest.importorskip("triton")
    cases = [(5, 8, 2, 16), (300, 128, 8, 64), (700, 128, 8, 128)]  # 10, 2,400 and 5,600 pairs
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", _ALIGN, json.dumps(cases)], capture_output=True, text=True,
                       env=env, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    for (n_tok, E, K, bm), r in zip(cases, json.loads(p.stdout)):
        ids, srt, total, n = r["ids"], r["sorted"], r["total"], n_tok * K
        counts = [ids.count(e) for e in range(E)]
        assert total == sum(-(-c // bm) * bm for c in counts) and total <= len(srt)
        assert sorted(v for v in srt[:total] if v != n) == list(range(n))  # each pair once
        assert all(v == n for v in srt[total:])
        for b in range(total // bm):
            rows = [v for v in srt[b * bm:(b + 1) * bm] if v != n]
            assert rows and all(ids[v] == r["experts"][b] for v in rows), (n_tok, b)


def test_fused_workspace_grows_without_freeing_what_graphs_use():
    """The fused path's workspace is shared per (device, H) and starts zeroed; a larger token count
    replaces it with a bigger zeroed one, and the old one stays alive, because a CUDA graph
    captured earlier keeps its address (freeing it would let that graph write into reused memory)."""
    from moelab.moe import triton_runner as tr

    cpu, H = torch.device("cpu"), 1234  # an H no other test uses
    small = tr.fused_workspace(cpu, 3, H)
    assert small[0].shape == (64, H) and small[1].shape == (64,) and not small[0].any()
    assert tr.fused_workspace(cpu, 64, H)[0] is small[0]  # fits: reused
    big = tr.fused_workspace(cpu, 65, H)
    assert big[0].shape == (128, H) and not big[0].any() and not big[1].any()
    assert any(ws[0] is small[0] for ws in tr._retired)
    assert tr.fused_workspace(cpu, 1, H)[0] is big[0]


def test_tuner_search_space_holds_every_shipped_config():
    """`moelab kernels --tune` can reproduce the shipped H200 files: every tile in them is one of
    the tuner's candidates for its path, stage and BLOCK_M, and each BLOCK_M is one it tries."""
    from moelab.moe.triton_configs import CONFIG_DIR
    from moelab.moe.tune import block_m_candidates, fused_tiles, gemv_tiles, tiled_tiles

    assert block_m_candidates(1, 128, 8) == [16] and block_m_candidates(4096, 128, 8) == [64, 128]
    assert block_m_candidates(512, 128, 8) == [16, 32, 64] and block_m_candidates(512, 128, 8, "nvfp4")[-1] == 128
    files = sorted(CONFIG_DIR.glob("E=*.json"))
    assert files
    for f in files:
        E = int(f.name.split(",")[0].removeprefix("E="))
        fmt = f.stem.split("fmt=")[1]
        for m, cfg in ((m, c) for m, c in json.loads(f.read_text()).items() if m.isdigit()):
            if cfg.get("path") == "fused":
                assert cfg in fused_tiles(fmt), (f.name, m)
                continue
            for stage in ("up", "down"):
                pool = gemv_tiles(stage) if cfg.get("path") == "gemv" else tiled_tiles(cfg["BLOCK_M"], stage, fmt)
                assert cfg[stage] in pool, (f.name, m, stage)
            if cfg.get("path") != "gemv":
                assert cfg["BLOCK_M"] in block_m_candidates(int(m), E, 8, fmt), (f.name, m)  # shipped: top-8 models


def test_launch_label_names_the_path_and_switches(monkeypatch):
    """`moelab kernels` prints it next to each triton timing, so a reader sees which rows ran fp8
    activations (A8) and which the gemv path. It names what is launched on the weights' device:
    A8 needs fp8 weights and a tl.dot that takes fp8 (sm_89 and later, or Triton's interpreter)."""
    from moelab.moe.bench import make_weights
    from moelab.moe.triton_configs import fused_config, gemv_config
    from moelab.moe.triton_runner import TritonRunner, fp8_dots

    bf16 = make_weights(8, 64, 32, "bf16", torch.device("cpu"), 0)
    fp8 = make_weights(8, 64, 32, "fp8", torch.device("cpu"), 0)
    tile = {"BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3, "GROUP_M": 1}
    both = {"BLOCK_M": 16, "up": {**tile, "A8": True, "SWAP_AB": True}, "down": {**tile, "A8": True, "SWAP_AB": True}}
    assert TritonRunner(gemv_config()).launch_label(1, fp8, 2) == "gemv"
    assert TritonRunner(fused_config()).launch_label(1, fp8, 2) == "fused"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fp8_dots.cache_clear()
    try:
        assert TritonRunner(both).launch_label(64, fp8, 2) == "tiled M16 A8 SWAP_AB"
        assert TritonRunner(both).launch_label(64, bf16, 2) == "tiled M16 SWAP_AB"  # A8 is for fp8 weights only
        monkeypatch.delenv("TRITON_INTERPRET")
        fp8_dots.cache_clear()
        assert TritonRunner(both).launch_label(64, fp8, 2) == "tiled M16 SWAP_AB"  # a CPU's tl.dot takes no fp8
    finally:
        fp8_dots.cache_clear()
    split_up = {"BLOCK_M": 128, "up": {**tile, "SPLIT_M": True}, "down": tile}
    assert TritonRunner(split_up).launch_label(4096, bf16, 2) == "tiled M128 up:SPLIT_M"
    assert TritonRunner().launch_label(1, bf16, 2) == "gemv"  # no tuned file on a CPU: the default
    assert RUNNERS.create("grouped").launch_label(1, bf16, 2) is None


def test_default_config_picks_gemv_for_few_pairs():
    from moelab.moe.triton_configs import GEMV_MAX_PAIRS, default_config

    E, K, H, I = 128, 8, 2048, 768
    few = default_config(GEMV_MAX_PAIRS // K, E, K, H, I, "nvfp4")
    assert few["path"] == "gemv" and "BLOCK_M" not in few and {"BLOCK_N", "BLOCK_K"} <= set(few["up"])
    many = default_config(GEMV_MAX_PAIRS // K + 1, E, K, H, I, "nvfp4")
    assert many.get("path", "tiled") == "tiled" and many["BLOCK_M"] >= 16
    # Mixtral (8 experts, top-2): 16 tokens put four pairs on each expert; the gemv path would read
    # every expert four times, so only up to one pair per expert on average takes it
    assert default_config(4, 8, 2, 4096, 14336, "bf16")["path"] == "gemv"
    assert "path" not in default_config(16, 8, 2, 4096, 14336, "bf16")


def test_get_config_honours_a_tuned_file_mixing_both_paths(tmp_path, monkeypatch):
    from moelab.moe import triton_configs as tc

    E, K, H, I = 8, 2, 64, 32
    gemv = {**tc.gemv_config(), "up": {"BLOCK_N": 8, "BLOCK_K": 128, "num_warps": 2, "num_stages": 2}}
    tiled = tc.tiled_config(4, E, K, H, I, "bf16")
    monkeypatch.setenv("MOELAB_MOE_CONFIG_DIR", str(tmp_path))
    tc.load_tuned.cache_clear()
    try:
        tc.save_tuned(E, I, "bf16", tc.device_name(), {1: gemv, 4: tiled, 100: gemv, 250: gemv})
        assert tc.get_config(1, E, K, H, I, "bf16") == gemv
        assert tc.get_config(3, E, K, H, I, "bf16") == tiled  # nearest is 4: tuned tiled wins over default gemv
        assert tc.get_config(120, E, K, H, I, "bf16") == gemv  # tuned gemv wins over default tiled
        assert "path" not in tc.get_config(1000, E, K, H, I, "bf16")  # too far from any tuned M: default
        assert tc.get_config(250, E, K, H, I, "bf16") == gemv  # 500 pairs: within the gemv range
        assert "path" not in tc.get_config(300, E, K, H, I, "bf16")  # 600 pairs: past it, the default
    finally:
        tc.load_tuned.cache_clear()


def test_save_tuned_into_a_directory_keeps_what_that_directory_holds(tmp_path, monkeypatch):
    """Saving token counts one at a time into an explicit directory accumulates them there (it once
    merged with the packaged file instead, so each save dropped the previous one)."""
    from moelab.moe import triton_configs as tc

    E, K, H, I = 8, 2, 64, 32
    monkeypatch.setenv("MOELAB_MOE_CONFIG_DIR", str(tmp_path / "in-use"))
    tc.load_tuned.cache_clear()
    try:
        tc.save_tuned(E, I, "bf16", tc.device_name(), {1: tc.gemv_config()})  # the file in use
        out = tmp_path / "new"
        for T in (64, 256):
            tc.save_tuned(E, I, "bf16", tc.device_name(), {T: tc.tiled_config(T, E, K, H, I, "bf16")}, out)
        saved = json.loads((out / tc.config_file_name(E, I, "bf16", tc.device_name())).read_text())
        assert sorted((m for m in saved if m.isdigit()), key=int) == ["1", "64", "256"]  # seeded, then accumulated
        assert saved["tuned_on"] == {m: tc.kernel_revision() for m in ("1", "64", "256")}
    finally:
        tc.load_tuned.cache_clear()


def test_a_file_tuned_on_other_kernels_still_runs_and_says_so(tmp_path, monkeypatch, caplog):
    """Each entry records the kernel revision it was tuned on. Entries from other kernels stay in
    use, but loading the file warns once, naming the token counts to re-tune; saving stamps what it
    writes and keeps the stamps of what it carries over."""
    import logging

    from moelab.moe import triton_configs as tc

    E, K, H, I = 8, 2, 64, 32
    monkeypatch.setenv("MOELAB_MOE_CONFIG_DIR", str(tmp_path))
    f = tmp_path / tc.config_file_name(E, I, "bf16", tc.device_name())
    old = tc.tiled_config(64, E, K, H, I, "bf16")
    f.write_text(json.dumps({"tuned_on": {"64": "0123456789ab"}, "64": old, "1": tc.gemv_config()}))
    tc.load_tuned.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="moelab.moe.triton_configs"):
            assert tc.get_config(64, E, K, H, I, "bf16") == old  # still used
            assert tc.get_config(1, E, K, H, I, "bf16") == tc.gemv_config()
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and "entries for 1,64 tokens" in warned[0], warned  # "1" carries no stamp
        assert "--tune --tokens 1,64" in warned[0] and str(f) in warned[0]
        tc.save_tuned(E, I, "bf16", tc.device_name(), {1: tc.gemv_config()})
        data = json.loads(f.read_text())
        assert data["tuned_on"] == {"1": tc.kernel_revision(), "64": "0123456789ab"}
        assert tc.stale_entries(data) == [64]
    finally:
        tc.load_tuned.cache_clear()


def test_kernel_revision_follows_code_not_prose(tmp_path):
    from moelab.moe import triton_configs as tc

    src = (tc.CONFIG_DIR.parent / "triton_gemv.py").read_text()
    f = tmp_path / "triton_gemv.py"
    f.write_text(src)
    rev = tc.source_revision([f])
    assert rev == tc.source_revision([tc.CONFIG_DIR.parent / "triton_gemv.py"])
    f.write_text(src.replace('"""Decode-size MoE kernels', '"""Decode-size MoE kernels, reworded', 1)
                 .replace("\nimport triton\n", "\n# a new comment\n\nimport triton\n", 1)
                 .replace("tl.constexpr(2.0 ** 64)", "tl.constexpr(2.0 ** 64)  # an inline one   ", 1))
    assert f.read_text() != src and tc.source_revision([f]) == rev
    f.write_text(src.replace("2.0 ** 64", "2.0 ** 63", 1))
    assert tc.source_revision([f]) != rev


def test_shipped_config_files_were_tuned_on_these_kernels():
    """Fails after a kernel change until the shipped H200 entries are re-tuned, or re-measured and
    re-stamped: otherwise every H200 user would get the stale-file warning (or, unwarned, tiles
    that were fastest for other kernels)."""
    from moelab.moe import triton_configs as tc

    for f in sorted(tc.CONFIG_DIR.glob("E=*.json")):
        stale = tc.stale_entries(json.loads(f.read_text()))
        assert not stale, (f"{f.name}: entries {stale} predate the kernels' revision {tc.kernel_revision()}; "
                           "re-tune them on an H200 (`moelab kernels --tune`), or re-measure and set their "
                           "tuned_on stamps to that revision")


def test_speed_next_to_correctness_over_token_counts():
    """grouped vs reference on CPU: correctness and wall-clock per token count (printed)."""
    E, K, H, I = 16, 4, 256, 128
    w13, w2, *_ = _problem(E, K, H, I, 1)
    w = quantize_experts(w13, w2, "bf16")
    ref, grouped = RUNNERS.create("reference"), RUNNERS.create("grouped")
    print(f"\n{'T':>5} {'reference us':>13} {'grouped us':>11} {'rel err':>8}")
    for T in (1, 2, 4, 8, 16, 32, 64):
        _, _, x, tw, ids = _problem(E, K, H, I, T, seed=T)
        times = []
        for fn in (ref, grouped):
            t0 = time.perf_counter()
            out = fn(x, tw, ids, w)
            times.append((time.perf_counter() - t0) * 1e6)
            if fn is ref:
                r = out
        err = _rel(out, r)
        print(f"{T:>5} {times[0]:>13.0f} {times[1]:>11.0f} {err:>8.1e}")
        assert err < 2e-2
