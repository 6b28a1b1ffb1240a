"""What packing and Ray cost or gain per trial: the same small study run three ways.

    python3 bench/cluster_overhead.py            # sequential, --parallel 2, --executor ray (local cluster)
    python3 bench/cluster_overhead.py --json
    python3 bench/cluster_overhead.py --address HOST:6379   # the Ray run on an existing cluster

The study is a grid over the embedded engine's `tiny` preset (2 MoE backends x 2 values of
--max-running-requests, then 2 finalists measured twice): 6 launches, each a real `moelab serve`
with readiness, probe and a load point. Every figure is measured by running `moelab study` itself
into a fresh store. Wall time includes each run's own start (Ray's: starting a local cluster);
"per trial" is the mean launch-to-verdict time of a trial in the store; ratios are against the
sequential run. On a 2-core machine the gain is small: the point is that the overhead per trial is
measured.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STUDY = {"name": "overhead", "engine": "embedded", "model": "tiny",
         "base": {"--moe-runner-backend": "reference", "--max-running-requests": 4},
         "axes": {"--moe-runner-backend": ["reference", "grouped"], "--max-running-requests": [2, 4]},
         "strategy": "grid", "workload": {"concurrency": [2], "input_len": 16, "output_len": 16, "num_prompts": 8},
         "staged": {"finalists": 2, "repeats": 2}, "launch": {"timeout_s": 180}}


def run(mode: str, extra: list[str], folder: Path) -> dict:
    study = folder / f"{mode}.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    store = folder / f"{mode}.db"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(study), "--store", str(store), "--json",
                        *extra], capture_output=True, text=True, timeout=900, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{mode}: moelab study exited {r.returncode}\n{r.stderr[-3000:]}")
    s = json.loads(r.stdout)
    sys.path.insert(0, str(ROOT / "src"))
    from moelab.store import Store

    with Store(store) as st:
        launched = [t for t in st.trials() if t["status"] == "done"]
    per = sum(t["finished"] - t["started"] for t in launched) / len(launched)
    return {"mode": mode, "args": " ".join(extra) or "(none)", "wall_s": round(wall, 1), "trials": len(launched),
            "trials_per_min": round(len(launched) / wall * 60, 2), "per_trial_s": round(per, 2),
            "causes": s["causes"], "recommended": (s.get("recommendation") or {}).get("label")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--address", help="an existing Ray cluster for the Ray run (default: a local one)")
    a = ap.parse_args()
    ray = ["--executor", "ray"] + (["--address", a.address] if a.address else [])
    with tempfile.TemporaryDirectory(prefix="moelab-cluster-bench-") as d:
        rows = [run("sequential", [], Path(d)), run("packed", ["--parallel", "2"], Path(d)), run("ray", ray, Path(d))]
    base = rows[0]
    for r in rows:
        r["wall_ratio"] = round(r["wall_s"] / base["wall_s"], 2)
        r["throughput_ratio"] = round(r["trials_per_min"] / base["trials_per_min"], 2)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'mode':<11} {'args':<18} {'trials':>6} {'wall s':>7} {'trials/min':>10} {'per trial s':>11} "
          f"{'wall x':>7} {'trials/min x':>12}")
    for r in rows:
        print(f"{r['mode']:<11} {r['args']:<18} {r['trials']:>6} {r['wall_s']:>7.1f} {r['trials_per_min']:>10.2f} "
              f"{r['per_trial_s']:>11.2f} {r['wall_ratio']:>7.2f} {r['throughput_ratio']:>12.2f}")
    print("recommended: " + "; ".join(f"{r['mode']} {r['recommended']}" for r in rows))


if __name__ == "__main__":
    main()
