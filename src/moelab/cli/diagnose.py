"""`moelab diagnose`."""
from __future__ import annotations

from moelab.cli.app import app  # noqa: F401
