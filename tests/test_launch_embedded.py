"""Tier 3: `moelab launch` supervising the real embedded engine (`moelab serve`, tiny preset) on CPU."""
from __future__ import annotations

import functools
import subprocess
import sys

import pytest

from moelab.launch import launch
from moelab.spec import Cause, LaunchSpec

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


@functools.lru_cache(maxsize=1)
def _serve_help() -> str:
    try:
        r = subprocess.run([sys.executable, "-m", "moelab.cli", "serve", "--help"], capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ""
    return r.stdout if r.returncode == 0 else ""


def _need_engine() -> None:
    if "--preset" not in _serve_help():
        pytest.skip("`moelab serve --preset` is not available yet (the embedded engine is built separately)")


def test_embedded_tiny_preset_launches_to_ok(tmp_path):
    _need_engine()
    r = launch(LaunchSpec(engine="embedded", args=["--preset", "tiny"], timeout_s=240), tmp_path / "ok")
    v = r.verdict
    assert v.cause is Cause.ok, v
    assert r.timings["ready_s"] > 0 and r.model
    log = (tmp_path / "ok" / "server.log").read_text()
    assert "moelab.engine phase=" in log  # the phases the supervisor reads
    assert v.detail["teardown"]["port_free"] and not v.detail["teardown"]["escaped"]


def test_embedded_refuses_a_bad_flag_value_as_bad_args(tmp_path):
    _need_engine()
    r = launch(LaunchSpec(engine="embedded", args=["--preset", "tiny", "--moe-runner-backend", "no-such-backend"],
                          timeout_s=120), tmp_path / "bad", probe=False)
    v = r.verdict
    assert v.cause is Cause.bad_args, v
    assert "--moe-runner-backend" in v.evidence[0].text


def test_embedded_engine_under_a_too_small_memory_limit_is_host_oom(tmp_path):
    _need_engine()
    from moelab.launch.cgroup import MemoryCgroup

    probe_cg = MemoryCgroup(None)
    if probe_cg.path is None:
        pytest.skip("no writable memory cgroup here (needs root and cgroup v1/v2 memory)")
    probe_cg.remove()
    # Importing torch alone needs more than 80 MiB of anonymous memory: the kernel OOM-kills it.
    r = launch(LaunchSpec(engine="embedded", args=["--preset", "tiny"], timeout_s=120, memory_limit_bytes=80 << 20),
               tmp_path / "oom")
    v = r.verdict
    assert v.cause is Cause.host_oom, v
    assert any(e.kind == "cgroup" and "oom_kill=0" not in e.text for e in v.evidence)
