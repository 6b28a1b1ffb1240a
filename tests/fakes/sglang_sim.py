"""A simulated SGLang launch: a real server process that behaves, flag by flag, the way an SGLang
MoE launch on an sm_90 GPU does, for study tests and bench/study_efficiency.py.

    python sglang_sim.py --port P [--moe-runner-backend X] [--fp4-gemm-backend Y]
        [--attention-backend Z] [--mem-fraction-static F] [--cuda-graph-max-bs N]

What it does, in SGLang's own words where SGLang has them:
  - arch gates: backends that need sm_100 die at startup with SGLang's and FlashInfer's own errors,
    which seldom name the flag (`kernel requires 10.x architecture`);
  - memory: the weights take 30 % of the GPU and the CUDA graphs of --cuda-graph-max-bs take more;
    a memory fraction that leaves no KV cache is `Not enough memory`, one past the device's memory
    fails in graph capture with a CUDA OOM; the KV cache that is left bounds the running batch;
  - numerics: one backend pair answers NaN logprobs, one FP4 backend answers '!!!!';
  - under load: moe=triton with attention=flashinfer dies of an illegal memory access once 48
    requests run together, and never at low load;
  - speed: continuous batching with a step time set by the three backends and the batch size;
    a decode batch above --cuda-graph-max-bs runs eagerly, slower;
  - what ran: like SGLang it logs its server arguments once, its own resolution applied (SGLang's
    `server_args=ServerArgs(...)` line): `auto` is flashinfer_cutlass here, and `triton_kernel`,
    a runner with no NVFP4 kernel, silently runs flashinfer_cutlass too: no warning, no error, as
    sglang#36395 reports of bench_one_batch and --moe-runner-backend.

`performance(flags, concurrency)` is the same model as a pure function: the steady-state output
rate of continuous batching at that many concurrent requests (the server admits a waiting request
at every step, so its batch stays at min(concurrency, KV capacity)). The bench uses it to know the
true optimum of the space without launching anything. Timings are scaled so that a
2-core machine can stream them (a step is tens of milliseconds, not microseconds).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import signal
import sys
import time

MOE = {"auto": 0.85, "triton": 1.0, "deep_gemm": 0.92, "flashinfer_trtllm": None, "flashinfer_cutlass": 0.85,
       "flashinfer_cutedsl": None, "cutlass": 0.95, "marlin": 1.3, "triton_kernel": 0.85}  # None: refused on sm_90
RAN = {"auto": "flashinfer_cutlass", "triton_kernel": "flashinfer_cutlass"}  # what a request of these runs here


def ran(moe: str) -> str:
    """The MoE runner a --moe-runner-backend value really runs (the server_args line says it)."""
    return RAN.get(moe, moe)
FP4 = {"auto": 1.0, "flashinfer_cutlass": 1.0, "flashinfer_trtllm": None, "flashinfer_cudnn": 0.9, "cutlass": 0.96}
ATTN = {"fa3": 0.9, "flashinfer": 1.0, "triton": 1.15, "trtllm_mha": None}
# The gates' wordings are real ones (docs/research/moe-backends-and-failures.md §1.3 and the
# signature table: SGLang's ModelOptNvFp4FusedMoEMethod, FlashInfer's SM-10.x checks, SGLang's older
# TRTLLM MHA check); like the real ones, most name neither the flag nor its value.
GATE = {("moe", "flashinfer_trtllm"): "ValueError: Current platform does not support NVFP4 quantization with the "
                                      "selected MoE backend. Please use Blackwell and above, or use "
                                      "moe_runner_backend=marlin on SM80+.",
        ("moe", "flashinfer_cutedsl"): "RuntimeError: MoE kernel requires SM 10.x",
        ("fp4", "flashinfer_trtllm"): "RuntimeError: kernel requires 10.x architecture",
        ("attn", "trtllm_mha"): "ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100)."}
WEIGHTS, GRAPH_PER_BS, KV_SEQS_PER_UNIT = 0.30, 0.06 / 512, 420  # fractions of the GPU; sequences per unit of KV
# Seconds per decode step at batch 0 (MOELAB_SIM_STEP_S): slow enough that a 2-core machine's load
# client streams every token of 192 concurrent requests without becoming the bottleneck. A step
# grows by STEP_S / BATCH_SCALE per running sequence (MOELAB_SIM_BATCH_SCALE): a smaller scale with a
# smaller STEP_S keeps a loaded step as long while a lone request (moelab's probe asks its prompts
# one at a time) runs faster, which is how the tests keep their launches short.
STEP_S = float(os.environ.get("MOELAB_SIM_STEP_S", "0.075"))
BATCH_SCALE = float(os.environ.get("MOELAB_SIM_BATCH_SCALE", "48"))
EAGER = 1.35
CRASH_BATCH = 48
# defaults at which, at 192 concurrent requests, both numeric knobs bind: the decode batch outgrows
# the CUDA graphs (eager steps), and a larger graph size needs a larger memory fraction
DEFAULT_FRACTION, DEFAULT_GRAPH_BS = 0.79, 160
WORDS = ["the", "expert", "router", "token", "gate", "layer", "cache", "batch", "kernel", "tensor", "warp", "block"]


def flags_of(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="launch_server.py")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model-path", default="Qwen3-30B-A3B-NVFP4")
    ap.add_argument("--moe-runner-backend", default="auto", choices=sorted(MOE))
    ap.add_argument("--fp4-gemm-backend", default="auto", choices=sorted(FP4))
    ap.add_argument("--attention-backend", default="flashinfer", choices=sorted(ATTN))
    ap.add_argument("--mem-fraction-static", type=float, default=DEFAULT_FRACTION)
    ap.add_argument("--cuda-graph-max-bs", type=int, default=DEFAULT_GRAPH_BS)
    ap.add_argument("--max-running-requests", type=int, default=1024)
    return ap.parse_args(argv)


def launch_failure(moe: str, fp4: str, attn: str, fraction: float, graph_bs: int) -> str | None:
    """The error a launch dies of at startup, or None."""
    for key in (("moe", moe), ("fp4", fp4), ("attn", attn)):
        if key in GATE:
            return GATE[key]
    graphs = graph_bs * GRAPH_PER_BS
    if fraction - WEIGHTS - graphs <= 0.02:
        return "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    if fraction + graphs > 0.93:
        return ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                "of 79.10 GiB of which 1.21 GiB is free.")
    return None


def kv_seqs(fraction: float, graph_bs: int) -> int:
    return max(0, int((fraction - WEIGHTS - graph_bs * GRAPH_PER_BS) * KV_SEQS_PER_UNIT))


def step_s(moe: str, fp4: str, attn: str, batch: int, graph_bs: int) -> float:
    base = STEP_S * MOE[moe] * FP4[fp4] * ATTN[attn] * (1 + batch / BATCH_SCALE)
    return base * (EAGER if batch > graph_bs else 1.0)


def performance(flags: dict, concurrency: int, output_len: int = 32) -> float | None:
    """Output tokens/s at this concurrency, None where the launch fails or the server dies under it."""
    moe, fp4, attn = (flags.get(k, d) for k, d in (("--moe-runner-backend", "auto"), ("--fp4-gemm-backend", "auto"),
                                                   ("--attention-backend", "flashinfer")))
    fraction, graph_bs = float(flags.get("--mem-fraction-static", DEFAULT_FRACTION)), int(flags.get("--cuda-graph-max-bs", DEFAULT_GRAPH_BS))
    if launch_failure(moe, fp4, attn, fraction, graph_bs) or behaviour(moe, fp4, attn) != "ok":
        return None
    batch = min(concurrency, kv_seqs(fraction, graph_bs), int(flags.get("--max-running-requests", 1024)))
    if batch >= CRASH_BATCH and crashes_under_load(moe, attn):
        return None
    return batch / step_s(moe, fp4, attn, batch, graph_bs)


def expected_cause(flags: dict, concurrency: int) -> str:
    """The verdict a launch of `flags` loaded up to `concurrency` (0: launch and probe only) deserves."""
    moe, fp4, attn = (flags.get(k, d) for k, d in (("--moe-runner-backend", "auto"), ("--fp4-gemm-backend", "auto"),
                                                   ("--attention-backend", "flashinfer")))
    fraction = float(flags.get("--mem-fraction-static", DEFAULT_FRACTION))
    graph_bs = int(flags.get("--cuda-graph-max-bs", DEFAULT_GRAPH_BS))
    err = launch_failure(moe, fp4, attn, fraction, graph_bs)
    if err is not None:
        return "gpu_oom" if "memory" in err.lower() else "unsupported_arch"
    kind = behaviour(moe, fp4, attn)
    if kind != "ok":
        return {"nan": "numerical_nan", "garbage": "garbage_output"}[kind]
    batch = min(concurrency, kv_seqs(fraction, graph_bs), int(flags.get("--max-running-requests", 1024)))
    return "illegal_memory_access" if batch >= CRASH_BATCH and crashes_under_load(moe, attn) else "ok"


def behaviour(moe: str, fp4: str, attn: str) -> str:
    if moe == "cutlass" and fp4 == "cutlass":
        return "nan"
    if fp4 == "flashinfer_cudnn":
        return "garbage"
    return "ok"


def crashes_under_load(moe: str, attn: str) -> bool:
    return moe == "triton" and attn == "flashinfer"


def log(msg: str, rank: str = "TP0") -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} {rank}] {msg}", flush=True)


def answer(prompt: str, n: int, kind: str) -> list[str]:
    if kind == "garbage":
        return ["!"] * n
    return [" " + WORDS[hashlib.sha256(f"{prompt}|{i}".encode()).digest()[0] % len(WORDS)] for i in range(n)]


class Engine:
    """Continuous batching: each step gives every running sequence one token."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.kind = behaviour(a.moe_runner_backend, a.fp4_gemm_backend, a.attention_backend)
        self.capacity = min(kv_seqs(a.mem_fraction_static, a.cuda_graph_max_bs), a.max_running_requests)
        self.waiting: list[tuple[list[str], asyncio.Queue]] = []
        self.running: list[list] = []  # [tokens left, queue]
        self.wake = asyncio.Event()

    def submit(self, toks: list[str]) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.waiting.append((toks, q))
        self.wake.set()
        return q

    async def loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
            while self.waiting and len(self.running) < self.capacity:
                toks, q = self.waiting.pop(0)
                self.running.append([list(toks), q])
            batch = len(self.running)
            if batch >= CRASH_BATCH and crashes_under_load(self.a.moe_runner_backend, self.a.attention_backend):
                log("Scheduler hit an exception: Traceback (most recent call last):")
                log('  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2712, in event_loop')
                log("RuntimeError: CUDA error: an illegal memory access was encountered")
                print("Received sigquit from a child process. It usually means the child failed.", flush=True)
                os._exit(1)
            await asyncio.sleep(step_s(self.a.moe_runner_backend, self.a.fp4_gemm_backend, self.a.attention_backend,
                                       batch, self.a.cuda_graph_max_bs))
            for seq in self.running:
                seq[1].put_nowait(seq[0].pop(0))
                if not seq[0]:
                    seq[1].put_nowait(None)
            self.running = [s for s in self.running if s[0]]


async def serve(a: argparse.Namespace) -> None:
    from aiohttp import web

    eng = Engine(a)

    async def health(_):
        return web.json_response({})

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": a.model_path, "object": "model"}]})

    async def completions(req: web.Request):
        body = await req.json()
        n = int(body.get("max_tokens") or 16)
        toks = answer(str(body.get("prompt")), n, eng.kind)
        q = eng.submit(toks)
        nan = eng.kind == "nan"
        if not body.get("stream"):
            out = []
            while (t := await q.get()) is not None:
                out.append(t)
            lp = None
            if body.get("logprobs"):
                v = math.nan if nan else -0.1
                lp = {"tokens": out, "token_logprobs": [v] * n, "top_logprobs": [{t: v, " other": -3.0} for t in out]}
            return web.Response(text=json.dumps({
                "id": "c", "object": "text_completion", "model": a.model_path,
                "choices": [{"index": 0, "text": "".join(out), "logprobs": lp, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}),
                content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        i = 0
        while (t := await q.get()) is not None:
            i += 1
            ev = {"choices": [{"index": 0, "text": t, "finish_reason": "length" if i == n else None}]}
            if i == n:
                ev["usage"] = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
            await resp.write(f"data: {json.dumps(ev)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, a.host, a.port).start()
    asyncio.get_running_loop().create_task(eng.loop())
    log("The server is fired up and ready to roll!")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def main() -> None:
    a = flags_of()
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] server_args=ServerArgs(model_path='{a.model_path}', "
          f"moe_runner_backend='{ran(a.moe_runner_backend)}', fp4_gemm_runner_backend='{a.fp4_gemm_backend}', "
          f"attention_backend='{a.attention_backend}', mem_fraction_static={a.mem_fraction_static}, "
          f"cuda_graph_max_bs={a.cuda_graph_max_bs})", flush=True)
    log("Load weight begin. avail mem=78.50 GB")
    time.sleep(0.2)
    err = launch_failure(a.moe_runner_backend, a.fp4_gemm_backend, a.attention_backend, a.mem_fraction_static,
                         a.cuda_graph_max_bs)
    if err is not None:
        log("Scheduler hit an exception: Traceback (most recent call last):")
        log('  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 301, in __init__')
        log(err)
        print("Received sigquit from a child process. It usually means the child failed.", flush=True)
        sys.exit(1)
    log(f"Load weight end. avail mem=40.10 GB; KV cache for {kv_seqs(a.mem_fraction_static, a.cuda_graph_max_bs)} "
        "sequences")
    log(f"Capture cuda graph begin. This can take up to several minutes. bs up to {a.cuda_graph_max_bs}")
    asyncio.run(serve(a))


if __name__ == "__main__":
    main()
