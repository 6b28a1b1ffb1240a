"""The MoE runner interface: a stateless function from routed tokens and expert weights to output.

The MoE layer owns the weights (an `ExpertWeights` in some format) and the router; a runner
backend only computes

    out[t] = sum_k topk_weights[t, k] * down_e( silu(gate_e(x[t])) * up_e(x[t]) ),  e = topk_ids[t, k]

so any backend can be swapped per call in a test or a benchmark. Shapes:
    x            [T, H]   activations (bf16/fp16/fp32)
    topk_weights [T, K]   float32 router weights (already normalised if the model wants that)
    topk_ids     [T, K]   int32/int64 expert ids
    w13          [E, 2I, H]  gate rows first, then up rows (the fused layout the engines use)
    w2           [E, H, I]
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # torch is an optional dependency of moelab's core
    import torch


class ExpertWeights(ABC):
    """The experts of one layer in one weight format. Subclasses hold the tensors."""

    fmt: ClassVar[str]  # "bf16" | "fp8" | "nvfp4"

    @property
    @abstractmethod
    def shape(self) -> tuple[int, int, int]:
        """(E, H, I): number of experts, hidden size, expert intermediate size."""

    @abstractmethod
    def dequantize(self, dtype: "torch.dtype") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Dense (w13 [E, 2I, H], w2 [E, H, I]) in `dtype` — what the format stands for."""

    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of all expert tensors (values and scales) as stored."""

    def _per_expert(self, part) -> "ExpertWeights":
        """A copy whose per-expert tensors are `part(tensor)`: every per-expert tensor of every
        format has the expert index as its leading dimension."""
        E = self.shape[0]
        out = copy.copy(self)
        for k, v in vars(self).items():
            if hasattr(v, "shape") and v.dim() and v.shape[0] == E:
                setattr(out, k, part(v))
        return out

    def select(self, first: int, count: int) -> "ExpertWeights":
        """Experts [first, first + count) only (expert parallelism), each tensor in its own storage
        so that the rest can be freed."""
        return self._per_expert(lambda v: v[first:first + count].clone())

    def take(self, experts: list[int]) -> "ExpertWeights":
        """The experts `experts` only, in that order (gathered): what a runner that loops over the
        routed experts dequantizes, instead of the whole layer."""
        import torch

        return self._per_expert(lambda v: v.index_select(0, torch.tensor(experts, dtype=torch.long, device=v.device)))

    @abstractmethod
    def slice_intermediate(self, start: int, stop: int) -> "ExpertWeights":
        """Every expert's intermediate rows [start, stop) only (tensor parallelism): the gate and up
        rows of w13 and the matching input columns of w2, with their scales. The stored values are
        not requantized, so the slices of all ranks hold exactly the whole layer's numbers."""


class MoERunner(ABC):
    """One MoE runner backend. Holds no weights and no per-call state."""

    name: ClassVar[str]
    formats: ClassVar[tuple[str, ...]]  # weight formats this backend accepts
    # True when a call never synchronises with the host, so the engine may capture it in a CUDA graph
    graph_safe: ClassVar[bool] = False

    @classmethod
    def unsupported_reason(cls, device: "torch.device", fmt: str) -> str | None:
        """None when this backend can run `fmt` on `device`; else one plain sentence why not."""
        if fmt not in cls.formats:
            return f"the {cls.name} MoE runner does not take {fmt} weights (it takes {', '.join(cls.formats)})"
        return None

    def warm_token_counts(self, max_tokens: int, w: ExpertWeights, top_k: int) -> list[int]:
        """Token counts whose calls, run once at startup, leave nothing to compile for any call of up
        to `max_tokens` tokens. Powers of two unless a backend knows better."""
        return [1 << i for i in range(max_tokens.bit_length()) if 1 << i <= max_tokens]

    def launch_label(self, T: int, w: ExpertWeights, top_k: int) -> str | None:
        """A few words on how a call of T tokens is launched (a tuned kernel's path and switches),
        shown next to its timing by `moelab kernels`; None when there is nothing to say."""
        return None

    @abstractmethod
    def __call__(
        self,
        x: "torch.Tensor",
        topk_weights: "torch.Tensor",
        topk_ids: "torch.Tensor",
        w: ExpertWeights,
    ) -> "torch.Tensor":
        """Return [T, H] in x.dtype."""


def gate_up_rows(t: "torch.Tensor", start: int, stop: int, intermediate: int) -> "torch.Tensor":
    """Rows [start, stop) of the gate half and of the up half of a w13-shaped tensor [E, 2I/g, ...]
    whose rows come in groups of g = 2I / t.shape[1] (g = 1: one row per row; fp8 block scales: 128)."""
    import torch

    g = 2 * intermediate // t.shape[1]
    if start % g or stop % g:
        raise ValueError(f"intermediate rows {start}-{stop} cut through this format's {g}-row scale blocks")
    a, b, half = start // g, stop // g, intermediate // g
    return torch.cat([t[:, a:b], t[:, half + a:half + b]], dim=1).contiguous()


def input_columns(t: "torch.Tensor", start: int, stop: int, intermediate: int) -> "torch.Tensor":
    """Columns [start, stop) of a w2-shaped tensor [E, H/., I/g] whose last axis packs g inputs per
    element (1 for plain values, 2 for nvfp4 bytes, 16 for nvfp4 scales, 128 for fp8 block scales)."""
    g = intermediate // t.shape[-1]
    if start % g or stop % g:
        raise ValueError(f"intermediate columns {start}-{stop} cut through this format's {g}-wide groups")
    return t[..., start // g:stop // g].contiguous()
