"""`--task lm-eval:NAME`: lm-evaluation-harness against the live server, read into a `TaskRun`.

lm-eval runs as its own process with its `local-completions` model pointed at the server's
/v1/completions (`tokenizer_backend=None`: prompts go as text, no tokenizer is downloaded),
greedy, `num_concurrent` = the concurrency, `--limit` = `--n`, `--log_samples`. Each logged sample
becomes an `ItemResult` (its metric value 1.0 = correct; `exact_match` when the task has it, else
its first metric), so the paired gate of `decide.py` applies unchanged, and the aggregate score
lm-eval printed is kept next to the per-item mean as a check. NAME is a task lm-eval knows, or a
task YAML file (its folder becomes `--include_path`):

    lm-eval:gsm8k                      lm-eval:tests/data/my_task.yaml

Where lm-eval is found, in order: this Python (`python -m lm_eval`), `lm_eval` on PATH,
`${MOELAB_LM_EVAL_VENV:-/tmp/moelab-lmeval-venv}/bin/lm_eval`. Hub downloads are switched off
(HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): a task whose data is not local fails with lm-eval's words.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from pydantic import BaseModel

from moelab.evaluate.run import ItemResult, TaskRun, public_url

PREFIX = "lm-eval:"


class LmEvalError(RuntimeError):
    """lm-eval is missing, or it ran and failed; the message carries its last words."""


class LmEvalTask(BaseModel):
    name: str  # the task name lm-eval knows
    include_path: str | None = None  # folder of a local task YAML
    limit: int | None = None  # the first n documents

    @property
    def source(self) -> str:
        return f"lm-eval:{self.include_path + '/' if self.include_path else ''}{self.name}"

    def head(self, n: int | None) -> "LmEvalTask":
        if n is not None and n < 1:
            raise ValueError(f"--n {n} must be at least 1")
        return self.model_copy(update={"limit": n})


def parse_spec(spec: str) -> LmEvalTask:
    """lm-eval:NAME or lm-eval:FILE.yaml -> LmEvalTask. ValueError on an unreadable YAML."""
    rest = spec[len(PREFIX):]
    if not rest:
        raise ValueError("lm-eval: needs a task, e.g. --task lm-eval:gsm8k or --task lm-eval:my_task.yaml")
    if rest.endswith((".yaml", ".yml")):
        p = Path(rest)
        try:
            doc = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"cannot read the lm-eval task file {rest}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("task"), str):
            raise ValueError(f"{rest} has no `task:` name; an lm-eval task YAML starts with `task: NAME`")
        return LmEvalTask(name=doc["task"], include_path=str(p.resolve().parent))
    return LmEvalTask(name=rest)


def find_lm_eval() -> list[str] | None:
    """The command that runs lm-eval here, or None."""
    if importlib.util.find_spec("lm_eval") is not None:
        return [sys.executable, "-m", "lm_eval"]
    exe = shutil.which("lm_eval") or shutil.which("lm-eval")
    if exe:
        return [exe]
    venv = Path(os.environ.get("MOELAB_LM_EVAL_VENV", "/tmp/moelab-lmeval-venv")) / "bin" / "lm_eval"
    return [str(venv)] if venv.is_file() else None


def run_lm_eval(url: str, task: LmEvalTask, *, model: str, concurrency: int = 1, chat: bool = False,
                timeout_s: float = 60.0) -> TaskRun:
    """Run lm-eval once against `url`; its logged samples as a TaskRun. Raises LmEvalError."""
    cmd = find_lm_eval()
    if cmd is None:
        raise LmEvalError("lm-evaluation-harness is not installed: `pip install 'lm-eval[api]'` (or into "
                          "${MOELAB_LM_EVAL_VENV:-/tmp/moelab-lmeval-venv}), or use a .jsonl task")
    if chat:
        raise LmEvalError("--chat with lm-eval is not supported; moelab drives lm-eval's local-completions model")
    base = url.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="moelab-lm-eval-") as out:
        args = [*cmd, "run", "--model", "local-completions", "--model_args",
                f"model={model},base_url={base}/v1/completions,num_concurrent={concurrency},"
                f"tokenizer_backend=None,max_retries=1,timeout={int(timeout_s)}",
                "--tasks", task.name, "--output_path", out, "--log_samples",
                "--gen_kwargs", "temperature=0,do_sample=False"]
        if task.include_path:
            args += ["--include_path", task.include_path]
        if task.limit:
            args += ["--limit", str(task.limit)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        t0 = time.perf_counter()
        try:
            p = subprocess.run(args, capture_output=True, text=True, env=env, cwd=out,
                               timeout=max(600.0, timeout_s * 20))
        except subprocess.TimeoutExpired:
            raise LmEvalError(f"lm-eval did not finish within {max(600.0, timeout_s * 20):.0f} s") from None
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            last = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()][-3:]
            raise LmEvalError(f"lm-eval exited {p.returncode}: " + " | ".join(last))
        items, score, version = read_output(Path(out), task.name)
    run = TaskRun(task=task.name, task_source=task.source, model=model, url=public_url(url), endpoint="completions",
                  concurrency=concurrency, items=items, wall_s=wall, harness=f"lm-eval {version}")
    if score is not None and abs(score - run.accuracy) > 1e-9:
        raise LmEvalError(f"lm-eval's score {score:.4f} is not the mean of its samples ({run.accuracy:.4f}); "
                          "the task's metric is not a per-item 0/1 score moelab can pair")
    return run


def read_output(out: Path, name: str) -> tuple[list[ItemResult], float | None, str]:
    """(items from samples_<name>_*.jsonl, lm-eval's aggregate score, its version) from an output folder."""
    samples = sorted(out.rglob(f"samples_{name}_*.jsonl"))
    results = sorted(out.rglob("results_*.json"))
    if not samples or not results:
        raise LmEvalError(f"lm-eval wrote no samples for task {name} under {out}")
    doc = json.loads(results[-1].read_text())
    rows: list[tuple[int, ItemResult]] = []
    metric = None
    for line in samples[-1].read_text().splitlines():
        s = json.loads(line)
        names = s.get("metrics") or []
        metric = metric or ("exact_match" if "exact_match" in names else names[0] if names else None)
        if metric is None or metric not in s:
            raise LmEvalError(f"sample {s.get('doc_id')} of {name} carries no metric value")
        d = s.get("doc") if isinstance(s.get("doc"), dict) else {}
        arg = next(iter((s.get("arguments") or {}).values()), {})
        resp = s.get("filtered_resps") or [""]
        rows.append((int(s["doc_id"]), ItemResult(id=str(d.get("id", s["doc_id"])), prompt=str(arg.get("arg_0", "")),
                                expected=str(s.get("target", "")), completion=str(resp[0]),
                                correct=float(s[metric]) == 1.0)))
    items = [r for _, r in sorted(rows, key=lambda x: x[0])]
    res = doc.get("results", {}).get(name, {})
    score = next((v for k, v in res.items() if k.split(",")[0] == metric and "stderr" not in k), None)
    return items, score, str(doc.get("lm_eval_version", "?"))
