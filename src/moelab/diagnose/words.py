"""Cause words scored over the whole log: layer 3, used when no rule and no structure decided.

Each cause has words that people and programs use around it; a log that never says "CUDA out of
memory" verbatim may still say "OOM" and "GPU" on one line and "KV cache" on another. Scores add
up per cause over lines that look like errors (or every line of a short log); the best cause wins
when it clearly leads, and the scores become the alternatives' confidences.

    >>> score(["ERROR: the GPU ran OOM while growing the KV cache"])[0][0].value
    'gpu_oom'
"""
from __future__ import annotations

import re

from moelab.spec import Cause

# GPU generations and parts named in "not supported on X"
_ARCHES = (r"kepler|maxwell|pascal|volta|turing|ampere|ada(?: lovelace)?|hopper|blackwell|gfx\d{3,4}\w?|cdna\d?|rdna\d?|"
           r"mi\d{2,3}x?|[vpt]100|t4|a10g?|a100|h100|h200|b200|l4|l40s?|rtx ?\d{4}|gtx ?\d{3,4}|sm_?\d{2,3}")
# cause -> (pattern, weight); patterns are searched case-insensitively in each line
WORDS: dict[Cause, tuple[tuple[str, float], ...]] = {
    Cause.gpu_oom: ((r"\b(?:cuda|gpu|vram|device|hip|mps|xpu|npu|metal|rocm|vulkan)\b.*\b(?:oom|out of memory)\b|"
                     r"\b(?:oom|out of memory)\b.*\b(?:cuda|gpu|vram|device)\b", 3),
                    (r"\bkv[ -]?cache\b.*\b(?:too small|not enough|insufficient|no room|exceed)", 2), (r"\bcudaMalloc\b", 2),
                    (r"\b(?:not enough|insufficient)\b.*\b(?:gpu|vram|device|video) memory\b|\bfail\w* to allocate\b.*\b(?:kv[ -]?cache|gpu|vram|cuda|device)\b", 3),
                    # "Insufficient VRAM for model and cache", "ran out of VRAM"
                    (r"\b(?:not enough|insufficient|out of|ran out of|exceeds?(?: the)?(?: available)?)\s+(?:free\s+)?vram\b", 3),
                    # TensorRT: "Requested amount of GPU memory (N bytes) could not be allocated", "Error Code 2: OutOfMemory"
                    (r"\b(?:gpu|device|cuda|vram) memory\b.*\b(?:could not|cannot|can't|unable to) be allocated\b|"
                     r"\bError Code \d+: OutOfMemory\b", 3),
                    # a device allocator's arena (ONNX Runtime's BFCArena, TensorFlow's GPU_0_bfc) that could not grow
                    (r"\b(?:bfc ?arena|gpu_\d+_bfc|cuda ?arena)\b.*\b(?:fail\w* to allocate|ran out of memory|out of memory)\b", 3)),
    Cause.host_oom: ((r"\b(?:system|host|cpu) memory\b|\bRAM\b.*\b(?:exhaust|not enough|insufficient|out of)", 2),
                     (r"\boom[- ]?kill", 3), (r"cannot allocate memory|\bENOMEM\b", 2),
                     (r"\balloc\w*\b.*\b(?:system|host|cpu) (?:ram|memory)\b", 2)),
    Cause.port_in_use: ((r"\baddress (?:already )?in use\b|\bport\b.*\b(?:in use|taken|busy|occupied)\b", 3),
                        (r"\b(?:bind|listen)\b.*\b(?:fail|error|denied)|\bfail\w* to (?:bind|listen)\b", 2)),
    Cause.startup_timeout: ((r"\btime[sd]? ?out\b.*\b(?:start|ready|readiness|startup|load|launch|health)", 3),
                            (r"\b(?:start|ready|startup|load|initiali[sz])\w*\b.*\btime[sd]? ?out\b", 3), (r"not ready (?:after|within)", 3),
                            (r"\b(?:did not|didn't|failed to) (?:respond|answer|become ready)\b.*\b(?:in|within|after) \d+", 2),
                            (r"\bhealth ?check\b.*\b(?:fail|not ready|unhealthy)", 2)),
    Cause.hang: ((r"\b(?:stuck|hung|hangs?|hanging|deadlock|freez\w*|no progress|not making progress)\b", 2),
                 (r"\bwatchdog\b", 2), (r"\bnot responding\b", 1),
                 (r"\bno (?:new )?tokens? (?:generated|produced)\b|\bno output for \d+", 2)),
    Cause.numerical_nan: ((r"\bnan\b|\binf\b.*\bnan\b|non-finite|not finite", 3),),
    Cause.killed_external: ((r"\bsigterm\b|\bterminated\b|\bsignal 15\b|\bevict\w*|\bpreempt\w*", 2), (r"\bkilled\b", 1)),
    Cause.native_crash: ((r"\bsegfault|segmentation fault|core dumped|\bsigsegv\b|\bsigabrt\b|\babort(?:ed)?\b|stack smashing|"
                          r"illegal instruction|bus error", 3),),
    Cause.unsupported_arch: ((r"\b(?:not|no longer|isn.t|un)\s?support\w*\b.*\b(?:gpu|device|arch\w*|sm_?\d+|compute capability|"
                              r"hardware|platform|cuda capability)", 3), (r"\bonly (?:supported|works|runs) on\b.*\b(?:gpus?|devices?|sm_?\d+|compute capability|"
                              r"ampere|hopper|blackwell|ada|turing|volta)\b", 3), (r"\bcompute capability\b", 2), (r"\bsm_?\d{2,3}\b", 1),
                             # "PagedKV Context FMHA is not supported on Volta": a feature refused on a named GPU generation
                             (r"\b(?:not|isn.t|un)\s?(?:yet )?support\w*\b (?:on|for|by) (?:the )?(?:nvidia |amd )?(?:"
                              + _ARCHES + r")\b", 3),
                             (r"no kernel image", 3)),
    Cause.bad_args: ((r"\bunrecognized (?:argument|option)|\binvalid (?:value|choice|argument|option)|\bunknown (?:argument|option|flag)",
                      3), (r"\bmust be\b.*(?:[<>]|\b(?:less|greater|between|divisible|positive|smaller|larger|at (?:least|most))\b)", 2),
                     (r"\bnot divisible\b|\bincompatible\b.*\b(?:flag|option|argument|setting)", 2), (r"^usage: ", 2),
                     # a feature switched on where it cannot be: "Paged KV cache is not supported for this model yet",
                     # "When KV cache block reuse is set, model has to be built with paged context FMHA support"
                     (r"\bis not (?:yet )?supported (?:for|with|by) (?:this|the) (?:model|checkpoint|architecture|quantization|engine)\b|"
                      r"\bwhen\b.{3,80}\b(?:is|are) (?:set|enabled|on|used|true)\b.{0,80}\b(?:must|has to|have to|needs? to|requires?)\b", 2),
                     # a malformed address in a setting ("WARN invalid port", a host with a colon or a stray character)
                     (r"\binvalid (?:port|host|hostname|address|url|endpoint)\b|"
                      r"\blookup (?:[^\s:]*[:%\\\u3000-\uffff][^\s]*|[A-Za-z]): no such host\b", 3)),
    Cause.model_load_error: ((r"\b(?:error|fail\w*) (?:loading|to load|to read)\b.*\b(?:model|weights?|checkpoint|tokenizer|gguf)", 3),
                             (r"unknown (?:model )?architecture|architectures? .* not supported|trust[_ -]remote[_ -]code", 3),
                             (r"invalid magic|corrupt\w*\b.*\b(?:file|model|weights)", 2)),
    Cause.jit_compile_error: ((r"\b(?:compil(?:e|ation)|build)\b.*\b(?:fail|error)", 2), (r"\bninja\b|\bnvcc\b|\bptxas\b|\bnvrtc\b", 2),
                              (r"cannot find -l\w+|undefined reference|collect2: error|\bld returned\b", 3)),
    Cause.collective_error: ((r"\bnccl\b|\bc10d\b|\bgloo\b|\brendezvous\b|\ball[-_ ]?reduce\b|\bprocessgroup", 2),
                             (r"\bcollective\b", 1)),
    Cause.kernel_resource_limit: ((r"\bshared memory\b.*\b(?:exceed|limit|too much|required|(?:more|larger|greater) than)|"
                                   r"\btoo many resources\b|\bout of resources?\b|\bregisters?\b.*\b(?:exceed|too many)|"
                                   r"\bmax\w*SharedMemory\w*", 3),),
    Cause.illegal_memory_access: ((r"illegal (?:memory access|address|instruction)|device-side assert|misaligned address|"
                                   r"\bxid\b|launch failure", 3),),
    Cause.orphan_leak: ((r"\borphan\w*|\bzombie\b|\bleak\w*\b|left behind|still (?:running|alive)|reparent", 2),),
}
_COMPILED = {c: [(re.compile(p, re.I), w) for p, w in ws] for c, ws in WORDS.items()}
_ERRORISH = re.compile(r"error|fail|fatal|exception|killed|abort|crash|timeout|timed out|refus|denied|warn|cannot|"
                       r"unable|not supported|invalid|stuck|nan\b", re.I)


def score(texts: list[str], max_lines: int = 20000) -> list[tuple[Cause, float, int]]:
    """[(cause, score, first line)] best first; only lines that read like errors count, except in
    short logs (a few pasted lines are all evidence)."""
    short = len(texts) <= 12
    totals: dict[Cause, float] = {}
    first: dict[Cause, int] = {}
    for n, t in enumerate(texts[:max_lines], 1):
        if not t or (not short and not _ERRORISH.search(t)):
            continue
        for cause, pats in _COMPILED.items():
            w = max((wt for rx, wt in pats if rx.search(t)), default=0)
            if w:
                totals[cause] = totals.get(cause, 0) + w
                first.setdefault(cause, n)
    return sorted(((c, s, first[c]) for c, s in totals.items()), key=lambda x: (-x[1], x[2]))
