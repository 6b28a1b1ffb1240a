"""Launch configurations for the fused Triton MoE kernel: defaults, and tuned JSON files per GPU.

A tuned file lives in moe/configs/ and is named like vLLM's, plus the weight format:
    E=128,N=768,device_name=NVIDIA_H200,fmt=bf16.json
(N is the expert intermediate size I). It maps a token count M to one config of either path:
    tiled  {"BLOCK_M": 16, "up": {BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages}, "down": {...}}
           (a tiled stage may add "SWAP_AB", "SPLIT_M" and "A8": true; see triton_kernels.py)
    gemv   {"path": "gemv", "up": {BLOCK_N, BLOCK_K, num_warps, num_stages}, "down": {...}}
    fused  {"path": "fused", BLOCK_I, BLOCK_K, BLOCK_H, num_warps, num_stages}  (one kernel)
BLOCK_M is shared because both tiled GEMMs walk the same aligned row list; the gemv kernels
(triton_gemv.py) need no alignment. At run time the nearest tuned M is used, with whatever path
it records; without a file, `default_config` applies. `moelab kernels --tune` writes files.

A file also records which kernels each entry was tuned (or last re-measured) on: "tuned_on":
{M: kernel_revision()}, a fingerprint of the kernels' code. Entries from other kernels are still
used (a launch config stays valid), but loading them logs a warning once, and `moelab kernels`
notes them: after a kernel change the fastest tiles move (seen on an H200: NVFP4 entries picked
for a byte-wise decode ran 1.2-1.9x slower than the defaults once the kernels decoded words).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import logging
import os
import tokenize
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).parent / "configs"
KERNEL_SOURCES = ("triton_align.py", "triton_gemv.py", "triton_kernels.py")


@functools.lru_cache(maxsize=1)
def kernel_revision() -> str:
    """The fingerprint of the kernels in this install (source_revision of KERNEL_SOURCES)."""
    return source_revision([Path(__file__).parent / name for name in KERNEL_SOURCES])


def source_revision(paths: list[Path]) -> str:
    """12 hex digits of a hash over the files' code lines: docstrings (found through the syntax
    tree) and comments (through the tokenizer) dropped, trailing blanks and empty lines too. Edits
    to prose keep it, edits to code change it, and it reads the same under any Python version (a
    hash of ast.dump did not: an H200's Python 3.12 gave another one than 3.11 here)."""
    h = hashlib.sha256()
    for path in paths:
        src = path.read_text()
        lines = src.splitlines()
        docs: set[int] = set()
        for node in ast.walk(ast.parse(src)):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                docs.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
        code = [line.rstrip() for i, line in enumerate(lines, 1) if i not in docs and line.strip()]
        h.update(path.name.encode() + b"\n" + "\n".join(code).encode() + b"\n")
    return h.hexdigest()[:12]


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() else "cpu"


def config_file_name(E: int, I: int, fmt: str, device: str) -> str:
    return f"E={E},N={I},device_name={device},fmt={fmt}.json"


def config_dirs(extra: str | Path | None = None) -> list[Path]:
    """Where tuned files are looked for: extra (else $MOELAB_MOE_CONFIG_DIR), whose files win, then the shipped ones."""
    extra = extra or os.environ.get("MOELAB_MOE_CONFIG_DIR")
    return ([Path(extra)] if extra else []) + [CONFIG_DIR]


def tuned_file(E: int, I: int, fmt: str, device: str, extra: str | Path | None = None) -> Path | None:
    """The config file in use for this shape, format and GPU: the first of config_dirs(extra) that has one."""
    return next((p for p in (d / config_file_name(E, I, fmt, device) for d in config_dirs(extra)) if p.is_file()), None)


@functools.lru_cache(maxsize=64)
def load_tuned(E: int, I: int, fmt: str, device: str) -> dict[int, dict[str, Any]] | None:
    p = tuned_file(E, I, fmt, device)
    if p is None:
        return None
    data = json.loads(p.read_text())
    note = stale_note(p, data)
    if note:
        log.warning("%s", note)
    return {int(m): c for m, c in data.items() if m.isdigit()}


def stale_entries(data: dict[str, Any]) -> list[int]:
    """The token counts of a config file's entries not stamped with the current kernel revision."""
    stamps = data.get("tuned_on") or {}
    return sorted(int(m) for m in data if m.isdigit() and stamps.get(m) != kernel_revision())


def stale_note(path: Path, data: dict[str, Any] | None = None) -> str | None:
    """What to tell a user whose config file holds entries tuned on other kernels, or None."""
    stale = stale_entries(json.loads(path.read_text()) if data is None else data)
    if not stale:
        return None
    toks = ",".join(map(str, stale))
    return (f"{path}: the entries for {toks} tokens were tuned on other kernels than these (revision "
            f"{kernel_revision()}): they still run, but may no longer be the fastest; "
            f"`moelab kernels --tune --tokens {toks}` re-tunes them")


# The gemv path while pairs are few (at most this many) and spread thin (at most one per expert on
# average): each pair re-reads its expert's weights (from L2 when pairs sharing an expert run side
# by side) and dequantizes them again, which costs less than the tiled path's alignment launches
# and padded M-blocks. Measured on an H200: Qwen3-30B-A3B (E=128, K=8) gains up to 8 tokens (64
# pairs); Mixtral (E=8, K=2) at 16 tokens, four pairs per 350 MB expert, took 1.9x (bf16) and
# 2.3x (fp8) the tiled time.
# A tuned file records the faster path per token count.
GEMV_MAX_PAIRS = 64
# The tuner tries the gemv path up to this many pairs: past it each expert's weights are re-read too
# often (on an H200 it won for nvfp4 at 512 pairs while the tiled kernels decoded nvfp4 byte by byte;
# with the word decode the tiled path wins from 256). A tuned gemv entry is not reused past it either.
GEMV_TUNE_MAX_PAIRS = 512
# The tuner tries the one-launch fused kernel up to this many pairs, and a tuned fused entry is not
# reused past it: its atomic adds grow with the tokens (T * K * I / BLOCK_I rows of H partial sums).
FUSED_TUNE_MAX_PAIRS = 128


def default_config(M: int, E: int, K: int, H: int, I: int, fmt: str) -> dict[str, Any]:
    return gemv_config(fmt) if M * K <= min(GEMV_MAX_PAIRS, E) else tiled_config(M, E, K, H, I, fmt)


def gemv_config(fmt: str = "bf16") -> dict[str, Any]:
    """Narrow N-tiles, so that one token still makes many programs (Qwen3-30B-A3B: 384 up, and 512
    down, each with a WIDE tile: every top-k slot's weights loaded at once)."""
    if fmt == "nvfp4":
        down = {"BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "WIDE": True}
    else:
        down = {"BLOCK_N": 4, "BLOCK_K": 128, "num_warps": 2, "num_stages": 3, "WIDE": True}
    return {"path": "gemv", "up": {"BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3}, "down": down}


def fused_config() -> dict[str, Any]:
    """The one-launch decode kernel (moe_fused_kernel): BLOCK_I intermediate rows of one pair per
    program, its gate/up tile walked along H in BLOCK_K steps and its down columns in BLOCK_H rows."""
    return {"path": "fused", "BLOCK_I": 16, "BLOCK_K": 256, "BLOCK_H": 128, "num_warps": 2, "num_stages": 3}


def tiled_config(M: int, E: int, K: int, H: int, I: int, fmt: str) -> dict[str, Any]:
    """A reasonable untuned choice: small M-blocks while experts get few rows each."""
    rows = M * K / E  # expected rows per expert under uniform routing
    bm = 16 if rows <= 16 else 32 if rows <= 48 else 64 if rows <= 160 else 128
    if bm <= 32:  # weight-streaming regime: many narrow N-tiles so every SM streams weights
        up = {"BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
        down = {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    else:
        up = {"BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
        down = {"BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": bm, "up": up, "down": down}


def get_config(M: int, E: int, K: int, H: int, I: int, fmt: str) -> dict[str, Any]:
    tuned = load_tuned(E, I, fmt, device_name())
    if tuned:
        near = min(tuned, key=lambda m: abs(m - M))
        # vLLM uses the nearest key at any distance; a config tuned for 64 tokens is a poor
        # guess at 1024 (seen: fp8 2x slower), so beyond a factor of 2 the default wins, and so it
        # does past the gemv path's range (seen: NVFP4 at 128 tokens ran its 64-token gemv entry
        # at 931 us, the default tiles at 542)
        cfg = tuned[near]
        limit = {"gemv": GEMV_TUNE_MAX_PAIRS, "fused": FUSED_TUNE_MAX_PAIRS}.get(cfg.get("path"))
        if max(near, M) <= 2 * min(near, M) and not (limit and M * K > limit):
            return cfg
    return default_config(M, E, K, H, I, fmt)


def save_tuned(E: int, I: int, fmt: str, device: str, configs: dict[int, dict[str, Any]],
               directory: Path | None = None) -> Path:
    d = directory or config_dirs()[0]
    d.mkdir(parents=True, exist_ok=True)
    p = d / config_file_name(E, I, fmt, device)
    # tuning some M keeps the others: those of the file being written, or else of the file in use
    # (the first one load_tuned finds, maybe in another directory)
    src = p if p.is_file() else tuned_file(E, I, fmt, device)
    data = json.loads(src.read_text()) if src else {}
    kept = {int(m): c for m, c in data.items() if m.isdigit()}
    stamps = {int(m): r for m, r in (data.get("tuned_on") or {}).items() if int(m) in kept}  # kept: as they were
    merged = {**kept, **configs}
    stamps.update({m: kernel_revision() for m in configs})
    out = {"tuned_on": {str(m): stamps[m] for m in sorted(stamps)}, **{str(m): merged[m] for m in sorted(merged)}}
    p.write_text(json.dumps(out, indent=1) + "\n")
    load_tuned.cache_clear()
    return p
