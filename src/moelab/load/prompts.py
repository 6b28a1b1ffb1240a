"""Prompts for a load run: synthetic ones of a given token length, or a JSONL dataset.

Token length, best source first: a tokenizer.json (the model's own, via `tokenizers`), the server's
`/tokenize` endpoint (vLLM and SGLang have one), the server's own `usage.prompt_tokens` for a
one-token calibration request, else an approximation (one common English word with a leading
space is one token in the usual BPE vocabularies). The source is reported, so an
approximate length is never passed off as exact. Every prompt starts differently (a seeded random
word sequence), so a prefix cache cannot turn the run into a cache benchmark.
"""
from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level").split()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _count_remote(base_url: str, model: str, text: str) -> int | None:
    body = json.dumps({"model": model, "prompt": text}).encode()
    req = urllib.request.Request(base_url.rstrip("/") + "/tokenize", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            doc = json.loads(r.read())
        return int(doc.get("count") or len(doc["tokens"]))
    except Exception:  # no such endpoint (404), or another shape: fall back, and say so
        return None


def _count_usage(base_url: str, model: str, text: str) -> int | None:
    """Prompt tokens of `text` as the server counts them: a max_tokens=1 completion's usage."""
    body = json.dumps({"model": model, "prompt": text, "max_tokens": 1, "temperature": 0.0}).encode()
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(json.loads(r.read())["usage"]["prompt_tokens"])
    except Exception:  # no usage reported, or rejected: fall back to the approximation, and say so
        return None


def synthetic(n: int, input_len: int, seed: int, *, tokenizer: Path | None = None, base_url: str | None = None,
              model: str | None = None) -> tuple[list[str], str]:
    """n prompts of ~input_len tokens and the name of the length source."""
    rng = random.Random(seed)
    if tokenizer is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
        out = []
        for _ in range(n):
            ids = tok.encode(_words(rng, input_len + 8), add_special_tokens=False).ids[:input_len]
            out.append(tok.decode(ids))
        return out, f"tokenizer {tokenizer.name}"
    texts = [_words(rng, input_len) for _ in range(n)]
    if base_url and model:
        for count, name in ((_count_remote, "server /tokenize"), (_count_usage, "server usage.prompt_tokens")):
            for size in (32, 6):  # a short sample too: 32 words may not fit a small context
                counted = count(base_url, model, _words(random.Random(seed + 1), size))
                if counted:
                    # scale the word count once by the measured tokens-per-word of this model
                    words = max(1, round(input_len * size / counted))
                    rng = random.Random(seed)
                    return [_words(rng, words) for _ in range(n)], f"{name} (scaled, ~{counted / size:.2f} tokens/word)"
    return texts, "approximate (1 word ~ 1 token; give --tokenizer for exact lengths)"


def dataset(path: Path, n: int, default_output: int, seed: int) -> list[tuple[str, int]]:
    """(prompt, output_len) pairs from JSONL lines {"prompt": str, "output_len"?: int}; cycles or
    samples to n. Raises ValueError naming the line that is wrong."""
    rows: list[tuple[str, int]] = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            prompt = doc.get("prompt") or doc.get("text")
            if not isinstance(prompt, str) or not prompt:
                raise ValueError("no non-empty 'prompt' string")
            out = int(doc.get("output_len") or doc.get("max_tokens") or default_output)
        except (ValueError, AttributeError, TypeError) as e:
            raise ValueError(f"{path}:{i}: {e} (each line must be JSON like {{\"prompt\": \"...\", \"output_len\": 64}})") from None
        rows.append((prompt, out))
    if not rows:
        raise ValueError(f"{path} holds no prompts")
    rng = random.Random(seed)
    rng.shuffle(rows)
    return [rows[i % len(rows)] for i in range(n)]
