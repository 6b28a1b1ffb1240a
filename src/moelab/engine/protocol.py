"""The OpenAI wire format: request validation into `SamplingParams`, and response bodies.

Validation raises `ApiError(status, message, param)`, which the server turns into OpenAI's error
JSON `{"error": {"message", "type", "param", "code"}}`. Pure functions, no sockets, no torch.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from moelab.engine.scheduler import SamplingParams

MAX_TOP_LOGPROBS = 20
CHAT_DEFAULT_MAX_TOKENS = 256  # OpenAI's chat default is "up to the context"; reservation makes that costly


class ApiError(Exception):
    TYPES = {400: "invalid_request_error", 404: "not_found_error", 500: "internal_server_error",
             503: "overloaded_error", 429: "overloaded_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code or self.status}}


@dataclass
class Parsed:
    prompts: list[list[int]]  # token ids of each prompt (one choice each)
    params: list[SamplingParams]
    stream: bool
    include_usage: bool


def _num(body: dict, key: str, kind: type, default, lo=None, hi=None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float) if kind is float else int):
        raise ApiError(400, f"'{key}' must be {'a number' if kind is float else 'an integer'}, got {v!r}", key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bound = (f"between {lo} and {hi}" if lo is not None and hi is not None
                 else f"at least {lo}" if lo is not None else f"at most {hi}")
        raise ApiError(400, f"'{key}' must be {bound}, got {v!r}", key)
    return kind(v)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {v!r}", key)
    return v


def check_model(body: dict, served: str) -> None:
    m = body.get("model")
    if m is not None and m != served:
        raise ApiError(404, f"The model '{m}' does not exist; this server serves '{served}' (see GET /v1/models)",
                       "model", "model_not_found")


def _common(body: dict, n_prompt: int, ctx: int, default_max: int, logprobs: int | None) -> SamplingParams:
    if _num(body, "n", int, 1, 1, 1) != 1:
        raise ApiError(400, "'n' must be 1", "n")
    explicit = body.get("max_tokens", body.get("max_completion_tokens"))
    key = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
    max_tokens = _num({key: explicit}, key, int, None, 1)
    if n_prompt == 0:
        raise ApiError(400, "the prompt is empty", "prompt")
    room = ctx - n_prompt
    if max_tokens is None:
        max_tokens = min(default_max, room)
    if room < 1 or max_tokens > room:
        raise ApiError(400, f"This model's maximum context length is {ctx} tokens. However, you requested "
                       f"{n_prompt + max(max_tokens, 1)} tokens ({n_prompt} in the prompt, {max(max_tokens, 1)} for the "
                       "completion). Please reduce the prompt or max_tokens.", "prompt", "context_length_exceeded")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of strings, got {body.get('stop')!r}", "stop")
    min_tokens = _num(body, "min_tokens", int, 0, 0, max_tokens)
    return SamplingParams(max_tokens=max_tokens, temperature=_num(body, "temperature", float, 1.0, 0.0, 2.0),
                          top_p=_num(body, "top_p", float, 1.0, 1e-6, 1.0), seed=_num(body, "seed", int, None),
                          stop=tuple(stop), logprobs=logprobs, ignore_eos=_bool(body, "ignore_eos"),
                          min_tokens=min_tokens)


def _stream_opts(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    return stream, bool(opts.get("include_usage"))


def parse_completion(body: dict, tok, ctx: int) -> Parsed:
    p = body.get("prompt")
    if isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(t, int) for t in p)):
        p = [p]
    if not isinstance(p, list) or not p or not all(isinstance(x, (str, list)) for x in p):
        raise ApiError(400, "'prompt' must be a string, a list of strings, or a list of token ids", "prompt")
    if _bool(body, "echo"):
        raise ApiError(400, "'echo' is not supported by the embedded engine", "echo")
    logprobs = _num(body, "logprobs", int, None, 0, MAX_TOP_LOGPROBS)
    prompts = []
    for x in p:
        ids = tok.encode(x) if isinstance(x, str) else x
        if not all(isinstance(t, int) and 0 <= t < tok_limit(tok) for t in ids):
            raise ApiError(400, f"prompt token ids must be integers in 0..{tok_limit(tok) - 1}", "prompt")
        prompts.append(ids)
    params = [_common(body, len(ids), ctx, 16, logprobs) for ids in prompts]
    return Parsed(prompts, params, *_stream_opts(body))


def tok_limit(tok) -> int:
    return getattr(tok, "model_vocab_size", tok.vocab_size)


def parse_chat(body: dict, tok, ctx: int) -> Parsed:
    from moelab.engine.tokenizer import chat_prompt

    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    flat = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            raise ApiError(400, f"messages[{i}] needs a role of system, user, assistant, tool or developer", "messages")
        c = m.get("content")
        if isinstance(c, list):  # content parts: keep the text ones
            c = "".join(part.get("text", "") for part in c if isinstance(part, dict) and part.get("type") == "text")
        if not isinstance(c, str):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", "messages")
        flat.append({"role": m["role"], "content": c})
    lp = None
    if _bool(body, "logprobs"):
        lp = _num(body, "top_logprobs", int, 0, 0, MAX_TOP_LOGPROBS)
    elif body.get("top_logprobs") is not None:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    ids = tok.encode(chat_prompt(flat))
    return Parsed([ids], [_common(body, len(ids), ctx, CHAT_DEFAULT_MAX_TOKENS, lp)], *_stream_opts(body))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def token_str(tok, tid: int) -> str:
    """A token as text; a byte that is not valid UTF-8 on its own is spelled `bytes:\\xNN` (OpenAI's habit)."""
    b = tok.token_bytes(tid)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{c:02x}" for c in b)


def completion_logprobs(tok, entries: list) -> dict[str, Any]:
    """Legacy completions format: tokens, token_logprobs, top_logprobs [{token: logprob}], text_offset."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, lp, top, off in entries:
        out["tokens"].append(token_str(tok, tid))
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({token_str(tok, t): v for t, v in (top or [])})
        out["text_offset"].append(off)
    return out


def chat_logprobs(tok, entries: list) -> dict[str, Any]:
    """Chat format: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    def item(t: int, v: float) -> dict[str, Any]:
        return {"token": token_str(tok, t), "logprob": v, "bytes": list(tok.token_bytes(t))}

    return {"content": [{**item(tid, lp), "top_logprobs": [item(t, v) for t, v in (top or [])]}
                        for tid, lp, top, _ in entries]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
