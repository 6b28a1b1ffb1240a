"""A real, small OpenAI-compatible server that prints a scripted log and dies in a scripted way.

Stdlib only, so it behaves like an engine process and not like moelab. Modes (--mode):
  ok          log phases, serve /health, /v1/models, /v1/completions until SIGTERM
  traceback   SGLang-style interleaved ranks: a CUDA OOM traceback on TP1, then wrapper lines, exit 1
  grow        allocate and touch 32 MiB chunks while "loading weights" (killed by a memory limit)
  sigkill     print a few lines, then SIGKILL itself (no OOM involved)
  segv        dereference NULL through ctypes: a real SIGSEGV
  hang_load   print "Loading weights", then sleep forever without opening the port
  noport      keep logging heartbeats but never open the port
  hang_ready  serve one completion (readiness), then every request blocks forever and logging stops
  steal       a helper child takes the port first, then this process fails to bind (Errno 98), exit 1
  grandchild  like ok, but first leave a grandchild behind in a session of its own
  gpu_grandchild  the same grandchild holding 256 MiB of GPU memory (needs torch and a CUDA GPU)
  worker_oom  the launcher lives on (never ready) while its worker grows until the cgroup OOM-kills it
  worker_dies /health answers 200, completions never do; a worker prints an NCCL error and exits 1
  error_alive prints a CUDA OOM traceback, then stays alive logging heartbeats without a port
--api-key KEY: every route but /health answers 401 without `Authorization: Bearer KEY` (as vLLM).
--children N: start N worker children in the server's own process group first (a TP-like tree).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from openai_http import OpenAIHandler, serve as serve_http

BLOCK = threading.Event()  # set -> hang_ready: requests never return


def log(msg: str, rank: str | None = None) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{' ' + rank if rank else ''}] {msg}", flush=True)


class Handler(OpenAIHandler):
    mode = "ok"
    served = 0

    def do_GET(self):
        if BLOCK.is_set():
            threading.Event().wait()
        super().do_GET()

    def do_POST(self):
        if BLOCK.is_set():
            threading.Event().wait()
        req = self._body()
        if self._refused():
            return
        Handler.served += 1
        self._json(200, {"id": "cmpl-1", "object": "text_completion", "model": req.get("model"),
                         "choices": [{"index": 0, "text": " Paris", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
        if Handler.mode == "hang_ready":
            BLOCK.set()  # the scheduler "deadlocks" right after the first token


def serve(port: int, mode: str, handler: type[OpenAIHandler] = Handler) -> None:
    Handler.mode = mode
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    serve_http(handler, port, f"[{stamp}] Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)",
               on_term=lambda: log("Received SIGTERM, shutting down"))


def load_phases() -> None:
    log("server_args=ServerArgs(model_path='fake-moe', tp_size=2, moe_runner_backend='auto')")
    for r in ("TP0", "TP1"):
        log("Load weight begin. avail mem=78.50 GB", r)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tag", default="", help="ignored; lets a test find its own processes")
    ap.add_argument("--api-key", default=None, help="accepted like a real server's, never printed")
    ap.add_argument("--children", type=int, default=0, help="worker children to start first")
    a = ap.parse_args()
    Handler.api_key = a.api_key
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(a.children)]
    if workers:
        log(f"started {len(workers)} worker process(es): {' '.join(str(w.pid) for w in workers)}")
    load_phases()
    if a.mode in ("ok", "hang_ready"):
        serve(a.port, a.mode)
    elif a.mode == "grandchild":
        # Double fork: the grandchild starts a session of its own and its parent exits at once, so
        # it is re-parented to init and out of reach of the server's process group.
        code = "import os,time\nif os.fork()==0:\n    os.setsid(); time.sleep(3600)\n"
        subprocess.run([sys.executable, "-c", code], check=True)
        log("spawned a detached helper")
        serve(a.port, "ok")
    elif a.mode == "gpu_grandchild":
        # like grandchild, but the detached helper holds GPU memory (needs torch and a CUDA GPU)
        code = ("import os,time\nif os.fork()==0:\n    os.setsid()\n    import torch\n"
                "    x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')\n    time.sleep(3600)\n")
        subprocess.run([sys.executable, "-c", code], check=True)
        time.sleep(8)  # the helper's CUDA context and allocation are in place before readiness
        log("spawned a detached helper that holds GPU memory")
        serve(a.port, "ok")
    elif a.mode == "worker_oom":
        grow = "h=[]\nwhile True: h.append(bytearray(32 << 20))"
        subprocess.Popen([sys.executable, "-c", grow])
        log("Loading safetensors checkpoint shards on the worker", "TP1")
        while True:
            time.sleep(0.5)
            log("launcher waiting for workers ...")
    elif a.mode == "worker_dies":
        code = ("import sys,time\ntime.sleep(2)\nprint('[2026-12-01 10:00:00 TP1] RuntimeError: NCCL error in: "
                "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)', flush=True)"
                "\nsys.exit(1)")
        subprocess.Popen([sys.executable, "-c", code])
        Handler.mode = "hang_ready"
        BLOCK.set()  # requests block forever: the scheduler is gone

        class HealthOnly(Handler):
            def do_GET(self):
                self._json(200, {}) if self.path == "/health" else threading.Event().wait()

        serve(a.port, "hang_ready", HealthOnly)
    elif a.mode == "error_alive":
        log("Traceback (most recent call last):", "TP0")
        log('  File "/sglang/srt/model_executor/model_runner.py", line 301, in init_memory_pool', "TP0")
        log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.", "TP0")
        while True:
            time.sleep(0.5)
            log("waiting for the tokenizer manager ...")
    elif a.mode == "traceback":
        log("Scheduler hit an exception: Traceback (most recent call last):", "TP1")
        log("Load weight end. type=Qwen3MoeForCausalLM, avail mem=40.10 GB", "TP0")
        for ln in ['  File "/sglang/srt/managers/scheduler.py", line 2712, in run_scheduler_process',
                   "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)",
                   '  File "/sglang/srt/model_executor/model_runner.py", line 301, in init_memory_pool',
                   "    self.req_to_token_pool = ReqToTokenPool(size=max_num_reqs)"]:
            log(ln, "TP1")
        log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 1 has a total "
            "capacity of 79.10 GiB of which 1.20 GiB is free.", "TP1")
        log("Received sigquit from a child process. It usually means the child failed.")
        print("RuntimeError: Rank 1 scheduler is dead. Please check if there are relevant logs.", flush=True)
        sys.exit(1)
    elif a.mode == "grow":
        hold = []
        for i in range(10_000):
            hold.append(bytearray(32 << 20))  # bytearray zero-fills: the pages are really touched
            log(f"Loading safetensors checkpoint shards: {i + 1} x 32 MiB", "TP0")
            time.sleep(0.05)  # about 640 MiB/s: the sampler (5 Hz) sees it grow
    elif a.mode == "sigkill":
        log("Loading safetensors checkpoint shards: 1/4", "TP0")
        os.kill(os.getpid(), signal.SIGKILL)
    elif a.mode == "segv":
        log("Capturing cuda graph bs [1, 2, 4]", "TP0")
        ctypes.string_at(0)
    elif a.mode == "hang_load":
        log("Loading safetensors checkpoint shards: 1/4", "TP0")
        time.sleep(3600)
    elif a.mode == "noport":
        while True:
            log("waiting for the tokenizer manager ...")
            time.sleep(0.5)
    elif a.mode == "steal":
        holder = subprocess.Popen([sys.executable, "-c", "import socket,time\ns=socket.socket();"
                                   f"s.bind(('127.0.0.1',{a.port}));s.listen();print('bound',flush=True);time.sleep(3600)"],
                                  stdout=subprocess.PIPE)
        holder.stdout.readline()
        serve(a.port, "ok")  # bind fails: the helper holds the port -> traceback, exit 1
    else:
        ap.error(f"unknown --mode {a.mode}")


if __name__ == "__main__":
    main()
