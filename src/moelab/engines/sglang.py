"""SGLang adapter: `python -m sglang.launch_server --model-path M --host H --port P ...`.

Flag names are SGLang's own. The python that runs SGLang is $MOELAB_SGLANG_PYTHON, else this
interpreter when it can import sglang. SGLang opens ports of its own (scheduler, detokenizer,
NCCL) besides --port; moelab picks, watches and probes --port only, and a launch that finds one of
the others taken is diagnosed from its log (port_in_use).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

from moelab.engines.base import with_host_port
from moelab.engines.catalogued import CataloguedAdapter
from moelab.engines.flags import Catalogue, load_or_build
from moelab.spec import LaunchSpec

_ENTRY = ["-m", "sglang.launch_server"]


@lru_cache(maxsize=4)
def _version_in(python: str) -> str | None:
    code = "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept Exception: pass"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def find_sglang() -> tuple[str, str] | None:
    """(python, sglang version) of the SGLang this machine would run, or None."""
    py = os.environ.get("MOELAB_SGLANG_PYTHON")
    if py:
        v = _version_in(py)
        return (py, v) if v else None
    if importlib.util.find_spec("sglang") is None:
        return None
    v = _version_in(sys.executable)
    return (sys.executable, v) if v else None


def _strip_prefix(args: list[str]) -> list[str]:
    """Accept `python -m sglang.launch_server ...`, `sglang serve ...` or just the flags."""
    args = list(args)
    if len(args) >= 3 and Path(args[0]).name.startswith("python") and args[1:3] == _ENTRY:
        return args[3:]
    if args[:2] == _ENTRY:
        return args[2:]
    if args and Path(args[0]).name == "sglang":
        args = args[1:]
        return args[1:] if args[:1] == ["serve"] else args
    return args


class SglangAdapter(CataloguedAdapter):
    name: ClassVar[str] = "sglang"
    running_limit_flag: ClassVar[str | None] = "--max-running-requests"
    kind_flags: ClassVar[dict[str, str]] = {
        "--moe-runner-backend": "moe_runner", "--fp4-gemm-backend": "fp4_gemm", "--fp8-gemm-backend": "fp8_gemm",
        "--attention-backend": "attention", "--prefill-attention-backend": "attention",
        "--decode-attention-backend": "attention"}
    memory_fraction_flag: ClassVar[str] = "--mem-fraction-static"
    # SGLang sizes the default by GPU memory and TP (about 0.8-0.9 on 80-192 GB GPUs); moelab assumes
    # this value when the flag is absent and says so in the forecast.
    memory_fraction_default: ClassVar[float] = 0.88
    flag_roles: ClassVar[dict[str, str]] = dict(
        tp="--tp-size", dp="--dp-size", ep="--ep-size", fraction="--mem-fraction-static", kv="--kv-cache-dtype",
        ctx="--context-length", quant="--quantization", dtype="--dtype", model="--model-path")
    # argparse types of SGLang's ServerArgs; the fraction is a share of the GPU's memory
    value_rules: ClassVar[dict[str, tuple]] = {
        "--tp-size": ("int", 1, None, False), "--dp-size": ("int", 1, None, False), "--ep-size": ("int", 1, None, False),
        "--pp-size": ("int", 1, None, False), "--mem-fraction-static": ("float", 0, 1, True),
        "--max-running-requests": ("int", 1, None, False), "--cuda-graph-max-bs": ("int", 1, None, False),
        "--context-length": ("int", 1, None, False), "--max-total-tokens": ("int", 1, None, False),
        "--chunked-prefill-size": ("int", -1, None, False), "--max-prefill-tokens": ("int", 1, None, False),
        "--random-seed": ("int", None, None, False), "--port": ("int", 1, 65535, False)}
    # SGLang's launch phases as its log announces them (sglang#8741 shows the sequence).
    phase_patterns: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"Load weight begin|Loading safetensors checkpoint shards", "loading_weights"),
        (r"KV Cache is allocated|Memory pool end", "kv_cache"),
        (r"Capture cuda graph begin|Capturing batches|Capture cuda graph end", "cuda_graph"),
        (r"The server is fired up and ready to roll|Uvicorn running on", "serving"),
    )

    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        found = find_sglang()
        if found is None:
            raise FileNotFoundError("sglang is not installed here: pip install sglang (needs a CUDA GPU), "
                                    "or set MOELAB_SGLANG_PYTHON to the python of an environment that has it")
        args = _strip_prefix(spec.args)
        return [found[0], *_ENTRY, *with_host_port(args, spec.host, port)], {"PYTHONUNBUFFERED": "1"}

    def version(self) -> str | None:
        found = find_sglang()
        return found[1] if found else None

    def engine_python(self) -> str | None:
        found = find_sglang()
        return found[0] if found else None

    def model_path(self, args: list[str]) -> str | None:
        from moelab.engines.flags import parse_args

        v = parse_args(_strip_prefix(args), self.flag_catalogue()).values.get("--model-path")
        return v if isinstance(v, str) else None

    def flag_catalogue(self) -> Catalogue:
        found = find_sglang()
        if found is None:
            return load_or_build(self.name, None, None)
        return load_or_build(self.name, found[1], [found[0], *_ENTRY, "--help"])

    def engine_args(self, args: list[str]) -> list[str]:
        return _strip_prefix(args)

    def split(self, argv: list[str]) -> list[str] | None:
        exe = Path(argv[0]).name if argv else ""
        if exe.startswith("python") and argv[1:3] == _ENTRY:
            return argv[3:]
        if exe == "sglang":
            return argv[2:] if argv[1:2] == ["serve"] else argv[1:]
        return None
