"""Tier 2: the supervisor against real processes that fail in each way (tests/fakes/fake_server.py).

Each test checks the cause, that the verdict came within a second of the death, and (through the
conftest fixture, plus explicit checks for processes that left the session) that nothing survives.
"""
from __future__ import annotations

import json
import subprocess
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from moelab.launch import Supervisor, launch
from moelab.launch.cgroup import MemoryCgroup
from moelab.spec import Cause, LaunchSpec, Phase

pytestmark = pytest.mark.process
FAKE = str(Path(__file__).parent / "fakes" / "fake_server.py")


def spec(mode: str, timeout: float = 10.0, **kw) -> LaunchSpec:
    return LaunchSpec(engine="command", args=[sys.executable, FAKE, "--mode", mode, "--port", "{port}"],
                      timeout_s=timeout, **kw)


def run(mode: str, tmp_path: Path, **kw):
    sup = {k: kw.pop(k) for k in ("stall_after_s", "hang_timeout_s") if k in kw}
    return launch(spec(mode, **kw), tmp_path / mode, probe=False, grace_s=2.0, **sup)


def test_ok_server_is_ready_and_leaves_a_complete_trial_folder(tmp_path):
    r = run("ok", tmp_path)
    assert r.verdict.cause is Cause.ok and r.model == "fake-moe"
    d = Path(r.paths["dir"])
    log = (d / "server.log").read_text().splitlines()
    assert any("Uvicorn running on" in ln for ln in log) and log[0][:4].isdigit() and "T" in log[0][:11]
    samples = [json.loads(ln) for ln in (d / "telemetry.jsonl").read_text().splitlines()]
    assert samples and {"t", "rss", "gpu", "phase"} <= samples[0].keys()
    assert json.loads((d / "verdict.json").read_text())["verdict"]["cause"] == "ok"
    assert "fake_server.py --mode ok --port" in (d / "repro.sh").read_text()
    assert r.verdict.detail["teardown"]["port_free"] is True


def test_traceback_behind_wrapper_lines_exit_1(tmp_path):
    r = run("traceback", tmp_path)
    v = r.verdict
    assert v.cause is Cause.gpu_oom and v.phase is Phase.launch
    assert v.evidence[0].text.startswith("torch.OutOfMemoryError") and v.evidence[0].line == 10
    assert "exit status 1" in [e.text for e in v.evidence if e.kind == "exit"]
    assert v.detail["verdict_after_death_s"] < 1.0


def _cgroup_works() -> bool:
    cg = MemoryCgroup(None)
    ok = cg.path is not None
    cg.remove()
    return ok


@pytest.mark.skipif(not _cgroup_works(), reason="no writable memory cgroup here (needs root and cgroup v1/v2 memory)")
def test_real_oom_in_a_real_cgroup_is_host_oom(tmp_path):
    r = run("grow", tmp_path, memory_limit_bytes=256 << 20)
    v = r.verdict
    assert v.cause is Cause.host_oom, v
    cgroup_ev = [e.text for e in v.evidence if e.kind == "cgroup"][0]
    assert "oom_kill=" in cgroup_ev and "oom_kill=0" not in cgroup_ev
    assert v.detail["verdict_after_death_s"] < 1.0
    assert r.telemetry["peak_rss_bytes"] > 64 << 20  # the sampler saw it grow


def test_without_a_cgroup_the_limit_falls_back_to_rlimit_as(tmp_path):
    r = launch(spec("grow", memory_limit_bytes=256 << 20), tmp_path / "rl", probe=False, use_cgroup=False)
    v = r.verdict
    assert v.cause is Cause.host_oom and v.detail["rule"] == "cpu-alloc-failed"
    assert "RLIMIT_AS" in r.telemetry["cgroup"]
    assert any("rlimit" in e.text for e in v.evidence)


def test_missing_executable_is_bad_args(tmp_path):
    s = LaunchSpec(engine="command", args=["/nonexistent/llama-server", "--port", "{port}"])
    v = launch(s, tmp_path / "nf", probe=False).verdict
    assert v.cause is Cause.bad_args and "not found" in " ".join(e.text for e in v.evidence)


def test_sigkill_without_oom_is_killed_external(tmp_path):
    v = run("sigkill", tmp_path, memory_limit_bytes=1 << 30).verdict
    assert v.cause is Cause.killed_external
    assert any("SIGKILL" in e.text for e in v.evidence) and v.detail["verdict_after_death_s"] < 1.0


def test_sigsegv_is_native_crash(tmp_path):
    v = run("segv", tmp_path).verdict
    assert v.cause is Cause.native_crash and any("SIGSEGV" in e.text for e in v.evidence)
    assert v.detail["log_phase"] == "warmup"


def test_hang_while_loading_is_startup_timeout_with_a_stall(tmp_path):
    v = run("hang_load", tmp_path, timeout=2.5, stall_after_s=1.0).verdict
    assert v.cause is Cause.startup_timeout and v.detail["log_phase"] == "loading_weights"
    assert any(e.text.startswith("stalled:") for e in v.evidence)


def test_process_that_never_opens_its_port(tmp_path):
    v = run("noport", tmp_path, timeout=2.5, stall_after_s=1.0).verdict
    assert v.cause is Cause.startup_timeout
    assert "the server never opened its port" in [e.text for e in v.evidence]
    assert not any(e.text.startswith("stalled:") for e in v.evidence)  # it kept logging: not a stall


def test_hang_after_readiness(tmp_path):
    with Supervisor(spec("hang_ready"), tmp_path / "hr", probe=False, grace_s=2.0, hang_timeout_s=1.0) as srv:
        assert srv.wait_ready() is None
        v = srv.alive_verdict()
        assert v.cause is Cause.hang and v.phase is Phase.probe
    assert srv.result.verdict.cause is Cause.hang


def test_port_already_taken_before_launch(tmp_path, free_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port))
        s.listen()
        r = launch(spec("ok", port=free_port), tmp_path / "busy", probe=False)
    v = r.verdict
    assert v.cause is Cause.port_in_use and v.phase is Phase.preflight
    assert f"127.0.0.1:{free_port} is already in use" in v.evidence[0].text
    assert "log" not in r.paths  # nothing was launched


def test_port_taken_during_startup_is_caught_from_the_log(tmp_path):
    v = run("steal", tmp_path).verdict
    assert v.cause is Cause.port_in_use and v.phase is Phase.launch
    assert "Address already in use" in v.evidence[0].text and v.evidence[0].line


def test_grandchild_in_its_own_session_is_found_ended_and_reported(tmp_path):
    r = run("grandchild", tmp_path)
    v = r.verdict
    assert v.cause is Cause.orphan_leak and v.phase is Phase.teardown
    escaped = v.detail["teardown"]["escaped"]
    assert len(escaped) == 1 and "had left the server's session" in escaped[0]
    pid = int(escaped[0].split()[1])
    time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_secrets_are_masked_in_repro_and_verdict(tmp_path):
    s = spec("ok", env={"HF_TOKEN": "hf_abcdef123456", "MY_API_KEY": "sk-live-999"})
    s.args += ["--api-key=sk-arg-777"]
    r = launch(s, tmp_path / "sec", probe=False)
    text = "".join((Path(r.paths["dir"]) / f).read_text() for f in ("repro.sh", "verdict.json"))
    for secret in ("hf_abcdef123456", "sk-live-999", "sk-arg-777"):
        assert secret not in text
    assert "export HF_TOKEN='***'" in text or "export HF_TOKEN=***" in text


def test_a_server_that_serves_garbage_is_never_ok(tmp_path):
    pytest.importorskip("moelab.probe", reason="the probe is built separately")
    r = launch(spec("ok"), tmp_path / "garbage", probe=True)  # the fake answers " Paris" to everything
    v = r.verdict
    assert v.cause is Cause.garbage_output and v.phase is Phase.probe, v
    assert r.timings["ready_s"] > 0  # it was ready: health and one token were fine


def test_an_error_in_the_callers_code_is_not_ok_and_still_tears_down(tmp_path):
    with pytest.raises(RuntimeError, match="study bug"):
        with Supervisor(spec("ok"), tmp_path / "err", probe=False, grace_s=2.0) as srv:
            assert srv.wait_ready() is None
            raise RuntimeError("study bug")
    v = srv.result.verdict
    assert v.cause is Cause.unknown and "study bug" in v.evidence[0].text
    assert v.detail["teardown"]["termed"] >= 1 and v.detail["teardown"]["port_free"]


# -- deaths inside a live tree ---------------------------------------------------------------------
def _launch_fake(tmp_path, mode: str, *extra: str, timeout: float = 60) -> tuple[dict, float]:
    import json as _json
    import time as _time

    t0 = _time.monotonic()
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "launch", "--engine", "command", "--json", "--no-probe",
                        "--out", str(tmp_path / mode), *extra, "--", sys.executable, str(FAKE), "--mode", mode,
                        "--port", "{port}"], capture_output=True, text=True, timeout=timeout + 60)
    return _json.loads(r.stdout), _time.monotonic() - t0


def test_a_worker_oom_killed_under_a_live_launcher_is_the_verdict_at_once(tmp_path):
    doc, took = _launch_fake(tmp_path, "worker_oom", "--memory-limit", "300M", "--timeout", "120")
    if "cgroup" not in str(doc["detail"].get("notes")):
        pytest.skip("no memory cgroup here: the OOM kill cannot be attributed")
    assert doc["cause"] == "host_oom", doc
    assert any(e["kind"] == "tree" and "while the server process" in e["text"] and "OOM killer" in e["text"] for e in doc["evidence"])
    assert took < 60, f"the verdict came {took:.0f} s after launch, not within a second of the kill"


def test_a_worker_that_dies_with_a_root_error_while_health_answers(tmp_path):
    doc, took = _launch_fake(tmp_path, "worker_dies", "--timeout", "120")
    assert doc["cause"] == "collective_error", doc
    assert doc["detail"].get("inner_death") and took < 40


def test_a_root_error_in_a_live_servers_log_beats_the_timeout(tmp_path):
    doc, _ = _launch_fake(tmp_path, "error_alive", "--timeout", "4")
    assert doc["cause"] == "gpu_oom" and doc["detail"].get("while") == "startup_timeout", doc
    assert any(e["kind"] == "timeout" for e in doc["evidence"])
