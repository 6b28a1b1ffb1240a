"""Diagnosis: evidence (log lines, exit status, cgroup OOM counters) -> a typed Verdict.

`classify` is a pure function in layers: signature rules (data in `rules/*.yaml`, format in
`ruleset.py`), the structure of the log (`structure.py`), cause words (`words.py`); lines are
read through `lines.strip_prefixes`, and `engine_guess` names the engine of a log from its words.
"""
from __future__ import annotations

from moelab.diagnose.classify import OomEvidence, classify, first_exception
from moelab.diagnose.engine_guess import guess_engine
from moelab.diagnose.lines import strip_prefixes
from moelab.diagnose.ruleset import Rule, RuleError, load_rules, parse_rules, rule_engines

__all__ = ["OomEvidence", "Rule", "RuleError", "classify", "first_exception", "guess_engine", "load_rules",
           "parse_rules", "rule_engines", "strip_prefixes"]
