"""Search launch configs of the fused triton MoE runner per token count; save them as JSON.

Coordinate descent per token count, timed on the whole layer call (graph replays, rotating
routing): for each candidate BLOCK_M, sweep the gate/up kernel's tile with the down kernel at its
default, then sweep the down kernel with the best gate/up. Up to GEMV_TUNE_MAX_PAIRS (token, slot)
pairs the gemv path (triton_gemv.py) is descended the same way and the faster path is kept. A
config that fails to compile or runs out of shared memory is skipped. Small on purpose (vLLM
sweeps 1,920 configs per M for an hour).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

import torch

from moelab.moe.bench import make_inputs, make_weights, time_calls
from moelab.moe.triton_configs import default_config, device_name, gemv_config, save_tuned, tiled_config
from moelab.moe.triton_runner import TritonRunner

TILES = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
         for bn, bk, nw, ns in itertools.product((32, 64, 128), (64, 128), (4, 8), (3, 4))]


def tiles_for(bm: int) -> list[dict]:
    """8 warps only pay off on big tiles; small M-blocks stream weights with 4."""
    return [t for t in TILES if t["num_warps"] == 4 or bm >= 64]


GEMV_TUNE_MAX_PAIRS = 256  # past this the gemv path re-reads each expert's weights too often
GEMV_TILES = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
              for bn, bk, nw, ns in itertools.product((8, 16, 32, 64), (128, 256, 512), (2, 4, 8), (2, 3))]


def gemv_tiles_for(stage: str) -> list[dict]:
    """32-64 fp32 accumulators per thread: fewer starve the weight stream, more spill.
    The up kernel's tile stacks gate and up rows, so it holds 2*BLOCK_N rows."""
    rows = 2 if stage == "up" else 1
    return [t for t in GEMV_TILES if 32 <= rows * t["BLOCK_N"] * t["BLOCK_K"] // (32 * t["num_warps"]) <= 64]


def _time(cfg: dict, w, inputs, dev) -> float:
    runner = TritonRunner(cfg)
    try:
        us, _ = time_calls(lambda *a: runner(*a, w), inputs, dev, reps=10)
        return us
    except Exception:  # OutOfResources, compile failure: not a candidate
        torch.cuda.synchronize()
        return float("inf")


def _descend(cfg: dict, us: float, tiles: dict[str, list[dict]], w, inputs, dev) -> tuple[dict, float]:
    """The up kernel's tile with down fixed, then down's with the best up."""
    for stage in ("up", "down"):
        for tile in tiles[stage]:
            cand = {**cfg, stage: tile}
            t = _time(cand, w, inputs, dev)
            if t < us:
                cfg, us = cand, t
    return cfg, us


def tune(spec: dict, emit: Callable[[dict[str, Any]], None]) -> None:
    dev = torch.device("cuda")
    E, K, H, I = spec["shape"]
    fmt = spec["format"]
    w = make_weights(E, H, I, fmt, dev, 0, spec.get("block"))
    best_by_m: dict[int, dict] = {}
    for T in spec["tokens"]:
        inputs = make_inputs(T, E, K, H, 4, dev, seed=T)
        base = default_config(T, E, K, H, I, fmt)
        best, best_us = base, _time(base, w, inputs, dev)
        default_us = best_us
        tiled = tiled_config(T, E, K, H, I, fmt)
        for bm in sorted({tiled["BLOCK_M"], max(16, tiled["BLOCK_M"] // 2)}):
            tiles = [{**t, "GROUP_M": 1 if bm <= 32 else 8} for t in tiles_for(bm)]
            cur = {**tiled, "BLOCK_M": bm}
            cur, cur_us = _descend(cur, _time(cur, w, inputs, dev), {"up": tiles, "down": tiles}, w, inputs, dev)
            if cur_us < best_us:
                best, best_us = cur, cur_us
            tiled = cur
        if T * K <= GEMV_TUNE_MAX_PAIRS:
            cur = gemv_config()
            cur, cur_us = _descend(cur, _time(cur, w, inputs, dev),
                                   {s: gemv_tiles_for(s) for s in ("up", "down")}, w, inputs, dev)
            if cur_us < best_us:
                best, best_us = cur, cur_us
        best_by_m[T] = best
        d = spec.get("config_dir")
        path = save_tuned(E, I, fmt, device_name(), {T: best}, Path(d) if d else None)  # kept if killed later
        emit({"kind": "tuned", "tokens": T, "format": fmt, "time_us": best_us, "default_us": default_us,
              "config": best})
    emit({"kind": "tune_saved", "path": str(path), "format": fmt})
