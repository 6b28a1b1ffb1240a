"""HTTP checks a supervisor makes: /health, the served model name, one real generated token.

Stdlib only (urllib), short timeouts; every function returns (ok, note) instead of raising, so a
refused connection, a timeout and a bad answer are all just evidence.
"""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _request(url: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(1 << 20)
    except urllib.error.HTTPError as e:
        return e.code, e.read(1 << 16) if e.fp else b""


def health(base: str, path: str = "/health", timeout: float = 2.0) -> tuple[bool, str]:
    try:
        code, _ = _request(base + path, None, timeout)
        return code == 200, f"GET {path} -> {code}"
    except (OSError, ValueError) as e:
        return False, f"GET {path} failed: {getattr(e, 'reason', e)}"


def served_model(base: str, timeout: float = 2.0) -> str | None:
    try:
        code, body = _request(base + "/v1/models", None, timeout)
        data = json.loads(body).get("data") or []
        return data[0]["id"] if code == 200 and data else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def one_token(base: str, model: str | None, path: str = "/v1/completions", timeout: float = 30.0) -> tuple[bool, str]:
    """Generate one greedy token; ok only when the answer really carries a generated token."""
    body = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    if model:
        body["model"] = model
    try:
        code, raw = _request(base + path, body, timeout)
    except (OSError, ValueError) as e:
        return False, f"POST {path} failed: {getattr(e, 'reason', e)}"
    if code != 200:
        return False, f"POST {path} -> {code}: {raw[:200].decode(errors='replace')}"
    try:
        data = json.loads(raw)
        text = data["choices"][0].get("text")
        n = (data.get("usage") or {}).get("completion_tokens")
    except (ValueError, KeyError, IndexError, TypeError):
        return False, f"POST {path} -> 200 but not an OpenAI completion: {raw[:200].decode(errors='replace')}"
    if not text and not n:
        return False, f"POST {path} -> 200 but no token was generated"
    return True, f"POST {path} -> 200, first token {text!r}"
