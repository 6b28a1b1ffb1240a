"""Run one kernel-benchmark worker process and turn how it ended into a verdict cause.

Pure of torch: the parent (`moelab kernels`) never touches the GPU itself. The worker prints JSON
lines on stdout; its stderr is kept as evidence. Classification reads the FIRST root error line,
because a failed CUDA call is usually followed by generic wrapper errors.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from moelab.spec import Cause

# (cause, substrings) in priority order for one line; the first line that matches any wins
SIGNATURES: list[tuple[Cause, tuple[str, ...]]] = [
    (Cause.illegal_memory_access, ("illegal memory access", "misaligned address", "unspecified launch failure",
                                   "device-side assert")),
    (Cause.kernel_resource_limit, ("OutOfResources", "out of resource", "Required: ")),
    (Cause.unsupported_arch, ("no kernel image is available", "not supported on this architecture")),
    (Cause.gpu_oom, ("CUDA out of memory", "OutOfMemoryError")),
    (Cause.jit_compile_error, ("CompilationError", "ptxas", "PassManager::run failed", "MLIRCompilationError",
                               "triton.compiler.errors")),
    (Cause.numerical_nan, ("contains either inf, nan",)),
]


def classify(returncode: int | None, stderr: str, timed_out: bool) -> tuple[Cause, str]:
    """(cause, evidence line) for a worker that did not end cleanly."""
    if timed_out:
        return Cause.hang, "worker did not finish within its time limit"
    for line in stderr.splitlines():
        for cause, needles in SIGNATURES:
            if any(n in line for n in needles):
                return cause, line.strip()[:300]
    if returncode is not None and returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
            return Cause.native_crash, f"worker died with {name}"
        if sig == signal.SIGKILL:
            return Cause.killed_external, "worker was killed with SIGKILL (no OOM evidence checked here)"
        return Cause.unknown, f"worker died with {name}"
    last = next((l for l in reversed(stderr.splitlines()) if l.strip()), f"exit status {returncode}")
    return Cause.unknown, last.strip()[:300]


@dataclass
class WorkerResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    returncode: int | None = None
    cause: Cause = Cause.ok
    evidence: str = ""
    stderr_tail: str = ""


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def worker_argv(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "moelab.moe.bench", json.dumps(spec)]


def run_worker(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> WorkerResult:
    """Run argv in its own process session; collect JSON lines; on failure classify. Never leaves it running."""
    res = WorkerResult()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        timed_out = False
        # a SIGTERM to moelab (e.g. `timeout`) must still end the worker, which lives in its own session
        prev = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if prev is not None:
            signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)
            if proc.poll() is None:  # end the whole session (the worker and anything it started)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                res.records.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    res.returncode = proc.returncode
    res.stderr_tail = stderr[-2000:]
    if timed_out or proc.returncode != 0:
        res.cause, res.evidence = classify(proc.returncode, stderr, timed_out)
    return res
