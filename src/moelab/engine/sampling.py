"""Next-token choice per sequence: greedy, or temperature + top-p with a per-request generator.

Logprobs are those of the model's own distribution (log-softmax of the raw logits, before
temperature and before the min_tokens EOS mask), like OpenAI and vLLM report them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from moelab.engine.scheduler import Sequence


@dataclass
class Choice:
    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None  # (token id, logprob), best first


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_ids: tuple[int, ...]) -> list[Choice]:
    """logits [B, V] float32, one row per sequence in `seqs` order."""
    raw = logits
    masked = [b for b, s in enumerate(seqs) if len(s.output_ids) < s.params.min_tokens and eos_ids]
    if masked:
        logits = logits.clone()
        rows = torch.tensor(masked, device=logits.device)
        logits[rows[:, None], torch.tensor(eos_ids, device=logits.device)[None, :]] = float("-inf")
    tokens = logits.argmax(dim=-1).tolist()  # greedy for all rows, replaced below where sampling
    for b, s in enumerate(seqs):
        p = s.params
        if p.temperature <= 0:
            continue
        row = logits[b] / p.temperature  # [V]
        if p.top_p < 1.0:
            sorted_l, idx = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_l, dim=-1) >= p.top_p  # keep the smallest prefix reaching top_p
            sorted_l[drop] = float("-inf")
            row = torch.full_like(row, float("-inf")).scatter(0, idx, sorted_l)
        probs = torch.softmax(row, dim=-1)
        tokens[b] = int(torch.multinomial(probs, 1, generator=s.extra.get("generator")).item())
    out = [Choice(t) for t in tokens]
    want = [b for b, s in enumerate(seqs) if s.params.logprobs is not None]
    if want:
        lp = torch.log_softmax(raw[want], dim=-1)  # [W, V]
        n = max(seqs[b].params.logprobs for b in want)
        top_v, top_i = torch.topk(lp, max(n, 1), dim=-1) if n else (None, None)
        chosen = lp.gather(1, torch.tensor([tokens[b] for b in want], device=lp.device)[:, None]).squeeze(1).tolist()
        for j, b in enumerate(want):
            k = seqs[b].params.logprobs
            out[b].logprob = chosen[j]
            out[b].top = list(zip(top_i[j, :k].tolist(), top_v[j, :k].tolist())) if k else []
    return out
