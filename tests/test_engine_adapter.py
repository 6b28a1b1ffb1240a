"""Tier 2: adding an engine is one adapter. A test registers tests/fakes/toy_engine.py's adapter and
runs a study through it with nothing else in moelab changed: its flags are checked, its model
argument passed, its command line recognised, its launches judged and recommended."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moelab.engines import ENGINES
from moelab.engines.check import split_command
from moelab.store import Store
from moelab.study import parse_study
from moelab.study.prune import unknown_axes

pytestmark = pytest.mark.process
sys.path.insert(0, str(Path(__file__).parent / "fakes"))


@pytest.fixture(scope="module")
def toy():
    from toy_engine import ToyAdapter

    if "toy" not in ENGINES:
        ENGINES.register("toy")(ToyAdapter)
    return ENGINES.create("toy")


def test_a_study_runs_through_an_engine_registered_from_outside(toy, tmp_path):
    from moelab.study.runner import StudyRunner
    from moelab.study.strategies import run_study

    assert split_command(["toy-serve", "--quant", "q8"]) == ("toy", {}, ["--quant", "q8"])
    assert unknown_axes("toy", ["--quant", "--qaunt"]) == ["--qaunt"]  # its own flags, from its adapter
    st = parse_study({"name": "toy", "engine": "toy", "model": "toy-moe", "strategy": "one-factor",
                      "base": {"--backend": "slow", "--quant": "none"},
                      "axes": {"--backend": ["slow", "fast"], "--quant": ["none", "bad"]},
                      "reference": {"--backend": "slow", "--quant": "none"},
                      "workload": {"concurrency": [2], "input_len": 8, "output_len": 4, "num_prompts": 4},
                      "staged": {"finalists": 1, "repeats": 2}, "launch": {"timeout_s": 30}})
    with Store(tmp_path / "s.db") as store:
        s = run_study(StudyRunner(st, store, tmp_path / "trials"))
    by = {t["label"]: t for t in s["trials"] if t["stage"] == "one-factor"}
    assert by["quant=bad"]["cause"] == "garbage_output" and by["backend=fast"]["cause"] == "ok"
    rec = s["recommendation"]
    assert rec["command"].startswith("toy-serve --model toy-moe ") and "--backend fast" in rec["command"]
    assert s["trials"][0]["stage"] == "reference" and s["trials"][0]["cause"] == "ok"
