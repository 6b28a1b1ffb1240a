"""HTTP checks a supervisor makes: /health, the served model name, one real generated token.

Stdlib only (urllib), short timeouts; every check returns a `Check` (ok, note, HTTP status)
instead of raising, so a refused connection, a timeout and a bad answer are all just evidence.
An API key, when given, goes as a bearer token and never into a note.
"""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import NamedTuple

from moelab.secrets import auth_headers


class Check(NamedTuple):
    ok: bool
    note: str
    status: int | None = None  # the HTTP status, when the server answered

    @property
    def auth_refused(self) -> bool:
        return self.status in (401, 403)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _request(url: str, body: dict | None, timeout: float, api_key: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **auth_headers(api_key)})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(1 << 20)
    except urllib.error.HTTPError as e:
        return e.code, e.read(1 << 16) if e.fp else b""


def health(base: str, path: str = "/health", timeout: float = 2.0, api_key: str | None = None) -> Check:
    try:
        code, _ = _request(base + path, None, timeout, api_key)
        return Check(code == 200, f"GET {path} -> {code}", code)
    except (OSError, ValueError) as e:
        return Check(False, f"GET {path} failed: {getattr(e, 'reason', e)}")


def served_model(base: str, timeout: float = 2.0, api_key: str | None = None) -> str | None:
    try:
        code, body = _request(base + "/v1/models", None, timeout, api_key)
        data = json.loads(body).get("data") or []
        return data[0]["id"] if code == 200 and data else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def one_token(base: str, model: str | None, path: str = "/v1/completions", timeout: float = 30.0,
              api_key: str | None = None) -> Check:
    """Generate one greedy token; ok only when the answer really carries a generated token."""
    body = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    if model:
        body["model"] = model
    try:
        code, raw = _request(base + path, body, timeout, api_key)
    except (OSError, ValueError) as e:
        return Check(False, f"POST {path} failed: {getattr(e, 'reason', e)}")
    if code != 200:
        return Check(False, f"POST {path} -> {code}: {raw[:200].decode(errors='replace')}", code)
    try:
        data = json.loads(raw)
        text = data["choices"][0].get("text")
        n = (data.get("usage") or {}).get("completion_tokens")
    except (ValueError, KeyError, IndexError, TypeError):
        return Check(False, f"POST {path} -> 200 but not an OpenAI completion: {raw[:200].decode(errors='replace')}",
                     code)
    if not text and not n:
        return Check(False, f"POST {path} -> 200 but no token was generated", code)
    return Check(True, f"POST {path} -> 200, first token {text!r}", code)
