"""Tier 1: the worked examples in the pure modules' docstrings are run, so they stay true."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["moelab.formats", "moelab.study.attribute", "moelab.study.search", "moelab.study.file", "moelab.diagnose.tailor",
           "moelab.diagnose.classify", "moelab.diagnose.engine_guess", "moelab.diagnose.lines", "moelab.diagnose.ruleset",
           "moelab.diagnose.structure", "moelab.diagnose.words",
           "moelab.engines.check", "moelab.study.executors.local", "moelab.engines.effective",
           "moelab.load.server_metrics", "moelab.load.capacity", "moelab.study.ranking",
           "moelab.cli.diagnose"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0, f"{name} lost its examples"
    assert res.failed == 0
