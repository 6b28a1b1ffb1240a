"""Plain (unquantized) expert weights: bf16, fp16 or fp32 tensors as they are."""
from __future__ import annotations

from typing import ClassVar

import torch

from moelab.moe.base import ExpertWeights, gate_up_rows, input_columns


class Bf16Experts(ExpertWeights):
    fmt: ClassVar[str] = "bf16"

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        E, two_i, H = w13.shape  # [E, 2I, H]
        assert w2.shape == (E, H, two_i // 2), f"w2 {tuple(w2.shape)} does not match w13 {tuple(w13.shape)}"
        self.w13, self.w2 = w13, w2

    @property
    def shape(self) -> tuple[int, int, int]:
        E, two_i, H = self.w13.shape
        return E, H, two_i // 2

    def dequantize(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w13.to(dtype), self.w2.to(dtype)

    def nbytes(self) -> int:
        return self.w13.nbytes + self.w2.nbytes

    def slice_intermediate(self, start: int, stop: int) -> "Bf16Experts":
        I = self.shape[2]
        return Bf16Experts(gate_up_rows(self.w13, start, stop, I), input_columns(self.w2, start, stop, I))
