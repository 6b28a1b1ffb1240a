"""Packed studies on one machine (`moelab study --parallel N`): embedded-engine trials side by side
on disjoint CPU shares of this machine, real servers, one store; an interrupt ends every server and
the study resumes; on GPUs, disjoint GPU sets by the trial's ranks, and a trial that needs more GPUs
than the machine has is refused before launch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moelab.store import Store
from moelab.study.executors import Need
from moelab.study.executors.local import LocalExecutor, resolve_parallel, shares

from test_study_process import fakes_of, study_cmd as study, study_file

pytestmark = [pytest.mark.embedded]


def write_study(tmp_path: Path, **kw) -> Path:
    doc = {"name": "packed", "engine": "embedded", "model": "tiny",
           "base": {"--moe-runner-backend": "reference", "--max-running-requests": 4},
           "axes": {"--moe-runner-backend": ["reference", "grouped"], "--max-running-requests": [2, 4]},
           "strategy": "grid", "workload": {"concurrency": [2], "input_len": 8, "output_len": 8, "num_prompts": 4},
           "staged": {"finalists": 1, "repeats": 2, "final_launches": 1}, "launch": {"timeout_s": 120}}
    doc.update(kw)
    return study_file(tmp_path, doc)


def overlapping(trials: list[dict]) -> list[tuple[dict, dict]]:
    return [(a, b) for i, a in enumerate(trials) for b in trials[i + 1:]
            if a["started"] < b["finished"] and b["started"] < a["finished"]]


def test_shares_and_parallel():
    assert shares([0, 1], 2) == [[0], [1]] and shares([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert shares([0, 1], 4) == [[0], [1]]  # never an empty share
    assert resolve_parallel("auto", [0, 1, 2, 3], [0, 1]) == 4 and resolve_parallel("auto", [], [0, 1]) == 2
    with pytest.raises(ValueError):
        resolve_parallel("0", [], [0])
    ex = LocalExecutor(parallel=2, gpus=[0, 1, 2, 3], cpus=[0, 1])
    assert ex.refuse(Need(gpus=8)) == "needs 8 GPUs, this machine has 4" and ex.refuse(Need(gpus=4)) is None


@pytest.mark.slow
@pytest.mark.process
def test_packed_study_runs_side_by_side_into_one_store(tmp_path):
    store = tmp_path / "p.db"
    r = subprocess.run(study(write_study(tmp_path), store, "--parallel", "2"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # the shares of this machine's CPUs (0 | 1 on two cores; wider shares on a larger machine)
    want = " | ".join(",".join(map(str, c)) for c in shares(sorted(os.sched_getaffinity(0)), 2))
    assert f"2 trials side by side on CPU shares {want}" in r.stderr
    s = json.loads(r.stdout)
    assert len(s["trials"]) == 5 and {t["cause"] for t in s["trials"]} == {"ok"}
    assert s["recommendation"]["n"] >= 2
    with Store(store) as st:
        trials = st.trials()
    assert all(t["status"] == "done" and t["metrics"]["points"] for t in trials)
    both = overlapping(trials)
    assert both, "no two trials ran at the same time"
    for a, b in both:  # side by side on disjoint CPU shares, each with its own server and port
        pa, pb = a["telemetry"]["placement"], b["telemetry"]["placement"]
        assert not set(pa["cpus"]) & set(pb["cpus"])
    for t in trials:  # the server itself ran on its share only (the embedded engine says so)
        log = Path(t["paths"]["log"]).read_text()
        cpus = ",".join(map(str, t["telemetry"]["placement"]["cpus"]))
        assert f"cpu threads=1 on cpus {cpus}" in log, log[-800:]
        assert "CUDA_VISIBLE_DEVICES" not in Path(t["paths"]["dir"], "repro.sh").read_text()
    assert fakes_of(store) == []


@pytest.mark.slow
@pytest.mark.process
def test_sigterm_ends_every_packed_server_and_the_study_resumes(tmp_path):
    path = write_study(tmp_path, workload={"concurrency": [2], "input_len": 8, "output_len": 48, "num_prompts": 24})
    store = tmp_path / "p.db"
    p = subprocess.Popen(study(path, store, "--parallel", "2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len({f.environ()["MOELAB_TRIAL_OWNER"] for f in fakes_of(store)}) < 2:
        time.sleep(0.2)
    assert len({f.environ()["MOELAB_TRIAL_OWNER"] for f in fakes_of(store)}) == 2, "two trials never ran at once"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=90)
    assert p.returncode == 130, err[-2000:]
    assert fakes_of(store) == []  # every server of every running trial ended
    with Store(store) as st:
        first = st.trials()
    assert sum(t["status"] == "interrupted" for t in first) == 2
    assert not any(t["status"] == "running" for t in first)
    r = subprocess.run(study(path, store, "--parallel", "2"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming" in r.stderr
    s = json.loads(r.stdout)
    done_before = {t["id"] for t in first if t["status"] == "done"}
    assert {t["id"] for t in s["trials"]} >= done_before  # kept, not rerun
    grid = [t for t in s["trials"] if t["stage"] == "grid" and t["status"] == "done"]
    assert len({t["label"] for t in grid}) == 4 and len(grid) == 4  # every candidate once, the interrupted ones again
    assert fakes_of(store) == []


@pytest.mark.slow
@pytest.mark.process
def test_gpu_packing_gives_disjoint_gpu_sets_and_refuses_an_oversize_trial(tmp_path):
    """Three (declared) GPUs: --tp-size 1 trials get one GPU each, side by side, as
    CUDA_VISIBLE_DEVICES; --tp-size 4 needs 4 and is refused before any launch. The embedded
    engine runs on the CPU here, so the GPUs are only handed out, which is what is checked."""
    from moelab.study import load_study
    from moelab.study.runner import StudyRunner
    from moelab.study.strategies import run_study

    st = load_study(write_study(tmp_path, axes={"--moe-runner-backend": ["reference", "grouped"],
                                                "--tp-size": [1, 4]}, base={"--moe-runner-backend": "reference"}))
    with Store(tmp_path / "g.db") as store:
        r = StudyRunner(st, store, tmp_path / "trials", executor=LocalExecutor(parallel=2, gpus=[0, 1, 2]))
        s = run_study(r)
        trials = store.trials()
    by = {t["label"]: t for t in trials if t["stage"] == "grid"}
    for b in ("reference", "grouped"):
        big = by[f"moe-runner-backend={b} tp-size=4"]
        assert (big["status"], big["cause"], big["phase"]) == ("pruned", "bad_args", "preflight")
        assert big["verdict"]["evidence"][0]["text"] == "needs 4 GPUs, this machine has 3"
    ran = [t for t in trials if t["status"] == "done"]
    assert ran and all(t["cause"] == "ok" for t in ran), s
    for t in ran:
        gpus = t["telemetry"]["placement"]["gpus"]
        assert len(gpus) == 1
        assert f"CUDA_VISIBLE_DEVICES={gpus[0]}" in Path(t["paths"]["dir"], "repro.sh").read_text()
    for a, b in overlapping(ran):
        assert a["telemetry"]["placement"]["gpus"] != b["telemetry"]["placement"]["gpus"]


@pytest.mark.process
def test_executor_ray_without_ray_says_how_to_install_it(tmp_path):
    """Ray is optional: imported only for --executor ray, and its absence is a clear message."""
    code = ("import sys; sys.modules['ray'] = None; from moelab.cli import main; "
            f"sys.argv = ['moelab', 'study', {str(write_study(tmp_path))!r}, '--executor', 'ray']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "pip install 'moelab[ray]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "study.db").exists()
