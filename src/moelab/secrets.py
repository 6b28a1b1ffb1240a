"""What is secret, and masking it wherever moelab writes or prints: the one place that decides.

A value is secret when it is
  - the value of an environment variable whose name has a part like TOKEN, KEY, SECRET,
    PASSWORD, AUTH or CREDENTIAL (`HF_TOKEN`, `MY_PASSWORD`, `CUSTOM_AUTH`; not `TOKENIZERS_PARALLELISM`),
  - the value of a flag named like one (`--api-key X`, `--hf-token=X`),
  - any environment or flag value that looks like a key (`hf_…`, `sk-…`, `ghp_…`, a JWT, a long
    random string), or
  - the API key moelab itself sends (`--api-key`, `MOELAB_API_KEY`, `OPENAI_API_KEY`).

    >>> s = Secrets.gather(env={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345", "OMP_NUM_THREADS": "2"},
    ...                    process_env=False)
    >>> s.text("token hf_abcdefghijklmnopqrstuvwxyz012345 in a log line")
    'token *** in a log line'
    >>> s.env({"HF_TOKEN": "anything", "OMP_NUM_THREADS": "2"})
    {'HF_TOKEN': '***', 'OMP_NUM_THREADS': '2'}

`Secrets.data` masks any JSON-like document (dicts, lists, strings) before it reaches a file, the
store, a report or stdout: environment mappings by name, argv lists by flag, every known value
wherever it appears in text.
"""
from __future__ import annotations

import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

MASK = "***"
# One part of a NAME_LIKE_THIS (split on _ and -) that makes the whole name secret.
_SECRET_PART = re.compile(r"^(?:\w*TOKEN|\w*KEY|\w*SECRETS?|PASSW(?:OR)?D\w*|\w*PASSWORD|AUTH\w*|"
                          r"CREDENTIALS?|COOKIE|BEARER|PAT)$", re.I)
_NOT_SECRET = {"KEYBOARD", "MONKEY", "AUTHOR", "AUTHORS"}
_KEY_PREFIX = re.compile(r"^(?:hf_|sk-|sk_|pk_|rk_|ghp_|gho_|ghu_|ghs_|github_pat_|glpat-|xox[abpr]-|AKIA|ASIA|"
                         r"AIza|ya29\.|eyJ)[\w\-.=+/]{8,}$")
_KEYISH = re.compile(r"^[A-Za-z0-9_\-+/=]{32,}$")
API_KEY_ENV = ("MOELAB_API_KEY", "OPENAI_API_KEY")


def secret_name(name: str) -> bool:
    """Does an environment variable or flag name hold a secret? (`HF_TOKEN`, `--api-key`: yes)."""
    parts = [p for p in re.split(r"[_\-.]+", name.strip("-")) if p]
    if any(p.upper() in ("API", "ACCESS", "PRIVATE") for p in parts) and any(p.upper() == "KEY" for p in parts):
        return True
    return any(_SECRET_PART.match(p) and p.upper() not in _NOT_SECRET for p in parts) or \
        bool(re.search(r"apikey|api_key|accesstoken", name, re.I))


def looks_like_key(value: str) -> bool:
    """A value shaped like a credential: a known key prefix, or a long high-entropy string of
    mixed case and digits (a model name such as `Qwen3-30B-A3B-Instruct-2507` is not)."""
    v = value.strip()
    if _KEY_PREFIX.match(v):
        return True
    if not _KEYISH.match(v) or not (re.search(r"[a-z]", v) and re.search(r"[A-Z]", v) and re.search(r"\d", v)):
        return False
    counts = Counter(v)
    entropy = -sum(n / len(v) * math.log2(n / len(v)) for n in counts.values())
    return entropy >= 4.2


def api_key(given: str | None = None) -> str | None:
    """The API key moelab sends as a bearer token: the flag, else MOELAB_API_KEY, else OPENAI_API_KEY."""
    if given:
        return given
    return next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _maskable(v: str) -> bool:
    """Worth replacing wherever it appears in text: `USE_AUTH=true` must not turn every "true" of
    a report into ***, so short, numeric and boolean-like values are masked by name only."""
    return len(v) >= 5 and not v.isdigit() and v.lower() not in ("true", "false", "none", "null", "enabled",
                                                                  "disabled")


def _flag_values(argv: Iterable[str]) -> list[str]:
    argv = [str(a) for a in argv]
    out = []
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name.startswith("-") and secret_name(name):
            if eq:
                out.append(val)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append(argv[i + 1])
        elif eq and name.startswith("-") and looks_like_key(val):
            out.append(val)
        elif not a.startswith("-") and looks_like_key(a):
            out.append(a)
    return out


@dataclass(frozen=True)
class Secrets:
    """The secret values of one run, longest first (so a value inside another is masked whole)."""

    values: tuple[str, ...] = ()

    @classmethod
    def gather(cls, *, env: Mapping[str, str] | None = None, argv: Iterable[str] = (),
               flags: Mapping[str, Any] | None = None, extra: Iterable[str | None] = (),
               process_env: bool = True) -> "Secrets":
        vals: list[str] = []
        envs = [env or {}] + ([os.environ] if process_env else [])
        for e in envs:
            vals += [str(v) for k, v in e.items() if v and (secret_name(k) or looks_like_key(str(v)))]
        vals += _flag_values(argv)
        for k, v in (flags or {}).items():
            if isinstance(v, str) and v and (secret_name(k) or looks_like_key(v)):
                vals.append(v)
        vals += [v for v in extra if v]
        return cls(tuple(sorted({v for v in vals if _maskable(v)}, key=lambda v: (-len(v), v))))

    def __add__(self, other: "Secrets") -> "Secrets":
        return Secrets(tuple(sorted(set(self.values) | set(other.values), key=lambda v: (-len(v), v))))

    def text(self, s: str) -> str:
        for v in self.values:
            if v in s:
                s = s.replace(v, MASK)
        return s

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """An environment mapping with every secret-named or key-like value masked."""
        return {k: (MASK if v and (secret_name(k) or looks_like_key(str(v))) else self.text(str(v)))
                for k, v in env.items()}

    def argv(self, argv: Iterable[str]) -> list[str]:
        argv = [str(a) for a in argv]
        out = []
        for i, a in enumerate(argv):
            name, eq, _ = a.partition("=")
            if eq and name.startswith("-") and secret_name(name):
                out.append(f"{name}={MASK}")
            elif i and argv[i - 1].startswith("-") and "=" not in argv[i - 1] and secret_name(argv[i - 1]) \
                    and not a.startswith("--"):
                out.append(MASK)
            else:
                out.append(self.text(a))
        return out

    def data(self, obj: Any) -> Any:
        """Any JSON-like document with every secret masked: values of secret-named environment
        variables and flags (`{"HF_TOKEN": …}`, `{"--api-key": …}`), argv lists, and every known
        value wherever it appears in text. Lower-case keys (`key`, `token` of a trial record or a
        logprob entry) are data, not names of secrets."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, Mapping):
            return {k: (MASK if isinstance(v, str) and v and _holds_secret(str(k), v) else self.data(v))
                    for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self.data(x) for x in obj]
            return self.argv(items) if items and all(isinstance(x, str) for x in items) else items
        return obj


def _holds_secret(name: str, value: str) -> bool:
    """An environment variable (UPPER_CASE) or a flag (--name) whose value is secret."""
    if not (name.startswith("-") or (name == name.upper() and re.match(r"^[A-Z_][A-Z0-9_]*$", name))):
        return False
    return secret_name(name) or looks_like_key(value)

NONE = Secrets()
