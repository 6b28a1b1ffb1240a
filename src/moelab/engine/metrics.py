"""The embedded engine's own Prometheus metrics: what `GET /metrics` serves, in the text format
(and the naming) of vLLM's `vllm:` series, written by prometheus_client.

    moelab:num_requests_running          gauge      sequences admitted (each holds a lane and KV slots)
    moelab:num_requests_waiting          gauge      sequences queued, not admitted yet
    moelab:kv_cache_usage_perc           gauge      share (0..1) of the KV slots reserved by running sequences
    moelab:prompt_tokens_total           counter    prompt tokens prefilled
    moelab:generation_tokens_total       counter    tokens generated
    moelab:request_success_total         counter    sequences finished
    moelab:time_to_first_token_seconds   histogram  submit -> first token, measured in the engine
    moelab:decode_step_seconds           histogram  wall time of each decode-only step

Gauges and counters are read from the engine when scraped; the two histograms are observed by the
engine thread as it runs (a few microseconds a step). The engine has no preemption, so it exports
no preemption counter.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Live:
    """Reads the engine's counters and the scheduler's state at scrape time."""

    def __init__(self, engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def collect(self):
        e, labels = self.engine, ["model_name"]
        s = e.sched.stats()
        total = max(1, s["kv_tokens_total"])
        for name, doc, value in (
                ("moelab:num_requests_running", "Sequences running (admitted).", s["running"]),
                ("moelab:num_requests_waiting", "Sequences waiting to be admitted.", s["waiting"]),
                ("moelab:kv_cache_usage_perc", "Share of the KV cache slots reserved by running sequences (0-1).",
                 (s["kv_tokens_total"] - s["kv_tokens_free"]) / total)):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self.model_name], value)
            yield g
        for name, doc, value in (("moelab:prompt_tokens", "Prompt tokens prefilled.", e.stats["prefill_tokens"]),
                                 ("moelab:generation_tokens", "Tokens generated.", e.stats["generated_tokens"]),
                                 ("moelab:request_success", "Sequences finished.", e.stats["finished"])):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric([self.model_name], value)
            yield c


class EngineMetrics:
    """One registry per server: the engine calls `first_token` and `step`, the server `render`."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Live(engine, model_name))
        self.ttft = Histogram("moelab:time_to_first_token_seconds", "Submit to first token, in the engine.",
                              ["model_name"], buckets=TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self.decode = Histogram("moelab:decode_step_seconds", "Wall time of each decode-only step.",
                                ["model_name"], buckets=STEP_BUCKETS, registry=self.registry).labels(model_name)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def step(self, seconds: float, decode_only: bool) -> None:
        if decode_only:
            self.decode.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
