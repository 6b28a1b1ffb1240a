"""Tier 1: the accuracy stage's pure parts: the paired rule at its edges, pairing, task files."""
from __future__ import annotations

import json
import random

import pytest

from moelab.evaluate import ItemResult, TaskError, TaskRun, bundled_tasks, decide, load_task, pair
from moelab.evaluate import digits
from moelab.evaluate.tasks import normalise


def pairs(lost: int, gained: int, both: int, neither: int = 0) -> list[tuple[bool, bool]]:
    return [(True, False)] * lost + [(False, True)] * gained + [(True, True)] * both + [(False, False)] * neither


@pytest.mark.parametrize("lost, gained, n, passed", [
    (0, 0, 40, True),    # identical: delta 1/n, difference 0
    (4, 0, 40, True),    # -10.0 % >= -(1.645*2+1)/40 = -10.7 %
    (5, 0, 40, False),   # -12.5 % <  -(1.645*sqrt(5)+1)/40 = -11.7 %
    (5, 5, 40, True),    # as many gained as lost
    (12, 3, 600, False),  # -1.5 % <  -(1.645*sqrt(15)+1)/600 = -1.2 %
    (9, 3, 600, True),    # -1.0 % >= -(1.645*sqrt(12)+1)/600 = -1.1 %
])
def test_the_rule_at_its_edges(lost, gained, n, passed):
    d = decide(pairs(lost, gained, n - lost - gained))
    noise = (1.6448536269514722 * (lost + gained) ** 0.5 + 1) / n
    assert d.noise_delta == pytest.approx(noise) and d.delta == pytest.approx(noise)
    assert d.difference == pytest.approx((gained - lost) / n)
    assert d.passed is passed
    assert (d.lost, d.gained, d.n) == (lost, gained, n)
    assert d.rule.startswith("pass" if d.passed else "FAIL") and f"sqrt({lost}+{gained})" in d.rule


def test_min_delta_widens_the_gate_and_an_exact_tie_passes():
    d = decide(pairs(5, 0, 35), min_delta=0.125)  # -12.5 % against a tolerance of exactly 12.5 %
    assert d.passed and d.delta == 0.125 and "min_delta 12.50%" in d.rule
    assert not decide(pairs(6, 0, 34), min_delta=0.125).passed


def test_a_higher_confidence_tolerates_more_before_it_fails():
    assert not decide(pairs(5, 0, 35), confidence=0.95).passed
    assert decide(pairs(5, 0, 35), confidence=0.99).passed  # z 2.326: (2.326*sqrt(5)+1)/40 = 15.5 %


@pytest.mark.parametrize("kw, msg", [({"confidence": 1.0}, "confidence"), ({"confidence": 0.2}, "confidence"),
                                     ({"min_delta": -0.1}, "min_delta"), ({"min_delta": 1.5}, "min_delta")])
def test_bad_levels_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        decide(pairs(1, 0, 9), **kw)
    with pytest.raises(ValueError, match="no paired items"):
        decide([])


def _run(rows: list[tuple[str, str, str, bool]], task: str = "t") -> TaskRun:
    return TaskRun(task=task, task_source="x.jsonl", model="m", url="http://h:1", concurrency=1,
                   items=[ItemResult(id=i, prompt=p, expected=a, completion=a if ok else "?", correct=ok)
                          for i, p, a, ok in rows])


def test_pairing_is_by_item_id_and_refuses_other_items():
    ref = _run([("1", "a", "x", True), ("2", "b", "y", False), ("3", "c", "z", True)])
    cand = _run([("3", "c", "z", False), ("1", "a", "x", True)])
    assert pair(ref, cand) == [(True, False), (True, True)]
    with pytest.raises(ValueError, match="no answer for item '4'"):
        pair(ref, _run([("4", "d", "w", True)]))
    with pytest.raises(ValueError, match="made on another task"):
        pair(ref, _run([("1", "other prompt", "x", True)]))


def test_a_saved_run_loads_back_with_its_numbers(tmp_path):
    from moelab.evaluate import load_answers, save_answers

    run = _run([("1", "a", "x", True), ("2", "b", "y", False)])
    save_answers(run, tmp_path / "ref.json")
    doc = json.loads((tmp_path / "ref.json").read_text())
    assert doc["accuracy"] == 0.5 and doc["n"] == 2
    assert load_answers(tmp_path / "ref.json") == run
    (tmp_path / "bad.json").write_text('{"items": 3}')
    with pytest.raises(ValueError, match="not a moelab eval answers file"):
        load_answers(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="cannot read"):
        load_answers(tmp_path / "missing.json")


def test_the_match_rule():
    assert normalise("  42 \nThe answer is 42") == "42"
    item = load_task("digits-add").items[0]
    assert item.matches(item.answer) and item.matches(f" {item.answer}\n") and not item.matches(item.answer + "0")


@pytest.mark.parametrize("text, msg", [
    ("not json\n", r"t.jsonl:1: not JSON"),
    ('{"prompt": "a"}\n', r"t.jsonl:1: each line must be an object"),
    ('{"prompt": "a", "answer": 3}\n', r"string fields"),
    ('{"prompt": "a", "answer": "b", "max_tokens": 0}\n', r"max_tokens"),
    ('{"id": "x", "prompt": "a", "answer": "b"}\n\n{"id": "x", "prompt": "c", "answer": "d"}\n', r"t.jsonl:3: item id 'x' appears twice"),
    ("\n\n", "holds no items"),
])
def test_a_bad_task_file_names_its_line(tmp_path, text, msg):
    f = tmp_path / "t.jsonl"
    f.write_text(text)
    with pytest.raises(TaskError, match=msg):
        load_task(str(f))


def test_task_names_files_and_n():
    assert {"digits", "digits-add", "digits-sort", "digits-rev"} <= set(bundled_tasks())
    with pytest.raises(TaskError, match="unknown task 'nope'.*digits-add"):
        load_task("nope")
    with pytest.raises(TaskError, match="no such task file"):
        load_task("/nonexistent/t.jsonl")
    t = load_task("digits")
    assert len(t.items) == 600 and [i.id for i in t.items[:3]] == ["add-000", "sort-000", "rev-000"]
    assert t.head(5).items == t.items[:5] and t.head(5).digest != t.digest
    with pytest.raises(TaskError, match="has 600 items"):
        t.head(601)


def test_the_shipped_items_are_the_generators_held_out_sets_and_right():
    for task in digits.TASKS:
        shipped = [(i.prompt, i.answer) for i in load_task(f"digits-{task}").items]
        assert shipped == digits.held_out(task, 200, 1)
    for p, a in digits.held_out("add", 50, 7):
        x, y = p.removeprefix("add ").removesuffix("=").split("+")
        assert int(x) + int(y) == int(a)
    for p, a in digits.held_out("sort", 50, 7):
        assert a == "".join(sorted(p[5:-1]))
    for p, a in digits.held_out("rev", 50, 7):
        assert a == p[4:-1][::-1]


def test_the_training_stream_never_shows_a_held_out_prompt():
    held = {p for t in digits.TASKS for p, _ in digits.held_out(t, 200, 1)}
    s = digits.stream(0, held, {"add": 2.0})
    seen = [next(s) for _ in range(20000)]
    assert not held & {p for _, p, _ in seen}
    share = sum(t == "add" for t, _, _ in seen) / len(seen)
    assert 0.47 < share < 0.53  # weight 2 of 4
    assert digits.make("rev", random.Random(3)) == digits.make("rev", random.Random(3))


def test_a_stored_url_keeps_no_credentials():
    from moelab.evaluate.run import public_url

    assert public_url("http://user:s3cret@127.0.0.1:8000/?key=abc") == "http://127.0.0.1:8000"
    assert public_url("http://localhost:30000/") == "http://localhost:30000"
