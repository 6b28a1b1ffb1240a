"""The probe's side of the wire: discover the model, send one greedy request, normalise the answer.

Stdlib only (urllib), synchronous: the probe sends a handful of requests one after another, so a
plain blocking client is the simplest correct thing. Both answer formats are normalised into
`checks.Answer`: legacy completions (`logprobs.tokens / token_logprobs / top_logprobs`) and chat
(`logprobs.content[i].{token, logprob, top_logprobs[]}`).
"""
from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from moelab.probe.checks import Answer, is_finite
from moelab.secrets import auth_headers


class ServerUnreachable(ConnectionError):
    """The URL does not answer at all (refused, DNS, timeout): bad usage, not a verdict."""


class RequestFailed(RuntimeError):
    """The server answered, but not with a usable completion (HTTP error, invalid JSON)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _call(url: str, body: dict | None, timeout_s: float, api_key: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **auth_headers(api_key)},
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode(errors="replace")
        raise RequestFailed(f"HTTP {e.code} from {url}: {detail}", status=e.code) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ServerUnreachable(f"cannot reach {url}: {reason}") from None
    try:
        return json.loads(raw)  # Python's json accepts the NaN / Infinity literals servers emit
    except ValueError:
        raise RequestFailed(f"invalid JSON from {url}: {raw[:120]!r}") from None


def discover_model(base_url: str, timeout_s: float = 10.0, api_key: str | None = None) -> tuple[str, int | None]:
    """(first model id, its max_model_len if the server says) from GET /v1/models."""
    doc = _call(base_url.rstrip("/") + "/v1/models", None, timeout_s, api_key)
    try:
        first = doc["data"][0]
    except (KeyError, IndexError, TypeError):
        raise RequestFailed(f"/v1/models lists no model: {str(doc)[:120]}") from None
    mlen = first.get("max_model_len") or first.get("context_length")
    return str(first["id"]), int(mlen) if mlen else None


def _num(x: Any) -> tuple[float | None, bool]:
    """(value as float, was it non-finite) for a logprob that may be a number, None or a string."""
    if x is None:
        return None, False
    if not is_finite(x):
        return math.nan, True
    try:
        return float(x), False
    except (TypeError, ValueError):
        return math.nan, True


def parse_answer(doc: dict, chat: bool) -> Answer:
    try:
        choice = doc["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise RequestFailed(f"response has no choices: {str(doc)[:160]}") from None
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    lp = choice.get("logprobs") or {}
    bad = False
    tokens: list[str] = []
    chosen: list[float | None] = []
    tops: list[dict[str, float]] = []
    if chat:  # {"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}
        for item in lp.get("content") or []:
            tokens.append(str(item.get("token", "")))
            v, b = _num(item.get("logprob"))
            chosen.append(v)
            bad |= b
            top: dict[str, float] = {}
            for alt in item.get("top_logprobs") or []:
                v, b = _num(alt.get("logprob"))
                top[str(alt.get("token", ""))] = math.nan if v is None else v
                bad |= b
            tops.append(top)
    else:  # legacy: parallel lists
        tokens = [str(t) for t in lp.get("tokens") or []]
        for x in lp.get("token_logprobs") or []:
            v, b = _num(x)
            chosen.append(v)
            bad |= b
        for top in lp.get("top_logprobs") or []:
            d: dict[str, float] = {}
            for k, x in (top or {}).items():
                v, b = _num(x)
                d[str(k)] = math.nan if v is None else v
                bad |= b
            tops.append(d)
    return Answer(text=text or "", tokens=tokens, token_logprobs=chosen, top_logprobs=tops,
                  finish_reason=choice.get("finish_reason"), raw_nonfinite=bad)


def greedy(base_url: str, model: str, prompt: dict, *, chat: bool, timeout_s: float, top_k: int = 5,
           api_key: str | None = None) -> Answer:
    """One greedy request for a prompt dict holding `prompt` (text) or `messages`, and `max_tokens`."""
    base = base_url.rstrip("/")
    common = {"model": model, "max_tokens": prompt["max_tokens"], "temperature": 0.0, "top_p": 1.0, "seed": 0}
    if chat:
        body = {**common, "messages": prompt["messages"], "logprobs": True, "top_logprobs": top_k}
        return parse_answer(_call(base + "/v1/chat/completions", body, timeout_s, api_key), chat=True)
    body = {**common, "prompt": prompt["prompt"], "logprobs": top_k}
    return parse_answer(_call(base + "/v1/completions", body, timeout_s, api_key), chat=False)
