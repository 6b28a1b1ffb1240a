"""The accuracy stage: exact-match tasks against a live server, and a paired gate on them.

    tasks.py    Item / Task, load_task(name | file.jsonl), bundled_tasks(); the match rule
    digits.py   the trained `digits` preset's tasks (add, sort, rev): generators for training
                and for the shipped held-out item files in tasks/
    run.py      run_task(url, task, concurrency) -> TaskRun (one ItemResult per item);
                pair(reference, candidate); save_answers / load_answers
    decide.py   decide(pairs, confidence, min_delta) -> Decision: the paired rule, pure
    lm_eval.py  lm-eval:NAME through lm-evaluation-harness's local-completions model
    gate.py     evaluate(url, task, n, concurrency, reference) -> EvalReport: what a study calls

torch-free: the stage runs wherever moelab's core runs.
"""
from __future__ import annotations

from moelab.evaluate.decide import Decision, decide
from moelab.evaluate.gate import EvalReport, Point, evaluate, resolve_task
from moelab.evaluate.lm_eval import LmEvalError, LmEvalTask
from moelab.evaluate.run import ItemResult, TaskRun, load_answers, pair, run_task, save_answers
from moelab.evaluate.tasks import Item, Task, TaskError, bundled_tasks, load_task

__all__ = ["Decision", "EvalReport", "Item", "ItemResult", "LmEvalError", "LmEvalTask", "Point", "Task", "TaskError",
           "TaskRun", "bundled_tasks", "decide", "evaluate", "load_answers", "load_task", "pair", "resolve_task",
           "run_task", "save_answers"]
