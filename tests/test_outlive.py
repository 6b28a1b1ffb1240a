"""Nothing outlives moelab (tier 2, real processes): SIGKILL and SIGHUP of `moelab launch
--keep-running` and of `moelab study`, leftovers found by owner, one writer per store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from moelab.launch import leftovers
from moelab.launch.proctree import environ_of

pytestmark = pytest.mark.process
FAKE = Path(__file__).parent / "fakes" / "fake_server.py"


def owned_by(pid: int) -> list[int]:
    """Pids whose MOELAB_OWNER names this moelab process (the servers it started)."""
    out = []
    for p in psutil.pids():
        env = environ_of(p)
        if env and env.get(leftovers.OWNER, "").startswith(f"{pid}:"):
            out.append(p)
    return out


def guardians_of(marker_pids: list[int]) -> list[int]:
    markers = {(environ_of(p) or {}).get("MOELAB_TRIAL") for p in marker_pids} - {None}
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "moelab.launch.guardian" in " ".join(p.info["cmdline"] or []) and
            any(m in (p.info["cmdline"] or []) for m in markers)]


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def gone(pids: list[int]) -> bool:
    return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def start_launch(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    cmd = [sys.executable, "-m", "moelab.cli", "launch", "--engine", "command", "--no-probe", "--keep-running",
           "--out", str(tmp_path / "t"), "--", sys.executable, str(FAKE), "--mode", "ok", "--port", "{port}",
           "--children", "1"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    servers = wait_for(lambda: len(owned_by(p.pid)) >= 2 and (tmp_path / "t" / "server.log").exists()
                       and owned_by(p.pid), 30, "the server and its child")
    wait_for(lambda: "Uvicorn running on" in (tmp_path / "t" / "server.log").read_text(), 30, "the server to listen")
    return p, servers


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_killed_launch_leaves_no_server(tmp_path, sig):
    p, servers = start_launch(tmp_path)
    guards = guardians_of(servers)
    assert guards, "a guardian watches every launch"
    t0 = time.monotonic()
    p.send_signal(sig)
    p.wait(20)
    wait_for(lambda: gone(servers), 10, f"the server tree to end after {sig.name} of moelab")
    assert time.monotonic() - t0 < 10
    wait_for(lambda: gone(guards), 10, "the guardian to exit")
    if sig == signal.SIGHUP:  # handled like SIGTERM: moelab itself tore down and wrote its verdict
        assert p.returncode == 130 or json.loads((tmp_path / "t" / "verdict.json").read_text())
        assert "moelab went away" not in (tmp_path / "t" / "guardian.log").read_text()
    else:  # moelab could do nothing: the guardian did it, and says so
        assert "moelab went away" in (tmp_path / "t" / "guardian.log").read_text()


def test_clean_launch_stands_the_guardian_down(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "launch", "--engine", "command", "--no-probe",
                        "--out", str(tmp_path / "t"), "--", sys.executable, str(FAKE), "--mode", "ok", "--port",
                        "{port}"], capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    log = (tmp_path / "t" / "guardian.log").read_text()
    assert "moelab went away" not in log


def test_leftovers_are_found_by_dead_owner_only(tmp_path):
    env_live = {**os.environ, "MOELAB_TRIAL": "live-trial", leftovers.OWNER: leftovers.owner_tag()}
    env_dead = {**os.environ, "MOELAB_TRIAL": "dead-trial", leftovers.OWNER: "1:12345.00"}
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env_live)
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env_dead)
    try:
        found = leftovers.find(lambda env: env["MOELAB_TRIAL"] in ("live-trial", "dead-trial"))
        assert [lo.marker for lo in found] == ["dead-trial"] and found[0].root == dead.pid
        assert leftovers.end(found, grace_s=1.0) == [dead.pid]
        assert dead.wait(5) is not None and live.poll() is None
    finally:
        for p in (live, dead):
            p.kill()
            p.wait()


def test_doctor_names_and_ends_leftovers(tmp_path):
    env = {**os.environ, "MOELAB_TRIAL": "doctor-trial", leftovers.OWNER: "1:12345.00"}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        r = subprocess.run([sys.executable, "-m", "moelab.cli", "doctor", "--json"], capture_output=True, text=True,
                           timeout=60)
        doc = json.loads(r.stdout)
        assert any(lo["root"] == orphan.pid for lo in doc["leftovers"])
        r = subprocess.run([sys.executable, "-m", "moelab.cli", "doctor", "--end-leftovers"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and str(orphan.pid) in r.stdout
        assert orphan.wait(10) is not None
    finally:
        orphan.kill()
        orphan.wait()


def test_a_store_has_one_writer(tmp_path):
    from moelab.store import Store, StoreError

    with Store(tmp_path / "s.db") as a:
        a.lock("moelab study first.yaml")
        with Store(tmp_path / "s.db") as b:
            with pytest.raises(StoreError, match=rf"being written by moelab pid {os.getpid()} \(moelab study first"):
                b.lock()
        a.unlock()
        with Store(tmp_path / "s.db") as c:
            c.lock()  # free again once the holder lets go
