"""Supervised launch of one server configuration, with a verdict at the end.

`Supervisor` is the context manager the study runner drives; `launch()` is the one-call form the
`moelab launch` command uses. See supervisor.py for the contract.
"""
from __future__ import annotations

from moelab.launch.run import launch
from moelab.launch.supervisor import Supervisor
from moelab.launch.folder import LaunchResult

__all__ = ["LaunchResult", "Supervisor", "launch"]
