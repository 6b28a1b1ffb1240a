"""Tier 3: `moelab eval` against the embedded engine serving the trained `digits` preset: the
reference runner solves the held-out items, grouped and triton (Triton's CPU interpreter) give the
same answers, fp8 and NVFP4 say what they cost, and the answers do not change with concurrency."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def digits_server(*args: str, env: dict | None = None, timeout: float = 180):
    """`moelab serve --preset digits ARGS` on a free port; it listens once the model is loaded."""
    return serve("", *args, command=[sys.executable, "-m", "moelab.cli", "serve", "--preset", "digits"], env=env,
                 timeout=timeout)


def eval_json(*args: str) -> tuple[int, dict]:
    p = subprocess.run([sys.executable, "-m", "moelab.cli", "eval", *args, "--json"], capture_output=True, text=True,
                       timeout=900)
    return p.returncode, json.loads(p.stdout)


def per_task(run: dict) -> dict[str, float]:
    by: dict[str, list[bool]] = {}
    for r in run["items"]:
        by.setdefault(r["id"].split("-")[0], []).append(r["correct"])
    return {k: sum(v) / len(v) for k, v in by.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference runner's answers to all 600 held-out items, at concurrency 1 and 16."""
    ref = tmp_path_factory.mktemp("eval") / "ref.json"
    with digits_server("--moe-runner-backend", "reference") as url:
        rc, doc = eval_json("--url", url, "--task", "digits", "--concurrency", "1,16", "--save", str(ref))
    return ref, rc, doc


def test_the_reference_runner_solves_the_held_out_items_at_every_concurrency(reference):
    ref, rc, doc = reference
    c1, c16 = doc["points"]
    assert doc["model"] == "moelab-digits" and c1["run"]["n"] == 600
    assert c1["run"]["accuracy"] >= 0.95, per_task(c1["run"])
    assert min(per_task(c1["run"]).values()) >= 0.9, per_task(c1["run"])
    # float32 on a CPU: a batch of 16 gives the very answers one at a time gives
    assert (c16["decision"]["lost"], c16["decision"]["gained"]) == (0, 0) and c16["decision"]["passed"]
    assert rc == 0 and json.loads(ref.read_text())["concurrency"] == 1


def test_the_grouped_runner_answers_like_the_reference(reference):
    ref = reference[0]
    with digits_server("--moe-runner-backend", "grouped") as url:
        rc, doc = eval_json("--url", url, "--task", "digits", "--concurrency", "16", "--against", str(ref))
    d = doc["points"][0]["decision"]
    assert rc == 0 and d["passed"] and d["lost"] + d["gained"] <= 1, d


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_fp8_and_nvfp4_say_what_they_cost(reference, fmt):
    ref = reference[0]
    with digits_server("--moe-runner-backend", "reference", "--quantization", fmt) as url:
        rc, doc = eval_json("--url", url, "--task", "digits", "--concurrency", "16", "--against", str(ref))
    p = doc["points"][0]
    d = p["decision"]
    print(f"{fmt}: accuracy {p['run']['accuracy']:.1%} {per_task(p['run'])}, {d['rule']}")
    assert p["run"]["errors"] == 0 and p["run"]["n"] == 600
    assert d["n"] == 600 and d["difference"] == pytest.approx(p["run"]["accuracy"] - d["reference_accuracy"])
    assert rc == (0 if d["passed"] else 1)
    assert p["run"]["accuracy"] >= 0.5  # quantized experts still answer: the cost is a number, not noise


def test_the_triton_runner_in_the_interpreter_answers_like_the_reference(reference):
    pytest.importorskip("triton")
    ref = reference[0]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    with digits_server("--moe-runner-backend", "triton", env=env, timeout=600) as url:
        rc, doc = eval_json("--url", url, "--task", "digits", "--n", "12", "--concurrency", "12", "--against", str(ref))
    d = doc["points"][0]["decision"]
    assert rc == 0 and (d["lost"], d["gained"]) == (0, 0), d
