"""Servers that want an API key (tier 2/3): readiness says so as its own verdict, the key moelab
sends is never written, and probe / bench end with a clear error instead of a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process
FAKE = Path(__file__).parent / "fakes" / "fake_server.py"
KEY = "sk-test-Zq8Lr4Vw2Np6Xt0Yb3Mc"


def moelab(*args: str, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "moelab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def launch_fake(tmp_path: Path, *moelab_args: str, env: dict | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--timeout", "20", "--out",
               str(tmp_path / "t"), *moelab_args, "--", sys.executable, str(FAKE), "--mode", "ok", "--port", "{port}",
               "--api-key", KEY, env=env)
    return json.loads(r.stdout), r


def test_no_key_is_bad_args_naming_the_key_not_a_timeout(tmp_path, monkeypatch):
    # the engine's own --api-key is not what this test is about: hide it from moelab with a server
    # started through a wrapper script, so moelab cannot read the key off the command line
    wrapper = tmp_path / "srv.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} --mode ok --port "$1" --api-key {KEY}\n')
    wrapper.chmod(0o755)
    r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--timeout", "20", "--out", str(tmp_path / "t"),
               "--", str(wrapper), "{port}", env={"MOELAB_API_KEY": "", "OPENAI_API_KEY": ""})
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["cause"] == "bad_args", doc
    assert "wants an API key" in doc["advice"] and any("401" in e["text"] for e in doc["evidence"])


def test_key_from_the_engine_args_is_used_and_never_written(tmp_path):
    doc, r = launch_fake(tmp_path)
    assert doc["cause"] == "ok", doc
    for f in (tmp_path / "t").iterdir():
        assert KEY not in f.read_text(errors="replace"), f.name
    assert KEY not in r.stdout + r.stderr


def test_wrong_key_says_it_was_refused(tmp_path):
    wrapper = tmp_path / "srv.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} --mode ok --port "$1" --api-key {KEY}\n')
    wrapper.chmod(0o755)
    r = moelab("launch", "--engine", "command", "--no-probe", "--json", "--timeout", "20", "--api-key", "sk-wrong-1234567",
               "--out", str(tmp_path / "t"), "--", str(wrapper), "{port}")
    doc = json.loads(r.stdout)
    assert doc["cause"] == "bad_args" and "refused the API key" in doc["advice"]
    assert "sk-wrong-1234567" not in r.stdout + (tmp_path / "t" / "verdict.json").read_text()


@pytest.fixture
def keyed_server(free_port):
    p = subprocess.Popen([sys.executable, str(FAKE), "--mode", "ok", "--port", str(free_port), "--api-key", KEY],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while "Uvicorn running" not in p.stdout.readline():
        pass
    yield f"http://127.0.0.1:{free_port}"
    p.terminate()
    p.wait(10)


@pytest.mark.parametrize("cmd", [["probe"], ["bench", "--concurrency", "1", "--num-prompts", "2"]])
def test_probe_and_bench_on_a_keyed_server(keyed_server, cmd):
    r = moelab(*cmd, "--url", keyed_server, env={"MOELAB_API_KEY": "", "OPENAI_API_KEY": ""})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "401" in r.stderr and "--api-key" in r.stderr
    r = moelab(*cmd, "--url", keyed_server, "--json", env={"MOELAB_API_KEY": KEY})
    assert "Traceback" not in r.stderr and KEY not in r.stdout
    json.loads(r.stdout)  # one JSON document either way


def test_probe_on_a_404_is_a_clear_error(keyed_server):
    r = moelab("probe", "--url", keyed_server + "/nope", "--api-key", KEY)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "404" in r.stderr
