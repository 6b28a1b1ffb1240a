"""Which engine wrote a log, guessed from its own words, for `moelab diagnose` without `--engine`.

Each engine leaves marks no other does: module paths in its tracebacks, the prefixes of its
loggers and worker processes, its executable's name. The first lines decide most logs; the whole
log is scored, and the engine with the most marks wins (none: no engine-specific rules apply).

    >>> guess_engine(["(EngineCore_DP0 pid=41) ERROR 11-30 20:07:21 [core.py:708] EngineCore failed to start."])
    'vllm'
    >>> guess_engine(["[2025-03-07 23:50:27 TP0] Load weight begin. avail mem=22.46 GB"])
    'sglang'
"""
from __future__ import annotations

import re

# engine -> marks in its logs (regexes, searched per line)
MARKS: dict[str, tuple[str, ...]] = {
    "vllm": (r"\bvllm[./]", r"\(EngineCore(?:_DP\d+)? pid=", r"\(VllmWorker", r"\bvLLM\b", r"vllm serve",
             r"\((?:RayWorkerWrapper|APIServer|Worker(?:_TP\d+)?) pid=\d+\)", r"\] Avg prompt throughput: [\d.]+ tokens/s"),
    "sglang": (r"\bsglang[./]", r"\bsgl_kernel\b", r"\[[\d\- :]+ (?:TP|DP|EP)\d+(?: \w+\d+)*\]",
               r"launch_server", r"Scheduler hit an exception"),
    "embedded": (r"\bmoelab\.engine\b", r"^moelab serve: "),
    "llama.cpp": (r"\bllama_model_load", r"\bggml_", r"\bllama-server\b", r"\bllama_init_from", r"\bGGML_ASSERT"),
    "ollama": (r"\bollama\b", r"level=(?:INFO|WARN|ERROR) source=", r"msg=\"(?:llama runner|server)"),
    "tgi": (r"text_generation_(?:launcher|router|server)", r"text-generation-(?:launcher|router)"),
    "lmdeploy": (r"\blmdeploy\b", r"\bturbomind\b"),
    "tensorrt-llm": (r"\btensorrt_llm\b", r"\[TRT-LLM\]", r"\[TensorRT-LLM\]", r"\btrtllm"),
    "ray": (r"\braylet\b", r"\bray::", r"RayActorError|RayTaskError", r"\(pid=\d+, ip="),
}
_COMPILED = {e: [re.compile(p) for p in ps] for e, ps in MARKS.items()}


def guess_engine(lines: list[str], max_lines: int = 4000) -> str | None:
    """The engine with the most marks in the log (ties: the first in MARKS), or None."""
    score = dict.fromkeys(_COMPILED, 0)
    head = lines[:max_lines] + (lines[-max_lines:] if len(lines) > max_lines else [])
    for line in head:
        for engine, rxs in _COMPILED.items():
            if any(rx.search(line) for rx in rxs):
                score[engine] += 1
    best = max(score, key=lambda e: score[e])
    return best if score[best] else None
