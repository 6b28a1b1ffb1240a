"""The engine adapter interface: turn a LaunchSpec into a command, and know the engine's ways.

One file per engine (embedded, command, vllm, sglang), one small interface, a registry by name
in `moelab.engines`. An adapter never renames the engine's flags: `spec.args` pass through as
they are, and the adapter only adds what it must (host, port) when the user did not.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from moelab.spec import LaunchSpec


class EngineAdapter(ABC):
    name: ClassVar[str]

    @abstractmethod
    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        """(argv, extra environment) that start the server on spec.host:port."""

    def health_path(self) -> str:
        return "/health"

    def version(self) -> str | None:
        """Installed engine version, or None when it is not installed here."""
        return None
