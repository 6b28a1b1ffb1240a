"""`moelab eval --task lm-eval:...`: lm-evaluation-harness (its local-completions model) against a
real answer-key server, read into the same paired gate. Skipped where lm-eval is not installed
(`pip install 'lm-eval[api]'`, or into ${MOELAB_LM_EVAL_VENV:-/tmp/moelab-lmeval-venv})."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.evaluate.lm_eval import find_lm_eval

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.slow]

KEY = Path(__file__).resolve().parent.parent / "src/moelab/evaluate/tasks/digits-add.jsonl"
SERVER = Path(__file__).resolve().parent / "fakes" / "answer_server.py"
IDS = [json.loads(line)["id"] for line in KEY.read_text().splitlines()]

TASK_YAML = """task: moelab_digits_add
dataset_path: json
dataset_kwargs:
  data_files:
    test: {key}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def eval_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moelab.cli", "eval", *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.skipif(find_lm_eval() is None, reason="lm-evaluation-harness is not installed")
def test_an_lm_eval_task_runs_against_the_server_and_pairs_with_a_moelab_reference(tmp_path):
    task = tmp_path / "digits_add.yaml"
    task.write_text(TASK_YAML.format(key=KEY))
    ref = tmp_path / "ref.json"
    with serve("", "--key", str(KEY), script=SERVER) as url:  # right on every item
        native = eval_cli("--url", url, "--task", "digits-add", "--n", "20", "--save", str(ref))
        ok = eval_cli("--url", url, "--task", f"lm-eval:{task}", "--n", "20", "--concurrency", "4",
                      "--against", str(ref), "--json")
    assert native.returncode == 0, native.stderr
    assert ok.returncode == 0, ok.stdout + ok.stderr
    run = json.loads(ok.stdout)["points"][0]["run"]
    assert run["harness"].startswith("lm-eval ") and run["accuracy"] == 1.0 and run["n"] == 20
    assert [r["id"] for r in run["items"]] == IDS[:20]  # the JSONL's own ids, in document order
    with serve("", "--key", str(KEY), "--wrong-ids", ",".join(IDS[:8]), script=SERVER) as url:
        bad = eval_cli("--url", url, "--task", f"lm-eval:{task}", "--n", "20", "--against", str(ref), "--json")
    d = json.loads(bad.stdout)["points"][0]["decision"]
    assert bad.returncode == 1 and (d["lost"], d["gained"], d["passed"]) == (8, 0, False)
    assert json.loads(bad.stdout)["points"][0]["run"]["accuracy"] == pytest.approx(0.6)


def test_without_lm_eval_the_task_is_a_clear_usage_error(tmp_path, free_port):
    if find_lm_eval() is not None and os.environ.get("MOELAB_LM_EVAL_VENV") is None:
        env = {**os.environ, "MOELAB_LM_EVAL_VENV": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"}
        if subprocess.run([sys.executable, "-c", "import lm_eval"], capture_output=True).returncode == 0:
            pytest.skip("lm_eval is importable in this Python: cannot hide it")
    else:
        env = dict(os.environ)
    with serve("", "--key", str(KEY), script=SERVER) as url:
        p = eval_cli("--url", url, "--task", "lm-eval:gsm8k", "--json", env=env)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and "lm-evaluation-harness is not installed" in doc["error"]


@pytest.mark.embedded
@pytest.mark.skipif(find_lm_eval() is None, reason="lm-evaluation-harness is not installed")
def test_lm_eval_scores_the_trained_preset_on_the_embedded_engine(tmp_path):
    pytest.importorskip("torch")
    task = tmp_path / "digits_add.yaml"
    task.write_text(TASK_YAML.format(key=KEY))
    with serve("", command=[sys.executable, "-m", "moelab.cli", "serve", "--preset", "digits"], timeout=180) as url:
        p = eval_cli("--url", url, "--task", f"lm-eval:{task}", "--n", "50", "--concurrency", "8", "--json")
    run = json.loads(p.stdout)["points"][0]["run"]
    assert p.returncode == 0 and run["model"] == "moelab-digits" and run["n"] == 50
    assert run["accuracy"] >= 0.95, [r for r in run["items"] if not r["correct"]][:3]
