"""The real-log corpus itself (tier 1): every case well formed and cited, every case in exactly one
split, each later batch's check part still in the check split, and every cause of the vocabulary
(except `ok`) with at least six cases, as the diagnosis issue asks."""
from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("corpus_check", ROOT / "scripts" / "corpus_check.py")
corpus_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus_check)


def test_every_case_is_well_formed_and_in_one_split():
    cases = sorted(p for p in corpus_check.ROOT.iterdir() if p.is_dir())
    assert len(cases) >= 200
    bad = [f"{c.name}: {p}" for c in cases for p in corpus_check.problems(c)]
    assert bad == []
    assert corpus_check.split_problems({c.name for c in cases}) == []


def test_every_cause_has_six_cases_and_the_check_split_has_each():
    cases = [json.loads(p.read_text()) | {"id": p.parent.name} for p in corpus_check.ROOT.glob("*/meta.json")]
    by = Counter(c["expected_cause"] for c in cases)
    assert {c for c in corpus_check.CAUSES if by[c] < 6} == set()
    check = set(json.loads((corpus_check.ROOT / "split.json").read_text())["check"])
    assert {c["expected_cause"] for c in cases if c["id"] in check} == set(corpus_check.CAUSES)
