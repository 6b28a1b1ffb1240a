"""`moelab kernels` end to end on CPU, and how a worker's death becomes a verdict cause."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moelab.moe.worker import classify, run_worker
from moelab.spec import Cause

MOELAB = [sys.executable, "-c", "from moelab.cli import main; main()"]


def _moelab(*args, timeout=240):
    return subprocess.run(MOELAB + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.process
@pytest.mark.engine
def test_kernels_json_on_cpu_runs_reference_and_grouped():
    p = _moelab("kernels", "--shape", "8,2,64,32", "--tokens", "1,4", "--formats", "bf16,nvfp4", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["device"] == "cpu" and doc["shape"]["E"] == 8
    assert {r["backend"] for r in doc["rows"]} == {"reference", "grouped"}
    assert len(doc["rows"]) == 2 * 2 * 2
    for r in doc["rows"]:
        assert r["cause"] == "ok" and r["rel_err"] < 2e-2 and r["time_us"] > 0
        assert r["roofline_us"] is None and r["timing"] == "wall-clock"
    assert any("no CUDA GPU" in n for n in doc["notes"])


@pytest.mark.process
@pytest.mark.engine
def test_kernels_table_and_explicit_triton_on_cpu():
    p = _moelab("kernels", "--shape", "4,1,32,16", "--tokens", "2", "--formats", "bf16", "--backends", "grouped,triton")
    assert p.returncode == 0, p.stderr
    assert "grouped" in p.stdout and "unsupported_arch" in p.stdout and "CUDA" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (["--shape", "bogus"], "neither a preset"),
    (["--shape", "8,9,64,32"], "K <= E"),
    (["--formats", "int4"], "--formats has unknown value"),
    (["--backends", "cutlass"], "--backends has unknown value"),
])
def test_bad_input_is_refused_with_a_clear_message(args, needle):
    p = _moelab("kernels", *args, timeout=60)
    assert p.returncode != 0
    assert needle in p.stderr


@pytest.mark.process
def test_a_crashing_worker_becomes_native_crash():
    r = run_worker([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], 30)
    assert r.cause is Cause.native_crash and "SIGSEGV" in r.evidence


@pytest.mark.process
def test_a_stuck_worker_becomes_hang_and_is_killed():
    r = run_worker([sys.executable, "-c", "import time; print('{\"kind\": \"row\"}', flush=True); time.sleep(60)"], 2)
    assert r.cause is Cause.hang and r.records == [{"kind": "row"}]


@pytest.mark.process
def test_first_root_error_wins_over_wrapper_messages():
    script = ("import sys; sys.stderr.write('RuntimeError: CUDA error: an illegal memory access was encountered\\n"
              "RuntimeError: CUDA error: unspecified launch failure\\nCUDA out of memory\\n'); sys.exit(1)")
    r = run_worker([sys.executable, "-c", script], 30)
    assert r.cause is Cause.illegal_memory_access


def test_classify_signatures():
    assert classify(1, "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 262144",
                    False)[0] is Cause.kernel_resource_limit
    assert classify(1, "ptxas fatal   : Unresolved extern function", False)[0] is Cause.jit_compile_error
    assert classify(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", False)[0] is Cause.gpu_oom
    assert classify(-9, "", False)[0] is Cause.killed_external
    assert classify(1, "ValueError: something else", False) == (Cause.unknown, "ValueError: something else")
