#!/usr/bin/env python3
"""How close can a two-launch MoE layer get to its byte roofline at one token? (CUDA only)

At one token a MoE layer is two dependent weight streams: the gate/up rows of the K routed experts,
then their down rows. This script times the cheapest possible version of that, two read-only
Triton streaming kernels over exactly those byte counts (no dequantization, no math, 16-byte loads,
launch shapes swept), in a CUDA graph over 8 rotating buffer sets so L2 starts cold, like
`moelab kernels`. That floor is the named baseline; in the same run it times the triton MoE runner
at one token in each format and prints both as multiples of the roofline, and the runner over the
floor. It also prints the one-launch floor (one stream over both byte counts), the bound for the
runner's fused path, and how the runner launched (gemv or fused).

    python bench/decode_floor.py                       # Qwen3-30B-A3B shape
    python bench/decode_floor.py --shape 256,8,7168,2048 --formats bf16,fp8
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from moelab.moe import RUNNERS
from moelab.moe.bench import copy_bandwidth, make_inputs, make_weights, time_calls
from moelab.moe.roofline import layer_cost, parse_shape, weight_bytes_per_expert

LAUNCHES = ((1024, 4, 4), (2048, 2, 8), (512, 4, 4), (4096, 1, 8))  # (BLOCK, ITERS, warps)


@triton.jit
def _stream(p, o, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in tl.range(ITERS, num_stages=4):
        offs = (tl.program_id(0) * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(p + offs, mask=offs < n, other=0)
    tl.store(o + tl.program_id(0), tl.sum(acc))  # keeps the loads alive


def floor_us(*stream_bytes: int, dev: torch.device) -> tuple[float, dict]:
    """Best time over LAUNCHES for one streaming kernel per byte count, back to back, and the launch
    shape that gave it: (up, down) is the two-launch floor, (up + down,) the one-launch floor."""
    bufs = [tuple(torch.randint(-2**31, 2**31 - 1, (b // 4,), dtype=torch.int32, device=dev)
                  for b in stream_bytes) for _ in range(8)]
    sink = torch.empty(1 << 20, dtype=torch.int32, device=dev)
    best = (float("inf"), {})
    for block, iters, warps in LAUNCHES:
        def call(*streams, block=block, iters=iters, warps=warps):  # one layer: the up stream, then the down stream
            for t in streams:
                _stream[(triton.cdiv(t.numel(), block * iters),)](t, sink, t.numel(), BLOCK=block, ITERS=iters,
                                                                   num_warps=warps)
        us, _ = time_calls(call, bufs, dev, 30)  # the same CUDA-graph timing as `moelab kernels`
        if us < best[0]:
            best = (us, {"BLOCK": block, "ITERS": iters, "num_warps": warps})
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", help="a preset or E,K,H,I (as for moelab kernels)")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_floor.py needs a CUDA GPU: it times kernels on the device")
    label, (E, K, H, I) = parse_shape(args.shape)
    dev = torch.device("cuda")
    bw, _ = copy_bandwidth(dev)
    runner = RUNNERS.create("triton")
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s; {label}, one token, {K} experts")
    print(f"{'fmt':6} {'roof_us':>8} {'floor_us':>9} {'floor_x':>8} {'floor1_us':>10} {'floor1_x':>9} "
          f"{'triton_us':>10} {'triton_x':>9} {'vs_floor':>9} launch")
    rows = []
    for fmt in args.formats.split(","):
        per_row = weight_bytes_per_expert(H, I, fmt) / (3 * I)  # bytes of one weight row of length H
        up_b, down_b = int(K * 2 * I * per_row), int(K * H * I * per_row / H)
        f_us, launch = floor_us(up_b, down_b, dev=dev)
        f1_us, launch1 = floor_us(up_b + down_b, dev=dev)
        w = make_weights(E, H, I, fmt, dev, 0)
        inputs = make_inputs(1, E, K, H, 8, dev, seed=1)
        t_us, _ = time_calls(lambda *a: runner(*a, w), inputs, dev, 30)
        roof = layer_cost(1, K, H, I, fmt, K)[0] / bw * 1e6
        path = runner.launch_label(1, w, K)
        row = {"format": fmt, "roofline_us": roof, "floor_us": f_us, "floor_launch": launch,
               "floor1_us": f1_us, "floor1_launch": launch1, "triton_us": t_us, "triton_launch": path}
        rows.append(row)
        print(f"{fmt:6} {roof:8.1f} {f_us:9.1f} {f_us / roof:7.2f}x {f1_us:10.1f} {f1_us / roof:8.2f}x "
              f"{t_us:10.1f} {t_us / roof:8.2f}x {t_us / f_us:8.2f}x {path}")
        w = None
        torch.cuda.empty_cache()
    print(json.dumps({"device": torch.cuda.get_device_name(), "shape": [E, K, H, I], "copy_bw_bytes_s": bw,
                      "rows": rows}))


if __name__ == "__main__":
    main()
