"""Search launch configs of the fused triton MoE runner per token count; save them as JSON.

Coordinate descent per token count, timed on the whole layer call (graph replays, rotating
routing): for each candidate BLOCK_M, sweep the gate/up kernel's tile with the down kernel at its
default, then sweep the down kernel with the best gate/up. A config that fails to compile or runs
out of shared memory is skipped. Small on purpose (vLLM sweeps 1,920 configs per M for an hour).
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

import torch

from moelab.moe.bench import make_inputs, make_weights, time_calls
from moelab.moe.triton_configs import default_config, device_name, save_tuned
from moelab.moe.triton_runner import TritonRunner

TILES = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
         for bn, bk, nw, ns in itertools.product((32, 64, 128), (64, 128), (4, 8), (3, 4))]


def tiles_for(bm: int) -> list[dict]:
    """8 warps only pay off on big tiles; small M-blocks stream weights with 4."""
    return [t for t in TILES if t["num_warps"] == 4 or bm >= 64]


def _time(cfg: dict, w, inputs, dev) -> float:
    runner = TritonRunner(cfg)
    try:
        us, _ = time_calls(lambda *a: runner(*a, w), inputs, dev, reps=10)
        return us
    except Exception:  # OutOfResources, compile failure: not a candidate
        torch.cuda.synchronize()
        return float("inf")


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
        bms = sorted({base["BLOCK_M"], max(16, base["BLOCK_M"] // 2)})
        for bm in bms:
            group = 1 if bm <= 32 else 8
            cur = {**best, "BLOCK_M": bm}
            cur_us = _time(cur, w, inputs, dev) if bm != best["BLOCK_M"] else best_us
            for stage in ("up", "down"):
                for tile in tiles_for(bm):
                    cand = {**cur, stage: {**tile, "GROUP_M": group}}
                    us = _time(cand, w, inputs, dev)
                    if us < cur_us:
                        cur, cur_us = cand, us
            if cur_us < best_us:
                best, best_us = cur, cur_us
        best_by_m[T] = best
        d = spec.get("config_dir")
        path = save_tuned(E, I, fmt, device_name(), {T: best}, Path(d) if d else None)  # kept if killed later
        emit({"kind": "tuned", "tokens": T, "format": fmt, "time_us": best_us, "default_us": default_us,
              "config": best})
    emit({"kind": "tune_saved", "path": str(path), "format": fmt})
