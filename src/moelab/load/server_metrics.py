"""The server's own metrics over one load point: scrape its Prometheus `/metrics`, summarise the window.

A client sees latency from outside; the engine knows how many requests it ran and queued, how full
its KV cache was, whether it preempted, and its own TTFT/ITL histograms. As GuideLLM does, moelab
scrapes the server while a load point runs (every `interval_s`, in a thread that only fetches
text) and summarises the window afterwards with prometheus_client's text parser: gauges as mean
and peak over the scrapes taken under load, counters and histograms as the difference between the
scrape before the load and the one after it drained. A histogram's mean is exact; its percentiles
are upper bounds, the edge of the bucket they fall in, as coarse as the server's buckets.

Which series measure what is data (`SERIES`); the first name present on the server wins, so one
table serves vLLM, SGLang (which serves /metrics only with --enable-metrics) and the embedded
engine. A server without /metrics, or with none of these series, gives `available: False` and says
why; nothing is made up for it.
"""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

from pydantic import BaseModel, Field

from moelab.secrets import auth_headers

# quantity -> (kind, metric names; the first one the server exposes wins). Sources: vLLM 0.32's
# /metrics as served by its CPU build here (tests/test_vllm_metrics.py); SGLang 0.5.23
# srt/observability/metrics_collector.py; the embedded engine's engine/metrics.py.
SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge", ("vllm:num_requests_running", "sglang:num_running_reqs", "moelab:num_requests_running")),
    "waiting": ("gauge", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "moelab:num_requests_waiting")),
    # share 0..1 of the KV cache in use (vLLM before 0.10 called it gpu_cache_usage_perc)
    "kv_usage": ("gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                           "moelab:kv_cache_usage_perc")),
    "preemptions": ("counter", ("vllm:num_preemptions_total", "sglang:num_retracted_requests_total")),
    "prompt_tokens": ("counter", ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total",
                                  "moelab:prompt_tokens_total")),
    "generation_tokens": ("counter", ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                                      "moelab:generation_tokens_total")),
    "ttft": ("histogram", ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds",
                           "moelab:time_to_first_token_seconds")),
    "itl": ("histogram", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                          "sglang:inter_token_latency_seconds")),
    "e2e": ("histogram", ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")),
    "queue": ("histogram", ("vllm:request_queue_time_seconds",)),
    "decode_step": ("histogram", ("moelab:decode_step_seconds",)),
}
KV_FULL = 0.99  # a KV cache this full at its peak bounds the point: more room, not faster kernels


class GaugeStat(BaseModel):
    mean: float
    peak: float
    n: int  # scrapes it is over


class HistStat(BaseModel):
    """A server histogram over the window, in milliseconds. The mean is exact (sum / count); each
    percentile is an upper bound, the edge of the bucket it falls in (None: beyond the last edge)."""

    mean_ms: float
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    n: int  # observations in the window


class ServerWindow(BaseModel):
    url: str
    available: bool
    note: str = ""  # why not, when not available
    scrapes: int = 0
    seconds: float = 0.0  # from the scrape before the load to the one after it
    series: dict[str, str] = Field(default_factory=dict)  # quantity -> the server's metric it was read from
    running: GaugeStat | None = None
    waiting: GaugeStat | None = None
    kv_usage: GaugeStat | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    ttft_ms: HistStat | None = None
    itl_ms: HistStat | None = None
    e2e_ms: HistStat | None = None
    queue_ms: HistStat | None = None
    decode_step_ms: HistStat | None = None

    @property
    def bound(self) -> str | None:
        """What limited the server at this point: "kv_cache" (its KV cache was full), "running" (it
        queued requests with room left in the cache), or None."""
        if self.kv_usage is not None and self.kv_usage.peak >= KV_FULL:
            return "kv_cache"
        if self.waiting is not None and self.waiting.peak >= 1:
            return "running"
        return None


# -- parsing (pure) ----------------------------------------------------------------------------------
def parse(text: str) -> dict[str, dict[tuple, float]]:
    """sample name -> {sorted label items: value}, through prometheus_client's text parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _total(samples: dict[tuple, float] | None, how=sum) -> float | None:
    return None if not samples else float(how(samples.values()))


def _buckets(parsed: dict, name: str) -> list[tuple[float, float]]:
    """[(le, cumulative count)] of a histogram, summed over its other labels, le ascending."""
    by_le: dict[float, float] = {}
    for labels, v in (parsed.get(f"{name}_bucket") or {}).items():
        le = dict(labels).get("le")
        if le is not None:
            by_le[float(le)] = by_le.get(float(le), 0.0) + v
    return sorted(by_le.items())


def bucket_bound(buckets: list[tuple[float, float]], q: float) -> float | None:
    """An upper bound of the q-quantile: the upper edge of the bucket its rank falls in (None in +Inf).
    Interpolating inside the bucket, as histogram_quantile does, invents a value: a queue time of
    0.03 ms on average would read 150 ms at p50 from a first bucket of 0-300 ms.

        >>> bucket_bound([(0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0)], 0.5)
        0.2
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    for le, c in buckets:
        if c >= rank:
            return None if le == float("inf") else le
    return None


def _pick(parsed: list[dict], kind: str, names: tuple[str, ...]) -> str | None:
    key = (lambda n: f"{n}_count") if kind == "histogram" else (lambda n: n)
    return next((n for n in names if any(key(n) in p for p in parsed)), None)


def summarize(url: str, scrapes: list[tuple[float, str]], under_load: tuple[float, float] | None = None,
              note: str = "") -> ServerWindow:
    """The window's summary from raw scrapes [(time, text)]: the first is the baseline before the
    load, the last is after it drained; gauges use the scrapes inside `under_load` (start, end)."""
    if len(scrapes) < 2:
        return ServerWindow(url=url, available=False, scrapes=len(scrapes),
                            note=note or "fewer than two scrapes of /metrics (the window has no before and after)")
    try:
        parsed = [parse(t) for _, t in scrapes]
    except ValueError as e:
        return ServerWindow(url=url, available=False, scrapes=len(scrapes), note=f"/metrics is not Prometheus text: {e}")
    inside = [p for (t, _), p in zip(scrapes, parsed) if under_load[0] <= t <= under_load[1]] \
        if under_load else parsed
    w = ServerWindow(url=url, available=True, scrapes=len(scrapes), seconds=round(scrapes[-1][0] - scrapes[0][0], 3))
    first, last = parsed[0], parsed[-1]
    for q, (kind, names) in SERIES.items():
        name = _pick(parsed, kind, names)
        if name is None:
            continue
        w.series[q] = name
        if kind == "gauge":
            how = max if q == "kv_usage" else sum  # data-parallel engines: the fullest cache, all requests
            vals = [v for p in inside if (v := _total(p.get(name), how)) is not None]
            if vals:
                setattr(w, q, GaugeStat(mean=sum(vals) / len(vals), peak=max(vals), n=len(vals)))
        elif kind == "counter":
            a, b = _total(first.get(name)), _total(last.get(name))
            if b is not None:
                setattr(w, q, b - (a or 0.0))
        else:
            b0, b1 = dict(_buckets(first, name)), _buckets(last, name)
            delta = [(le, c - b0.get(le, 0.0)) for le, c in b1]
            n = (_total(last.get(f"{name}_count")) or 0.0) - (_total(first.get(f"{name}_count")) or 0.0)
            s = (_total(last.get(f"{name}_sum")) or 0.0) - (_total(first.get(f"{name}_sum")) or 0.0)
            if n > 0:
                qs = [bucket_bound(delta, x) for x in (0.5, 0.9, 0.99)]
                setattr(w, f"{q}_ms", HistStat(mean_ms=1e3 * s / n, n=int(round(n)),
                                               **{k: (None if v is None else 1e3 * v)
                                                  for k, v in zip(("p50_ms", "p90_ms", "p99_ms"), qs)}))
    if not w.series:
        return ServerWindow(url=url, available=False, scrapes=len(scrapes),
                            note="/metrics has none of the series moelab reads (vllm:, sglang:, moelab:)")
    if not inside:
        w.note = "no scrape fell inside the load (it was shorter than the scrape interval): no gauges"
    return w


def findings(server: ServerWindow | None, label: str, client_ttft_ms: float | None = None,
             client_tokens: int | None = None) -> list[str]:
    """What the server's own figures say about a point that the client's cannot (pure): a client TTFT
    (mean) far from the server's, a full KV cache, queued or preempted requests, other traffic.

        >>> w = ServerWindow(url="u", available=True, series={"ttft": "vllm:time_to_first_token_seconds"},
        ...                  ttft_ms=HistStat(mean_ms=40.0, n=8))
        >>> findings(w, "c=8", client_ttft_ms=95.0)[0][:64]
        "c=8: client TTFT 95.0 ms (mean) against the server's own 40.0 ms"
    """
    if server is None or not server.available:
        return []
    out = []
    s = server.ttft_ms.mean_ms if server.ttft_ms else None
    if client_ttft_ms is not None and s is not None and abs(client_ttft_ms - s) > max(20.0, 0.5 * s):
        out.append(f"{label}: client TTFT {client_ttft_ms:.1f} ms (mean) against the server's own {s:.1f} ms "
                   f"({server.series['ttft']}): {client_ttft_ms - s:+.1f} ms lie outside the engine's clock "
                   "(HTTP, tokenisation, a queue in front of the engine, or the client machine)")
    if server.bound == "kv_cache":
        out.append(f"{label}: the KV cache was full (peak {server.kv_usage.peak:.0%}): this point is "
                   "capacity-bound, not slow; more KV room admits more requests")
    if server.waiting is not None and server.waiting.peak >= 1:
        run = f", at most {server.running.peak:.0f} running" if server.running else ""
        out.append(f"{label}: the server queued up to {server.waiting.peak:.0f} requests (mean "
                   f"{server.waiting.mean:.1f}){run}")
    if server.preemptions:
        out.append(f"{label}: the server preempted {server.preemptions:.0f} requests")
    gen = server.generation_tokens
    if gen is not None and client_tokens and gen > 1.2 * client_tokens + 16:
        out.append(f"{label}: the server generated {gen:.0f} tokens in the window, the client received "
                   f"{client_tokens}: other traffic shared the server")
    return out


# -- scraping (the process edge) ---------------------------------------------------------------------
class Scraper:
    """Fetch `/metrics` before a load point, every `interval_s` while it runs, and after it."""

    def __init__(self, base_url: str, interval_s: float = 0.5, api_key: str | None = None,
                 timeout_s: float = 2.0) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.base_url, self.interval_s, self.timeout_s = base_url, interval_s, timeout_s
        self.headers = auth_headers(api_key)
        self.scrapes: list[tuple[float, str]] = []
        self.answered: list[float] = []  # when each scrape's text had been read, beside when it was asked
        self.note = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.load: tuple[float, float] | None = None

    def _get(self) -> bool:
        try:
            req = urllib.request.Request(self.url, headers=self.headers)
            asked = time.monotonic()  # the server renders the text when asked; a busy client may read it late
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                text = r.read().decode("utf-8", errors="replace")
            self.scrapes.append((asked, text))
            self.answered.append(time.monotonic())
            return True
        except urllib.error.HTTPError as e:
            self.note = (f"GET /metrics answered {e.code}" + (": no Prometheus metrics there (SGLang serves them "
                                                               "only with --enable-metrics)" if e.code == 404 else ""))
        except (OSError, ValueError) as e:
            self.note = f"GET /metrics failed: {getattr(e, 'reason', e)}"
        return False

    def _run(self) -> None:
        # every 0.1 s for the first 2 s, so that a short point (a fraction of a second of load) still has
        # several scrapes while it runs; then 0.2, 0.3, ... s apart, up to interval_s
        k = 0
        while not self._stop.wait(min(self.interval_s, 0.1 * max(1, (k := k + 1) - 19))):
            self._get()

    def start(self) -> "Scraper":
        if self._get():  # the baseline; a server without /metrics is not asked again
            self._thread = threading.Thread(target=self._run, name="moelab-metrics", daemon=True)
            self._thread.start()
        return self

    def mark(self, start: float, end: float) -> None:
        """The load's own span (time.monotonic()): the gauges are averaged inside it."""
        self.load = (start, end)

    def stop(self) -> ServerWindow:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(self.timeout_s + 1)
            self._get()  # after the drain: the counters' end
        return summarize(self.base_url, self.placed(), self.load, self.note)

    def placed(self) -> list[tuple[float, str]]:
        """The scrapes, each at the time its text was rendered as far as it can be told: when it was
        asked, except one asked under load and answered only after the load ended (a busy server can
        take a second to answer), which may show the drained server: it is placed at its answer."""
        end = self.load[1] if self.load else None
        return [(b if end is not None and a <= end < b else a, t) for (a, t), b in zip(self.scrapes, self.answered)]
