"""The server's own metrics over a load window, and the capacity search under an SLO.

Pure: the window summary of two real /metrics pages of vLLM 0.32's CPU build (before and after a
load of 32 requests x 64 tokens, tests/logs/vllm-0.32.0-cpu-metrics-*.txt), bucket bounds,
findings, the search's decisions. Embedded: the embedded engine's /metrics, `moelab bench`
scraping it, and `bench --find max-concurrency` converging where the SLO breaks, checked
against a sweep of the same server.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.load import capacity as C
from moelab.load.server_metrics import HistStat, ServerWindow, GaugeStat, bucket_bound, findings, summarize
from moelab.load.workload import SLO

LOGS = Path(__file__).parent / "logs"
BEFORE = (LOGS / "vllm-0.32.0-cpu-metrics-before-load.txt").read_text()
AFTER = (LOGS / "vllm-0.32.0-cpu-metrics-after-load.txt").read_text()


def test_a_real_vllm_window_counters_and_histograms_are_differences():
    w = summarize("http://x", [(0.0, BEFORE), (5.0, AFTER)])
    assert w.available and w.series["ttft"] == "vllm:time_to_first_token_seconds"
    assert (w.prompt_tokens, w.generation_tokens, w.preemptions) == (972.0, 2048.0, 0.0)  # 32 x 64 tokens
    assert w.ttft_ms.n == 32 and 47.0 < w.ttft_ms.mean_ms < 48.0  # exact: sum / count
    assert w.itl_ms.n == 2016  # 32 x 63 gaps
    assert w.ttft_ms.p50_ms <= w.ttft_ms.p90_ms <= w.ttft_ms.p99_ms
    # a percentile is the edge of its bucket, never an interpolation inside it
    assert w.queue_ms.mean_ms < 1.0 and w.queue_ms.p50_ms == 300.0
    same = summarize("http://x", [(0.0, AFTER), (1.0, AFTER)])
    assert same.generation_tokens == 0 and same.ttft_ms is None  # nothing happened in between


def test_no_metrics_or_foreign_metrics_is_said_not_invented():
    assert not summarize("u", [(0.0, BEFORE)]).available
    bad = summarize("u", [(0.0, "not prometheus {"), (1.0, "x")])
    assert not bad.available and "Prometheus" in bad.note
    other = summarize("u", [(0.0, "# TYPE up gauge\nup 1\n"), (1.0, "# TYPE up gauge\nup 1\n")])
    assert not other.available and "none of the series" in other.note
    assert findings(other, "c=1", client_ttft_ms=500.0) == []


def test_bucket_bound_is_an_upper_edge():
    b = [(0.1, 2.0), (0.2, 6.0), (float("inf"), 8.0)]
    assert (bucket_bound(b, 0.2), bucket_bound(b, 0.5), bucket_bound(b, 0.99)) == (0.1, 0.2, None)
    assert bucket_bound([], 0.5) is None and bucket_bound([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_findings_name_what_the_client_cannot_see():
    w = ServerWindow(url="u", available=True, series={"ttft": "vllm:time_to_first_token_seconds"},
                     ttft_ms=HistStat(mean_ms=40.0, n=8), kv_usage=GaugeStat(mean=0.9, peak=1.0, n=5),
                     waiting=GaugeStat(mean=2.5, peak=6, n=5), running=GaugeStat(mean=8, peak=8, n=5),
                     preemptions=3.0, generation_tokens=5000.0)
    f = findings(w, "c=16", client_ttft_ms=95.0, client_tokens=1024)
    assert len(f) == 5 and w.bound == "kv_cache"
    assert "client TTFT 95.0 ms (mean) against the server's own 40.0 ms" in f[0]
    assert "capacity-bound, not slow" in f[1] and "queued up to 6" in f[2] and "preempted 3" in f[3]
    assert "other traffic" in f[4]
    close = ServerWindow(url="u", available=True, series={"ttft": "t"}, ttft_ms=HistStat(mean_ms=40.0, n=8))
    assert findings(close, "c=1", client_ttft_ms=52.0, client_tokens=10) == [] and close.bound is None


def test_the_search_doubles_then_bisects_to_one_request():
    break_above = 11
    h: dict[float, bool] = {}
    order = []
    while (v := C.next_value(h, "concurrency", 1, 1024)) is not None:
        order.append(v)
        h[v] = v <= break_above
    assert order == [1, 2, 4, 8, 16, 12, 10, 11]
    cap = C.answer("max-concurrency", SLO(ttft_ms=1), 90, [C.Step(value=v, met=ok) for v, ok in h.items()], 1024)
    assert cap.answer == 11 and cap.broke_next.value == 12 and not cap.at_limit


def test_the_search_goes_down_stops_at_limits_and_rates_bisect_to_a_tolerance():
    assert C.next_value({4: False}, "concurrency", 4, 64) == 2
    assert C.next_value({4: False, 2: False, 1: False}, "concurrency", 4, 64) is None
    h = {8: True, 16: True, 32: True, 64: True}
    assert C.next_value(h, "concurrency", 8, 64) is None
    cap = C.answer("max-concurrency", SLO(ttft_ms=1), 90, [C.Step(value=v, met=True) for v in h], 64)
    assert cap.answer == 64 and cap.at_limit
    r: dict[float, bool] = {}
    while (v := C.next_value(r, "request_rate", 1.0, 1000.0, rel_tol=0.1)) is not None:
        r[v] = v <= 5.3
    lo, hi = max(v for v, ok in r.items() if ok), min(v for v, ok in r.items() if not ok)
    assert lo <= 5.3 < hi and (hi - lo) / hi <= 0.1
    noisy = [C.Step(value=1, met=True), C.Step(value=2, met=False), C.Step(value=4, met=True)]
    assert C.answer("max-concurrency", SLO(ttft_ms=1), 90, noisy, 64).non_monotone == [4]


# -- the embedded engine ---------------------------------------------------------------------------
MOELAB = [sys.executable, "-m", "moelab.cli"]


def _serve(tmp_path, *args):
    pytest.importorskip("torch")
    from test_engine_server import Serve

    return Serve("--preset", "tiny", *args, log=tmp_path / "server.log")


def _bench(*args, timeout=240) -> tuple[int, dict]:
    r = subprocess.run([*MOELAB, "bench", *args, "--json"], capture_output=True, text=True, timeout=timeout)
    assert r.stdout.strip(), r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout)


@pytest.mark.embedded
def test_the_embedded_engine_serves_prometheus_text_and_bench_reads_it(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    s = _serve(tmp_path, "--max-running-requests", "4")
    try:
        import urllib.request

        with urllib.request.urlopen(s.url + "/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        assert {"moelab:num_requests_running", "moelab:num_requests_waiting", "moelab:kv_cache_usage_perc",
                "moelab:prompt_tokens", "moelab:generation_tokens", "moelab:time_to_first_token_seconds",
                "moelab:decode_step_seconds"} <= set(fams)
        assert fams["moelab:decode_step_seconds"].type == "histogram"
        rc, d = _bench("--url", s.url, "--concurrency", "8", "--num-prompts", "32", "--input-len", "16",
                       "--output-len", "48")
        pt = d["points"][0]
        w = pt["server"]
        assert w["available"] and w["series"]["running"] == "moelab:num_requests_running"
        tokens = sum(x["output_tokens"] or 0 for x in pt["samples"] if x["error"] is None)
        assert w["generation_tokens"] == tokens == 32 * 48  # the server counted what the client received
        assert w["running"]["peak"] == 4 and w["waiting"]["peak"] >= 1  # 8 in flight, 4 slots
        assert w["ttft_ms"]["n"] == 32 and w["decode_step_ms"]["n"] > 0 and w["scrapes"] >= 3
        assert any("queued up to" in f for f in pt["findings"])
    finally:
        s.stop()


@pytest.mark.embedded
@pytest.mark.slow
def test_capacity_search_converges_where_the_slo_breaks_checked_against_a_sweep(tmp_path):
    # 3 running slots: a 4th concurrent request waits for a whole request (~256 decode steps), so p90
    # TTFT jumps from milliseconds to about a request's length (about 0.3 s at the tiny model's 1 ms a
    # step, more on a busy machine, whose stalls the 150 ms SLO leaves room for) between concurrency 3
    # and 4. (128 steps made a request about as long as the SLO on a fast machine: concurrency 5 met it.)
    s = _serve(tmp_path, "--max-running-requests", "3")
    common = ["--url", s.url, "--input-len", "16", "--output-len", "256", "--num-prompts", "12"]
    slo = SLO(ttft_ms=150)
    try:
        rc, found = _bench(*common, "--find", "max-concurrency", "--slo", "ttft_ms=150")
        rc_sweep, sweep = _bench(*common, "--concurrency", "1,2,3,4,5", "--slo", "ttft_ms=150")
    finally:
        s.stop()
    cap = found["capacity"]
    assert rc == 0 and cap["answer"] == 3, cap
    assert [st["value"] for st in cap["steps"]] == [1, 2, 4, 3] and cap["broke_next"]["value"] == 4
    assert len(found["points"]) == 4 and cap["goodput"] > 0
    # the sweep, judged the same way: every point up to 3 meets it, 4 and 5 do not
    from moelab.load import LoadResult

    met = {r["workload"]["concurrency"]: not C.breaks(LoadResult.model_validate(r), slo, 90) for r in sweep["points"]}
    assert met == {1: True, 2: True, 3: True, 4: False, 5: False}, met


def test_find_refuses_bad_usage_with_a_clear_error():
    for args, words in ((["--find", "max-concurrency"], "--find needs --slo"),
                        (["--find", "fastest", "--slo", "ttft_ms=9"], "is not a search"),
                        (["--find", "max-rate", "--concurrency", "4", "--slo", "ttft_ms=9"], "starts from --request-rate"),
                        (["--find", "max-concurrency", "--slo", "ttft_ms=9", "--slo-percentile", "0"], "not a percentile")):
        r = subprocess.run([*MOELAB, "bench", "--url", "http://127.0.0.1:9", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_scrape_counts_when_it_was_asked_not_when_a_busy_client_read_it():
    """A real HTTP server renders /metrics when asked and answers late (as a starved client reads it late): the
    scrape belongs to the moment it was asked, so one asked before the load does not count as under load."""
    import http.server
    import threading
    import time

    from moelab.load.server_metrics import Scraper

    asked: list[float] = []

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(time.monotonic())
            body = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {len(asked) - 1}\n".encode()
            time.sleep(0.3)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = Scraper(f"http://127.0.0.1:{srv.server_port}", interval_s=10)
        s.start()  # the baseline, rendered with 0 running, read 0.3 s later
        start = time.monotonic()
        s.mark(start - 0.1, start + 5)  # a load that began after the baseline was asked
        w = s.stop()
    finally:
        srv.shutdown()
    assert s.scrapes[0][0] <= asked[0] + 0.05  # stamped when asked, not when read
    # every scrape but the baseline counts (the scraper's own may add one if this thread is slow), none reads 0
    assert w.running is not None and w.running.n == len(s.scrapes) - 1 >= 1 and w.running.mean >= 1


def test_a_scrape_answered_after_the_load_ended_is_not_counted_under_load():
    """vLLM's API server on a busy 2-core machine answered one scrape 0.95 s after it was asked, across
    the end of the load: its text may show the drained server (0 running), so it is placed at its answer."""
    from moelab.load.server_metrics import Scraper

    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {}\n"
    s = Scraper("http://127.0.0.1:9")  # never asked: the scrapes are set as a run would leave them
    s.scrapes = [(0.0, text.format(0)), (1.0, text.format(4)), (2.5, text.format(0)), (3.2, text.format(0))]
    s.answered = [0.01, 1.01, 3.45, 3.21]
    s.mark(0.5, 3.0)
    assert [t for t, _ in s.placed()] == [0.0, 1.0, 3.45, 3.2]
    from moelab.load.server_metrics import summarize

    w = summarize("u", s.placed(), s.load)
    assert w.running.n == 1 and w.running.peak == 4  # the straddling zero is not a reading under load
