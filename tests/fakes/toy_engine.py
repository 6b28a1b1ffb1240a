"""An engine moelab has never heard of, added the way a new engine is: one adapter.

`ToyAdapter` drives tests/fakes/study_server.py as if it were an installed engine called `toy`:
how it starts, how a model is passed, its full command line (`toy-serve ...`), the flags it
accepts, its version. tests/test_engine_adapter.py registers it and runs a study through it;
nothing else in moelab changes.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

from moelab.engines.base import EngineAdapter
from moelab.spec import LaunchSpec

SERVER = Path(__file__).with_name("study_server.py")


class ToyAdapter(EngineAdapter):
    name: ClassVar[str] = "toy"

    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        args = self.split(list(spec.args)) or list(spec.args)
        return [sys.executable, str(SERVER), "--port", str(port), *args], {"PYTHONUNBUFFERED": "1"}

    def version(self) -> str | None:
        return "0.1.0"

    def model_args(self, model: str | None) -> list[str]:
        return ["--model", model] if model else []

    def split(self, argv: list[str]) -> list[str] | None:
        return argv[1:] if argv[:1] == ["toy-serve"] else None

    def flag_names(self) -> frozenset[str] | None:
        return frozenset({"--port", "--model", "--backend", "--quant", "--batch"})

    def display_command(self, args: list[str], argv: list[str]) -> list[str]:
        return ["toy-serve", *super().display_command(args, argv)[2:]]
