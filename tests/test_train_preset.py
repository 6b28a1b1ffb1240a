"""The trained `digits` preset: the training forward is the engine's forward, the script trains and
writes a directory the engine loads, and the shipped preset is what the README says."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from moelab.engine.checkpoint import load_checkpoint  # noqa: E402
from moelab.engine.config import PRESETS, TRAINED_PRESETS, ModelConfig, ServerConfig  # noqa: E402
from moelab.engine.model import Qwen3Moe, StepBatch  # noqa: E402
from moelab.engine.train import TrainableQwen3Moe  # noqa: E402
from moelab.moe import RUNNERS  # noqa: E402
from moelab.moe.bf16 import Bf16Experts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def engine_logits(cfg: ModelConfig, dense: dict, experts: list, ids: list[int]) -> torch.Tensor:
    """The engine's model on one fresh prompt: logits [T, V] for every position."""
    model = Qwen3Moe(cfg, dict(dense), [Bf16Experts(w13, w2) for w13, w2 in experts], RUNNERS.create("reference"))
    T = len(ids)
    b = StepBatch(input_ids=torch.tensor(ids), positions=torch.arange(T), write_slots=torch.arange(T),
                  prefills=[(0, T)], decode_rows=torch.zeros(0, dtype=torch.long), last_index=None)
    return model.forward(b, model.new_kv_cache(T))


def test_the_training_forward_is_the_engine_forward():
    cfg = PRESETS["tiny"]
    m = TrainableQwen3Moe(cfg, torch.Generator().manual_seed(3))
    ids = [97, 100, 100, 32, 49, 50, 43, 51, 61]
    out = m.forward(torch.tensor([ids, ids[:5] + [256] * 4]), torch.tensor([[True] * 9, [True] * 5 + [False] * 4]))
    want = engine_logits(cfg, *m.weights(), ids)
    assert torch.allclose(out.logits[0], want, atol=1e-4, rtol=1e-4)
    assert torch.allclose(out.logits[1, :5], engine_logits(cfg, *m.weights(), ids[:5]), atol=1e-4, rtol=1e-4)
    assert out.expert_counts.sum().item() == cfg.num_hidden_layers * 14 * cfg.num_experts_per_tok  # real tokens only
    (out.logits[0, -1, 50] + out.balance_loss).backward()
    assert m.p["model.layers.0.mlp.gate.weight"].grad.abs().sum() > 0  # the router learns
    assert m.p["w13.1"].grad.abs().sum() > 0


@pytest.mark.slow
def test_the_script_trains_and_writes_a_directory_the_engine_loads(tmp_path):
    out = tmp_path / "digits"
    shipped = {f: f.stat().st_mtime_ns for f in (ROOT / "src/moelab/evaluate/tasks").iterdir()}
    p = subprocess.run([sys.executable, str(ROOT / "scripts/train_preset.py"), "--steps", "20", "--batch", "16",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "held-out greedy accuracy" in p.stdout and f"wrote {out}" in p.stdout
    rec = json.loads((out / "training.json").read_text())
    assert rec["steps"] == 20 and set(rec["held_out"]) == {"add", "sort", "rev"}
    cfg, dense, experts = load_checkpoint(out, torch.float32, torch.device("cpu"))
    assert cfg.num_experts == 8 and len(experts) == cfg.num_hidden_layers
    # the shipped item files are rewritten only by a run into the shipped preset directory
    assert shipped == {f: f.stat().st_mtime_ns for f in (ROOT / "src/moelab/evaluate/tasks").iterdir()}


def test_the_shipped_preset_is_the_one_the_readme_describes():
    d = TRAINED_PRESETS["digits"]
    cfg = ServerConfig(preset="digits")
    assert cfg.model_dir == d and cfg.model_name == "moelab-digits"
    size = sum(f.stat().st_size for f in d.iterdir())
    assert size < 6 << 20, size  # a few MB in the wheel
    hf = json.loads((d / "config.json").read_text())
    assert (hf["num_hidden_layers"], hf["num_experts"], hf["num_experts_per_tok"]) == (4, 8, 2)
    rec = json.loads((d / "training.json").read_text())
    assert all(r["accuracy"] >= 0.95 for r in rec["held_out"].values()), rec["held_out"]
    # the router specialises: every task leans on some experts more than on others
    for task, r in rec["held_out"].items():
        assert max(max(row) for row in r["expert_share"]) > 2 / 8, (task, r["expert_share"])
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
