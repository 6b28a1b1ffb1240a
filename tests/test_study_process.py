"""Tier 2: studies over real server processes (the fake engine tests/fakes/study_server.py).

A `command`-engine study whose flags make the fake refuse, crash, serve garbage or serve well;
resume after a real SIGTERM and a real SIGKILL of `moelab study`; reuse across studies; bisect.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from moelab.store import Store

pytestmark = pytest.mark.process
FAKE = Path(__file__).parent / "fakes" / "study_server.py"


def write_study(tmp_path: Path, **kw) -> Path:
    doc = {"name": "fake", "engine": "command", "command": [sys.executable, str(FAKE), "--port", "{port}"],
           "base": {"--backend": "slow", "--quant": "none", "--batch": 4},
           "axes": {"--backend": ["slow", "fast", "refuse"], "--quant": ["none", "q8", "bad"],
                    "--batch": {"low": 2, "high": 8, "step": 2}},
           "reference": {"--backend": "slow", "--quant": "none"},
           "workload": {"concurrency": [1, 4], "input_len": 8, "output_len": 6, "num_prompts": 6},
           "staged": {"tune_trials": 2, "finalists": 2, "repeats": 2, "bench_in_screen": False}, "launch": {"timeout_s": 30}}
    doc.update(kw)
    return study_file(tmp_path, doc)


def study_file(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "study.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def study_cmd(path: Path, store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "moelab.cli", "study", str(path), "--store", str(store), "--json", *extra]


def fakes_of(store: Path) -> list[psutil.Process]:
    owner = str(store.resolve())
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("MOELAB_TRIAL_OWNER", "").startswith(owner + "#"):
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


@pytest.mark.slow
def test_staged_study_judges_every_kind_of_trial(tmp_path):
    store = tmp_path / "s.db"
    r = subprocess.run(study_cmd(write_study(tmp_path), store), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    by = {(t["stage"], t["label"]): t for t in s["trials"]}
    assert by[("screen", "backend=slow quant=bad")]["cause"] == "garbage_output"
    assert by[("screen", "backend=fast quant=q8")]["cause"] == "illegal_memory_access"
    refused = by[("screen", "backend=refuse quant=none")]
    assert (refused["cause"], refused["status"], refused["phase"]) == ("bad_args", "done", "launch")
    for q in ("q8", "bad"):  # the refusal named --backend refuse: the rest are pruned before launch
        t = by[("screen", f"backend=refuse quant={q}")]
        assert (t["cause"], t["status"], t["phase"]) == ("bad_args", "pruned", "preflight")
        assert f"trial {refused['id']}" in t["reason"]
    assert {t["stage"] for t in s["trials"]} == {"reference", "screen", "bench", "tune", "final"}
    rec = s["recommendation"]
    assert rec["label"].startswith("backend=fast quant=none") and rec["n"] >= 3
    assert rec["ci95"][0] <= rec["output_tps"] <= rec["ci95"][1]
    assert "--backend fast" in rec["command"] and "--quant none" in rec["command"] and str(FAKE) in rec["command"]
    with Store(store) as st:  # raw samples, telemetry and log paths are kept with each verdict
        t = next(t for t in st.trials() if t["stage"] == "bench")
        assert t["samples"][0]["samples"] and Path(t["paths"]["log"]).exists() and "timings" in t["telemetry"]
        assert st.study()["status"] == "done"

    # a second study over the same keys reuses the stored verdicts instead of launching
    p2 = write_study(tmp_path, name="again", strategy="one-factor", axes={"--quant": ["bad"]},
                     staged={"finalists": 1, "repeats": 2})
    r2 = subprocess.run(study_cmd(p2, store), capture_output=True, text=True, timeout=120)
    s2 = json.loads(r2.stdout)
    bad = next(t for t in s2["trials"] if t["label"] == "quant=bad")
    assert (bad["status"], bad["cause"]) == ("reused", "garbage_output"), s2["trials"]
    r3 = subprocess.run(study_cmd(p2, store, "--rerun"), capture_output=True, text=True, timeout=120)
    bad = next(t for t in json.loads(r3.stdout)["trials"] if t["label"] == "quant=bad")
    assert (bad["status"], bad["cause"]) == ("done", "garbage_output")


def _run_and_kill(cmd: list[str], store: Path, sig: int, after_trials: int) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # kill while a trial is running, after some finished
            if store.exists():
                with Store(store) as st:
                    ts = st.trials()
                if len([t for t in ts if t["status"] != "running"]) >= after_trials and ts[-1]["status"] == "running" \
                        and fakes_of(store):
                    break
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_study_resumes_without_losing_or_repeating(tmp_path, sig):
    path = write_study(tmp_path, strategy="grid", axes={"--quant": ["none", "q8", "bad"], "--batch": [2, 4]},
                       staged={"finalists": 1, "repeats": 2})
    store = tmp_path / "s.db"
    _run_and_kill(study_cmd(path, store), store, sig, after_trials=3)
    with Store(store) as st:
        before = {t["id"]: t for t in st.trials() if t["status"] in ("done", "pruned")}
        running = [t for t in st.trials() if t["status"] in ("running", "interrupted")]
    assert len(before) >= 3 and running, "the kill must land during a trial"
    if sig == signal.SIGTERM:  # moelab tore its server down and marked the trial itself
        assert not fakes_of(store) and running[0]["status"] == "interrupted"
    r = subprocess.run(study_cmd(path, store), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not fakes_of(store)  # a SIGKILLed moelab's server was found and ended on resume
    with Store(store) as st:
        after = st.trials()
    for tid, t in before.items():  # nothing finished was lost or changed
        assert next(a for a in after if a["id"] == tid)["verdict"] == t["verdict"]
    done = [(t["stage"], t["key"], t["rep"]) for t in after if t["status"] != "interrupted"]
    assert len(done) == len(set(done))  # nothing finished was run twice
    assert [t["status"] for t in after if t["id"] == running[0]["id"]] == ["interrupted"]
    assert len([t for t in after if t["stage"] == "grid" and t["status"] != "interrupted"]) == 6


def test_bisect_finds_the_interacting_pair(tmp_path):
    path = write_study(tmp_path, strategy="bisect", axes={}, reference=None,
                       bisect={"--backend": "fast", "--quant": "q8", "--batch": 8},
                       workload={"concurrency": [2], "input_len": 8, "output_len": 4, "num_prompts": 2})
    r = subprocess.run(study_cmd(path, tmp_path / "b.db"), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(r.stdout)["bisect"]
    assert b["reproduced"] and b["cause"] == "illegal_memory_access"
    assert b["minimal"] == [["--backend", "fast"], ["--quant", "q8"]]
    assert set(b["alone"].values()) == {"ok"} and b["interaction"] is True
    md = subprocess.run([sys.executable, "-m", "moelab.cli", "report", str(tmp_path / "b.db")], capture_output=True,
                        text=True, timeout=60).stdout
    assert "needs all of `--backend fast --quant q8`" in md and "not independent" in md


def test_bad_study_file_is_refused_with_the_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("engine: command\ncommand: [x, '{port}']\naxes: {--a: [1]}\nworklaod: {}\n")
    r = subprocess.run(study_cmd(p, tmp_path / "s.db"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "worklaod: unknown key" in " ".join(r.stderr.split())
    r = subprocess.run(study_cmd(tmp_path / "none.yaml", tmp_path / "s.db"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no study file" in r.stderr
    assert os.path.exists(tmp_path / "s.db") is False


def test_a_budget_that_stops_the_plan_is_said_loudly_and_the_finalists_still_run(tmp_path):
    path = write_study(tmp_path, strategy="grid", axes={"--quant": ["none", "q8"], "--batch": [2, 4, 6]},
                       reference=None, budget={"trials": 3}, staged={"finalists": 1, "repeats": 2})
    store = tmp_path / "s.db"
    dry = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(path), "--store", str(store), "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "the budget stops it" in dry.stdout and not store.exists()
    r = subprocess.run(study_cmd(path, store), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "the plan has up to" in r.stderr and "budget.trials is 3" in " ".join(r.stderr.split())
    s = json.loads(r.stdout)
    assert s["status"] == "budget" and "trial budget is spent" in s["budget"]
    assert [t["stage"] for t in s["trials"]].count("grid") == 3
    final = [t for t in s["trials"] if t["stage"] == "final"]
    assert final and s["recommendation"]["n"] >= 2  # measured again past the budget, never a lone sample
    md = subprocess.run([sys.executable, "-m", "moelab.cli", "report", str(store)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "STOPPED BY THE BUDGET" in md


def test_fake_decision_table():
    sys.path.insert(0, str(FAKE.parent))
    from study_server import answer, behaviour

    assert behaviour("refuse", "none") == "refuse"
    assert behaviour("fast", "q8") == "ima" and behaviour("fast", "none") == "ok" and behaviour("slow", "q8") == "ok"
    assert behaviour("slow", "bad") == "garbage"
    assert answer("p", 3, "ok") == answer("p", 3, "ok") != answer("p", 3, "bad")


@pytest.mark.embedded
def test_a_workload_longer_than_the_context_is_bad_args_not_zero_throughput(tmp_path):
    """The digits preset serves 64 tokens of context; 100-token prompts are refused (HTTP 400) by a
    live server. That is the trial's verdict (bad_args, phase load, the server's words), never an ok
    configuration at 0 tok/s that could be recommended; and the study stops there instead of
    launching the other configurations to be refused the same way."""
    p = tmp_path / "s.yaml"
    p.write_text("engine: embedded\nmodel: digits\naxes: {--moe-runner-backend: [grouped, reference]}\n"
                 "workload: {concurrency: [2], input_len: 100, output_len: 8, num_prompts: 4}\n")
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(p), "--store", str(tmp_path / "s.db"), "--json"],
                       capture_output=True, text=True, timeout=120)
    s = json.loads(r.stdout)
    assert r.returncode == 1 and s["recommendation"] is None and s["status"] == "stopped"
    (t,) = s["trials"]  # the second backend was never launched
    assert t["cause"] == "bad_args" and "refused" in t["reason"]
    assert "maximum context length is 64" in s["stopped"] and "workload" in s["stopped"]
    v = json.loads((tmp_path / "s.trials" / "trial-0001" / "verdict.json").read_text())["verdict"]
    assert v["phase"] == "load" and "maximum context length is 64" in json.dumps(v["evidence"])
