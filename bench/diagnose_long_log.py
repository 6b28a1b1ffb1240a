"""How long `moelab diagnose` takes on a long log: a server that ran for days logs hundreds of MB.

    python3 bench/diagnose_long_log.py            # 30 MB each
    python3 bench/diagnose_long_log.py --mb 100

Three logs of real engine output from tests/logs, each ending with a real failure (SGLang's KV-cache
OOM):
  repeated   healthy lines repeated as a long run repeats them (the same warnings, the same reports)
  numbered   the same lines, each with its own counter in front, so no two lines are alike
  tracebacks a real failing launch log (SGLang refusing NVFP4 on sm_90) repeated: an exception every few
             lines, as from a server that logs one per request; its first root error is the verdict
The baseline, measured in the same run, is the floor any reader pays: one case-insensitive search
for "error" on every line (what `grep -i error` does). The ratio says how many such passes a verdict
costs.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

LOGS = Path(__file__).resolve().parent.parent / "tests" / "logs"


def build(mb: int) -> dict[str, tuple[list[str], str]]:
    """name -> (lines, the cause the verdict must name)"""
    body = [ln for p in sorted(LOGS.glob("*.log")) if "ok" in p.name or "phases" in p.name
            for ln in p.read_text().splitlines()]
    failing = (LOGS / "sglang-0.5.23-nvfp4-on-sm90.log").read_text().splitlines()
    tail = (LOGS / "sglang-4330-not-enough-memory.log").read_text().splitlines()

    def fill(unit: list[str]) -> list[str]:
        size = sum(len(x) + 1 for x in unit)
        return unit * max(1, (mb << 20) // size)

    rep = fill(body)
    return {"repeated": (rep + tail, "gpu_oom"), "numbered": ([f"[{i}] {x}" for i, x in enumerate(rep)] + tail, "gpu_oom"),
            "tracebacks": (fill(failing) + tail, "unsupported_arch")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=30)
    a = ap.parse_args()
    from moelab.diagnose import classify

    classify(["warm-up: the rules are loaded once"])
    floor_rx = re.compile("error", re.I)
    print(f"{'log':<11} {'MB':>5} {'lines':>9} {'verdict':>16} {'s':>7} {'MB/s':>6}  baseline grep -i error (s)  ratio")
    for name, (lines, want) in build(a.mb).items():
        mb = sum(len(x) + 1 for x in lines) / (1 << 20)
        t0 = time.perf_counter()
        hits = sum(1 for x in lines if floor_rx.search(x))
        floor = time.perf_counter() - t0
        t0 = time.perf_counter()
        v = classify(lines)
        took = time.perf_counter() - t0
        ok = "" if v.cause.value == want else f"  WRONG (expected {want})"
        print(f"{name:<11} {mb:>5.1f} {len(lines):>9,} {v.cause.value:>16} {took:>7.2f} {mb / took:>6.1f}  "
              f"{floor:>26.2f}  {took / floor:>5.0f}x{ok}  ({hits:,} lines say error)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
