"""The effective configuration read from real engine logs (tests/logs/): what ran, beside what was asked.

Pure: the signatures in diagnose/rules/*.yaml against real lines of vLLM (its CPU build here, GPU
lines pasted in vllm#31085 and vllm#43507) and SGLang (a public MI355X launch log).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from moelab.engines import effective as E

LOGS = Path(__file__).parent / "logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.mark.parametrize("engine,glob", [("vllm", "vllm-*.log"), ("sglang", "sglang-*.log")])
def test_every_effective_signature_fires_on_a_real_log(engine, glob):
    sec = E.section(engine)
    text = [ln for f in LOGS.glob(glob) for ln in f.read_text().splitlines()]
    missing = [s.id for s in sec.signatures if not any(s.regex.search(ln) for ln in text)]
    assert missing == [] and all(s.source for s in sec.signatures), missing


def test_vllm_cpu_refuses_a_flash_attention_request_and_says_only_that():
    # vLLM 0.32 CPU, `--attention-backend FLASH_ATTN`: it starts, logs one INFO line, runs its own.
    args = ["/tmp/measure/tiny", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
            "--attention-backend", "FLASH_ATTN"]
    e = E.read(lines("vllm-0.32.0-cpu-attention-flash-attn.log"), args, "vllm")
    att = e.get("attention")
    assert (att.status, att.requested, att.refused, att.ran) == ("refused", "FLASH_ATTN", "FLASH_ATTN", None)
    assert "Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU." in att.text and att.line == 39
    assert att.describe() == "asked FLASH_ATTN: the engine refused it; ran: not reported by the engine"
    assert [s.name for s in e.changed] == ["attention"]
    moe, graph, quant = e.get("moe_runner"), e.get("cuda_graph"), e.get("quantization")
    assert (moe.status, moe.ran) == ("resolved", "CPU")
    assert (graph.flag, graph.requested, graph.ran, graph.status) == ("--enforce-eager", "off", "off", "as asked")
    assert (quant.ran, e.get("kv_cache_dtype").ran) == ("none", None)  # kv_cache_dtype=auto reports nothing


def test_a_log_that_does_not_say_is_not_reported_never_guessed():
    e = E.read(lines("vllm-0.32.0-cpu-ok.log"), ["/tmp/h5/tiny", "--attention-backend", "CPU_ATTN"], "vllm")
    att = e.get("attention")
    assert att.ran is None and att.status == "not reported"
    assert att.describe() == "asked CPU_ATTN, ran: not reported by the engine"
    assert not e.changed


def test_vllm_gpu_lines_auto_and_explicit_moe_backends():
    e = E.read(lines("vllm-31085-nvfp4-b12x-sm120.log"), ["m", "--moe-backend", "flashinfer_b12x"], "vllm")
    assert e.get("moe_runner").status == "as asked" and e.get("moe_runner").ran == "FLASHINFER_B12X"
    assert (e.get("attention").status, e.get("attention").ran) == ("resolved", "FLASH_ATTN")
    # the same real line against a request for another backend is a replacement, named as such
    m = E.read(lines("vllm-43507-nvfp4-marlin-sm120.log"), ["m", "--moe-backend", "flashinfer_cutlass"], "vllm")
    assert m.get("moe_runner").describe() == "asked flashinfer_cutlass, ran MARLIN"
    assert m.get("fp4_gemm").ran == "CutlassNvFp4LinearKernel" and m.get("fp4_gemm").flag is None


def test_sglang_server_args_resolved_values():
    args = ["--attention-backend", "triton", "--model-path", "zai-org/GLM-5-FP8", "--tp-size", "8",
            "--kv-cache-dtype", "fp8_e4m3"]
    e = E.read(lines("sglang-glm5-fp8-mi355x-server-args.log"), args, "sglang")
    assert e.get("attention").status == "as asked" and e.get("kv_cache_dtype").status == "as asked"
    assert (e.get("fp4_gemm").status, e.get("fp4_gemm").ran) == ("resolved", "flashinfer_cutlass")
    # 'auto' left in server_args, quantization=None (from the checkpoint): nothing reported
    assert e.get("moe_runner").ran is None and e.get("quantization").ran is None
    assert e.get("cuda_graph").ran == "on"
    # speculative_moe_runner_backend / decode_attention_backend never stand in for the real fields
    assert e.get("moe_runner").status == "not reported"


def test_an_engine_without_signatures_is_read_with_the_best_matching_ones():
    e = E.read(lines("sglang-glm5-fp8-mi355x-server-args.log"), ["python", "x.py", "--attention-backend", "fa3"],
               "command")
    assert e.signatures == "sglang" and e.get("attention").describe() == "asked fa3, ran triton"
    assert E.read(["nothing to see"], [], "command").signatures is None


def test_identity_merges_what_ran_the_same_and_nothing_unreported():
    def eff(requested, ran):
        return {"settings": [{"name": "moe_runner", "flag": "--moe-runner-backend", "requested": requested,
                              "ran": ran}]}
    auto = E.identity({"--moe-runner-backend": "auto", "--x": 1}, eff("auto", "triton"))
    assert auto == E.identity({"--moe-runner-backend": "triton", "--x": 1}, eff("triton", "triton"))
    assert E.identity({"--moe-runner-backend": "auto"}, eff("auto", None)) != \
        E.identity({"--moe-runner-backend": "triton"}, eff("triton", None))


def test_a_bad_section_is_refused_with_its_entry_named():
    with pytest.raises(E.SignatureError, match="named groups that are settings"):
        E.parse_section({"engine": "x", "effective": {"signatures": [{"id": "s", "pattern": "(?P<nope>a)"}]}},
                        "x.yaml")
    with pytest.raises(E.SignatureError, match="'speed' is not a setting"):
        E.parse_section({"engine": "x", "effective": {"flags": {"speed": "--fast"}}}, "x.yaml")
