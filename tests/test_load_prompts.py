"""Tier 1: synthetic prompt lengths with a real tokenizer.json, and JSONL dataset errors."""
from __future__ import annotations

import pytest

from moelab.load.prompts import WORDS, dataset, synthetic


def test_synthetic_with_tokenizer_json_has_exact_length(tmp_path):
    tk = pytest.importorskip("tokenizers", reason="tokenizers comes with the engine extra")
    Tokenizer, models, pre_tokenizers = tk.Tokenizer, tk.models, tk.pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    prompts, source = synthetic(5, 40, seed=1, tokenizer=path)
    assert source == "tokenizer tokenizer.json" and len(set(prompts)) == 5  # distinct: no prefix-cache hits
    assert all(len(tok.encode(p).ids) == 40 for p in prompts)
    assert synthetic(5, 40, seed=1, tokenizer=path)[0] == prompts  # seeded


def test_synthetic_without_tokenizer_says_it_is_approximate():
    prompts, source = synthetic(3, 16, seed=0)
    assert source.startswith("approximate") and all(len(p.split()) == 16 for p in prompts)


def test_dataset_cycles_and_names_the_bad_line(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a", "output_len": 3}\n{"text": "b"}\n')
    rows = dataset(f, 5, default_output=7, seed=0)
    assert len(rows) == 5 and {r for r in rows} == {("a", 3), ("b", 7)}
    f.write_text('{"prompt": "a"}\n{"prompt": ""}\n')
    with pytest.raises(ValueError, match=r"d.jsonl:2: no non-empty 'prompt'"):
        dataset(f, 2, 4, 0)
    f.write_text("not json\n")
    with pytest.raises(ValueError, match=r"d.jsonl:1"):
        dataset(f, 2, 4, 0)
    f.write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        dataset(f, 2, 4, 0)
