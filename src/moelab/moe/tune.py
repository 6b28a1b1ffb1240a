"""Search launch configs of the fused triton MoE runner per token count; save them as JSON.

The gate/up and down kernels do not share a tile, so each is chosen by its own device time: for
each path (gemv, and tiled at each candidate BLOCK_M, which both tiled kernels share) the two
candidate lists are zipped into whole configs, every config runs a few layer calls under
torch.profiler, and the fastest up tile and the fastest down tile (by the time of their own
kernel) are kept. Each path's pair of winners is then timed as a whole call (CUDA-graph replays,
rotating routing, as `moelab kernels` does) against the current config, and the fastest whole
call is saved. The fused path is one kernel, so each of its candidates is timed as a whole call
(up to FUSED_TUNE_MAX_PAIRS pairs). A config that fails to compile or runs out of shared memory
is skipped. This is how the shipped H200 files were made (about 100 candidates per kernel and
path, twice that where the A8 or SPLIT_M switches apply; vLLM sweeps 1,920 configs per token
count for an hour). Some entries came from same-run A/B sweeps of the same candidates instead
(A8, SPLIT_M, NVFP4 from 256 tokens; see the README).
"""
from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any, Callable

import torch

from moelab.moe.bench import make_inputs, make_weights, time_calls
from moelab.moe.triton_configs import FUSED_TUNE_MAX_PAIRS, GEMV_TUNE_MAX_PAIRS, device_name, get_config, save_tuned
from moelab.moe.triton_runner import TritonRunner, fp8_dots

KERNELS = {"up": ("moe_gemv_up_kernel", "moe_up_kernel"), "down": ("moe_gemv_down_kernel", "moe_down_kernel")}


def gemv_tiles(stage: str, top_k: int = 8) -> list[dict]:
    """16-128 fp32 accumulators per thread: fewer starve the weight stream, more spill. The up
    kernel's tile stacks gate and up rows, so it holds 2*BLOCK_N rows. (The H200 winners were 4-16
    rows a program on one or two warps: many small programs keep more loads in flight.) The down
    kernel also tries WIDE tiles, every top-k slot at once, which hold next_pow2(top_k) * BLOCK_N
    rows."""
    rows = 2 if stage == "up" else 1
    out = []
    for bn, bk, nw, ns in itertools.product((4, 8, 16, 32), (128, 256, 512), (1, 2, 4, 8), (2, 3, 4)):
        if 16 <= rows * bn * bk // (32 * nw) <= 128:
            out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns})
    if stage == "down":
        slots = 1 << max(0, top_k - 1).bit_length()
        for bn, bk, nw, ns in itertools.product((2, 4, 8, 16), (128, 256), (1, 2, 4, 8), (2, 3)):
            if 16 <= slots * bn * bk // (32 * nw) <= 128:
                out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns, "WIDE": True})
    return out


def fused_tiles(fmt: str = "bf16") -> list[dict]:
    """The one-launch kernel: BLOCK_I intermediate rows per program (16 at least for nvfp4's scale
    groups), with the gate/up tile (2*BLOCK_I x BLOCK_K) and the down tile (BLOCK_H x BLOCK_I) each
    holding 16-128 fp32 accumulators per thread, as gemv_tiles."""
    out = []
    for bi, bk, bh, nw, ns in itertools.product((8, 16, 32, 64), (128, 256, 512), (64, 128, 256, 512), (1, 2, 4),
                                                (2, 3, 4)):
        if fmt == "nvfp4" and bi < 16:
            continue
        if 16 <= 2 * bi * bk // (32 * nw) <= 128 and 16 <= bh * bi // (32 * nw) <= 128:
            out.append({"path": "fused", "BLOCK_I": bi, "BLOCK_K": bk, "BLOCK_H": bh, "num_warps": nw, "num_stages": ns})
    return out


def tiled_tiles(bm: int, stage: str, fmt: str = "bf16", a8: bool = True) -> list[dict]:
    """8 warps and 5 stages only for big M-blocks; 256-wide K steps only below 128 rows (shared
    memory); a 256-wide N-tile only for the down kernel (the up tile is already 2*BLOCK_N wide).
    fp8 at M-blocks of 16-32 rows also tries fp8 activations with the weight rows on the dot's M
    axis (A8 + SWAP_AB); M-blocks of 64 rows and
    more also try the half-height tile for a mostly empty last block (SPLIT_M). a8=False (a GPU
    before sm_89, whose tl.dot takes no fp8) leaves A8 out."""
    out = []
    bns = (32, 64, 128) + ((256,) if stage == "down" and bm >= 64 else ())
    for bn, bk, nw, ns in itertools.product(bns, (64, 128, 256), (4, 8), (3, 4, 5)):
        if (nw == 8 and bm < 64) or (ns == 5 and bm <= 32) or (bk == 256 and (bm >= 128 or ns == 5)):
            continue
        out.append({"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns, "GROUP_M": 1 if bm <= 32 else 8})
    if fmt == "fp8" and bm <= 32 and a8:
        out += [{**t, "SWAP_AB": True, "A8": True} for t in out]
    if bm >= 64:
        out += [{**t, "SPLIT_M": True} for t in out]
    return out


def block_m_candidates(T: int, E: int, K: int, fmt: str = "bf16") -> list[int]:
    """M-blocks from half to twice the expected rows per expert (16 at least, 128 at most). NVFP4
    tries every size up to 128 from 8 rows per expert on: it dequantizes an expert's weights once
    per M-block, so fewer, taller blocks can win."""
    rows = T * K / E
    top = 128 if fmt == "nvfp4" and rows >= 8 else max(16, 2 * rows)
    return [bm for bm in (16, 32, 64, 128) if min(64, rows / 2) <= bm <= top]


def kernel_times(cfg: dict, w, inputs, reps: int = 3) -> dict[str, float]:
    """Device microseconds per layer call of the up and down kernels (torch.profiler, eager)."""
    runner = TritonRunner(cfg)
    for inp in inputs:  # compile and warm outside the profile
        runner(*inp, w)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for inp in inputs:
                runner(*inp, w)
        torch.cuda.synchronize()
    total: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        for stage, names in KERNELS.items():
            if any(n in ev.name for n in names):
                total[stage] += ev.device_time_total
    return {k: v / (reps * len(inputs)) for k, v in total.items()}


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # OutOfResources, compile failure: not a candidate
        torch.cuda.synchronize()
        return None


def _whole_us(cfg: dict, w, inputs) -> float:
    runner = TritonRunner(cfg)
    us = _try(lambda: time_calls(lambda *a: runner(*a, w), inputs, torch.device("cuda"), reps=20)[0])
    return float("inf") if us is None else us


def best_pair(make: Callable[[dict, dict], dict], ups: list[dict], downs: list[dict], w, inputs
              ) -> tuple[dict | None, dict[str, float]]:
    """Zip the two candidate lists (the shorter one cycles) and keep each kernel's fastest tile."""
    best: dict[str, tuple[float, dict | None]] = {"up": (float("inf"), None), "down": (float("inf"), None)}
    for i in range(max(len(ups), len(downs))):
        tiles = {"up": ups[i % len(ups)], "down": downs[i % len(downs)]}
        times = _try(kernel_times, make(tiles["up"], tiles["down"]), w, inputs) or {}
        for stage, us in times.items():
            if us < best[stage][0]:
                best[stage] = (us, tiles[stage])
    if best["up"][1] is None or best["down"][1] is None:
        return None, {}
    return make(best["up"][1], best["down"][1]), {s: best[s][0] for s in best}


def thin(tiles: list[dict], n: int | None) -> list[dict]:
    """At most n tiles, evenly spaced through the list (a quick tune; the tests use it)."""
    if not n or len(tiles) <= n:
        return tiles
    return [tiles[i * len(tiles) // n] for i in range(n)]


def tune(spec: dict, emit: Callable[[dict[str, Any]], None]) -> None:
    dev = torch.device("cuda")
    E, K, H, I = spec["shape"]
    fmt = spec["format"]
    n = spec.get("max_candidates")
    w = make_weights(E, H, I, fmt, dev, 0, spec.get("block"))
    a8 = fp8_dots(dev)  # A8 candidates only where tl.dot takes fp8
    path = None
    for T in spec["tokens"]:
        inputs = make_inputs(T, E, K, H, 8, dev, seed=T)
        current = get_config(T, E, K, H, I, fmt)
        results = [("current", _whole_us(current, w, inputs), current, {})]
        if T * K <= FUSED_TUNE_MAX_PAIRS:  # one kernel: each candidate is timed as a whole call
            us, cfg = min(((_whole_us(c, w, inputs), c) for c in thin(fused_tiles(fmt), n)), key=lambda r: r[0])
            results.append(("fused", us, cfg, {}))
        if T * K <= GEMV_TUNE_MAX_PAIRS:
            cfg, per = best_pair(lambda u, d: {"path": "gemv", "up": u, "down": d},
                                 thin(gemv_tiles("up", K), n), thin(gemv_tiles("down", K), n), w, inputs)
            if cfg:
                results.append(("gemv", _whole_us(cfg, w, inputs), cfg, per))
        for bm in block_m_candidates(T, E, K, fmt):
            cfg, per = best_pair(lambda u, d, bm=bm: {"BLOCK_M": bm, "up": u, "down": d},
                                 thin(tiled_tiles(bm, "up", fmt, a8), n), thin(tiled_tiles(bm, "down", fmt, a8), n), w, inputs)
            if cfg:
                results.append((f"tiled BLOCK_M={bm}", _whole_us(cfg, w, inputs), cfg, per))
        name, us, best, per = min(results, key=lambda r: r[1])
        d = spec.get("config_dir")
        path = save_tuned(E, I, fmt, device_name(), {T: best}, Path(d) if d else None)  # kept if killed later
        emit({"kind": "tuned", "tokens": T, "format": fmt, "time_us": us, "default_us": results[0][1],
              "winner": name, "kernel_us": per, "candidates": {r[0]: r[1] for r in results}, "config": best})
    emit({"kind": "tune_saved", "path": str(path), "format": fmt})
