"""How few launches a staged study needs to find the best configuration of an SGLang-style space.

    python3 bench/study_efficiency.py                  # staged, the one-factor baseline, a bisect
    python3 bench/study_efficiency.py --skip-baseline  # staged and the bisect only
    python3 bench/study_efficiency.py --json

The engine is tests/fakes/sglang_sim.py: a real server process per launch that behaves like an
SGLang MoE launch on an sm_90 GPU (architecture gates in SGLang's and FlashInfer's own words,
memory limits from --mem-fraction-static and --cuda-graph-max-bs, NaN and '!!!!' backends, one
backend pair that dies of an illegal memory access only once 48 requests run together, step times
set by the backends and the batch). The space is 7 MoE runners x 5 FP4 GEMM backends x 4 attention
backends x --mem-fraction-static 0.30-0.95 (0.05) x --cuda-graph-max-bs 64-512 (64): 15,680
configurations. The load is 192 concurrent requests, where both numeric knobs bind (at 8 they do
nothing: the study reports that too).

Every number is measured by running `moelab study` itself (its CLI, its store). The truth the
study is scored against is the simulator's own model (`sglang_sim.performance`: the steady-state
output rate at 192 concurrent requests), evaluated for every configuration of the space without
launching anything: "ratio" is the model's throughput of the recommended configuration over the
model's best in the whole space. Run it again with the same --keep folder and it re-scores the
stored studies (moelab resumes them: nothing is launched again). The baseline, measured
in the same run, is the one-factor strategy (what engineers do by hand: the base, then every value
of every axis alone, numeric grid points included).
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "tests" / "fakes" / "sglang_sim.py"
sys.path.insert(0, str(SIM.parent))
import sglang_sim as sim  # noqa: E402

MOE, FP4, ATTN = "--moe-runner-backend", "--fp4-gemm-backend", "--attention-backend"
FRAC, GRAPH = "--mem-fraction-static", "--cuda-graph-max-bs"
AXES = {MOE: ["triton", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "cutlass",
              "marlin"],
        FP4: ["auto", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cudnn", "cutlass"],
        ATTN: ["fa3", "flashinfer", "triton", "trtllm_mha"],
        FRAC: {"low": 0.30, "high": 0.95, "step": 0.05}, GRAPH: {"low": 64, "high": 512, "step": 64}}
# the user's current configuration: it launches, and crashes once the load is real
BASE = {MOE: "triton", FP4: "auto", ATTN: "flashinfer", FRAC: sim.DEFAULT_FRACTION, GRAPH: sim.DEFAULT_GRAPH_BS}
LOAD, ROUNDS, OUTPUT_LEN = 192, 2, 16


def truth(flags: dict) -> float:
    """The simulator's own steady-state output rate for `flags` at LOAD concurrent requests."""
    return sim.performance(flags, LOAD, OUTPUT_LEN) or 0.0


def study_doc(name: str, **kw) -> dict:
    doc = {"name": name, "engine": "command", "command": [sys.executable, str(SIM), "--port", "{port}"],
           "base": dict(BASE), "axes": AXES,
           "reference": {MOE: "flashinfer_cutlass", FP4: "auto", ATTN: "fa3"},
           "workload": {"concurrency": [8, LOAD], "input_len": 32, "output_len": OUTPUT_LEN, "rounds": ROUNDS},
           "launch": {"timeout_s": 60}, "budget": {"trials": 200, "time_s": 7200}}
    doc.update(kw)
    return doc


def space() -> list[dict]:
    grid = {k: (v if isinstance(v, list) else [round(v["low"] + i * v["step"], 2)
                                                for i in range(int(round((v["high"] - v["low"]) / v["step"])) + 1)])
            for k, v in AXES.items()}
    return [dict(zip(grid, c)) for c in itertools.product(*grid.values())]


def run_study(doc: dict, work: Path) -> tuple[dict, list[dict], float]:
    path = work / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    store = work / f"{doc['name']}.db"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(path), "--store", str(store), "--json"],
                       capture_output=True, text=True, timeout=7200)
    took = time.monotonic() - t0
    if r.returncode == 2 or not r.stdout.strip():  # 2: moelab refused the study file itself
        raise SystemExit(f"moelab study {doc['name']} printed nothing (exit {r.returncode}):\n{r.stderr[-3000:]}")
    from moelab.store import Store

    with Store(store) as st:
        trials = st.trials()
    return json.loads(r.stdout), trials, took


def score(summary: dict, trials: list[dict], optimum: float, name: str) -> dict:
    """Launches, the best-so-far curve, causes against the simulator's truth, the recommendation's ratio."""
    from moelab.study.ranking import primary

    launched = [t for t in trials if t["status"] == "done"]
    curve, best_m, best_true = [], 0.0, 0.0
    wrong = []
    for i, t in enumerate(launched, 1):
        conc = 0 if t["stage"] in ("reference", "isolate") else LOAD  # every load trial runs up to LOAD
        want = sim.expected_cause(t["flags"], conc)
        if t["cause"] != want:
            wrong.append(f"trial {t['id']} {t['label']}: {t['cause']} (expected {want})")
        p = primary(t.get("metrics"))
        if t["cause"] == "ok" and p and p.get("output_tps") and p.get("concurrency") == LOAD:
            best_m = max(best_m, p["output_tps"])
            best_true = max(best_true, truth(t["flags"]))
        curve.append((i, round(best_m, 1), round(best_true / optimum, 3)))
    rec = summary.get("recommendation")
    flags = rec["flags"] if rec else None
    true = truth(flags) if flags else None
    pruned = [t for t in trials if t["status"] == "pruned"]
    return {"name": name, "launches": len(launched), "pruned": len(pruned), "trials": len(trials),
            "causes_right": len(launched) - len(wrong), "wrong": wrong, "curve": curve,
            "recommended": rec["label"] if rec else None, "recommended_measured_tps": rec["output_tps"] if rec else None,
            "recommended_true_tps": round(true, 1) if true else None,
            "ratio": round(true / optimum, 4) if true else 0.0,
            "fails_under_load": bool(flags) and sim.expected_cause(flags, LOAD) != "ok",
            "blamed": summary.get("blamed", []), "tuning": summary.get("tuning", []),
            "status": summary.get("status")}


def show(res: dict) -> None:
    print(f"\n== {res['name']}: {res['launches']} launches ({res['pruned']} more pruned before launch), "
          f"status {res['status']}")
    print(f"   causes right: {res['causes_right']}/{res['launches']}")
    for w in res["wrong"]:
        print(f"     WRONG {w}")
    print(f"   recommended: {res['recommended']}")
    print(f"     measured {res['recommended_measured_tps']:.1f} tok/s; simulator's model {res['recommended_true_tps']} "
          f"tok/s = {res['ratio']:.3f} of the space's optimum; fails under load: {res['fails_under_load']}")
    marks = [c for c in res["curve"] if c[0] in (1, 5, 10, 15, 20, 25, 30, 40, 50, 60) or c is res["curve"][-1]]
    print("   best so far (launch: measured tok/s, model ratio to optimum): "
          + ", ".join(f"{i}: {m:.0f} ({r:.2f})" for i, m, r in marks))
    for b in res["blamed"]:
        print(f"   pruned {b['flag']} {b['value']} ({b['cause']}, {b['how']}): {b['why']}")
    for tu in res["tuning"]:
        knobs = "; ".join(f"{k} {'flat' if v.get('flat') else 'best ' + str(v.get('best'))} effect "
                          + ", ".join(f"c={c}: {e:.0%}" for c, e in sorted(v.get('effect', {}).items(),
                                                                             key=lambda x: int(x[0])))
                          for k, v in tu["knobs"].items())
        print(f"   tuned {tu['survivor']} in {tu['launches']} launches: {knobs}")


def bisect(work: Path) -> dict:
    doc = study_doc("bisect", strategy="bisect", axes={}, reference=None,
                    base={**BASE, MOE: "flashinfer_cutlass", ATTN: "fa3"},
                    bisect={MOE: "triton", FP4: "cutlass", ATTN: "flashinfer", GRAPH: 256},
                    workload={"concurrency": [64], "input_len": 32, "output_len": 8, "rounds": 2})
    s, trials, took = run_study(doc, work)
    b = s.get("bisect") or {}
    return {"minimal": b.get("minimal"), "cause": b.get("cause"), "launches": sum(t["status"] == "done" for t in trials),
            "exact": sorted(map(tuple, b.get("minimal") or [])) == sorted([(MOE, "triton"), (ATTN, "flashinfer")]),
            "seconds": round(took)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the stores and trial folders here")
    a = ap.parse_args()
    pts = space()
    perf = [(truth(f), f) for f in pts]
    optimum, best = max(perf, key=lambda x: x[0])
    near = sum(1 for p, _ in perf if p >= 0.97 * optimum)
    print(f"space: {len(pts):,} configurations (the full grid's launch count); {sum(p > 0 for p, _ in perf):,} work "
          f"at {LOAD} concurrent requests; {near} are within 3 % of the optimum, "
          f"{optimum:.0f} tok/s (model) at {' '.join(f'{k} {v}' for k, v in best.items())}")
    work = a.keep or Path(tempfile.mkdtemp(prefix="moelab-bench-study-"))
    work.mkdir(parents=True, exist_ok=True)
    out = {"space": len(pts), "optimum_tps": round(optimum, 1), "within_3pct": near}
    s, trials, took = run_study(study_doc("staged"), work)
    out["staged"] = score(s, trials, optimum, "staged")
    out["staged"]["seconds"] = round(took)
    show(out["staged"])
    if not a.skip_baseline:
        s, trials, took = run_study(study_doc("one-factor", strategy="one-factor"), work)
        out["one_factor"] = score(s, trials, optimum, "one-factor (baseline)")
        out["one_factor"]["seconds"] = round(took)
        show(out["one_factor"])
    out["bisect"] = bisect(work)
    b = out["bisect"]
    print(f"\n== bisect of {MOE} triton + {FP4} cutlass + {ATTN} flashinfer + {GRAPH} 256 at 64 concurrent: "
          f"minimal {b['minimal']} ({b['cause']}) in {b['launches']} launches: exact={b['exact']}")
    st = out["staged"]
    line = (f"\nsummary: staged {st['launches']} launches -> {st['ratio']:.3f} of the optimum "
            f"(target: >= 0.97 in <= 60); full grid {len(pts):,} launches")
    if "one_factor" in out:
        of = out["one_factor"]
        line += f"; one-factor baseline {of['launches']} launches -> {of['ratio']:.3f}"
    print(line)
    if a.json:
        print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
