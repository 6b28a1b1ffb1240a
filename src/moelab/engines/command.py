"""The `command` adapter: supervise any OpenAI-compatible server given as a command line.

`{host}` and `{port}` in the arguments are replaced by the launch's host and port, so engines
moelab has no adapter for (TensorRT-LLM, llama.cpp's server, TGI ...) get the same supervision,
readiness check, teardown and diagnosis. The command is run as given, never through a shell.
"""
from __future__ import annotations

from typing import ClassVar

from moelab.engines.base import EngineAdapter
from moelab.spec import LaunchSpec


class CommandAdapter(EngineAdapter):
    name: ClassVar[str] = "command"
    needs_command: ClassVar[bool] = True

    def model_args(self, model: str | None) -> list[str]:
        return []  # the study's `command:` is the whole server line; moelab adds nothing

    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        if not spec.args:
            raise ValueError("the command engine needs a command line after `--`, "
                             "e.g. `moelab launch --engine command -- llama-server --port {port}`")
        argv = [a.replace("{host}", spec.host).replace("{port}", str(port)) for a in spec.args]
        if not any("{port}" in a for a in spec.args) and spec.port is None and self.port_in(spec.args) is None:
            # Without {port} moelab cannot tell the server which port to use; it would then probe a
            # port the server never opens. Refuse instead of timing out later.
            raise ValueError("the command line has no {port} placeholder and no --port N: add {port} where "
                             "the server takes its port (or give the port with moelab launch --port)")
        return argv, {"PYTHONUNBUFFERED": "1"}

    def display_command(self, args: list[str], argv: list[str]) -> list[str]:
        """The user's own command line, placeholders kept: `{port}` is theirs to fill."""
        return list(args) if args else list(argv)

    def port_in(self, args: list[str]) -> int | None:
        """With a {port} placeholder moelab picks the port; otherwise a `--port N` of the command."""
        return None if any("{port}" in a for a in args) else super().port_in(args)
