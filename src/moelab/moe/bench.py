"""The kernel benchmark worker: one backend and one weight format per process.

Run by `moelab kernels` as `python -m moelab.moe.bench '<json spec>'` so that a crash, an illegal
memory access or a compile error ends only this process. It prints one JSON line per result as
it goes (stdout), so rows finished before a crash survive. Modes:
    calibrate  copy bandwidth and bf16 matmul rate of this GPU (the roofline's ceilings)
    run        correctness vs the reference on the same dequantized weights, then timing
    tune       search launch configs of the triton runner per token count, write moe/configs/
Timing on CUDA: CUDA events over CUDA-graph replays of R calls with different routing (rotating
inputs, so L2 does not hold one call's experts for the next); on CPU: wall clock.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import torch

from moelab.moe import RUNNERS, quantize_experts
from moelab.moe.bf16 import Bf16Experts
from moelab.moe.roofline import layer_cost, roofline_us

TOLERANCE = 2e-2  # relative L2 error vs the reference; bf16 activations land near 5e-3


def emit(row: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def make_inputs(T: int, E: int, K: int, H: int, R: int, dev: torch.device, seed: int) -> list[tuple]:
    """R routed batches: x [T, H] bf16, topk_weights [T, K] fp32 (softmax-renormalised), ids [T, K]."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(R):
        logits = torch.randn(T, E, generator=g)
        w, ids = torch.topk(torch.softmax(logits, dim=1), K, dim=1)
        x = torch.randn(T, H, generator=g).to(torch.bfloat16)
        out.append((x.to(dev), (w / w.sum(1, keepdim=True)).to(dev), ids.to(torch.int32).to(dev)))
    return out


def make_weights(E: int, H: int, I: int, fmt: str, dev: torch.device, seed: int, block=None):
    torch.manual_seed(seed)
    # scale ~ 1/sqrt(fan_in) so outputs stay O(1) like a trained layer
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * H ** -0.5
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * I ** -0.5
    return quantize_experts(w13, w2, fmt, **({"block": block} if block else {}))


def time_calls(fn, inputs: list[tuple], dev: torch.device, reps: int) -> tuple[float, bool]:
    """Median microseconds per call and whether a CUDA graph was used."""
    if dev.type != "cuda":
        samples = []
        for i in range(max(3, reps // 10)):
            t0 = time.perf_counter()
            fn(*inputs[i % len(inputs)])
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), False
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up (compiles) outside the graph
        for inp in inputs:
            fn(*inp)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph, used = None, True
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for inp in inputs:
                fn(*inp)
        run = graph.replay
    except Exception:  # a backend with a host sync cannot be captured: time it eagerly
        used, graph = False, None
        torch.cuda.synchronize()

        def run():
            for inp in inputs:
                fn(*inp)
    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1e3 / len(inputs))
    return statistics.median(samples), used


def copy_bandwidth(dev: torch.device) -> tuple[float, dict[str, float]]:
    """Best of a device-to-device memcpy and an elementwise kernel (read + write counted), 2 GiB
    each way, far past the 60 MB L2; timed eagerly (a memcpy node inside a CUDA graph measured only
    2.7 TB/s on the H200, below what the MoE kernel itself streamed). (bytes/s, by method)"""
    n = 1 << 29  # float32 elements = 2 GiB
    a, b = torch.rand(n, device=dev), torch.empty(n, device=dev)
    rates = {}
    for label, fn in (("memcpy", lambda: b.copy_(a)), ("add", lambda: torch.add(a, 1.0, out=b))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(10):
            fn()
        ev[1].record()
        ev[1].synchronize()
        rates[label] = 10 * 2 * a.nbytes / (ev[0].elapsed_time(ev[1]) * 1e-3)
    return max(rates.values()), rates


def calibrate(spec: dict) -> None:
    if not torch.cuda.is_available():
        emit({"kind": "calibration", "device": "cpu", "copy_bw_bytes_s": None, "bf16_flops_s": None})
        return
    dev = torch.device("cuda")
    m = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(20):  # bring the clocks up before measuring anything
        m @ m
    us_mm, _ = time_calls(lambda: m @ m, [()], dev, 20)
    bw, rates = copy_bandwidth(dev)
    emit({"kind": "calibration", "copy_bw_bytes_s": bw, "copy_bw_by_method": rates,
          "bf16_flops_s": 2 * 8192 ** 3 / (us_mm * 1e-6), "device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability())})


def run(spec: dict) -> None:
    dev = torch.device(spec.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    E, K, H, I = spec["shape"]
    fmt, backend = spec["format"], spec["backend"]
    runner = RUNNERS.create(backend)
    why = runner.unsupported_reason(dev, fmt)
    if why:
        emit({"kind": "unsupported", "reason": why})
        return
    w = make_weights(E, H, I, fmt, dev, spec.get("seed", 0), spec.get("block"))
    ref_w = Bf16Experts(*w.dequantize(torch.float32))  # the same (dequantized) weights, once
    reference = RUNNERS.create("reference")
    R = spec.get("rotations", 8 if dev.type == "cuda" else 2)
    for T in spec["tokens"]:
        inputs = make_inputs(T, E, K, H, R, dev, seed=1000 + T)
        x, tw, ids = inputs[0]
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
        out = runner(x, tw, ids, w)
        ref = reference(x, tw, ids, ref_w).float()
        mem = (torch.cuda.max_memory_allocated() - base) / 2 ** 20 if dev.type == "cuda" else None
        outf = out.float()
        finite = bool(torch.isfinite(outf).all())
        err = float((outf - ref).norm() / ref.norm().clamp(min=1e-30)) if finite else float("nan")
        cause = "ok" if finite and err <= TOLERANCE else "numerical_nan" if not finite else "garbage_output"
        us, graphed = time_calls(lambda *a: runner(*a, w), inputs, dev, spec.get("reps", 50))
        touched = statistics.mean(float(torch.unique(i).numel()) for _, _, i in inputs)
        bytes_, flops = layer_cost(T, K, H, I, fmt, touched)
        roof = roofline_us(bytes_, flops, spec.get("copy_bw_bytes_s"), spec.get("bf16_flops_s"))
        emit({"kind": "row", "backend": backend, "format": fmt, "tokens": T, "time_us": us, "graph": graphed,
              "rel_err": err, "cause": cause, "mem_mib": mem, "experts_touched": touched,
              "bytes": bytes_, "flops": flops, "roofline_us": roof, "launch": runner.launch_label(T, w, K),
              "timing": "cuda-graph" if graphed else
              ("cuda-events" if dev.type == "cuda" else "wall-clock")})


def main() -> None:
    spec = json.loads(sys.argv[1])
    mode = spec.get("mode", "run")
    if mode == "calibrate":
        calibrate(spec)
    elif mode == "tune":
        from moelab.moe.tune import tune

        tune(spec, emit)
    else:
        run(spec)


if __name__ == "__main__":
    main()
