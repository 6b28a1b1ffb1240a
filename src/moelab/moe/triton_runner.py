"""The fused Triton MoE runner: align -> gate/up GEMM + SiLU*up -> down GEMM * router weight -> sum.

Tiled path: four launches per layer on CUDA (alignment, two GEMMs, the top-k sum); past 4,096
(token, slot) pairs the alignment takes three launches and a memset instead of one.
Intermediates:
    act  [maxlen, I]   SiLU(gate)*up per sorted row (bf16)
    y    [T*K, H]      router-weighted expert outputs per (token, slot)
Gemv path (a config with "path": "gemv", the default at few tokens): two launches, no alignment,
the top-k sum fused into the down kernel (triton_gemv.py); act [T*K, I] per pair.
Fused path ("path": "fused", tuned at a few tokens): one launch, the activation kept in registers,
partial sums added into a zeroed fp32 workspace per device that the kernel leaves zeroed.
Both are free of host synchronisation, so a decode step can be captured in a CUDA graph. Quantized
weights are read in their stored format and dequantized in registers (see triton_kernels.py); a
tiled config may also run fp8 weights against fp8 activations ("A8", sm_89 and later).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, ClassVar

import torch

from moelab.moe.base import ExpertWeights, MoERunner

_FMT_BF16, _FMT_FP8_CH, _FMT_FP8_BLOCK, _FMT_NVFP4 = 0, 1, 2, 3


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _operands(w: ExpertWeights) -> tuple[int, tuple[int, int], tuple, tuple]:
    """(FMT code, (BSN, BSK), up operands (w, s, g), down operands (w, s, g))."""
    if w.fmt == "bf16":
        return _FMT_BF16, (1, 1), (w.w13, w.w13, w.w13), (w.w2, w.w2, w.w2)
    if w.fmt == "fp8":
        code = _FMT_FP8_CH if w.block is None else _FMT_FP8_BLOCK
        blk = w.block or (1, 1)
        return code, blk, (w.w13, w.w13_scale, w.w13_scale), (w.w2, w.w2_scale, w.w2_scale)
    if w.fmt == "nvfp4":
        return (_FMT_NVFP4, (1, 1), (w.w13, w.w13_scale, w.w13_scale_2),
                (w.w2, w.w2_scale, w.w2_scale_2))
    raise ValueError(f"the triton MoE runner cannot take {w.fmt} weights")


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    s = t.stride()
    return (s[0], s[1], s[2]) if t.dim() == 3 else (s[0], s[1], 0) if t.dim() == 2 else (0, 0, 0)


class TritonRunner(MoERunner):
    name: ClassVar[str] = "triton"
    formats: ClassVar[tuple[str, ...]] = ("bf16", "fp8", "nvfp4")
    graph_safe: ClassVar[bool] = True

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config  # a fixed launch config (the tuner sets it); None: tuned file or default

    @classmethod
    def unsupported_reason(cls, device: torch.device, fmt: str) -> str | None:
        why = super().unsupported_reason(device, fmt)
        if why:
            return why
        # The GPU first: on a CPU-only machine "no CUDA" is the reason that matters, whether or
        # not the triton package happens to be installed.
        if device.type != "cuda" and not _interpreting():
            return (f"the triton MoE runner needs a CUDA GPU (device is {device.type}; "
                    "TRITON_INTERPRET=1 runs it slowly on CPU for tests)")
        try:
            import triton  # noqa: F401
        except ImportError:
            return "the triton MoE runner needs the triton package, which is not installed"
        return None

    def _config(self, T: int, w: ExpertWeights, top_k: int) -> dict[str, Any]:
        from moelab.moe.triton_configs import get_config

        E, H, I = w.shape
        return self.config or get_config(T, E, top_k, H, I, w.fmt)

    def _launch(self, T: int, w: ExpertWeights, top_k: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The config for T tokens and its two stages as launched: fp8 block scales cap BLOCK_K (one
        k-scale per tile), and A8 holds only for fp8 weights on a device whose tl.dot takes fp8."""
        cfg = self._config(T, w, top_k)
        fmt, (_, bsk), (w13, _, _), _ = _operands(w)
        if cfg.get("path") == "fused":  # one kernel; its K steps along H and along I stay in one block
            if fmt == _FMT_FP8_BLOCK:
                cfg = {**cfg, "BLOCK_K": min(cfg["BLOCK_K"], bsk), "BLOCK_I": min(cfg["BLOCK_I"], bsk)}
            return cfg, cfg, cfg
        up, down = dict(cfg["up"]), dict(cfg["down"])
        if fmt == _FMT_FP8_BLOCK:
            up["BLOCK_K"], down["BLOCK_K"] = min(up["BLOCK_K"], bsk), min(down["BLOCK_K"], bsk)
        if fmt not in (_FMT_FP8_CH, _FMT_FP8_BLOCK) or not fp8_dots(w13.device):
            up["A8"] = down["A8"] = False
        return cfg, up, down

    def warm_token_counts(self, max_tokens: int, w: ExpertWeights, top_k: int) -> list[int]:
        """One token count per distinct compiled variant: launch config x alignment path (the kernels'
        token-count arguments are not specialised, so nothing else varies)."""
        from moelab.moe.triton_align import ONE_PROGRAM_MAX_PAIRS

        seen: dict[str, int] = {}
        for T in range(1, max_tokens + 1):
            cfg = self._config(T, w, top_k)
            key = json.dumps(cfg, sort_keys=True) + str(T * top_k <= ONE_PROGRAM_MAX_PAIRS)
            seen.setdefault(key, T)
        return sorted(seen.values())

    def launch_label(self, T: int, w: ExpertWeights, top_k: int) -> str:
        """"gemv", "fused", or "tiled M<BLOCK_M>" plus the switches in use, e.g. "tiled M16 A8 SWAP_AB"
        (per stage when the two kernels differ: "tiled M128 up:SPLIT_M")."""
        cfg, up, down = self._launch(T, w, top_k)
        if cfg.get("path") in ("gemv", "fused"):
            return cfg["path"]
        flags = {st: [k for k in ("A8", "SWAP_AB", "SPLIT_M") if tile.get(k)] for st, tile in (("up", up), ("down", down))}
        label = f"tiled M{cfg['BLOCK_M']}"
        if flags["up"] == flags["down"]:
            return " ".join([label, *flags["up"]])
        return " ".join([label] + [f"{st}:{'+'.join(f)}" for st, f in flags.items() if f])

    def __call__(self, x, topk_weights, topk_ids, w: ExpertWeights):
        import triton

        from moelab.moe.triton_align import align_block_size
        from moelab.moe.triton_kernels import moe_down_kernel, moe_sum_kernel, moe_up_kernel

        T, H = x.shape
        K = topk_ids.shape[1]
        E, _, I = w.shape
        x = x.contiguous()
        fmt, (bsn, bsk), (w13, s13, g13), (w2, s2, g2) = _operands(w)
        cfg, up, down = self._launch(T, w, K)
        if cfg.get("path") == "gemv":
            return _gemv(x, topk_weights, topk_ids, I, fmt, (bsn, bsk), (w13, s13, g13), (w2, s2, g2), up, down)
        if cfg.get("path") == "fused":
            return _fused(x, topk_weights, topk_ids, I, fmt, (bsn, bsk), (w13, s13, g13), (w2, s2, g2), up)
        bm = cfg["BLOCK_M"]
        sorted_ids, expert_ids, total = align_block_size(topk_ids, E, bm)
        num_m = expert_ids.numel()
        n_pairs = T * K
        act = torch.empty(num_m * bm, I, dtype=x.dtype, device=x.device)  # [maxlen, I]
        y = torch.empty(n_pairs, H, dtype=x.dtype, device=x.device)  # [T*K, H]
        tw = topk_weights.reshape(-1).to(torch.float32).contiguous()

        grid_up = (num_m * triton.cdiv(I, up["BLOCK_N"]),)
        moe_up_kernel[grid_up](
            x, w13, s13, g13, act, sorted_ids, expert_ids, total,
            n_pairs, I, H, K, num_m, x.stride(0), act.stride(0),
            *_strides3(w13), *_strides3(s13),
            FMT=fmt, BSN=bsn, BSK=bsk, DOT_F32=_interpreting(), BLOCK_M=bm, **_launch_kwargs(up))
        grid_down = (num_m * triton.cdiv(H, down["BLOCK_N"]),)
        moe_down_kernel[grid_down](
            act, w2, s2, g2, y, tw, sorted_ids, expert_ids, total,
            n_pairs, H, I, num_m, act.stride(0), y.stride(0),
            *_strides3(w2), *_strides3(s2),
            FMT=fmt, BSN=bsn, BSK=bsk, DOT_F32=_interpreting(), BLOCK_M=bm, **_launch_kwargs(down))
        if K == 1:
            return y
        out = torch.empty(T, H, dtype=x.dtype, device=x.device)
        bh = min(1024, triton.next_power_of_2(H))
        moe_sum_kernel[(T, triton.cdiv(H, bh))](y, out, T, H, TOPK=K, BLOCK_H=bh)  # top-k combine
        return out


@functools.lru_cache(maxsize=8)
def fp8_dots(device: torch.device) -> bool:
    """Whether tl.dot takes float8 operands here: sm_89 (Ada) and later, or the interpreter."""
    return _interpreting() or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9))


def _launch_kwargs(c: dict[str, Any]) -> dict[str, Any]:
    kw = {k: c[k] for k in ("BLOCK_N", "BLOCK_K", "GROUP_M")}
    kw.update(SWAP_AB=bool(c.get("SWAP_AB")), SPLIT_M=bool(c.get("SPLIT_M")), A8=bool(c.get("A8")))
    if not _interpreting():
        kw.update(num_warps=c["num_warps"], num_stages=c["num_stages"])
    return kw


def _gemv(x, topk_weights, topk_ids, I, fmt, blk, up_ops, down_ops, up, down):
    """The decode path: act [T*K, I] per pair, then out [T, H] with the top-k combine fused."""
    import triton

    from moelab.moe.triton_gemv import moe_gemv_down_kernel, moe_gemv_up_kernel

    T, H = x.shape
    K = topk_ids.shape[1]
    (w13, s13, g13), (w2, s2, g2) = up_ops, down_ops
    ids = topk_ids.reshape(-1).contiguous()  # int32 or int64, read as is
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    act = torch.empty(T * K, I, dtype=x.dtype, device=x.device)
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    moe_gemv_up_kernel[(T * K * triton.cdiv(I, up["BLOCK_N"]),)](
        x, w13, s13, g13, act, ids, T * K, I, H, K, x.stride(0), act.stride(0),
        *_strides3(w13), *_strides3(s13), FMT=fmt, BSN=blk[0], BSK=blk[1], **_gemv_kwargs(up, H))
    moe_gemv_down_kernel[(T * triton.cdiv(H, down["BLOCK_N"]),)](
        act, w2, s2, g2, out, tw, ids, T, H, I, act.stride(0), out.stride(0), *_strides3(w2), *_strides3(s2),
        TOPK=K, TOPK_P2=triton.next_power_of_2(K), FMT=fmt, BSN=blk[0], BSK=blk[1], **_gemv_kwargs(down, I))
    return out


def _gemv_kwargs(c: dict[str, Any], k: int) -> dict[str, Any]:
    """num_stages goes to the kernels' tl.range (STAGES), which pipelines their dot-free loops."""
    kw = {"BLOCK_N": c["BLOCK_N"], "BLOCK_K": c["BLOCK_K"], "EVEN_K": k % c["BLOCK_K"] == 0,
          "STAGES": c["num_stages"]}
    if c.get("WIDE"):
        kw["WIDE"] = True
    if not _interpreting():
        kw["num_warps"] = c["num_warps"]
    return kw


_workspaces: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []  # outgrown workspaces, which captured graphs may still use


def fused_workspace(device: torch.device, T: int, H: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 [rows, H], int32 [rows] counters), zeroed once and kept zeroed by moe_fused_kernel, for
    at least T rows. Shared by every layer on a device: their launches run one after another on the
    stream (two streams running fused MoE layers at once on one device would need one each).
    Grown (doubling, 64 rows at least) when T exceeds it; growing inside a CUDA-graph capture
    records the zeroing in the graph, which stays correct. An outgrown workspace is kept, never
    freed: graphs captured before the growth still write to it."""
    key = (device, H)
    ws = _workspaces.get(key)
    if ws is None or ws[1].numel() < T:
        if ws is not None:
            _retired.append(ws)
        rows = max(64, T, 2 * ws[1].numel() if ws is not None else 0)
        ws = (torch.zeros(rows, H, dtype=torch.float32, device=device),
              torch.zeros(rows, dtype=torch.int32, device=device))
        _workspaces[key] = ws
    return ws


def _fused(x, topk_weights, topk_ids, I, fmt, blk, up_ops, down_ops, c):
    """One launch: T*K*cdiv(I, BLOCK_I) programs, each an (I-block, pair) of the whole layer."""
    import triton

    from moelab.moe.triton_gemv import moe_fused_kernel

    T, H = x.shape
    K = topk_ids.shape[1]
    (w13, s13, g13), (w2, s2, g2) = up_ops, down_ops
    ids = topk_ids.reshape(-1).contiguous()
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    acc, cnt = fused_workspace(x.device, T, H)
    kw = {"BLOCK_I": c["BLOCK_I"], "BLOCK_K": c["BLOCK_K"], "BLOCK_H": c["BLOCK_H"],
          "EVEN_K": H % c["BLOCK_K"] == 0, "EVEN_I": I % c["BLOCK_I"] == 0, "STAGES": c["num_stages"]}
    if not _interpreting():
        kw["num_warps"] = c["num_warps"]
    moe_fused_kernel[(T * K * triton.cdiv(I, c["BLOCK_I"]),)](
        x, w13, s13, g13, w2, s2, g2, out, acc, cnt, tw, ids, T * K, I, H, K, x.stride(0), out.stride(0),
        *_strides3(w13), *_strides3(s13), *_strides3(w2), *_strides3(s2),
        FMT=fmt, BSN=blk[0], BSK=blk[1], **kw)
    return out
