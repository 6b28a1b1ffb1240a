"""Adapters for engines whose flags moelab reads from the engine's own `--help` (vLLM, SGLang).

They share everything that follows from having a flag catalogue: checking a command line against
it, the preflight verdict before launch, `moelab check`'s verdict for a study's candidates. Each
subclass says how to find the engine, how to read its catalogue, and how to strip its command
prefix (`vllm serve`, `python -m sglang.launch_server`) from a user's command line.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from moelab.engines.base import EngineAdapter
from moelab.engines.flags import Catalogue, FlagProblem, flag_verdict, validate
from moelab.spec import LaunchSpec


class CataloguedAdapter(EngineAdapter):
    # What moelab's check reads from a command line, by role, in the engine's own flag names:
    # tp, dp, ep (parallel sizes; ep may be a switch), fraction, kv (cache dtype), ctx (context
    # length), quant, dtype, model.
    flag_roles: ClassVar[dict[str, str]] = {}
    # Values the engine's argparse types and its own config checks refuse: flag -> (type, low, high,
    # low_open); type "int" or "float"; None bounds are open ends. Checked before anything launches.
    value_rules: ClassVar[dict[str, tuple]] = {}

    @abstractmethod
    def flag_catalogue(self) -> Catalogue:
        """The installed engine's flags (cached per version), or a bundled catalogue."""

    @abstractmethod
    def engine_args(self, args: list[str]) -> list[str]:
        """The engine's own arguments, without the command prefix the user may have typed."""

    def check_args(self, args: list[str]) -> tuple[Catalogue, list[FlagProblem]]:
        cat = self.flag_catalogue()
        return cat, validate(self.engine_args(args), cat)

    def flag_check(self, spec: LaunchSpec):
        return flag_verdict(self.name, self.flag_catalogue(), self.engine_args(spec.args), spec.env)

    def flag_names(self) -> frozenset[str] | None:
        return frozenset(self.flag_catalogue().index())

    def check_launch(self, spec: LaunchSpec, hw=None):
        """`moelab check`'s own verdict on the launch (flags, support matrix, memory forecast)."""
        from moelab.engines.check import check_command, decide, this_machine

        rep = check_command(self.name, self.engine_args(spec.args), hw or this_machine(), spec.env)
        if rep.flag_problems and self.flag_check(spec) is None:  # MOELAB_NO_FLAG_CHECK=1: the engine decides
            rep.flag_problems = []
            rep.verdict = decide(rep)
        return None if rep.verdict.ok else rep.verdict
