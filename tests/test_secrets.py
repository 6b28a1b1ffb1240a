"""What is secret and where it is masked: the pure decisions (tier 1), then every artefact of a
real study grepped for planted secrets (tier 3, the embedded engine with --api-key)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moelab.secrets import MASK, Secrets, looks_like_key, secret_name


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_PASSWORD", "CUSTOM_AUTH", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
                                  "GITHUB_PAT", "--api-key", "--hf-token", "DB_PASSWD", "x-api-key"])
def test_secret_names(name):
    assert secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "PWD", "NCCL_IB_HCA",
                                  "--max-num-batched-tokens", "--kv-cache-dtype", "--tokenizer", "AUTHOR"])
def test_not_secret_names(name):
    assert not secret_name(name)


@pytest.mark.parametrize("value,key", [("hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", True), ("sk-proj-abc123def456ghi", True),
                                       ("ghp_abcdefghijklmnop1234", True), ("aZ3kLm9QpR2sT7vW1xY4bC6dE8fG0hJ5", True),
                                       ("Qwen3-30B-A3B-Instruct-2507", False), ("flashinfer_trtllm", False),
                                       ("/models/Qwen3.5-397B-A17B-NVFP4", False), ("0.8", False)])
def test_values_that_look_like_keys(value, key):
    assert looks_like_key(value) is key


def test_masking_documents():
    s = Secrets.gather(env={"CUSTOM_AUTH": "opensesame42", "OMP_NUM_THREADS": "2", "USE_AUTH": "true"},
                       argv=["serve", "--api-key", "sk-live-1234567890"], process_env=False)
    doc = {"env": {"CUSTOM_AUTH": "opensesame42", "OMP_NUM_THREADS": "2", "USE_AUTH": "true"},
           "flags": {"--api-key": "sk-live-1234567890", "--tp": 8}, "key": "3f2a", "token": "Paris",
           "command": ["serve", "--api-key=sk-live-1234567890"], "evidence": [{"text": "auth opensesame42 failed"}]}
    out = s.data(doc)
    assert out["env"] == {"CUSTOM_AUTH": MASK, "OMP_NUM_THREADS": "2", "USE_AUTH": MASK}
    assert out["flags"] == {"--api-key": MASK, "--tp": 8} and out["key"] == "3f2a" and out["token"] == "Paris"
    assert out["command"] == ["serve", f"--api-key={MASK}"] and out["evidence"][0]["text"] == f"auth {MASK} failed"
    assert s.text("the value true stays") == "the value true stays"  # short or boolean values: by name only


PLANTED = {"HF_TOKEN": "hf_PlantedTokenAbCdEfGhIjKlMn0123", "MY_PASSWORD": "correct-horse-battery-9",
           "CUSTOM_AUTH": "planted-auth-value-77"}
API_KEY = "sk-planted-Zx9Wv8Ut7Sr6Qp5"


@pytest.mark.embedded
@pytest.mark.slow
def test_no_planted_secret_in_any_artefact_of_a_study(tmp_path):
    pytest.importorskip("torch")
    study = {"name": "secrets", "engine": "embedded", "model": "tiny", "strategy": "grid", "env": PLANTED,
             "base": {"--api-key": API_KEY, "--max-running-requests": 4},
             "axes": {"--moe-runner-backend": ["reference", "grouped"]},
             "workload": {"concurrency": [2], "input_len": 8, "output_len": 6, "num_prompts": 6},
             "launch": {"timeout_s": 90}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    store = tmp_path / "s.db"
    env = {**os.environ, "MOELAB_API_KEY": ""}
    outs, stdouts = [], []
    for cmd in (["study", str(path), "--store", str(store)], ["study", str(path), "--store", str(store), "--json"],
                ["report", str(store), "--html", str(tmp_path / "r.html"), "--md", str(tmp_path / "r.md")],
                ["report", str(store), "--json"], ["store", "export", str(store)], ["store", "list", str(store)]):
        r = subprocess.run([sys.executable, "-m", "moelab.cli", *cmd], capture_output=True, text=True, timeout=300,
                           env=env)
        assert r.returncode in (0, 1), r.stderr[-2000:]
        outs.append(r.stdout + r.stderr)
        stdouts.append(r.stdout)
    summary = json.loads(stdouts[1])
    assert summary["recommendation"] is not None, "the servers answered with the key moelab read off --api-key"
    assert MASK in summary["recommendation"]["command"]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != path]
    assert any(p.name == "server.log" for p in files) and any(p.name == "repro.sh" for p in files)
    for secret in [*PLANTED.values(), API_KEY]:
        for text in outs:
            assert secret not in text
        for p in files:
            assert secret.encode() not in p.read_bytes(), f"{secret} in {p.relative_to(tmp_path)}"
