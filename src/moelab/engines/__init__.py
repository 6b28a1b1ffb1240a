"""Engine adapters by name. The default everywhere a user names no engine is `embedded`."""
from __future__ import annotations

from moelab.engines.base import EngineAdapter
from moelab.registry import Registry

ENGINES: Registry[EngineAdapter] = Registry("engine")


@ENGINES.register("embedded")
def _embedded() -> EngineAdapter:
    from moelab.engines.embedded import EmbeddedAdapter

    return EmbeddedAdapter()


@ENGINES.register("command")
def _command() -> EngineAdapter:
    from moelab.engines.command import CommandAdapter

    return CommandAdapter()


@ENGINES.register("vllm")
def _vllm() -> EngineAdapter:
    from moelab.engines.vllm import VllmAdapter

    return VllmAdapter()


@ENGINES.register("sglang")
def _sglang() -> EngineAdapter:
    from moelab.engines.sglang import SglangAdapter

    return SglangAdapter()
