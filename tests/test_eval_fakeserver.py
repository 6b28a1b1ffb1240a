"""Tier 2: `moelab eval` against real HTTP server processes that know the answers and get chosen
ones wrong (tests/fakes/answer_server.py): the paired rule at its edges end to end, failures that
appear only under load, failed requests, and every usage error as one line (or one JSON object)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

pytestmark = pytest.mark.process

KEY = Path(__file__).resolve().parent.parent / "src/moelab/evaluate/tasks/digits-add.jsonl"
SERVER = Path(__file__).resolve().parent / "fakes" / "answer_server.py"
IDS = [json.loads(line)["id"] for line in KEY.read_text().splitlines()]


def eval_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moelab.cli", "eval", *args], capture_output=True, text=True,
                          timeout=120)


def key_server(*args: str):
    return serve("", "--key", str(KEY), *args, script=SERVER)


@pytest.fixture
def reference(tmp_path) -> Path:
    """Answers of a server that is right on all 40 first items but add-000 (so gains are possible)."""
    ref = tmp_path / "ref.json"
    with key_server("--wrong-ids", IDS[0]) as url:
        p = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--save", str(ref))
    assert p.returncode == 0, p.stderr
    assert "97.5% 39/40" in p.stdout and f"answers saved to {ref}" in p.stdout
    return ref


@pytest.mark.parametrize("lost, passed", [(6, True), (7, False)])
def test_the_decision_flips_between_six_and_seven_lost_items_of_forty(reference, lost, passed):
    # the candidate gets add-000 right (one item gained) and the next `lost` items wrong:
    # 6 lost: -12.5 % >= -(1.645*sqrt(7)+1)/40 = -13.4 %;  7 lost: -15.0 % < -(1.645*sqrt(8)+1)/40 = -14.1 %
    with key_server("--wrong-ids", ",".join(IDS[1:lost + 1])) as url:
        p = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--against", str(reference), "--json")
    doc = json.loads(p.stdout)
    d = doc["points"][0]["decision"]
    assert (d["lost"], d["gained"], d["n"]) == (lost, 1, 40)
    assert d["noise_delta"] == pytest.approx((1.6448536 * (lost + 1) ** 0.5 + 1) / 40)
    assert d["difference"] == pytest.approx((1 - lost) / 40)
    assert d["passed"] is passed and doc["passed"] is passed
    assert p.returncode == (0 if passed else 1)


def test_a_tolerance_on_top_lets_a_known_cost_pass(reference):
    # 8 lost, 1 gained: -17.5 % < -(1.645*3+1)/40 = -14.8 %; a tolerance of exactly 17.5 % passes it
    with key_server("--wrong-ids", ",".join(IDS[1:9])) as url:
        strict = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--against", str(reference))
        loose = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--against", str(reference),
                         "--min-delta", "0.175")
    assert strict.returncode == 1 and "FAIL: paired difference -17.50% < -14.84%" in strict.stdout
    assert loose.returncode == 0 and "pass: paired difference -17.50% >= -17.50%" in loose.stdout
    assert "max(min_delta 17.50%, noise 14.84%)" in loose.stdout


def test_an_accuracy_that_falls_only_under_load_fails_against_the_first_concurrency():
    # more than 2 requests in flight: wrong answers; each request stays 30 ms in flight
    with key_server("--wrong-above", "2", "--latency-ms", "30") as url:
        p = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--concurrency", "1,8", "--json")
    doc = json.loads(p.stdout)
    c1, c8 = doc["points"]
    assert c1["run"]["accuracy"] == 1.0 and c1["decision"] is None
    assert c8["compared_with"] == "concurrency 1" and c8["run"]["accuracy"] < 0.8
    assert c8["decision"]["passed"] is False and p.returncode == 1


def test_failed_requests_count_as_wrong_and_fail_the_run(reference):
    with key_server("--fail-ids", IDS[3]) as url:
        p = eval_cli("--url", url, "--task", "digits-add", "--n", "40", "--against", str(reference))
    assert p.returncode == 1
    assert "HTTP 500" in p.stdout and "add-003" in p.stdout
    assert "pass" in p.stdout  # one lost, one gained: the paired rule passes; the error still fails it


def test_the_chat_endpoint(tmp_path):
    with key_server() as url:
        p = eval_cli("--url", url, "--task", "digits-add", "--n", "10", "--chat", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["points"][0]["run"]["endpoint"] == "chat"
    assert doc["points"][0]["run"]["accuracy"] == 1.0


def test_a_reference_of_other_items_is_refused_before_any_request(reference, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "add-000", "prompt": "add 1+1=", "answer": "2"}\n')
    with key_server() as url:
        p = eval_cli("--url", url, "--task", "digits-sort", "--n", "5", "--against", str(reference), "--json")
        more = eval_cli("--url", url, "--task", "digits-add", "--n", "41", "--against", str(reference))
        same_id = eval_cli("--url", url, "--task", str(other), "--against", str(reference))
    assert p.returncode == 2 and "no answer for item 'sort-000'" in json.loads(p.stdout)["error"]
    assert more.returncode == 2 and "no answer for item 'add-040'" in more.stderr
    assert same_id.returncode == 2 and "made on another task" in same_id.stderr


@pytest.mark.parametrize("args, words", [
    (["--task", "nope"], "unknown task 'nope'"),
    (["--task", "digits", "--n", "0"], "--n 0"),
    (["--task", "digits", "--concurrency", "1,x"], "comma-separated integers"),
    (["--task", "digits", "--concurrency", "0"], "positive integers"),
    (["--task", "digits", "--against", "/nonexistent/ref.json"], "cannot read the reference answers"),
    (["--task", "digits", "--confidence", "1.5"], "confidence 1.5"),
    (["--task", "lm-eval:"], "lm-eval: needs a task"),
])
def test_usage_errors_are_one_json_object_and_exit_2(args, words):
    with key_server() as url:
        p = eval_cli("--url", url, *args, "--json")
        plain = eval_cli("--url", url, *args)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and words in doc["error"] and doc["exit_code"] == 2
    assert plain.returncode == 2 and words in plain.stderr and "Traceback" not in plain.stderr + plain.stdout


def test_an_unreachable_server_is_a_usage_error(free_port):
    p = eval_cli("--url", f"http://127.0.0.1:{free_port}", "--task", "digits", "--json")
    assert p.returncode == 2 and "cannot reach" in json.loads(p.stdout)["error"]
