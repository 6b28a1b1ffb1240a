"""ModelOpt checkpoint layout: experts written to safetensors and read back bit-identically."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from moelab.moe import quantize_experts  # noqa: E402
from moelab.moe.modelopt import (experts_from_checkpoint, experts_to_checkpoint,  # noqa: E402
                                 format_from_config, quantization_config)

PREFIX = "model.layers.0.mlp.experts"


@pytest.mark.parametrize("fmt,block", [("bf16", None), ("fp8", None), ("fp8", (128, 128)), ("nvfp4", None)])
def test_checkpoint_round_trip_through_safetensors(tmp_path, fmt, block):
    E, H, I = 3, 256, 128
    g = torch.Generator().manual_seed(1)
    w = quantize_experts(torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g), fmt,
                         **({"block": block} if block else {}))
    tensors = experts_to_checkpoint(w, PREFIX)
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(quantization_config(fmt, block, nested=True)))
    loaded = safetensors_torch.load_file(str(path))
    quant = json.loads((tmp_path / "hf_quant_config.json").read_text())
    back = experts_from_checkpoint(loaded, PREFIX, E, quant)
    assert back.fmt == fmt and back.shape == (E, H, I)
    for a, b in zip(w.dequantize(torch.float32), back.dequantize(torch.float32)):
        assert torch.equal(a, b)


def test_modelopt_names_and_dtypes():
    w = quantize_experts(torch.randn(2, 64, 32), torch.randn(2, 32, 32), "nvfp4")
    t = experts_to_checkpoint(w, PREFIX)
    assert t[f"{PREFIX}.1.gate_proj.weight"].dtype == torch.uint8
    assert t[f"{PREFIX}.1.gate_proj.weight"].shape == (32, 16)
    assert t[f"{PREFIX}.1.up_proj.weight_scale"].dtype == torch.float8_e4m3fn
    assert t[f"{PREFIX}.0.down_proj.weight_scale_2"].shape == ()
    assert t[f"{PREFIX}.0.down_proj.input_scale"].dtype == torch.float32


def test_config_forms_and_errors():
    assert quantization_config("nvfp4")["quant_method"] == "modelopt"
    assert quantization_config("nvfp4")["group_size"] == 16
    assert format_from_config(quantization_config("fp8")) == "fp8"
    assert format_from_config(quantization_config("nvfp4", nested=True)) == "nvfp4"
    assert format_from_config(None) == "bf16"
    with pytest.raises(ValueError, match="INT4_AWQ"):
        format_from_config({"quant_algo": "INT4_AWQ"})
    w = quantize_experts(torch.randn(2, 64, 32), torch.randn(2, 32, 32), "fp8")
    t = experts_to_checkpoint(w, PREFIX)
    del t[f"{PREFIX}.1.down_proj.weight_scale"]
    with pytest.raises(KeyError, match="down_proj.weight_scale"):
        experts_from_checkpoint(t, PREFIX, 2, quantization_config("fp8"))
