"""Load benchmark: a lean async streaming client, Poisson or fixed-concurrency schedules, metrics
recomputable from raw samples, validity checks, and correctness spot-checks under load.

Public API: `run_load`, `sweep`, `Workload`, `SLO`, `LoadResult`; statistics in `load.stats`.
"""
from __future__ import annotations

from moelab.load.client import Sample
from moelab.load.run import LoadResult, alive, run_load, sweep
from moelab.load.stats import Metrics, summarize, validity
from moelab.load.workload import SLO, Workload, parse_points, parse_slo

__all__ = ["LoadResult", "Metrics", "SLO", "Sample", "Workload", "alive", "parse_points", "parse_slo",
           "run_load", "summarize", "sweep", "validity"]
