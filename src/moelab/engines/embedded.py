"""The embedded engine adapter: `python -m moelab.cli serve ARGS` with this interpreter.

The user's arguments are `moelab serve`'s own (SGLang dialect: --model-path, --moe-runner-backend,
--quantization ...); the adapter only adds --host/--port when they are absent.
"""
from __future__ import annotations

import sys
from typing import ClassVar

from moelab.engines.base import EngineAdapter, with_host_port
from moelab.spec import LaunchSpec


class EmbeddedAdapter(EngineAdapter):
    name: ClassVar[str] = "embedded"
    running_limit_flag: ClassVar[str | None] = "--max-running-requests"

    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        args = list(spec.args)
        if args[:1] == ["serve"]:  # accept `moelab launch -- serve --preset tiny` too
            args = args[1:]
        return [sys.executable, "-m", "moelab.cli", "serve", *with_host_port(args, spec.host, port)], \
            {"PYTHONUNBUFFERED": "1"}

    def version(self) -> str | None:
        from moelab import __version__

        return __version__

    def display_command(self, args: list[str], argv: list[str]) -> list[str]:
        """`moelab serve ...` rather than `<python> -m moelab.cli serve ...`, without the trial's port."""
        argv = super().display_command(args, argv)
        return ["moelab", *argv[3:]] if argv[1:4] == ["-m", "moelab.cli", "serve"] else argv

    def model_args(self, model: str | None) -> list[str]:
        """`--preset NAME` for a preset name, `--model-path DIR` for a directory."""
        if not model:
            return []
        from pathlib import Path

        return ["--preset" if "/" not in model and not Path(model).exists() else "--model-path", model]

    def flag_names(self) -> frozenset[str] | None:
        """`moelab serve`'s own options, read from its command definition (no process started)."""
        import typer.main

        from moelab.cli import app

        serve = typer.main.get_command(app).commands["serve"]
        return frozenset(o for p in serve.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]
                         if o.startswith("--")) or None

    def gpus_needed(self, args: list[str]) -> int:
        """`moelab serve` runs one rank per GPU: --tp-size, else --ep-size, else 1."""
        spec = LaunchSpec(args=args)
        for flag in ("--tp-size", "--tp", "--tensor-parallel-size", "--ep-size", "--ep", "--expert-parallel-size"):
            v = spec.flag(flag)
            if v is not None and v.isdigit() and int(v) > 0:
                return int(v)
        return 1

    def model_path(self, args: list[str]) -> str | None:
        spec = LaunchSpec(args=args)
        return spec.flag("--model-path") or spec.flag("--preset")
