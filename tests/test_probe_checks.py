"""Tier 1: the probe's decision logic on plain data (milliseconds, no sockets)."""
from __future__ import annotations

import math
import random

import pytest

from moelab.probe import Answer, compare, judge, symptoms, tolerance_for
from moelab.probe.judge import make_result
from moelab.spec import Cause

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def ans(tokens, lps=None, tops=None, text=None):
    lps = lps if lps is not None else [-0.1] * len(tokens)
    tops = tops if tops is not None else [{t: lp, "zz": lp - 3.0} for t, lp in zip(tokens, lps)]
    return Answer(text="".join(tokens) if text is None else text, tokens=tokens, token_logprobs=lps, top_logprobs=tops)


def random_model(seed: int, n: int = 20) -> Answer:
    rng = random.Random(seed)
    return ans([" " + rng.choice(WORDS) for _ in range(n)])


def results(answers):
    return [make_result(f"p{i}", "t", a) for i, a in enumerate(answers)]


def test_absolute_symptoms():
    assert symptoms(ans(["!"] * 8)).repeated_token == "!"
    assert symptoms(ans([])).empty
    assert symptoms(ans([" a", " b"] * 8)).loop_period == 2
    assert symptoms(ans(["\ufffd"] * 3 + ["x"], text="\ufffd\ufffd\ufffdx")).replacement_fraction == 0.75
    assert symptoms(ans([" a", " b"], lps=[-0.1, math.nan])).nonfinite
    assert symptoms(Answer(text="x", tokens=["x"], token_logprobs=[-1.0], top_logprobs=[{"x": -math.inf}])).nonfinite
    assert not symptoms(random_model(1)).names


def test_healthy_random_model_is_ok_even_with_some_loops():
    answers = [random_model(i) for i in range(6)] + [ans([" a", " b"] * 8), ans(["?"] * 6)]
    v = judge(results(answers))
    assert v.cause is Cause.ok, v.evidence
    assert any("warning" in e.text for e in v.evidence)  # the loop is still reported


def test_same_repeated_token_everywhere_is_garbage():
    v = judge(results([ans(["!"] * 16) for _ in range(8)]))
    assert v.cause is Cause.garbage_output
    assert "'!'" in v.evidence[0].text


def test_different_repeated_tokens_are_not_condemned():
    # a weak greedy model may collapse per prompt, but onto prompt-dependent tokens
    v = judge(results([ans([w] * 8) for w in WORDS[:8]]))
    assert v.cause is Cause.ok


def test_one_answer_for_every_prompt_is_garbage():
    same = random_model(7)
    assert judge(results([same] * 5)).cause is Cause.garbage_output


def test_nan_beats_everything():
    answers = [random_model(i) for i in range(5)] + [ans([" x"] * 4, lps=[math.nan] * 4)]
    v = judge(results(answers))
    assert v.cause is Cause.numerical_nan and v.detail["nan_prompts"] == 1


def test_empty_and_failed_requests():
    assert judge(results([ans([], text="")] * 4)).cause is Cause.garbage_output
    failed = [make_result("a", "t", None, error="HTTP 500")]
    assert judge(failed).cause is Cause.garbage_output


def test_compare_identical_and_near_tie():
    tol = tolerance_for("bf16")
    ref = ans([" a", " b", " c", " d"], lps=[-0.1, -0.7, -0.2, -0.3],
              tops=[{" a": -0.1}, {" b": -0.7, " x": -0.8}, {" c": -0.2}, {" d": -0.3}])
    c = compare(ref, ref, tol)
    assert c.identical and c.passed and c.agreement == 1.0 and c.max_drift == 0.0
    tie = ans([" a", " x", " q", " r"], lps=[-0.12, -0.75, -0.5, -0.5])
    c = compare(tie, ref, tol)
    assert c.first_divergence == 1 and abs(c.tie_gap - 0.1) < 1e-9 and c.passed, c.reason


def test_compare_early_clear_divergence_fails():
    ref = ans([" a", " b", " c", " d"], tops=[{" a": -0.1, " z": -5.0}] * 4)
    c = compare(ans([" z", " z", " z", " z"]), ref, tolerance_for("bf16"))
    assert not c.passed and c.first_divergence == 0 and "diverges at token 0" in c.reason


@pytest.mark.parametrize("drift,ok_formats", [(0.05, {"bf16", "fp8", "nvfp4"}), (0.2, {"fp8", "nvfp4"}),
                                              (0.5, {"nvfp4"})])
def test_tolerance_orders_formats(drift, ok_formats):
    toks = [" a", " b", " c", " d", " e", " f"]
    ref = ans(toks, lps=[-1.0] * 6)
    cand = ans(toks, lps=[-1.0 - drift] * 6)
    for fmt in ("bf16", "fp8", "nvfp4"):
        assert compare(cand, ref, tolerance_for(fmt)).passed == (fmt in ok_formats), fmt


def test_reference_judgement_uses_failed_fraction():
    refs = {f"p{i}": random_model(i) for i in range(8)}
    same = judge(results([random_model(i) for i in range(8)]), reference=refs)
    assert same.cause is Cause.ok and same.detail["compared"] == 8
    other = judge(results([random_model(100 + i) for i in range(8)]), reference=refs)
    assert other.cause is Cause.garbage_output


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown weight format"):
        tolerance_for("int3")
    assert tolerance_for("none") == tolerance_for("bf16") and tolerance_for("fp4") == tolerance_for("nvfp4")
