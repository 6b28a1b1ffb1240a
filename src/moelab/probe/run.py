"""`run_probe` and `record_reference`: the probe end to end against a live server.

The prompt set is bundled (`moelab/data/probe_prompts.json`). A recorded reference keeps the exact
prompts it was made with (the long-context prompt depends on the model's context length), so a
comparison always sends byte-identical inputs.
"""
from __future__ import annotations

import json
import re
import time
from importlib import resources
from pathlib import Path

from moelab.probe.checks import Answer
from moelab.probe.http import RequestFailed, discover_model, greedy
from moelab.probe.judge import ProbeReport, PromptResult, judge, make_result

LONG_FALLBACK_TOKENS = 1500  # when /v1/models does not say max_model_len


def bundled_prompts() -> list[dict]:
    text = resources.files("moelab").joinpath("data/probe_prompts.json").read_text()
    return json.loads(text)["prompts"]


def render(prompts: list[dict], max_model_len: int | None) -> list[dict]:
    """Concrete prompts: multi-turn also as plain text, the long one sized to ~80% of the context.

    Token count of the long prompt is approximated at 1.3 tokens per word (the probe does not need
    the exact length, only "near the limit"; a server that rejects it gets a halved prompt)."""
    out = []
    for p in prompts:
        p = dict(p)
        if p.get("long"):
            limit = max_model_len or LONG_FALLBACK_TOKENS / 0.8
            target = int(0.8 * limit) - p["max_tokens"]
            words_per_par = len(p["paragraph"].split())
            reps = max(1, int(target / 1.3 / words_per_par))
            p["prompt"] = p["paragraph"] * reps + p["question"]
            p["messages"] = [{"role": "user", "content": p["prompt"]}]
        elif "messages" in p and "prompt" not in p:
            turns = [f"{m['role'].capitalize()}: {m['content']}" for m in p["messages"]]
            p["prompt"] = "\n".join(turns) + "\nAssistant:"
        elif "prompt" in p and "messages" not in p:
            p["messages"] = [{"role": "user", "content": p["prompt"]}]
        out.append(p)
    return out


# The context limit and the prompt's token count in a refusal, as vLLM, SGLang and moelab serve word it
# ("maximum context length is 64 tokens ... (62 in the prompt, 32 for the completion)"; "maximum context
# length of 2048 tokens ... 2000 tokens from the input"; "... and your request has 2000 input tokens").
_CTX_LIMIT = re.compile(r"maximum context length (?:is|of) (\d+)")
_CTX_PROMPT = re.compile(r"(\d+) (?:in the prompt|input tokens|tokens from the input)")


def fit_to_context(p: dict, message: str) -> dict | None:
    """The prompt made to fit a context the server says is too short for it, or None when the
    refusal does not say its limit and the prompt's length. The completion keeps its length where
    the context allows, else half the context; the prompt keeps its head, cut in proportion to its
    tokens. The fitted prompt is what is sent and what a recorded reference keeps."""
    limit, used = _CTX_LIMIT.search(message), _CTX_PROMPT.search(message)
    if not (limit and used):
        return None
    ctx, n_prompt = int(limit.group(1)), int(used.group(1))
    out = min(p["max_tokens"], max(ctx - n_prompt, ctx // 2))
    keep = ctx - out
    text = p["prompt"]
    if keep < n_prompt:
        text = text[:max(1, int(len(text) * keep / n_prompt * 0.9))]
    if out == p["max_tokens"] and text == p["prompt"]:
        return None  # nothing left to cut: the refusal is about something else
    return {**p, "prompt": text, "messages": [{"role": "user", "content": text}], "max_tokens": out,
            "fitted_to_context": ctx}


def _ask(base_url: str, model: str, p: dict, chat: bool, timeout_s: float,
         api_key: str | None = None) -> tuple[dict, PromptResult]:
    """Send one prompt. One the server refuses as longer than its context is fitted to the limit the
    refusal states; a long prompt refused without one is halved, up to 3 times."""
    for _ in range(4):
        try:
            return p, make_result(p["id"], p.get("kind", ""), greedy(base_url, model, p, chat=chat, timeout_s=timeout_s,
                                                                       api_key=api_key))
        except RequestFailed as e:
            if e.status in (401, 403, 404):  # the whole probe would fail the same way: say it once
                raise
            fitted = fit_to_context(p, str(e)) if e.status == 400 else None
            if fitted is not None:
                p = fitted
                continue
            if not (p.get("long") and e.status == 400 and len(p["prompt"]) > 200):
                return p, make_result(p["id"], p.get("kind", ""), None, error=str(e))
            body = p["paragraph"] * max(1, p["prompt"].count(p["paragraph"]) // 2)
            p = {**p, "prompt": body + p["question"], "messages": [{"role": "user", "content": body + p["question"]}]}
    return p, make_result(p["id"], p.get("kind", ""), None, error="long prompt rejected even when shortened")


def collect(base_url: str, model: str | None, prompts: list[dict] | None, *, chat: bool,
            timeout_s: float, api_key: str | None = None) -> tuple[str, list[dict], list[PromptResult]]:
    """Ask every prompt. Raises ServerUnreachable when the server does not answer at all, and
    RequestFailed when it refuses every request alike (401/403: an API key; 404: not this API)."""
    found, mlen = discover_model(base_url, timeout_s=min(timeout_s, 10.0), api_key=api_key)
    model = model or found
    sent, results = [], []
    for p in prompts or render(bundled_prompts(), mlen):
        p2, r = _ask(base_url, model, p, chat, timeout_s, api_key)
        sent.append(p2)
        results.append(r)
    return model, sent, results


def load_reference(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
        doc["prompts"] and doc["answers"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a moelab probe reference ({e}); record one with "
                         f"`moelab probe --url URL --record {path}`") from None
    return doc


def run_probe(base_url: str, model: str | None = None, reference: Path | None = None, timeout_s: float = 60.0,
              *, weight_format: str | None = None, chat: bool = False, api_key: str | None = None) -> ProbeReport:
    """Probe a live server; with `reference`, compare against it, else only the absolute checks."""
    t0 = time.perf_counter()
    ref = load_reference(reference) if reference is not None else None
    if ref is not None:
        chat = bool(ref.get("chat", chat))  # answers are only comparable in the mode they were made in
    model, _, results = collect(base_url, model, ref["prompts"] if ref else None, chat=chat, timeout_s=timeout_s,
                                api_key=api_key)
    ref_answers = {k: Answer.model_validate(v) for k, v in ref["answers"].items()} if ref else None
    verdict = judge(results, weight_format=weight_format, reference=ref_answers)
    note = "compared with the reference" if ref else "no reference: only the absolute checks ran"
    return ProbeReport(verdict=verdict, model=model, base_url=base_url, weight_format=weight_format or "bf16",
                       reference_used=ref is not None, reference_path=str(reference) if reference else None,
                       prompts=results, elapsed_s=time.perf_counter() - t0, note=note)


def record_reference(base_url: str, model: str | None, path: Path, timeout_s: float = 60.0, *,
                     weight_format: str | None = None, chat: bool = False, api_key: str | None = None) -> ProbeReport:
    """Probe (absolute checks) and, only when that passes, write the answers as the reference."""
    t0 = time.perf_counter()
    model, sent, results = collect(base_url, model, None, chat=chat, timeout_s=timeout_s, api_key=api_key)
    verdict = judge(results, weight_format=weight_format)
    rep = ProbeReport(verdict=verdict, model=model, base_url=base_url, weight_format=weight_format or "bf16",
                      reference_used=False, prompts=results, elapsed_s=time.perf_counter() - t0,
                      note="recording: only the absolute checks ran")
    if verdict.ok:
        doc = {"moelab_probe_reference": 1, "model": model, "base_url": base_url, "chat": chat,
               "weight_format": weight_format or "bf16", "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "prompts": sent, "answers": {r.id: r.answer.model_dump() for r in results if r.error is None}}
        Path(path).write_text(json.dumps(doc, indent=1))
        rep.reference_path = str(path)
        rep.note = f"recorded {len(doc['answers'])} answers to {path}"
    return rep
