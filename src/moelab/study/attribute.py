"""Which flag value a failed launch died of: pure attribution, so a study stops relaunching it.

Real errors seldom name the flag and its value together ("trtllm-gen MoE kernels are SM100-only"
names neither `--moe-runner-backend` nor `flashinfer_trtllm`). After a death of a cause that is a
property of the configuration and not of the load (the engine refused it, the architecture gate,
a kernel resource limit, a model that cannot load), the culprit is found from, in order:
  1. a launch that worked and differs from the failed one in exactly one flag: that flag's value;
  2. the error's words: the value's own name parts (`trtllm`) and the words of its flag (`moe`,
     `fp4 gemm`, `attention`, with the engine's synonyms such as `mha`) in the evidence;
  3. when two suspects remain, a one-launch check of each alone over the base (the runner asks).
Load-dependent causes (a crash under load, an OOM at some concurrency) are never generalised.

    >>> f = {"--moe-runner-backend": "flashinfer_trtllm", "--attention-backend": "fa3"}
    >>> a = attribute(f, f, "unsupported_arch", ["ValueError: trtllm-gen MoE kernels are SM100-only"], [])
    >>> (a.flag, a.value, a.how)
    ('--moe-runner-backend', 'flashinfer_trtllm', 'words')
    >>> attribute(f, f, "unsupported_arch", ["this GPU is too old"], [({**f, "--attention-backend": "triton"}, 3)]).why
    'trial 3, the same but --attention-backend triton, came up'
    >>> attribute(f, f, "gpu_oom", ["CUDA out of memory"], []) is None  # load and memory: never generalised
    True
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

DETERMINISTIC = ("bad_args", "unsupported_arch", "kernel_resource_limit", "model_load_error")
# words an error uses for what a backend flag selects, beyond the flag's own name parts
SYNONYMS = {"attention": ("attn", "mha", "mla", "fmha", "flash attention", "flashattention"),
            "moe": ("expert", "experts", "fused_moe", "grouped gemm", "grouped_gemm"),
            "fp4": ("nvfp4", "fp4", "e2m1"), "fp8": ("fp8", "e4m3"), "gemm": ("gemm", "matmul")}
_FILLER = {"backend", "runner", "size", "use", "enable", "disable", "max", "min", "num"}


@dataclass
class Attribution:
    flag: str
    value: object
    how: str  # "differs" | "words" | "alone"
    why: str  # one sentence the report shows
    trial_ids: list[int] = field(default_factory=list)


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[^a-z0-9]+", text.lower()) if t}


def flag_words(flag: str) -> set[str]:
    """`--fp4-gemm-backend` -> {fp4, gemm} and their synonyms (filler words dropped)."""
    parts = _tokens(flag) - _FILLER
    out = set(parts)
    for p in parts:
        out.update(w for w in SYNONYMS.get(p, ()))
    return out


def scores(changes: tuple, evidence: list[str]) -> list[tuple[int, str, object]]:
    """(score, flag, value) per changed categorical flag, best first: value parts x2, flag words x3."""
    text = " ".join(evidence).lower()
    toks = _tokens(text)
    out = []
    for flag, value in changes:
        if not isinstance(value, str):
            continue
        vt = _tokens(value) - _FILLER
        fw = flag_words(flag)
        s = 2 * len({t for t in vt if len(t) >= 3 and t in toks})
        s += 3 * sum(1 for w in fw if (" " in w and w in text) or w in toks)
        s += 4 if flag in text and str(value).lower() in text else 0
        out.append((s, flag, value))
    return sorted(out, key=lambda x: -x[0])


def attribute(flags: dict, axes, cause: str, evidence: list[str], worked: list[dict], trial_id: int = 0
              ) -> Attribution | None:
    """The (flag, value) a deterministic launch failure is blamed on, or None (unknown, or ambiguous:
    see `suspects`). `flags` are the failed launch's full flags, `axes` the study's flags that may
    be blamed, `worked` (full flags, trial id) of this study's launches that came up."""
    if cause not in DETERMINISTIC:
        return None
    axes = set(axes)
    for ok, ok_id in worked:
        diff = [k for k in set(flags) | set(ok) if flags.get(k) != ok.get(k)]
        if len(diff) == 1 and diff[0] in axes and diff[0] in flags:
            k = diff[0]
            return Attribution(k, flags[k], "differs", f"trial {ok_id}, the same but {k} {ok.get(k, '(unset)')}, "
                                                       "came up", [trial_id, ok_id])
    ranked = scores(tuple((k, v) for k, v in flags.items() if k in axes), evidence)
    if ranked and ranked[0][0] >= 2 and (len(ranked) == 1 or ranked[0][0] > ranked[1][0]):
        s, k, v = ranked[0]
        return Attribution(k, v, "words", f"the error's words point to {k} {v} (attribution score {s} "
                                          f"against {ranked[1][0] if len(ranked) > 1 else 0} for the next flag)",
                           [trial_id])
    return None


def suspects(flags: dict, axes, cause: str, evidence: list[str], limit: int = 2) -> list[tuple[str, object]]:
    """The values worth a one-launch check alone when launches and words cannot decide: the best
    scored ones (every tie), at most `limit`."""
    if cause not in DETERMINISTIC:
        return []
    ranked = scores(tuple((k, v) for k, v in flags.items() if k in set(axes)), evidence)
    top = [(k, v) for s, k, v in ranked if s == ranked[0][0]] if ranked else []
    return (top if len(top) > 1 else [(k, v) for _, k, v in ranked])[:limit]
