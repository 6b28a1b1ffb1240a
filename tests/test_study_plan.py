"""Tier 1: the study file, the planners, pruning rules and statistics, as pure functions."""
from __future__ import annotations

import pytest

from moelab.study import StudyError, parse_study
from moelab.study import planner, ranking
from moelab.study.planner import Candidate

BASE = {"engine": "embedded", "model": "tiny", "axes": {"--moe-runner-backend": ["reference", "grouped"]}}


def study(**kw):
    return parse_study({**BASE, **kw})


def test_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(StudyError) as e:
        study(axis={"--x": [1]})
    assert "axis: unknown key" in str(e.value) and "axes" in str(e.value)


def test_bad_values_are_named_by_their_key():
    with pytest.raises(StudyError) as e:
        study(strategy="random", workload={"concurrency": [0]})
    msg = str(e.value)
    assert "strategy" in msg and "workload.concurrency" in msg


def test_axis_must_be_a_flag_and_a_range_must_be_ordered():
    with pytest.raises(StudyError, match="is not a flag"):
        study(axes={"moe-runner-backend": ["grouped"]})
    with pytest.raises(StudyError, match="below low"):
        study(axes={"--max-running-requests": {"low": 8, "high": 2}})
    with pytest.raises(StudyError, match="needs `command:`"):
        parse_study({"engine": "command", "axes": {"--a": [1]}})
    with pytest.raises(StudyError, match="a YAML mapping"):
        parse_study([1, 2])


def test_ranges_expand_to_grid_points():
    s = study(axes={"--max-running-requests": {"low": 2, "high": 8, "step": 2}, "--frac": {"low": 0.5, "high": 0.9}})
    assert s.axis_values("--max-running-requests") == [2, 4, 6, 8]
    assert s.axis_values("--frac") == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert list(s.numeric()) == ["--max-running-requests", "--frac"] and s.categorical() == {}


def test_grid_one_factor_and_screen():
    s = study(base={"--moe-runner-backend": "reference", "--quantization": "none"},
              axes={"--moe-runner-backend": ["reference", "grouped", "triton"], "--quantization": ["none", "fp8"],
                    "--max-running-requests": {"low": 4, "high": 8, "step": 4}})
    assert len(planner.grid(s)) == 3 * 2 * 2
    of = planner.one_factor(s)
    assert of[0].label == "baseline" and len(of) == 1 + 2 + 1 + 2  # values equal to the base are skipped
    sc = planner.screen(s)
    assert len(sc) == 6 and all("--max-running-requests" not in dict(c.changes) for c in sc)
    assert planner.to_args(sc[1].flags(s.base)) == ["--moe-runner-backend", "reference", "--quantization", "fp8"]
    assert planner.to_args({"--enable-x": True, "--off": None, "--n": 3}) == ["--enable-x", "--n", "3"]


def test_ddmin_finds_the_interacting_pair():
    changes = [("--a", 1), ("--b", 2), ("--c", 3), ("--d", 4), ("--e", 5)]
    calls = []

    def fails(subset):
        calls.append(tuple(subset))
        return ("--b", 2) in subset and ("--d", 4) in subset

    assert planner.ddmin(changes, fails) == [("--b", 2), ("--d", 4)]
    assert len(calls) < 2 ** len(changes)  # not exhaustive


def test_ddmin_single_culprit():
    assert planner.ddmin([("--a", 1), ("--b", 2), ("--c", 3)], lambda s: ("--c", 3) in s) == [("--c", 3)]


def test_blame_needs_the_flag_and_value_in_the_evidence():
    ch = (("--moe-runner-backend", "triton"), ("--quantization", "fp8"))
    ev = ["moelab serve: error: argument --moe-runner-backend: 'triton' needs a CUDA GPU"]
    b = planner.blame(ch, "bad_args", ev, 7)
    assert (b.flag, b.value, b.trial_id) == ("--moe-runner-backend", "triton", 7)
    assert planner.blame(ch, "illegal_memory_access", ev, 7) is None  # a crash is never generalised
    assert planner.blame(ch, "bad_args", ["error: unrecognized arguments"], 7) is None


def test_t_interval():
    m, lo, hi = ranking.t_interval([10.0, 12.0, 11.0])
    assert m == 11.0 and lo == pytest.approx(11 - 4.303 * 1 / 3 ** 0.5, rel=1e-3) and hi > m
    assert ranking.t_interval([5.0]) == (5.0, 5.0, 5.0)


def _trial(i, label, tps, changes, cause="ok", e2e=100.0, valid=True):
    pts = [{"concurrency": 4, "output_tps": tps[0], "e2e_p90_ms": e2e, "ttft_p90_ms": 50, "valid": valid}]
    return {"id": i, "label": label, "cause": cause, "flags": dict(changes), "changes": changes, "stage": "bench",
            "command": ["srv", "--x", label], "env": {}, "metrics": {"points": pts, "repeats": tps} if cause == "ok" else None}


def test_recommend_calls_a_tie_a_tie_and_prefers_the_baseline():
    trials = [_trial(1, "a", [100, 104, 98], [["--b", "x"]]), _trial(2, "b", [101, 99, 103], [["--b", "y"]]),
              _trial(3, "c", [50, 51, 49], [["--b", "z"]]), _trial(4, "d", [500], [["--b", "w"]], cause="hang")]
    rec = ranking.recommend(trials, {}, base={"--b": "y"})
    assert rec["label"] == "b" and [t["label"] for t in rec["tie"]] == ["a"] and rec["n"] == 3
    assert rec["command"] == "srv --x b"
    clear = ranking.recommend([_trial(1, "a", [100, 101, 99], [["--b", "x"]]),
                             _trial(2, "b", [50, 51, 49], [["--b", "y"]])], {})
    assert clear["label"] == "a" and clear["tie"] == [] and clear["runner_up"]["label"] == "b"


def test_a_reused_measurement_counts_once():
    a = _trial(1, "a", [100, 104, 98], [["--b", "x"]])
    again = {**_trial(2, "a", [100, 104, 98], [["--b", "x"]]), "reused_from": 1}
    twice = {**_trial(3, "a", [100, 104, 98], [["--b", "x"]]), "reused_from": 1}
    assert ranking.recommend([a, again], {})["n"] == 3 and ranking.recommend([again, twice], {})["n"] == 3


def test_slo_excludes_and_pareto():
    fast_slow = _trial(1, "fast", [200], [["--b", "x"]], e2e=900)
    ok = _trial(2, "ok", [100], [["--b", "y"]], e2e=100)
    assert ranking.recommend([fast_slow, ok], {"e2e_ms": 500})["label"] == "ok"
    assert ranking.slo_failures(fast_slow["metrics"]["points"][0], {"e2e_ms": 500}) == ["p90 E2E 900 ms > 500 ms"]
    pts = [{"output_tps": 10, "e2e_p90_ms": 5}, {"output_tps": 20, "e2e_p90_ms": 9}, {"output_tps": 15, "e2e_p90_ms": 12}]
    assert ranking.pareto(pts) == pts[:2]


def test_candidate_label():
    assert Candidate((("--moe-runner-backend", "grouped"), ("--enable-x", True))).label == "moe-runner-backend=grouped enable-x=on"


EXAMPLES = sorted((__import__("pathlib").Path(__file__).parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "embedded" not in p.name], ids=lambda p: p.name)
def test_examples_are_valid_and_use_real_engine_flags(path):
    from moelab.study import load_study
    from moelab.study.prune import unknown_axes

    s = load_study(path)
    assert unknown_axes(s.engine, [*s.axes, *s.base, *(s.bisect or {})]) == []


def test_support_matrix_and_flag_catalogue_prune_before_launch():
    from moelab.engines.check import Hardware
    from moelab.spec import LaunchSpec
    from moelab.study import load_study
    from moelab.study.prune import launch_check as preflight
    from moelab.study.runner import model_args

    s = load_study(next(p for p in EXAMPLES if p.name == "sglang-nvfp4.yaml"))
    hopper = Hardware(arch="sm_90", gpu_memory=80 * 2**30, gpus=1, source="test")
    verdicts = {c.label: preflight(LaunchSpec(engine="sglang", args=model_args(s) + planner.to_args(c.flags(s.base))),
                                   hopper) for c in planner.screen(s)}
    assert verdicts["moe-runner-backend=auto fp4-gemm-backend=auto"] is None  # the only one worth launching
    v = verdicts["moe-runner-backend=auto fp4-gemm-backend=flashinfer_cutlass"]
    assert (v.cause.value, v.phase.value) == ("unsupported_arch", "preflight") and "sm_90" in v.evidence[0].text
    typo = preflight(LaunchSpec(engine="sglang", args=model_args(s) + ["--moe-runner-backend", "flashinfer_cutlas"]),
                     hopper)
    assert typo.cause.value == "bad_args" and "did you mean flashinfer_cutlass" in typo.evidence[0].text
