"""Memory forecast on checkpoint directories written here (bf16 and NVFP4), and on bundled configs."""
from __future__ import annotations

import json
import struct

import pytest

from moelab.forecast import BYTES, forecast, load_model, read_safetensors_header

# dtype name -> bytes per element, as the safetensors format names them
WIDTH = {"BF16": 2, "U8": 1, "F8_E4M3": 1, "F32": 4}


def save_file(tensors: dict[str, tuple[str, tuple[int, ...]]], path: str) -> None:
    """A real .safetensors file (8-byte header length, JSON header, zero data) without torch, so
    the forecast, which reads only headers, is tested in moelab's core install."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = WIDTH[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(offset))

GiB = 2**30
H, I, E, L, V, KV, HD, NH = 64, 32, 8, 2, 128, 2, 16, 4  # hidden, expert inter, experts, layers, vocab ...


def _config(**extra):
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
            "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": HD,
            "num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I, "vocab_size": V,
            "max_position_embeddings": 512, **extra}


def _dense(L_, dtype="BF16"):
    t = {"model.embed_tokens.weight": (dtype, (V, H)), "lm_head.weight": (dtype, (V, H))}
    for li in range(L_):
        p = f"model.layers.{li}."
        t[p + "self_attn.q_proj.weight"] = (dtype, (NH * HD, H))
        t[p + "self_attn.k_proj.weight"] = (dtype, (KV * HD, H))
        t[p + "self_attn.v_proj.weight"] = (dtype, (KV * HD, H))
        t[p + "self_attn.o_proj.weight"] = (dtype, (H, NH * HD))
        t[p + "mlp.gate.weight"] = (dtype, (E, H))
    return t


def write_bf16(d):
    d.mkdir()
    t = _dense(L)
    for li in range(L):
        for e in range(E):
            p = f"model.layers.{li}.mlp.experts.{e}."
            t[p + "gate_proj.weight"] = ("BF16", (I, H))
            t[p + "up_proj.weight"] = ("BF16", (I, H))
            t[p + "down_proj.weight"] = ("BF16", (H, I))
    # two shards, like a real checkpoint
    keys = sorted(t)
    save_file({k: t[k] for k in keys[: len(keys) // 2]}, str(d / "model-00001-of-00002.safetensors"))
    save_file({k: t[k] for k in keys[len(keys) // 2:]}, str(d / "model-00002-of-00002.safetensors"))
    (d / "config.json").write_text(json.dumps(_config()))
    return d


def write_nvfp4(d, where="hf_quant_config"):
    """ModelOpt NVFP4 layout: uint8 [N, K/2] packed e2m1, float8_e4m3fn [N, K/16] scales, fp32 scale_2."""
    d.mkdir()
    t = _dense(L)
    for li in range(L):
        for e in range(E):
            p = f"model.layers.{li}.mlp.experts.{e}."
            for name, (n, k) in {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}.items():
                t[p + name + ".weight"] = ("U8", (n, k // 2))
                t[p + name + ".weight_scale"] = ("F8_E4M3", (n, k // 16))
                t[p + name + ".weight_scale_2"] = ("F32", ())
                t[p + name + ".input_scale"] = ("F32", ())
    save_file(t, str(d / "model.safetensors"))
    q = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    if where == "hf_quant_config":
        (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": q}))
        (d / "config.json").write_text(json.dumps(_config()))
    else:  # flat form in config.json, nested text_config like Qwen3.5
        cfg = {"architectures": ["X"], "model_type": "qwen3_5_moe", "text_config": _config(),
               "quantization_config": {"quant_method": "modelopt", **q}}
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_bf16_weights_from_headers_exactly(tmp_path):
    m = load_model(str(write_bf16(tmp_path / "bf16")))
    expert = L * E * 3 * H * I * 2
    dense = (2 * V * H + L * (NH * HD * H * 2 + 2 * KV * HD * H + E * H)) * 2
    assert (m.weight_bytes, m.expert_bytes) == (expert + dense, expert)
    assert m.quant_format == "bf16" and "2 files" in m.weight_bytes_source
    assert m.largest_file > 0


@pytest.mark.parametrize("where", ["hf_quant_config", "config"])
def test_nvfp4_checkpoint(tmp_path, where):
    m = load_model(str(write_nvfp4(tmp_path / "fp4", where)))
    assert m.quant_format == "nvfp4"
    assert m.quant_source == ("hf_quant_config.json" if where == "hf_quant_config" else "config.json quantization_config")
    per_expert = 2 * (I * H // 2 + I * H // 16 + 8) + (H * I // 2 + H * I // 16 + 8)
    assert m.expert_bytes == L * E * per_expert
    assert m.num_experts == E and m.hidden_size == H  # read from text_config when nested
    # about 0.5625 bytes per weight + small per-tensor scales
    assert m.expert_bytes / (L * E * 3 * H * I) == pytest.approx(BYTES["nvfp4"], rel=0.1)


def test_forecast_numbers_under_tp_and_ep(tmp_path):
    m = load_model(str(write_bf16(tmp_path / "m")))
    f1 = forecast(m, engine="sglang", tp=1, gpu_memory=GiB, n_gpus=2, mem_fraction=0.5)
    f2 = forecast(m, engine="sglang", tp=2, gpu_memory=GiB, n_gpus=2, mem_fraction=0.5)
    assert f2.weight_bytes_per_gpu == pytest.approx(f1.weight_bytes_per_gpu / 2, abs=2)
    assert f1.kv_bytes_per_token_total == 2 * L * KV * HD * 2
    assert f2.kv_bytes_per_token_per_gpu == 2 * L * 1 * HD * 2  # 2 KV heads split over 2 ranks
    f4 = forecast(m, engine="sglang", tp=4, gpu_memory=GiB, n_gpus=4, mem_fraction=0.5)
    assert f4.kv_bytes_per_token_per_gpu == f2.kv_bytes_per_token_per_gpu  # replicated once tp > n_kv
    assert f1.kv_tokens == (GiB // 2 - f1.weight_bytes_per_gpu) // f1.kv_bytes_per_token_per_gpu
    fp8 = forecast(m, engine="sglang", tp=1, gpu_memory=GiB, n_gpus=1, kv_dtype="fp8_e4m3")
    assert fp8.kv_bytes_per_token_total == f1.kv_bytes_per_token_total // 2
    ep = forecast(m, engine="vllm", tp=1, dp=2, ep=True, gpu_memory=GiB, n_gpus=2)
    assert ep.weight_bytes_per_gpu < f1.weight_bytes_per_gpu  # experts spread over tp*dp
    assert f1.fits and "sglang default" not in f1.memory_fraction_source


def test_does_not_fit_is_reported_with_numbers(tmp_path):
    m = load_model(str(write_bf16(tmp_path / "m")))
    tiny_gpu = m.weight_bytes // 2
    f = forecast(m, engine="sglang", tp=1, gpu_memory=tiny_gpu, n_gpus=1)
    assert not f.fits and "GiB per GPU" in f.problems[0]
    f = forecast(m, engine="vllm", tp=4, gpu_memory=GiB, n_gpus=2)
    assert any("needs tp x dp = 4 GPUs, only 2" in p for p in f.problems)
    f = forecast(m, engine="sglang", tp=1, gpu_memory=int(m.weight_bytes * 1.05), n_gpus=1, mem_fraction=0.9)
    assert not f.fits and "no room for the KV cache" in f.problems[0]
    f = forecast(m, engine="vllm", cpu_kv_bytes=GiB, host_limit=GiB)
    assert not f.fits and "host RAM" in f.problems[0] and "limit is 1.0 GiB" in f.problems[0]


def test_vllm_needs_one_full_sequence_of_kv(tmp_path):
    m = load_model(str(write_bf16(tmp_path / "m")))
    room = m.weight_bytes + 100 * 2 * L * KV * HD * 2  # KV for ~100 tokens after the weights
    f = forecast(m, engine="vllm", gpu_memory=int(room / 0.9) + 1, n_gpus=1, context_len=512, refuses_short_kv=True)
    assert not f.fits and "less than one 512-token sequence" in f.problems[0]
    g = forecast(m, engine="sglang", gpu_memory=int(room / 0.88) + 1, n_gpus=1, context_len=512)
    assert g.fits and any("512-token" in n for n in g.notes)  # SGLang caps instead of refusing


def test_bundled_config_for_a_well_known_name():
    m = load_model("nvidia/Qwen3.5-397B-A17B-NVFP4")
    assert "bundled config" in m.source and m.quant_format == "nvfp4"
    assert (m.num_experts, m.attention_layers, m.num_kv_heads, m.head_dim) == (512, 15, 2, 256)
    f = forecast(m, engine="sglang", tp=8, gpu_memory=96 * 10**9, n_gpus=8)
    assert f.kv_bytes_per_token_total == 15 * 2 * 2 * 256 * 2  # 30 KiB/token (research notes §6)
    assert 200 * GiB < m.weight_bytes < 240 * GiB and f.fits
    assert any("hybrid model" in n for n in f.notes)


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a well-known model"):
        load_model("no/such-model-xyz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(str(tmp_path / "empty"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="corrupt"):
        read_safetensors_header(bad)
