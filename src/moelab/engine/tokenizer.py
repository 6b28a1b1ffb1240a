"""Tokenizers: tokenizer.json through the `tokenizers` package when present, byte-level otherwise.

The byte-level tokenizer maps byte b to id b and puts Qwen's chat specials after the 256 bytes.
`write_tokenizer_json` writes the same vocabulary as a Hugging Face byte-level BPE (no merges), so
a preset directory loads through `tokenizers` and through the fallback with identical ids.
Ids the tokenizer does not know (a random model with a large vocab emits them) decode to `<|id|>`
so generated text is never silently empty.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ByteTokenizer:
    """ids 0..255 = bytes; 256.. = SPECIALS. Specials in text are recognised as single tokens."""

    def __init__(self) -> None:
        self.special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
        self.vocab_size = 256 + len(SPECIALS)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for s, sid in self.special_ids.items():
                if text.startswith(s, i):
                    ids.append(sid)
                    i += len(s)
                    break
            else:
                j = text.find("<|", i + 1)
                j = len(text) if j < 0 else j
                ids.extend(text[i:j].encode("utf-8"))
                i = j
        return ids

    def token_bytes(self, tid: int) -> bytes:
        if tid < 256:
            return bytes([tid])
        if tid < self.vocab_size:
            return SPECIALS[tid - 256].encode()
        return f"<|{tid}|>".encode()

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(t) for t in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer.json through the `tokenizers` package."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(path))
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def token_bytes(self, tid: int) -> bytes:
        return self.decode([tid]).encode("utf-8", errors="replace")

    def decode(self, ids: list[int]) -> str:
        # ids past the vocabulary would be dropped by tokenizers; spell them out instead
        out, run = [], []
        for t in ids:
            if t < self.vocab_size:
                run.append(t)
            else:
                if run:
                    out.append(self.tok.decode(run, skip_special_tokens=False))
                run = []
                out.append(f"<|{t}|>")
        if run:
            out.append(self.tok.decode(run, skip_special_tokens=False))
        return "".join(out)


def load_tokenizer(model_dir: Path | None) -> ByteTokenizer | HFTokenizer:
    """tokenizer.json in model_dir via `tokenizers` when both exist, else the byte-level tokenizer."""
    if model_dir is not None and (model_dir / "tokenizer.json").exists():
        try:
            return HFTokenizer(model_dir / "tokenizer.json")
        except ImportError:
            pass
        except Exception as e:  # a corrupt tokenizer.json is a model load error, said plainly
            raise ValueError(f"{model_dir / 'tokenizer.json'} cannot be read: {e}") from None
    return ByteTokenizer()


def write_tokenizer_json(model_dir: Path) -> None:
    """Write the byte-level vocabulary as a HF byte-level BPE tokenizer.json (plus tokenizer_config.json)."""
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }
    (model_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "bos_token": None, "model_max_length": 1 << 20}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def chat_prompt(messages: list[dict]) -> str:
    """Qwen's ChatML template, ending with the assistant turn opened."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"
