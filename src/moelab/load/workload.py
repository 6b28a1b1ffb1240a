"""What one load point asks for (`Workload`, `SLO`) and the parsers the CLI uses for them.

Exactly one of `concurrency` / `request_rate` is set per point; `sweep` varies it. A rate of
`math.inf` sends every request at once (optionally capped by `max_concurrency`).
"""
from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator


class SLO(BaseModel):
    """The service-level objective, one model for the whole of moelab: a request meets it when each
    bound holds for it (goodput counts those); a load point (a study's, a capacity search's) meets
    it when the p90 of each bounded metric does."""

    model_config = ConfigDict(extra="forbid")  # a misspelt bound in a study file is an error

    ttft_ms: float | None = None
    itl_ms: float | None = None  # on the request's mean inter-token latency
    tpot_ms: float | None = None
    e2e_ms: float | None = None


class Workload(BaseModel):
    concurrency: int | None = None
    request_rate: float | None = None  # requests/s, Poisson arrivals; inf = all at once
    max_concurrency: int | None = None  # cap for a rate run
    input_len: int = 128
    output_len: int = 64
    dataset: Path | None = None  # JSONL: {"prompt": str, "output_len"?: int} per line
    num_prompts: int = 64
    slo: SLO = SLO()
    seed: int = 0
    fixed_output: bool = True  # send ignore_eos + min_tokens so every answer has output_len tokens
    probe_every: int = 0  # mix one probe prompt into every N-th request (0 = none)
    weight_format: str | None = None  # tolerance for the under-load probe comparison
    timeout_s: float = 300.0  # per request
    tokenizer: Path | None = None  # tokenizer.json for exact synthetic prompt lengths
    scrape_s: float | None = 0.5  # scrape the server's /metrics this often during the point (None: never)
    # validity thresholds (the run is marked invalid past them)
    max_error_rate: float = 0.0
    max_loop_lag_ms: float = 10.0  # p99 of the client's own event-loop lag, when arrivals are stamped
    # by the loop (they are late by it); with kernel receive stamps lag only delays sends, which the
    # rate / concurrency checks see, so only a stalled client is flagged
    max_loop_lag_kernel_ms: float = 50.0
    max_send_lateness_ms: float = 10.0  # p90 of (actual - scheduled) send time, rate runs
    min_concurrency_ratio: float = 0.9  # achieved / requested, concurrency runs ...
    max_slot_gap_ms: float = 2.0  # ... unless a slot's idle time per request stays below this

    @model_validator(mode="after")
    def _one_mode(self) -> "Workload":
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give exactly one of concurrency or request_rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0 (or inf), got {self.request_rate}")
        if self.num_prompts < 1 or self.input_len < 1 or self.output_len < 1:
            raise ValueError("num_prompts, input_len and output_len must be >= 1")
        return self

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        return "rate=inf" if math.isinf(self.request_rate or 0) else f"rate={self.request_rate:g}/s"


def parse_points(text: str, kind: str) -> list[float]:
    """'1,4,16' -> [1, 4, 16]; 'inf' allowed for rates. Raises ValueError with what was wrong."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"{kind}: {part!r} is not a number (example: 1,4,16{' or 2,8,inf' if kind == 'request-rate' else ''})") from None
        if kind == "concurrency" and (math.isinf(v) or v != int(v) or v < 1):
            raise ValueError(f"concurrency: {part!r} must be a whole number >= 1")
        if not v > 0:
            raise ValueError(f"{kind}: {part!r} must be > 0")
        out.append(v)
    return out


def parse_slo(text: str | None) -> SLO:
    """'ttft_ms=500,itl_ms=50' -> SLO. Unknown keys are an error that lists the known ones."""
    if not text:
        return SLO()
    vals: dict[str, float] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in SLO.model_fields:
            raise ValueError(f"--slo: {part!r} is not KEY=MS with KEY one of {', '.join(SLO.model_fields)}")
        try:
            vals[k] = float(v)
        except ValueError:
            raise ValueError(f"--slo: {v!r} for {k} is not a number of milliseconds") from None
    return SLO(**vals)
