"""Train the `digits` preset: a small Qwen3-MoE (the engine's own architecture) that adds, sorts
and reverses digits, written through moelab's checkpoint writer into the package.

    PYTHONPATH=src python3 scripts/train_preset.py            # ~20 minutes on one (shared) CPU core
    PYTHONPATH=src python3 scripts/train_preset.py --steps 300 --out /tmp/digits   # a quick look

It writes OUT/ (config.json, model.safetensors in bf16, tokenizer.json: `moelab serve --preset
digits` serves the shipped copy), OUT/training.json (seed, steps, seconds, loss, the training
model's greedy held-out accuracy and expert use per task), and, with the default OUT, the held-out
item files src/moelab/evaluate/tasks/digits-*.jsonl that `moelab eval --task digits` reads. The
held-out prompts never appear in training. Training is seeded; a rerun on another machine or torch
is not bit-identical but lands within a point of the same accuracy.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from moelab.engine.checkpoint import save_checkpoint
from moelab.engine.config import ModelConfig
from moelab.engine.train import TrainableQwen3Moe
from moelab.evaluate import digits
from moelab.moe import quantize_experts

ROOT = Path(__file__).resolve().parent.parent
PRESET_DIR = ROOT / "src/moelab/engine/presets/digits"
TASK_DIR = ROOT / "src/moelab/evaluate/tasks"
EOS, PAD = 256, 256  # <|endoftext|> ends every answer; padding is masked out of the loss
HELD_OUT, HELD_OUT_SEED = 200, 1
MAX_TOKENS = digits.MAX_ANSWER_CHARS + 4  # room past the answer: a model that does not stop is wrong, not cut

CONFIG = ModelConfig(vocab_size=259, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=128, intermediate_size=512, max_position_embeddings=64,
                     rope_theta=10_000.0, eos_token_id=[256, 258], torch_dtype="bfloat16")


def batch(items: list[tuple[str, str, str]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [B, S], targets [B, S] with -100 outside answers, real-token mask [B, S])."""
    seqs = [(list(p.encode()), list(a.encode()) + [EOS]) for _, p, a in items]
    S = max(len(p) + len(a) for p, a in seqs) - 1
    ids = torch.full((len(seqs), S), PAD)
    tgt = torch.full((len(seqs), S), -100)
    mask = torch.zeros(len(seqs), S, dtype=torch.bool)
    for b, (p, a) in enumerate(seqs):
        s = (p + a)[:-1]
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = True
        tgt[b, len(p) - 1:len(s)] = torch.tensor(a)  # the answer bytes and EOS, predicted from the left
    return ids, tgt, mask


@torch.no_grad()
def greedy(model: TrainableQwen3Moe, prompts: list[str], max_new: int = digits.MAX_ANSWER_CHARS + 1
           ) -> tuple[list[str], torch.Tensor]:
    """Greedy answers (up to EOS) and the expert assignments [L, E] of the prompt tokens."""
    seqs = [list(p.encode()) for p in prompts]
    done = [False] * len(seqs)
    outs: list[list[int]] = [[] for _ in seqs]
    counts = None
    for step in range(max_new):
        S = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), S), PAD)
        mask = torch.zeros(len(seqs), S, dtype=torch.bool)
        for b, s in enumerate(seqs):
            ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), True
        out = model.forward(ids, mask)
        if step == 0:
            counts = out.expert_counts
        last = torch.tensor([len(s) - 1 for s in seqs])
        nxt = out.logits[torch.arange(len(seqs)), last].argmax(-1).tolist()
        for b, t in enumerate(nxt):
            if not done[b]:
                if t in CONFIG.eos_ids:
                    done[b] = True
                else:
                    outs[b].append(t)
                    seqs[b].append(t)
        if all(done):
            break
    return [bytes(o).decode(errors="replace") for o in outs], counts


def evaluate(model: TrainableQwen3Moe, held: dict[str, list[tuple[str, str]]]) -> dict[str, dict]:
    res = {}
    for task, items in held.items():
        answers, counts = greedy(model, [p for p, _ in items])
        share = counts.float() / counts.sum(1, keepdim=True)  # [L, E]
        res[task] = {"accuracy": sum(a == want for a, (_, want) in zip(answers, items)) / len(items),
                     "expert_share": [[round(x, 3) for x in row] for row in share.tolist()]}
    return res


def round_to_bf16(model: TrainableQwen3Moe) -> None:
    """The shipped weights are bf16: judge the model the engine will load, not the float32 one."""
    with torch.no_grad():
        for t in model.parameters():
            t.copy_(t.to(torch.bfloat16).float())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PRESET_DIR)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--balance", type=float, default=0.01, help="weight of the load-balancing loss")
    ap.add_argument("--seed", type=int, default=0)
    # One thread: on a 2-core machine shared with other work, two threads spin-waiting on each
    # other took 3.1 s a step against 0.33 s for one (same batch, same load).
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    held = {t: digits.held_out(t, HELD_OUT, HELD_OUT_SEED) for t in digits.TASKS}
    # addition is the hard one (a carry can run through every digit): it gets half the batch
    data = digits.stream(args.seed, {p for items in held.values() for p, _ in items}, {"add": 2.0})
    model = TrainableQwen3Moe(CONFIG, torch.Generator().manual_seed(args.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    t0, loss_avg = time.monotonic(), None
    for step in range(1, args.steps + 1):
        ids, tgt, mask = batch([next(data) for _ in range(args.batch)])
        out = model.forward(ids, mask)
        ce = F.cross_entropy(out.logits.view(-1, CONFIG.vocab_size), tgt.view(-1), ignore_index=-100)
        loss = ce + args.balance * out.balance_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ce_now = ce.item()
        loss_avg = ce_now if loss_avg is None else 0.98 * loss_avg + 0.02 * ce_now
        if step % 250 == 0 or step == args.steps:
            print(f"step {step:5d}  loss {loss_avg:.4f}  balance {out.balance_loss.item():.3f}  "
                  f"{time.monotonic() - t0:6.0f}s", flush=True)
    train_s = time.monotonic() - t0
    round_to_bf16(model)
    result = evaluate(model, held)
    for task, r in result.items():
        print(f"{task:5s} held-out greedy accuracy {r['accuracy']:.1%}; layer-0 expert share "
              + " ".join(f"{x:.2f}" for x in r["expert_share"][0]))
    dense, experts = model.weights()
    to_bf16 = lambda t: t.to(torch.bfloat16)  # noqa: E731
    save_checkpoint(args.out, CONFIG, {k: to_bf16(v) for k, v in dense.items()},
                    [quantize_experts(to_bf16(w13), to_bf16(w2), "bf16", dtype=torch.bfloat16) for w13, w2 in experts],
                    shard_bytes=1 << 40)
    record = {"seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr, "balance": args.balance,
              "threads": args.threads, "train_seconds": round(train_s, 1), "final_loss": round(loss_avg, 5),
              "torch": torch.__version__, "held_out_items": HELD_OUT, "held_out": result}
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    if args.out.resolve() == PRESET_DIR.resolve():
        write_task_files(held)
    print(f"wrote {args.out} in {train_s:.0f}s of training", flush=True)
    return 0


def write_task_files(held: dict[str, list[tuple[str, str]]]) -> None:
    """digits-<task>.jsonl per task and digits.jsonl with all of them, items interleaved."""
    TASK_DIR.mkdir(parents=True, exist_ok=True)
    rows = {t: [{"id": f"{t}-{i:03d}", "prompt": p, "answer": a, "max_tokens": MAX_TOKENS} for i, (p, a) in enumerate(items)]
            for t, items in held.items()}
    for t, r in rows.items():
        (TASK_DIR / f"digits-{t}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r))
    mixed = [x for group in zip(*rows.values()) for x in group]
    (TASK_DIR / "digits.jsonl").write_text("".join(json.dumps(x) + "\n" for x in mixed))


if __name__ == "__main__":
    sys.exit(main())
