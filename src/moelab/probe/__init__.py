"""Correctness gate: greedy probe prompts, absolute checks, comparison with a reference.

Public API: `run_probe`, `record_reference`, `ProbeReport`; the pure decision logic lives in
`checks` (one answer), `compare` (answer vs reference) and `judge` (prompt set -> Verdict).
"""
from __future__ import annotations

from moelab.probe.checks import Answer, Symptoms, symptoms
from moelab.probe.compare import Comparison, Tolerance, compare, tolerance_for
from moelab.probe.http import RequestFailed, ServerUnreachable, discover_model
from moelab.probe.judge import ProbeReport, PromptResult, judge
from moelab.probe.run import bundled_prompts, load_reference, record_reference, render, run_probe

__all__ = ["Answer", "Comparison", "Symptoms", "ProbeReport", "PromptResult", "RequestFailed", "ServerUnreachable",
           "Tolerance", "bundled_prompts", "compare", "discover_model", "symptoms", "judge", "load_reference",
           "record_reference", "render", "run_probe", "tolerance_for"]
