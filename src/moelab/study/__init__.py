"""Studies: a search over engine flags that ends in a recommendation and a verdict for every trial.

`load_study` reads and validates a study file, `StudyRunner` runs or reuses one trial at a time
against the store, `run_study` drives the study's strategy to the end; `planner`, `prune` and
`stats` are the pure decisions.
"""
from __future__ import annotations

from moelab.study.file import StudyError, StudyFile, load_study, parse_study

__all__ = ["StudyError", "StudyFile", "load_study", "parse_study"]
