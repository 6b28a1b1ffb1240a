"""Tier 2: staged studies over the SGLang-like simulator (tests/fakes/sglang_sim.py), a real server
process per launch: architecture gates whose errors name no flag, memory limits, a knob that only
matters under load. bench/study_efficiency.py runs the whole space; these run small slices of it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moelab.store import Store

pytestmark = [pytest.mark.process, pytest.mark.slow]
SIM = Path(__file__).parent / "fakes" / "sglang_sim.py"
MOE, FP4, ATTN = "--moe-runner-backend", "--fp4-gemm-backend", "--attention-backend"
FRAC, GRAPH = "--mem-fraction-static", "--cuda-graph-max-bs"


def run(tmp_path: Path, doc: dict, *extra: str, step_s: float = 0.006,
        batch_scale: float = 2.8) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The study `doc` over the simulator, its decode step `step_s` seconds at batch 0, growing by
    `step_s / batch_scale` per running sequence. Most of a launch is moelab's probe (its prompts one
    at a time, about 200 tokens in all), so the lone request's step sets the test's time; a step of
    about 23 ms at batch 8 leaves a load of 8 concurrent requests far from client-bound."""
    base = {"name": "sim", "engine": "command", "command": [sys.executable, str(SIM), "--port", "{port}"],
            "workload": {"concurrency": [8], "input_len": 16, "output_len": 6, "num_prompts": 8},
            "launch": {"timeout_s": 60}, "staged": {"finalists": 1, "repeats": 2, "final_launches": 1}}
    base.update(doc)
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    store = tmp_path / "sim.db"
    env = {**os.environ, "MOELAB_SIM_STEP_S": str(step_s), "MOELAB_SIM_BATCH_SCALE": str(batch_scale)}
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(path), "--store", str(store), "--json",
                        *extra], capture_output=True, text=True, timeout=900, env=env)
    trials = []
    if store.exists():
        with Store(store) as st:
            trials = st.trials()
    return r, trials


def test_gates_that_name_no_flag_are_attributed_once_and_pruned(tmp_path):
    r, trials = run(tmp_path, {
        "base": {MOE: "flashinfer_cutlass", FP4: "auto", ATTN: "fa3"},
        "axes": {MOE: ["flashinfer_cutlass", "flashinfer_trtllm", "marlin"], FP4: ["auto", "flashinfer_trtllm"],
                 ATTN: ["fa3", "trtllm_mha"]}})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    launched_gates = [t for t in trials if t["cause"] == "unsupported_arch" and t["status"] == "done"]
    # three gated values, each launched once; every other candidate holding one is pruned
    assert sorted((b["flag"], b["value"]) for b in s["blamed"]) == [
        (ATTN, "trtllm_mha"), (FP4, "flashinfer_trtllm"), (MOE, "flashinfer_trtllm")]
    assert len(launched_gates) == 3
    pruned = [t for t in trials if t["status"] == "pruned"]
    assert pruned and all(t["cause"] == "unsupported_arch" for t in pruned)
    for t in pruned:  # the report says which evidence pruned it
        text = t["verdict"]["evidence"][0]["text"]
        assert "already failed on this machine" in text and "attributed:" in text
        assert t["verdict"]["detail"]["how"] in ("differs", "words", "alone", "named")
    assert s["recommendation"] and "trtllm" not in s["recommendation"]["label"]


def test_an_ambiguous_gate_is_isolated_by_launching_each_suspect_alone(tmp_path):
    # the first launch dies of "Current platform does not support NVFP4 quantization with the selected
    # MoE backend": the words point to the MoE runner and to the FP4 GEMM alike, and no launch has
    # come up yet to compare with; moelab launches each suspect alone over the base
    r, trials = run(tmp_path, {
        "base": {MOE: "flashinfer_cutlass", FP4: "auto", ATTN: "fa3"},
        "axes": {MOE: ["flashinfer_trtllm", "flashinfer_cutlass"], FP4: ["cutlass", "auto"]}})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    first = next(t for t in trials if t["stage"] == "screen")
    assert first["cause"] == "unsupported_arch" and "NVFP4" in first["verdict"]["evidence"][0]["text"]
    iso = [t for t in trials if t["stage"] == "isolate"]
    assert 1 <= len(iso) <= 2 and all(t["status"] == "done" for t in iso), [t["label"] for t in iso]
    b = next(b for b in s["blamed"] if b["value"] == "flashinfer_trtllm")
    assert b["flag"] == MOE and b["how"] in ("alone", "differs")
    # the isolation launch decided it: the suspect alone failed, or the other suspect alone came up
    assert any(f"trial {t['id']}" in b["why"] for t in iso), (b, [t["id"] for t in iso])
    assert not any(x["flag"] == FP4 for x in s["blamed"])  # the FP4 GEMM was never blamed
    again = next(t for t in trials if t["stage"] == "screen" and t["flags"][MOE] == "flashinfer_trtllm"
                 and t["flags"][FP4] == "auto")
    assert again["status"] == "pruned"


def test_a_knob_that_matters_only_under_load_is_tuned_and_said_so(tmp_path):
    # at 96 concurrent requests a CUDA-graph batch of 64 runs decode eagerly; at 8 it changes nothing
    r, trials = run(tmp_path, {
        "base": {MOE: "flashinfer_cutlass", FP4: "auto", ATTN: "fa3", FRAC: 0.85, GRAPH: 64},
        "axes": {MOE: ["flashinfer_cutlass"], GRAPH: {"low": 64, "high": 512, "step": 64}},
        "reference": None, "staged": {"tune_trials": 3, "finalists": 1, "repeats": 2, "final_launches": 1},
        "workload": {"concurrency": [8, 96], "input_len": 16, "output_len": 16, "rounds": 2}},
        step_s=0.01, batch_scale=7)  # 150 ms at batch 96: a 2-core machine's client streams 96 requests'
    # tokens without being the bound; 22 ms at batch 8, 10 ms for the probe's lone requests
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    (tu,) = s["tuning"]
    knob = tu["knobs"][GRAPH]
    assert tu["launches"] <= 3 and knob["best"] >= 128, tu
    # (a 2-core machine streaming 16 tokens per request measures low loads within about 10 %)
    assert knob["effect"]["96"] > 0.15 and knob["effect"]["8"] < knob["effect"]["96"] / 2, knob["effect"]
    # every graph size from 128 on holds the 96 requests' decode batch: those are one plateau, and the
    # repeated measurements in separate launches pick among them, not the tuner's single launches
    picked = int(s["recommendation"]["command"].split(f"{GRAPH} ")[1].split()[0])
    assert picked >= 128 and str(picked) in knob["tried"], (picked, knob)
    assert "0.8500000" not in json.dumps(s)  # values stay on the axis's own grid


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path):
    r, trials = run(tmp_path, {"base": {MOE: "flashinfer_cutlass"},
                               "axes": {MOE: ["triton", "cutlass", "marlin", "deep_gemm"],
                                        FP4: ["auto", "cutlass", "flashinfer_cutlass"],
                                        ATTN: ["fa3", "flashinfer", "triton"],
                                        GRAPH: {"low": 64, "high": 512, "step": 64}}}, "--dry-run")
    assert r.returncode == 0 and not (tmp_path / "sim.db").exists() and not trials
    plan = json.loads(r.stdout)
    stages = {s["stage"]: s["launches"] for s in plan["steps"]}
    # 36 combinations > max_factorial 24: one factor at a time (1 + 3 + 2 + 2), then 2 x 2 x 2 combinations
    assert stages["screen"] == 8 and stages["combine"] == 8 and stages["tune"] == 20
    assert plan["full_grid"] == 4 * 3 * 3 * 8 and plan["launches_at_most"] == sum(stages.values())


def test_a_flag_the_engine_ignores_is_reported_and_what_ran_the_same_is_one_configuration(tmp_path):
    # the simulator runs flashinfer_cutlass for `auto` and, silently, for `triton_kernel`; its
    # server_args line (SGLang's) says what ran. marlin is really different, and slower.
    r, trials = run(tmp_path, {
        "base": {MOE: "flashinfer_cutlass", FP4: "auto", ATTN: "fa3"},
        "axes": {MOE: ["auto", "flashinfer_cutlass", "triton_kernel", "marlin"]},
        "staged": {"finalists": 1, "repeats": 2, "final_launches": 2}})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    tk = next(t for t in trials if t["flags"][MOE] == "triton_kernel")
    moe = next(x for x in tk["effective"]["settings"] if x["name"] == "moe_runner")
    assert (moe["requested"], moe["ran"]) == ("triton_kernel", "flashinfer_cutlass") and "server_args=" in moe["text"]
    assert any(e["kind"] == "effective" and "asked triton_kernel, ran flashinfer_cutlass" in e["text"]
               for e in tk["verdict"]["evidence"])
    said = next(x for x in s["trials"] if x["id"] == tk["id"])["ran_otherwise"]  # and in --json
    assert said == ["moe runner --moe-runner-backend: asked triton_kernel, ran flashinfer_cutlass"], said
    rec = s["recommendation"]
    assert rec["label"] == "moe-runner-backend=flashinfer_cutlass", rec
    assert sorted(rec["same_as"]) == ["moe-runner-backend=auto", "moe-runner-backend=triton_kernel"]
    assert rec["launches"] >= 3 and rec["interval_over"] == "launches"  # screen launches + 2 final launches
    finals = [t for t in trials if t["stage"] == "final"]
    assert sorted(t["rep"] for t in finals) == [0, 1] and len({t["id"] for t in finals}) == 2
    from moelab.report.build import build
    from moelab.report.markdown import render

    with Store(tmp_path / "sim.db") as st:
        md = render(build(st))
    assert "**asked triton_kernel, ran flashinfer_cutlass**" in md and "stands for" in md
    ranked = md.split("## Configurations that work")[1].split("##")[0]
    assert "moe-runner-backend=auto" not in ranked and "moe-runner-backend=marlin" in ranked
    assert "## Spread within and across launches" in md and "Decided by the objective `throughput`" in md
