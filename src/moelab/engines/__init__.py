"""Engine adapters by name. The default everywhere a user names no engine is `embedded`."""
from __future__ import annotations

from moelab.engines.base import EngineAdapter
from moelab.registry import Registry

ENGINES: Registry[EngineAdapter] = Registry("engine")
