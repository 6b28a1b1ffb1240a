#!/usr/bin/env python3
"""What each MoE runner and weight format costs in answers: the trained `digits` preset's held-out
accuracy per configuration, paired with the reference runner in bf16 measured in the same run.

For each (runner, format) it serves `moelab serve --preset digits` and runs `moelab eval`'s
library (`moelab.evaluate.evaluate`) on the bundled `digits` task (600 held-out items: add, sort,
rev), greedy, at --concurrency; every row after the first is judged against the first row's
answers by the paired rule; "mean lp" is the answers' mean log-likelihood, which moves with a
format before the answers do. The triton runner runs through Triton's CPU interpreter on a CPU
(slow: it gets the first --triton-n items). Then the training record (steps, seconds, accuracy
the training model had) and the expert use per task from the preset's training.json.

    PYTHONPATH=src python3 bench/preset_accuracy.py                      # CPU, ~3 minutes
    python bench/preset_accuracy.py --device cuda --triton-n 600         # on a GPU machine
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from engine_throughput import Server  # `moelab serve` in its own session, ready on phase=ready (same folder)

from moelab.engine.config import TRAINED_PRESETS
from moelab.evaluate import evaluate, load_task


def per_task(run) -> dict[str, float]:
    by: dict[str, list[bool]] = {}
    for r in run.items:
        by.setdefault(r.id.split("-")[0], []).append(r.correct)
    return {k: sum(v) / len(v) for k, v in by.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--runners", default="reference,grouped,triton")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--triton-n", type=int, default=60, help="items for the triton runner on a CPU (interpreter)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="moelab-preset-accuracy-"))
    task = load_task("digits")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    configs = [(r, f) for f in a.formats.split(",") for r in a.runners.split(",")]
    configs.remove(("reference", "bf16"))
    configs.insert(0, ("reference", "bf16"))  # the baseline, first
    base = None
    print(f"digits preset, task digits ({len(task.items)} held-out items), device {a.device}, greedy, "
          f"concurrency {a.concurrency}; baseline: reference runner, bf16, same run", flush=True)
    print(f"{'runner':>9} {'format':>6} {'items':>5} {'accuracy':>8} {'add':>6} {'sort':>6} {'rev':>6} "
          f"{'lost':>4} {'gained':>6} {'mean lp':>8}  decision vs baseline {'':>20} {'wall':>6}", flush=True)
    for runner, fmt in configs:
        interp = runner == "triton" and a.device == "cpu"
        n = min(a.triton_n, len(task.items)) if interp else None
        q = {"bf16": "none"}.get(fmt, fmt)
        srv = Server(["--preset", "digits", "--device", a.device, "--moe-runner-backend", runner, "--quantization", q,
                      "--max-running-requests", str(a.concurrency)], work / f"{runner}-{fmt}.log", 1800,
                     {**env, "TRITON_INTERPRET": "1"} if interp else env)
        try:
            t0 = time.perf_counter()
            rep = evaluate(srv.url, task, n=n, concurrency=(a.concurrency,), reference=base, timeout_s=1800)
            wall = time.perf_counter() - t0
        finally:
            srv.stop()
        run, d = rep.points[0].run, rep.points[0].decision
        base = base or run
        acc = per_task(run)
        verdict = "baseline" if d is None else d.rule.split(" (")[0]
        print(f"{runner:>9} {fmt:>6} {run.n:>5} {run.accuracy:>8.1%} {acc.get('add', 0):>6.1%} {acc.get('sort', 0):>6.1%} "
              f"{acc.get('rev', 0):>6.1%} {'-' if d is None else d.lost:>4} {'-' if d is None else d.gained:>6} "
              f"{'-' if run.mean_logprob is None else f'{run.mean_logprob:.1e}':>8}  "
              f"{verdict:<41} {wall:>5.1f}s" + ("  (Triton CPU interpreter)" if interp else ""), flush=True)
    rec = json.loads((TRAINED_PRESETS["digits"] / "training.json").read_text())
    print(f"training: {rec['steps']} steps of {rec['batch']} sequences in {rec['train_seconds']:.0f} s on "
          f"{rec['threads']} CPU thread(s), torch {rec['torch']}, seed {rec['seed']}; final loss {rec['final_loss']}")
    print("expert use per task (share of the prompt tokens' top-k assignments, layer by layer, experts 0-7):")
    for t, r in rec["held_out"].items():
        for i, row in enumerate(r["expert_share"]):
            print(f"  {t:>4} layer {i}: " + " ".join(f"{x:4.2f}" for x in row))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the server it started
    main()
