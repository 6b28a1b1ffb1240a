"""The MoE of one rank under expert parallelism: dispatch to the local experts, partial combine.

Attention is tensor-parallel, so after its all-reduce every rank holds every token: dispatch is
choosing, on each rank, the (token, top-k slot) pairs routed to its own experts, and combine is
the weighted sum of those pairs per token; the all-reduce that follows (model.py) adds the
ranks' partial sums. Worked example, 8 experts over 2 groups, rank 1 holds experts 4-7:

    topk_ids [[1, 5], [6, 4], [0, 2]]  ->  pairs (0, slot 1) expert 5, (1, 0) expert 6, (1, 1) expert 4
    runner(x[[0, 1, 1]], weights of those pairs, local ids [[1], [2], [0]])  -> [3, H]
    index_add into rows 0, 1, 1 of a zero [3, H]; token 2 has no local expert and stays zero.

The runner sees one pair per row (top-k 1), so no expert is computed for a pair another rank owns.
Counting the pairs is a host synchronisation, so this path is not captured in CUDA graphs.
"""
from __future__ import annotations

import torch

from moelab.moe.base import ExpertWeights, MoERunner


def local_experts_moe(runner: MoERunner, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      w: ExpertWeights, first: int) -> torch.Tensor:
    """x [T, H], routing [T, K] over all experts, w the local experts [first, first + E_local) -> [T, H]
    in x.dtype: this rank's share of the MoE output (summed in float32 before the cast)."""
    n = w.shape[0]
    mine = (topk_ids >= first) & (topk_ids < first + n)  # [T, K]
    tok, slot = mine.nonzero(as_tuple=True)  # [P] each
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    if tok.numel():
        y = runner(x[tok], topk_weights[tok, slot][:, None], (topk_ids[tok, slot] - first)[:, None], w)  # [P, H]
        out.index_add_(0, tok, y.float())
    return out.to(x.dtype)
