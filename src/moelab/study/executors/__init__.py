"""Where a study's trials run: one after another here (no executor), packed side by side on this
machine (`local`), or on a Ray cluster (`ray`). A registry by name; each creator imports lazily,
so Ray is imported only for `--executor ray`.

    ex = create("local", parallel=2)   # or create("ray", address="10.0.0.5:6379")
"""
from __future__ import annotations

from moelab.study.executors.base import Executor, ExecutorError, Lost, Need, TrialJob


def _local(**kw) -> Executor:
    from moelab.study.executors.local import LocalExecutor

    return LocalExecutor(**kw)


def _ray(**kw) -> Executor:
    from moelab.study.executors.ray_cluster import RayExecutor

    return RayExecutor(**kw)


EXECUTORS = {"local": _local, "ray": _ray}


def create(name: str, **kw) -> Executor:
    return EXECUTORS[name](**kw)


__all__ = ["EXECUTORS", "Executor", "ExecutorError", "Lost", "Need", "TrialJob", "create"]
