"""The supervisor's pure pieces (tier 1): sizes, secret masking, repro.sh, cgroup counters, kernel
log matching, teardown verdicts, adapters' command lines and log phases."""
from __future__ import annotations

import socket
import sys

import pytest

from moelab.engines import ENGINES
from moelab.launch import folder, kernellog, machine, verdicts
from moelab.launch.cgroup import MemoryCgroup, parse_size
from moelab.launch.proctree import TeardownReport
from moelab.spec import Cause, LaunchSpec, Phase, Verdict


@pytest.mark.parametrize("text,n", [("512M", 512 << 20), ("4G", 4 << 30), ("1.5GiB", 3 << 29), ("2097152", 2 << 20)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["lots", "12Q", "10"])
def test_parse_size_refuses_with_an_example(bad):
    with pytest.raises(ValueError, match="e.g."):
        parse_size(bad)


def test_secrets_from_env_names_and_flags_are_masked(tmp_path, monkeypatch):
    from moelab.secrets import Secrets

    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    argv = ["vllm", "serve", "m", "--api-key", "sk-one", "--hf-token=hf_two", "--port", "8000"]
    env = folder.repro_env({"NCCL_P2P_DISABLE": "1", "OPENAI_API_KEY": "sk-three"}, {"PYTHONUNBUFFERED": "1"})
    secrets = Secrets.gather(env={"OPENAI_API_KEY": "sk-three"}, argv=argv)
    folder.write_repro(tmp_path / "repro.sh", argv, env, LaunchSpec(engine="vllm"), secrets)
    text = (tmp_path / "repro.sh").read_text()
    for s in ("sk-one", "hf_two", "sk-three", "hf_supersecret"):
        assert s not in text
    assert "export NCCL_P2P_DISABLE=1" in text and "--api-key '***'" in text and "exec vllm serve m" in text
    assert secrets.text("key sk-one here") == "key *** here"


def test_cgroup_v2_counters_are_read(tmp_path):
    cg = MemoryCgroup(None, try_cgroup=False)
    cg.path, cg.version, cg.limit = tmp_path, 2, 1 << 30
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\n")
    (tmp_path / "memory.peak").write_text(str(1 << 30) + "\n")
    ev = cg.oom_evidence(last_rss=900 << 20)
    assert (ev.source, ev.oom_kill, ev.failcnt, ev.max_usage_bytes) == ("cgroup v2", 1, 17, 1 << 30) and ev.found
    cg.path = None  # not ours to remove


def test_without_cgroup_the_wrapper_sets_rlimit_as():
    cg = MemoryCgroup(256 << 20, try_cgroup=False)
    assert cg.path is None and "RLIMIT_AS" in cg.note
    assert cg.wrap(["srv"])[:3] == ["/bin/sh", "-c", 'ulimit -v 262144 && exec "$@"'] and cg.wrap(["srv"])[-1] == "srv"
    assert cg.oom_evidence().source.startswith("rlimit")


def test_kernel_log_lines_only_for_our_pids():
    dmesg = ["[ 1.0] Memory cgroup out of memory: Killed process 4242 (python3) total-vm:289368kB",
             "[ 2.0] Out of memory: Killed process 999 (other)",
             "[ 3.0] python3[4243]: segfault at 0 ip 00007f sp 00007ffe error 4 in libc.so.6"]
    oom, segv = kernellog.lines_for({4242, 4243}, dmesg)
    assert oom == [dmesg[0]] and segv == [dmesg[2]]


def test_teardown_leak_makes_ok_an_orphan_leak_and_keeps_a_failure():
    rep = TeardownReport(escaped=["pid 7 (sleep) had left the server's session 5"])
    ok = verdicts.with_teardown(Verdict(cause=Cause.ok, phase=Phase.probe), rep, 8000)
    assert ok.cause is Cause.orphan_leak and ok.phase is Phase.teardown and "pid 7" in ok.evidence[0].text
    bad = verdicts.with_teardown(Verdict(cause=Cause.gpu_oom, phase=Phase.launch), rep, 8000)
    assert bad.cause is Cause.gpu_oom and bad.detail["orphan_leak"]
    clean = verdicts.with_teardown(Verdict(cause=Cause.ok, phase=Phase.probe), TeardownReport(), 8000)
    assert clean.cause is Cause.ok and clean.detail["teardown"]["escaped"] == []


def test_preflight_names_the_port_holder():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        v = machine.check_port("127.0.0.1", port)
        assert v.cause is Cause.port_in_use and v.phase is Phase.preflight
        assert "pid " in v.evidence[0].text and "--port" in v.advice
    assert machine.check_port("127.0.0.1", port) is None


def test_adapters_command_lines():
    emb = ENGINES.create("embedded")
    argv, env = emb.command(LaunchSpec(args=["--preset", "tiny"]), 8123)
    assert argv == [sys.executable, "-m", "moelab.cli", "serve", "--preset", "tiny", "--host", "127.0.0.1",
                    "--port", "8123"] and env["PYTHONUNBUFFERED"] == "1"
    cmd = ENGINES.create("command")
    argv, _ = cmd.command(LaunchSpec(engine="command", args=["llama-server", "--host", "{host}", "--port={port}"]), 9)
    assert argv == ["llama-server", "--host", "127.0.0.1", "--port=9"]
    with pytest.raises(ValueError, match=r"\{port\}"):
        cmd.command(LaunchSpec(engine="command", args=["llama-server"]), 9)


@pytest.mark.parametrize("line,phase", [
    ("moelab.engine phase=quantizing layers=2", "quantizing"),
    ("[2026-11-30 09:14:20 TP0] Load weight begin. avail mem=78.50 GB", "loading_weights"),
    ("[2026-11-30 09:15:02 TP1] Capture cuda graph begin.", "warmup"),
    ("INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)", "serving"),
    ("INFO 11-30 09:14:02 [core.py:77] nothing special", None),
])
def test_log_phases(line, phase):
    assert ENGINES.create("command").phase_of(line) == phase


def test_busy_gpu_is_refused_unless_forced():
    from moelab.hw import GPU, GPUProcess

    gpus = [GPU(index=0, name="NVIDIA H100", sm="sm_90", capability=(9, 0), memory_total=80 << 30,
                memory_free=10 << 30, processes=[GPUProcess(pid=4242, name="python train.py", used_bytes=70 << 30)]),
            GPU(index=1, name="NVIDIA H100", sm="sm_90", capability=(9, 0), memory_total=80 << 30, memory_free=80 << 30)]
    v, notes = machine.check_gpus([0, 1], found=gpus)
    assert v.phase is Phase.preflight and "pid 4242 (python train.py) holds 70.0 GiB" in v.evidence[0].text
    assert "--force" in v.advice and len(notes) == 2
    assert machine.check_gpus([1], found=gpus)[0] is None  # only GPU 1 is used: it is free
    v, notes = machine.check_gpus(None, force=True, found=gpus)
    assert v is None and any(n.startswith("--force: going past") for n in notes)
