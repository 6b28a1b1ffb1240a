"""MoE runner backends by name, and the one function that resolves `auto`.

One file per backend; creators import lazily so listing names never needs torch.
"""
from __future__ import annotations

from moelab.moe.base import MoERunner
from moelab.registry import Registry

RUNNERS: Registry[MoERunner] = Registry("MoE runner backend")


@RUNNERS.register("reference")
def _reference() -> MoERunner:
    from moelab.moe.reference import ReferenceRunner

    return ReferenceRunner()
