#!/usr/bin/env python3
"""Output tokens/s of `moelab serve` at several concurrencies against one-at-a-time, same run.

Starts `moelab serve` as a subprocess (real HTTP on 127.0.0.1), sends the same N greedy requests
(fixed ASCII prompts of exactly --prompt-len bytes = tokens, ignore_eos, fixed max_tokens) one at
a time and then at each concurrency, and prints tokens/s and the ratio to one-at-a-time. With
`--preset small --device cuda` it first writes the preset with moelab's checkpoint writer, serves
that directory, and then runs Hugging Face transformers `generate()` (batch --hf-batch) on the
same directory as the baseline. With `--tp 1,2` it serves once per rank count (`--tp-size N`:
gloo on CPU, NCCL on CUDA) and also prints each concurrency's tokens/s against --tp 1 measured in
the same run. The last line of output is one JSON document with every figure.

    python bench/engine_throughput.py                                    # tiny preset on CPU
    python bench/engine_throughput.py --tp 1,2 --torch-all-reduce        # the cost of two ranks here
    python bench/engine_throughput.py --preset small --device cuda --backend grouped
    python bench/engine_throughput.py --preset small --device cuda --backend triton --tp 1,2,4,8 --hf off
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

SENTENCES = [
    "The quick brown fox jumps over the lazy dog while the cat watches from the fence. ",
    "Mixture of experts models route every token to a few experts chosen by a router. ",
    "A continuous batching server lets new requests join between two decode steps. ",
    "Greedy decoding picks the most likely next token at every step of generation. ",
]


def prompts(n: int, length: int) -> list[str]:
    """n ASCII prompts of exactly `length` characters (one byte-level token each), all different."""
    out = []
    for i in range(n):
        s = f"Request {i}: " + "".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(1 + length // 60))
        out.append(s[:length])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`moelab serve` in its own session; stopped with SIGTERM (then SIGKILL) on exit."""

    def __init__(self, args: list[str], log: Path, timeout: float, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "moelab.cli", "serve", *args, "--port", str(self.port)]
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while "phase=ready" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"moelab serve did not become ready (exit {self.proc.returncode}); log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


async def run_level(url: str, texts: list[str], max_tokens: int, concurrency: int) -> dict:
    """Send every prompt with at most `concurrency` in flight; returns tokens/s and the outputs."""
    sem = asyncio.Semaphore(concurrency)
    outs: list[str | None] = [None] * len(texts)
    tokens = 0

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal tokens
        async with sem:
            # min_tokens masks EOS exactly like transformers' min_new_tokens, so greedy texts stay comparable
            body = {"prompt": texts[i], "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True}
            async with session.post(url + "/v1/completions", json=body) as r:
                data = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {data}")
        tokens += data["usage"]["completion_tokens"]
        outs[i] = data["choices"][0]["text"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async with session.get(url + "/stats") as r:
            before = await r.json()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(session, i) for i in range(len(texts))))
        dt = time.perf_counter() - t0
        async with session.get(url + "/stats") as r:
            after = await r.json()
    steps = after["steps"] - before["steps"]
    gen = after["generated_tokens"] - before["generated_tokens"]
    dsteps = after["decode_steps"] - before["decode_steps"]
    decode = {"decode_steps": dsteps, "graph_steps": after["graph_steps"] - before["graph_steps"],
              "mean_decode_batch": round((after["decode_tokens"] - before["decode_tokens"]) / max(dsteps, 1), 2),
              "ms_per_decode_step": round(1000 * (after["decode_busy_s"] - before["decode_busy_s"]) / max(dsteps, 1),
                                          3)}
    return {**decode, "model_config": after.get("model_config"), "expert_format": after["resolved"]["weight_format"],
            "concurrency": concurrency, "requests": len(texts), "output_tokens": tokens, "seconds": round(dt, 3),
            "tokens_per_s": round(tokens / dt, 1), "mean_batch": round(gen / max(steps, 1), 2),
            "engine_busy": round((after["busy_s"] - before["busy_s"]) / dt, 2),
            "ms_per_step": round(1000 * (after["busy_s"] - before["busy_s"]) / max(steps, 1), 2), "outputs": outs}


def calibrate() -> dict:
    """Copy bandwidth and bf16 matmul rate of this GPU, measured now (moelab's kernel-bench calibration)."""
    p = subprocess.run([sys.executable, "-m", "moelab.moe.bench", json.dumps({"mode": "calibrate"})],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def decode_roofline(row: dict, cal: dict, context: float) -> dict:
    """The decode-step roofline at the level's mean decode batch against its measured decode step."""
    from moelab.moe.roofline import decode_step_cost

    B = row["mean_decode_batch"]
    bytes_, flops = decode_step_cost(row["model_config"], row["expert_format"], round(B), context)
    roof_ms = 1e3 * max(bytes_ / cal["copy_bw_bytes_s"], flops / cal["bf16_flops_s"])
    return {"batch": B, "roofline_ms": round(roof_ms, 3), "measured_ms": row["ms_per_decode_step"],
            "fraction_of_roofline": round(roof_ms / row["ms_per_decode_step"], 3),
            "roofline_tokens_per_s": round(B / roof_ms * 1e3, 1),
            "decode_tokens_per_s": round(B / row["ms_per_decode_step"] * 1e3, 1), "bytes": bytes_}


def hf_generate(model_dir: Path, texts: list[str], max_tokens: int, batch: int, device: str) -> dict:
    """Hugging Face transformers generate() on the directory moelab wrote (greedy, fixed length)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # what `moelab serve --dtype auto` uses
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
    ids = torch.tensor([list(t.encode()) for t in texts[:batch]], device=device)  # equal lengths: no padding

    def gen() -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False, pad_token_id=256)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen()  # warm-up
    sync()
    t0 = time.perf_counter()
    out = gen()
    sync()
    dt = time.perf_counter() - t0
    new = out[:, ids.shape[1]:]
    from moelab.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)  # the server's own tokenizer, so equal ids give equal text
    return {"batch": len(ids), "output_tokens": new.numel(), "seconds": round(dt, 3),
            "tokens_per_s": round(new.numel() / dt, 1), "outputs": [tok.decode(r.tolist()) for r in new],
            "transformers": __import__("transformers").__version__}


def agreement(a: list[str], b: list[str]) -> dict:
    """How far greedy texts agree: exact matches and mean common-prefix length in characters."""
    pre = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        pre.append(k)
    return {"compared": len(pre), "identical": sum(x == y for x, y in zip(a, b)),
            "mean_common_prefix_chars": round(sum(pre) / max(len(pre), 1), 1)}


def measure(serve_args: list[str], log: Path, texts: list[str], levels: list[int], a) -> tuple[list[dict], float]:
    """One server: warm-up, one-at-a-time, then each concurrency; rows with ratios and text agreement."""
    t0 = time.perf_counter()
    srv = Server(serve_args, log, a.timeout)
    startup = time.perf_counter() - t0
    try:
        asyncio.run(run_level(srv.url, texts[:4], a.max_tokens, 4))  # warm-up, not counted
        base = asyncio.run(run_level(srv.url, texts, a.max_tokens, 1))
        base["concurrency"] = "one-at-a-time"
        rows = [base] + [asyncio.run(run_level(srv.url, texts, a.max_tokens, c)) for c in levels]
    finally:
        srv.stop()
    for r in rows:
        r["ratio_vs_one_at_a_time"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2)
        r["same_text_as_one_at_a_time"] = sum(x == y for x, y in zip(r["outputs"], base["outputs"]))
    return rows, startup


def print_levels(rows: list[dict]) -> None:
    print(f"{'concurrency':>14} {'tok/s':>9} {'ratio':>6} {'mean batch':>10} {'greedy = 1-at-a-time':>21} "
          f"{'ms/decode step':>14} {'graph steps':>11}")
    for r in rows:
        print(f"{r['concurrency']!s:>14} {r['tokens_per_s']:>9.1f} {r['ratio_vs_one_at_a_time']:>5.2f}x "
              f"{r['mean_batch']:>10.2f} {r['same_text_as_one_at_a_time']:>13}/{r['requests']} "
              f"{r['ms_per_decode_step']:>14.3f} {r['graph_steps']:>6}/{r['decode_steps']}")


def compare_tp(runs: dict, labels: list[str], ep: int) -> list[dict]:
    """Each concurrency of every variant against the first one (measured in the same run)."""
    base = labels[0]
    print(f"ranks against {base} (same run{f', --ep-size {ep}' if ep > 1 else ''}; torch: "
          f"--disable-custom-all-reduce); greedy: texts equal to {base}'s")
    print(f"{'concurrency':>14} " + " ".join(f"{label + ' tok/s':>18} {'ratio':>6} {'ms/step':>8}" for label in labels)
          + f" {'greedy':>8}")
    out = []
    for i, r0 in enumerate(runs[base][0]):
        cells, row = [], {"concurrency": r0["concurrency"]}
        for label in labels:
            r = runs[label][0][i]
            ratio = r["tokens_per_s"] / r0["tokens_per_s"]
            cells.append(f"{r['tokens_per_s']:>18.1f} {ratio:>5.2f}x {r['ms_per_decode_step']:>8.3f}")
            row[label] = {"tokens_per_s": r["tokens_per_s"], "ratio": round(ratio, 3),
                          "ms_per_decode_step": r["ms_per_decode_step"],
                          "same_text": sum(x == y for x, y in zip(r["outputs"], r0["outputs"]))}
        same = min(row[label]["same_text"] for label in labels)
        print(f"{r0['concurrency']!s:>14} " + " ".join(cells) + f" {same:>4}/{r0['requests']}")
        out.append(row)
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="moelab-bench-"))
    try:
        run(work)
    finally:  # the small preset's checkpoint is ~6 GB: never leave it behind
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", default="auto", help="--moe-runner-backend for moelab serve")
    ap.add_argument("--quantization", default="none", choices=["none", "fp8", "nvfp4"])
    ap.add_argument("--requests", type=int, default=None, help="default 64 (CPU) or 32 (CUDA: fits ~5 minutes)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--concurrency", default=None, help="comma list; default 1,4,16 (CPU) or 1,4,16,32 (CUDA)")
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--hf", default="auto", choices=["auto", "on", "off"],
                    help="transformers generate() baseline (auto: on with --device cuda)")
    ap.add_argument("--via-checkpoint", action="store_true",
                    help="serve the preset from a directory written by moelab's checkpoint writer (implied by --hf)")
    ap.add_argument("--tp", default="1", help="comma list of --tp-size values, each served in turn (default 1)")
    ap.add_argument("--ep-size", type=int, default=1, help="--ep-size for the runs with more than one rank")
    ap.add_argument("--torch-all-reduce", action="store_true",
                    help="also serve each --tp above 1 with --disable-custom-all-reduce (torch.distributed's all-reduce)")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    tps = [int(t) for t in a.tp.split(",")]
    a.requests = a.requests or (32 if a.device == "cuda" else 64)
    levels = [int(c) for c in (a.concurrency or ("1,4,16,32" if a.device == "cuda" else "1,4,16")).split(",")]
    texts = prompts(a.requests, a.prompt_len)
    serve_args = ["--device", a.device, "--moe-runner-backend", a.backend, "--quantization", a.quantization,
                  "--max-running-requests", str(max(levels + [a.hf_batch])), "--served-model-name", "bench"]
    hf = a.hf == "on" or (a.hf == "auto" and a.device == "cuda")
    if hf and importlib.util.find_spec("transformers") is None:
        sys.exit("the transformers baseline needs `pip install transformers` (or pass --hf off)")
    if hf or a.via_checkpoint:  # the same weights for both: moelab's checkpoint writer, then both load it
        ckpt = work / "ckpt"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "moelab.cli", "serve", "--preset", a.preset, "--device", a.device,
                        "--save", str(ckpt)], check=True, stdout=subprocess.DEVNULL)
        print(f"wrote {ckpt} in {time.perf_counter() - t0:.1f}s", flush=True)
        serve_args = ["--model-path", str(ckpt), *serve_args]
    else:
        serve_args = ["--preset", a.preset, *serve_args]
    cal = calibrate() if a.device == "cuda" else None  # before the server holds the GPU
    if cal:
        print(f"calibration on {cal['device']}: copy {cal['copy_bw_bytes_s'] / 1e12:.2f} TB/s, "
              f"bf16 matmul {cal['bf16_flops_s'] / 1e12:.0f} TFLOP/s", flush=True)
    variants = [(f"tp={t}", [] if t == 1 else ["--tp-size", str(t), "--ep-size", str(a.ep_size)]) for t in tps]
    if a.torch_all_reduce:
        variants += [(f"tp={t} torch", ["--tp-size", str(t), "--ep-size", str(a.ep_size), "--disable-custom-all-reduce"])
                     for t in tps if t > 1]
    runs = {}
    for label, extra in variants:
        runs[label] = measure(serve_args + extra, work / f"server-{label.replace(' ', '-')}.log", texts, levels, a)
        rows, startup = runs[label]
        print(f"moelab serve --preset {a.preset} --device {a.device} --moe-runner-backend {a.backend} "
              f"--quantization {a.quantization}{' ' + ' '.join(extra) if extra else ''}: {a.requests} requests x "
              f"{a.max_tokens} tokens, prompt {a.prompt_len} tokens (startup {startup:.1f}s)")
        print_levels(rows)
    rows, startup = runs[variants[0][0]]
    base = rows[0]
    if cal:
        context = a.prompt_len + a.max_tokens / 2  # mean keys per decode token
        print(f"decode-step roofline (weights + experts touched + KV at {context:.0f} keys, at the measured "
              f"{cal['copy_bw_bytes_s'] / 1e12:.2f} TB/s):")
        for r in rows[1:]:
            r["decode_roofline"] = d = decode_roofline(r, cal, context)
            print(f"  concurrency {r['concurrency']:>3}: mean decode batch {d['batch']:.1f}, step {d['measured_ms']:.3f} ms "
                  f"vs roofline {d['roofline_ms']:.3f} ms = {100 * d['fraction_of_roofline']:.0f}% of roofline; "
                  f"decode {d['decode_tokens_per_s']:.0f} tok/s vs roofline {d['roofline_tokens_per_s']:.0f} tok/s")
    result = {"preset": a.preset, "device": a.device, "backend": a.backend, "quantization": a.quantization,
              "requests": a.requests, "max_tokens": a.max_tokens, "prompt_len": a.prompt_len,
              "startup_s": round(startup, 1),
              "levels": [{k: v for k, v in r.items() if k not in ("outputs", "model_config")} for r in rows],
              "calibration": cal}
    if len(variants) > 1:
        result["tp"] = compare_tp(runs, [v[0] for v in variants], a.ep_size)
    if hf:
        h = hf_generate(work / "ckpt", texts, a.max_tokens, a.hf_batch, a.device)
        ours = next((r for r in rows if r["concurrency"] == a.hf_batch), rows[-1])
        h["agreement_with_moelab"] = agreement(base["outputs"][: h["batch"]], h["outputs"])
        print(f"transformers {h['transformers']} generate() batch {h['batch']}: {h['tokens_per_s']:.1f} tok/s; "
              f"moelab at concurrency {ours['concurrency']}: {ours['tokens_per_s']:.1f} tok/s "
              f"({ours['tokens_per_s'] / h['tokens_per_s']:.2f}x); greedy agreement {h['agreement_with_moelab']}")
        result["hf_generate"] = {k: v for k, v in h.items() if k != "outputs"}

    print(json.dumps(result))


if __name__ == "__main__":
    main()
