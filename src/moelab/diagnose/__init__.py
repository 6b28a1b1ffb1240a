"""Diagnosis: evidence (log lines, exit status, cgroup OOM counters) -> a typed Verdict.

`classify` is a pure function; the signatures are data in `rules/*.yaml` (format documented in
`ruleset.py` and at the top of `rules/generic.yaml`).
"""
from __future__ import annotations

from moelab.diagnose.classify import OomEvidence, classify, first_exception, strip_prefixes
from moelab.diagnose.ruleset import Rule, RuleError, load_rules, parse_rules, rule_engines

__all__ = ["OomEvidence", "Rule", "RuleError", "classify", "first_exception", "load_rules",
           "parse_rules", "rule_engines", "strip_prefixes"]
