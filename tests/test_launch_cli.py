"""`moelab launch` as a user runs it: JSON shape, exit codes, bad usage, interrupts (tier 2)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.process
FAKE = str(Path(__file__).parent / "fakes" / "fake_server.py")
MOELAB = [sys.executable, "-m", "moelab.cli"]


def moelab(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*MOELAB, *args], capture_output=True, text=True, timeout=timeout)


def test_failing_launch_json_and_exit_code(tmp_path):
    r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--out", str(tmp_path / "t"),
               "--", sys.executable, FAKE, "--mode", "traceback", "--port", "{port}")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert list(doc)[:4] == ["cause", "phase", "evidence", "advice"]
    assert doc["cause"] == "gpu_oom" and doc["evidence"][0]["line"] == 10
    assert "--mem-fraction-static" in doc["advice"]
    assert Path(doc["paths"]["verdict"]).is_file()


def test_passing_launch_panel_and_exit_0(tmp_path):
    r = moelab("launch", "--engine", "command", "--no-probe", "--out", str(tmp_path / "t"),
               "--", sys.executable, FAKE, "--mode", "ok", "--port", "{port}", "--api-key", "sk-test-4242")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout and "trial folder" in r.stdout and "sk-test-4242" not in r.stdout


@pytest.mark.parametrize("args,msg", [
    (["--engine", "nosuch", "--", "x"], "unknown engine"),
    (["--memory-limit", "lots", "--", "x"], "cannot read 'lots' as a size"),
    (["--engine", "command", "--", "server", "--no-port-here"], "no {port} placeholder"),
    (["--gpus", "a,b", "--", "x"], "not a list of GPU indices"),
    (["--timeout", "0", "--", "x"], "--timeout must be positive"),
])
def test_bad_usage_exits_2_with_a_reason(args, msg):
    r = moelab("launch", *args)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupt_of_moelab_tears_the_server_down(tmp_path, sig):
    tag = uuid.uuid4().hex
    out = tmp_path / "t"
    p = subprocess.Popen([*MOELAB, "launch", "--engine", "command", "--no-probe", "--keep-running", "--json",
                          "--out", str(out), "--", sys.executable, FAKE, "--mode", "ok", "--port", "{port}",
                          "--tag", tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (out / "server.log").exists() and "Uvicorn running" in (out / "server.log").read_text():
                break
            time.sleep(0.1)
        time.sleep(1.0)  # readiness (health + one token) follows the bind within milliseconds
        mine = [q for q in psutil.process_iter(["cmdline"]) if tag in " ".join(q.info["cmdline"] or [])]
        assert mine, "the fake server should be running"
        os.kill(p.pid, sig)
        stdout, _ = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    doc = json.loads(stdout)
    assert doc["cause"] == "ok" and doc["detail"]["teardown"]["port_free"]
    assert any("interrupt" in n for n in doc["detail"]["notes"])
    left = [q for q in psutil.process_iter(["cmdline"]) if tag in " ".join(q.info["cmdline"] or [])
            and q.status() != psutil.STATUS_ZOMBIE]
    assert not left


def test_the_port_the_user_gives_is_the_port_moelab_watches(tmp_path, free_port):
    # the command's own --port (no {port} placeholder): moelab waits on that port and probes it
    r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--out", str(tmp_path / "t"),
               "--", sys.executable, FAKE, "--mode", "ok", "--port", str(free_port))
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["cause"] == "ok", doc
    assert doc["url"] == f"http://127.0.0.1:{free_port}"
    assert f"--port {free_port}" in (tmp_path / "t" / "repro.sh").read_text()


def test_a_busy_user_port_is_port_in_use_naming_its_holder(tmp_path, free_port):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port))
        s.listen()
        r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--out", str(tmp_path / "t"),
                   "--", sys.executable, FAKE, "--mode", "ok", "--port", str(free_port))
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["cause"] == "port_in_use" and doc["phase"] == "preflight"
    assert f"127.0.0.1:{free_port} is already in use by pid {os.getpid()}" in doc["evidence"][0]["text"]
    assert doc.get("url") in (None, f"http://127.0.0.1:{free_port}")  # never a port moelab picked and never used
