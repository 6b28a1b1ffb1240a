"""`moelab serve --tp-size 2` for real on CPU: two rank processes over gloo (tiers 2 and 3).

Greedy text at --tp-size 2 (moelab's socket all-reduce, and gloo's) and at --ep-size 2 equals one
rank's in float32; a clean SIGTERM ends
every rank with status 0. Under `moelab launch`, a rank that dies (SIGKILLed while loading,
raising in warm-up, OOM-killed under --memory-limit) or hangs makes rank 0 end the launch within
seconds, the verdict names the first cause (or `collective_error` when the collective itself
timed out), and no process is left for the supervisor to end. Failures are made with
MOELAB_ENGINE_FAULT (moelab/engine/parallel/faults.py) or a real SIGKILL from outside.
"""
from __future__ import annotations

import threading
import time

import psutil
import pytest

pytest.importorskip("torch")

from moelab.launch import Supervisor, launch  # noqa: E402
from moelab.spec import Cause, LaunchSpec  # noqa: E402
from test_engine_server import Serve  # noqa: E402

pytestmark = [pytest.mark.embedded, pytest.mark.process, pytest.mark.slow]

PROMPTS = ["The capital of France is", "def fib(n):", "Mixture of experts", "1, 2, 3, 4,"]


def _greedy(srv: Serve) -> list[str]:
    status, body = srv.post("/v1/completions", {"prompt": PROMPTS, "max_tokens": 24, "temperature": 0,
                                                "ignore_eos": True})  # four sequences batched in every step
    assert status == 200, body
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    status, one = srv.post("/v1/completions", {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0,
                                               "ignore_eos": True})  # and one alone
    return texts + [one["choices"][0]["text"]]


def test_greedy_text_at_tp2_and_ep2_equals_one_rank(tmp_path):
    texts, logs = {}, {}
    for name, extra in (("tp1", ()), ("tp2", ("--tp-size", "2")), ("ep2", ("--tp", "2", "--ep-size", "2")),
                        ("tp2-gloo", ("--tp-size", "2", "--disable-custom-all-reduce"))):
        srv = Serve("--preset", "tiny", "--dtype", "float32", *extra, log=tmp_path / f"{name}.log")
        try:
            texts[name] = _greedy(srv)
            ranks = psutil.Process(srv.proc.pid).children(recursive=True)
        finally:
            assert srv.stop() == 0  # SIGTERM: rank 0 sends STOP, every rank exits 0
        assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        logs[name] = srv.log.read_text()
    assert texts["tp2"] == texts["tp1"] and texts["ep2"] == texts["tp1"] and texts["tp2-gloo"] == texts["tp1"], texts
    assert len(set(texts["tp1"][:4])) > 1  # different prompts, different answers: a real comparison
    for name in ("tp2", "ep2"):  # both ranks logged, each line with SGLang's prefix
        lines = logs[name].splitlines()
        assert any("TP1] moelab.engine phase=start" in ln for ln in lines)
        assert all(ln.startswith("[20") for ln in lines if "moelab.engine" in ln)
    assert "experts 4-7, intermediate 0-31" in logs["ep2"] and "experts 0-7, intermediate 16-31" in logs["tp2"]
    assert "all-reduce: moelab's custom" in logs["tp2"] and "all-reduce: torch.distributed (gloo)" in logs["tp2-gloo"]


def _spec(*extra: str, fault: str | None = None, **kw) -> LaunchSpec:
    return LaunchSpec(engine="embedded", args=["--preset", "tiny", "--tp-size", "2", *extra],
                      env={"MOELAB_ENGINE_FAULT": fault} if fault else {}, timeout_s=120, **kw)


def _ended_by_rank0(v) -> None:
    """Rank 0 ended the other rank itself: the supervisor found nothing left to stop."""
    td = v.detail["teardown"]
    assert td["termed"] == 0 and not td["escaped"] and not td["survivors"], td


def test_a_rank_sigkilled_while_loading_ends_the_launch_as_killed_external(tmp_path):
    killed_at: list[float] = []

    def kill_rank1(srv: Supervisor) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and srv.proc.poll() is None:
            if any("fails in phase building_weights" in ln for ln in srv.log.snapshot()):
                for p in psutil.Process(srv.proc.pid).children(recursive=True):
                    if "--rank" in p.cmdline() and p.cmdline()[p.cmdline().index("--rank") + 1] == "1":
                        p.kill()
                        killed_at.append(time.monotonic())
                        return
            time.sleep(0.05)

    # rank 1 stalls while building its weights (a slow load), and is SIGKILLed from outside meanwhile
    with Supervisor(_spec(fault="rank=1 phase=building_weights action=hang"), tmp_path / "k", probe=False,
                    grace_s=2.0) as srv:
        killer = threading.Thread(target=kill_rank1, args=(srv,))
        killer.start()
        v = srv.wait_ready()
        killer.join()
    v = srv.result.verdict
    assert killed_at, "rank 1 was never seen loading"
    assert v.cause is Cause.killed_external, v
    assert "rank 1" in v.evidence[0].text and "signal 9 (SIGKILL)" in v.evidence[0].text
    assert srv.t0 + v.detail["died_after_s"] - killed_at[0] < 3.0  # rank 0 followed within seconds
    _ended_by_rank0(v)


def test_a_rank_raising_in_warmup_is_named_not_the_collective_it_broke(tmp_path):
    r = launch(_spec(fault="rank=1 phase=warmup action=raise"), tmp_path / "r", probe=False, grace_s=2.0)
    v = r.verdict
    # the root cause is rank 1's own exception, not rank 0's failed all-reduce that followed it
    assert v.cause is not Cause.collective_error, v
    first = v.evidence[0]
    assert "RuntimeError: MOELAB_ENGINE_FAULT: injected failure in rank 1" in first.text
    line = (tmp_path / "r" / "server.log").read_text().splitlines()[first.line - 1]
    assert "TP1]" in line
    log = (tmp_path / "r" / "server.log").read_text()
    assert "rank 1 (pid" in log and "exited with status 1" in log and "as a consequence" in log
    _ended_by_rank0(v)


@pytest.mark.parametrize("all_reduce", [(), ("--disable-custom-all-reduce",)], ids=["custom", "gloo"])
def test_a_hung_rank_fails_the_others_collective_within_dist_timeout(tmp_path, all_reduce):
    t0 = time.monotonic()
    r = launch(_spec("--dist-timeout", "3", *all_reduce, fault="rank=1 phase=warmup action=hang"), tmp_path / "h",
               probe=False, grace_s=2.0)
    v = r.verdict
    assert v.cause is Cause.collective_error, v
    assert "timed out after 3 s (--dist-timeout)" in v.evidence[0].text
    assert v.detail["rule"] == "embedded-collective-timeout"
    assert time.monotonic() - t0 < 60
    _ended_by_rank0(v)  # rank 0 killed the hung rank itself


def test_a_rank_oom_killed_under_memory_limit_is_host_oom(tmp_path):
    from moelab.launch.cgroup import MemoryCgroup

    cg = MemoryCgroup(None)
    if cg.path is None:
        pytest.skip("no writable memory cgroup here (needs root and cgroup v1/v2 memory)")
    cg.remove()
    # rank 1 takes memory until the cgroup's OOM killer ends it (it is then the largest process)
    r = launch(_spec(fault="rank=1 phase=building_weights action=alloc", memory_limit_bytes=1 << 30),
               tmp_path / "o", probe=False, grace_s=2.0)
    v = r.verdict
    assert v.cause is Cause.host_oom, v
    assert any(e.kind == "cgroup" and "oom_kill=0" not in e.text for e in v.evidence)
    assert "rank 1" in v.evidence[0].text and "SIGKILL" in v.evidence[0].text
    _ended_by_rank0(v)


def test_a_split_the_model_cannot_take_is_bad_args_before_any_rank_starts(tmp_path):
    r = launch(LaunchSpec(engine="embedded", args=["--preset", "tiny", "--tp-size", "3"], timeout_s=60),
               tmp_path / "b", probe=False)
    assert r.verdict.cause is Cause.bad_args, r.verdict
    assert "--tp-size" in r.verdict.evidence[0].text and "do not split over 3" in r.verdict.evidence[0].text
    assert "TP1]" not in (tmp_path / "b" / "server.log").read_text()


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
def test_nccl_ranks_give_one_gpus_greedy_text(tmp_path):
    """Two ranks on two GPUs over NCCL (float32, the grouped runner): the text of one GPU."""
    if _gpus() < 2:
        pytest.skip("needs two CUDA GPUs")
    texts = {}
    for name, extra in (("tp1", ()), ("tp2", ("--tp-size", "2")), ("ep2", ("--tp-size", "2", "--ep-size", "2"))):
        srv = Serve("--preset", "tiny", "--device", "cuda", "--dtype", "float32", "--moe-runner-backend", "grouped",
                    *extra, log=tmp_path / f"{name}.log")
        try:
            texts[name] = _greedy(srv)
        finally:
            assert srv.stop() == 0
        if extra:
            assert "collectives nccl" in srv.log.read_text()
    assert texts["tp2"] == texts["tp1"] and texts["ep2"] == texts["tp1"], texts


@pytest.mark.gpu
def test_nccl_all_reduce_replayed_from_cuda_graphs_matches_eager(tmp_path):
    """--tp-size 2 with the triton runner: decode steps replayed from CUDA graphs that hold NCCL
    all-reduces give the text of the same launch with --disable-cuda-graph."""
    if _gpus() < 2:
        pytest.skip("needs two CUDA GPUs")
    common = ("--preset", "tiny", "--device", "cuda", "--dtype", "bfloat16", "--moe-runner-backend", "triton",
              "--tp-size", "2")
    texts = {}
    for name, extra in (("graphs", ()), ("eager", ("--disable-cuda-graph",))):
        srv = Serve(*common, *extra, log=tmp_path / f"{name}.log")
        try:
            texts[name] = _greedy(srv)
            if not extra:
                assert srv.get("/stats")["graph_steps"] > 0
        finally:
            assert srv.stop() == 0
    assert texts["graphs"] == texts["eager"]


def test_a_refused_split_with_json_is_one_json_document(tmp_path):
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "moelab.cli", "serve", "--preset", "tiny", "--tp-size", "2",
                        "--ep-size", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["exit_code"] == 2 and "--ep-size" in doc["error"] and "must divide --tp-size 2" in doc["error"]
    assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1
