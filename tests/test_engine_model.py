"""The embedded engine's math and bookkeeping, in process (no HTTP): the batched, KV-cached forward
against an independent full-sequence reference written from the HF Qwen3-MoE definition, the
scheduler's capacity rules, stop strings, and the checkpoint round trip."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from moelab.engine.build import build_engine  # noqa: E402
from moelab.engine.checkpoint import ModelLoadError, load_checkpoint, save_checkpoint  # noqa: E402
from moelab.engine.config import PRESETS, ConfigError, ServerConfig  # noqa: E402
from moelab.engine.detok import TextStream  # noqa: E402
from moelab.engine.scheduler import Overloaded, SamplingParams, Scheduler, Sequence  # noqa: E402
from moelab.engine.tokenizer import ByteTokenizer  # noqa: E402

pytestmark = pytest.mark.embedded


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """Full-sequence forward without cache, straight from the weights: logits [L, V] (float64)."""
    c, d = model.cfg, {k: v.double() for k, v in model.dense.items()}
    L, nh, kvh, D = len(ids), c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def norm(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps)

    inv = 1.0 / (c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None]  # [L, D/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # x [L, heads, D]
        rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    x = d["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = norm(x, d[p + "input_layernorm.weight"])
        q = (h @ d[p + "self_attn.q_proj.weight"].T).view(L, nh, D)
        k = (h @ d[p + "self_attn.k_proj.weight"].T).view(L, kvh, D)
        v = (h @ d[p + "self_attn.v_proj.weight"].T).view(L, kvh, D)
        q, k = rope(norm(q, d[p + "self_attn.q_norm.weight"])), rope(norm(k, d[p + "self_attn.k_norm.weight"]))
        out = torch.zeros(L, nh, D, dtype=torch.float64)
        for t in range(L):  # token t attends to 0..t; head j uses KV head j // (nh / kvh)
            for j in range(nh):
                kv = j // (nh // kvh)
                s = (k[: t + 1, kv] @ q[t, j]) / D ** 0.5
                out[t, j] = torch.softmax(s, 0) @ v[: t + 1, kv]
        x = x + out.reshape(L, nh * D) @ d[p + "self_attn.o_proj.weight"].T
        h = norm(x, d[p + "post_attention_layernorm.weight"])
        probs = torch.softmax(h @ d[p + "mlp.gate.weight"].T, -1)
        w13, w2 = (t.double() for t in model.experts[i].dequantize(torch.float64))
        I = w2.shape[2]
        moe = torch.zeros_like(x)
        for t in range(L):
            top = torch.topk(probs[t], c.num_experts_per_tok)
            wts = top.values / top.values.sum() if c.norm_topk_prob else top.values
            for wt, e in zip(wts, top.indices.tolist()):
                gu = w13[e] @ h[t]
                moe[t] += wt * (w2[e] @ (torch.nn.functional.silu(gu[:I]) * gu[I:]))
        x = x + moe
    return norm(x, d["model.norm.weight"]) @ d["lm_head.weight"].T


@pytest.fixture(scope="module")
def engine():
    eng, _ = build_engine(ServerConfig(preset="tiny", device="cpu", backends=("reference", "grouped")))
    return eng


def _other_shape_engine(backend: str):
    """4 query heads per KV head, tied embeddings, un-normalised top-k: the branches tiny does not take."""
    from moelab.engine.checkpoint import random_weights
    from moelab.engine.config import ModelConfig
    from moelab.engine.model import Qwen3Moe
    from moelab.engine.runtime import Engine
    from moelab.engine.tokenizer import ByteTokenizer
    from moelab.moe import RUNNERS, quantize_experts

    mc = ModelConfig(vocab_size=300, hidden_size=96, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=24, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=40,
                     norm_topk_prob=False, tie_word_embeddings=True, max_position_embeddings=64)
    dense, raw = random_weights(mc, 3, torch.float32, torch.device("cpu"))
    experts = [quantize_experts(a, b, "bf16", dtype=torch.float32) for a, b in raw]
    return Engine(Qwen3Moe(mc, dense, experts, RUNNERS.create(backend)), ByteTokenizer(), Scheduler(8, 512, 8))


@pytest.mark.parametrize("which", ["tiny", "other-shape-reference-runner"])
def test_batched_cached_forward_matches_full_sequence_reference(engine, which):
    """Three sequences of different lengths, admitted at different steps (mixed prefill + decode),
    each step's logits equal the reference's logits for that prefix."""
    if which != "tiny":
        engine = _other_shape_engine("reference")
    prompts = [[5, 70, 71, 72], [9] * 11, [100, 101]]
    seqs = [Sequence(f"s{i}", p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0))
            for i, p in enumerate(prompts)]
    engine.submit(seqs[0])
    engine.submit(seqs[1])
    engine.step()  # two prefills
    engine.submit(seqs[2])  # joins between decode steps
    while engine.step():
        pass
    assert engine.stats["max_batch"] >= 3
    for s in seqs:
        assert len(s.output_ids) == 6
        full = s.prompt_ids + s.output_ids
        ref = torch.log_softmax(reference_logits(engine.model, full[:-1]), -1)  # [L-1, V]
        for j, (tok, lp, _top, _off) in enumerate(s.extra["logprobs"]):
            row = ref[len(s.prompt_ids) - 1 + j]
            assert tok == int(row.argmax()), f"{s.rid} token {j}: greedy pick differs from the reference"
            assert lp == pytest.approx(float(row[tok]), abs=1e-4)


def test_scheduler_waits_for_kv_capacity_and_refuses_a_full_queue():
    sch = Scheduler(max_running=8, max_total_tokens=40, max_queued=2)
    a = Sequence("a", [1] * 10, SamplingParams(max_tokens=10))  # needs 20
    b = Sequence("b", [1] * 10, SamplingParams(max_tokens=15))  # needs 25: must wait for a
    sch.add(a)
    sch.add(b)
    with pytest.raises(Overloaded):
        sch.add(Sequence("c", [1], SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="max-total-tokens"):
        sch.add(Sequence("d", [1] * 30, SamplingParams(max_tokens=20)))
    prefill, decode = sch.schedule()
    assert [s.rid for s in prefill] == ["a"] and decode == [] and len(sch.free) == 20
    assert sch.schedule() == ([], [a])  # b still does not fit
    sch.finish(a, "length")
    prefill, decode = sch.schedule()
    assert [s.rid for s in prefill] == ["b"] and len(sch.free) == 15
    sch.abort(b)
    sch.schedule()
    assert len(sch.free) == 40 and not sch.running


def test_max_running_requests_caps_the_batch():
    sch = Scheduler(max_running=2, max_total_tokens=1000, max_queued=10)
    for i in range(5):
        sch.add(Sequence(str(i), [1, 2], SamplingParams(max_tokens=4)))
    prefill, _ = sch.schedule()
    assert len(prefill) == 2 and len(sch.waiting) == 3
    # each running sequence holds its own slot-table lane; a finished one hands it to the next
    assert sorted(s.lane for s in prefill) == [0, 1]
    sch.finish(prefill[0], "length")
    assert prefill[0].lane == -1
    nxt, running = sch.schedule()
    assert len(nxt) == 1 and {s.lane for s in sch.running} == {0, 1}


def test_cuda_graph_sizes_pad_by_less_than_eight_rows():
    from moelab.engine.graphs import default_sizes

    assert default_sizes(1) == [1]
    assert default_sizes(8) == [1, 2, 4, 8]
    assert default_sizes(30) == [1, 2, 4, 8, 16, 24, 30]
    assert default_sizes(64)[-3:] == [48, 56, 64]


def test_decode_step_roofline_counts_weights_experts_and_kv():
    """The bench's decode roofline, against the arithmetic done by hand for the small preset."""
    import dataclasses

    from moelab.moe.roofline import decode_step_cost, expected_active

    mc = dataclasses.asdict(PRESETS["small"])
    b1, _ = decode_step_cost(mc, "bf16", 1, 64)
    attn = 2048 * 128 * (2 * 32 + 2 * 4) * 2 + 128 * 2048 * 2  # q/k/v/o + router, bf16
    experts = 8 * 3 * 2048 * 768 * 2  # one token touches 8 experts
    kv = 64 * 2 * 4 * 128 * 2
    assert b1 == pytest.approx(4 * (attn + experts + kv) + 151936 * 2048 * 2)
    b32, _ = decode_step_cost(mc, "bf16", 32, 64)
    assert b32 - b1 == pytest.approx(4 * ((expected_active(128, 8, 32) - 8) * 3 * 2048 * 768 * 2 + 31 * kv))
    assert decode_step_cost(mc, "nvfp4", 32, 64)[0] < decode_step_cost(mc, "fp8", 32, 64)[0] < b32


def test_stop_strings_are_cut_and_never_leak_in_pieces():
    tok = ByteTokenizer()
    ids = tok.encode("abc<END>def")
    ts, out = TextStream(tok, ("<END>",)), ""
    for i in range(1, len(ids) + 1):
        delta, hit = ts.push(ids[:i], final=False)
        out += delta
        assert "<" not in out
        if hit:
            break
    assert hit and out == "abc"
    ts = TextStream(tok, ())
    ids = tok.encode("héllo")  # é is two bytes: never hand out half of it
    pieces = [ts.push(ids[:i], final=i == len(ids))[0] for i in range(1, len(ids) + 1)]
    assert "".join(pieces) == "héllo" and "\ufffd" not in "".join(pieces)


def test_checkpoint_round_trip_and_clear_errors(engine, tmp_path):
    m = engine.model
    save_checkpoint(tmp_path, m.cfg, m.dense, m.experts)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == ["Qwen3MoeForCausalLM"] and hf["model_type"] == "qwen3_moe"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.1.self_attn.q_norm.weight", "model.layers.0.mlp.gate.weight",
            "model.layers.1.mlp.experts.7.down_proj.weight"} <= names
    cfg, dense, experts = load_checkpoint(tmp_path, torch.float32, torch.device("cpu"))
    assert cfg == m.cfg
    assert all(torch.equal(dense[k], m.dense[k]) for k in dense)
    assert torch.equal(experts[1].w13, m.experts[1].w13) and torch.equal(experts[0].w2, m.experts[0].w2)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="cannot read the weights"):
        load_checkpoint(tmp_path, torch.float32, torch.device("cpu"))
    (tmp_path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_checkpoint(tmp_path, torch.float32, torch.device("cpu"))


def test_config_is_validated_once_with_the_flag_named(tmp_path):
    with pytest.raises(ConfigError, match="--quantization: invalid choice: 'int4'"):
        ServerConfig(preset="tiny", quantization="int4")
    with pytest.raises(ConfigError, match="--model-path"):
        ServerConfig(preset="tiny", model_path=str(tmp_path))
    with pytest.raises(ConfigError, match="--model-path: .* is not a directory"):
        ServerConfig(model_path=str(tmp_path / "nope"))
    assert ServerConfig(preset="tiny").model_name == "moelab-tiny"
    assert PRESETS["small"].num_experts == 128 and PRESETS["small"].hidden_size == 2048


def test_hf_transformers_loads_our_checkpoint_and_agrees(engine, tmp_path):
    """The directory we write is a real HF Qwen3-MoE checkpoint: transformers' Qwen3MoeForCausalLM
    loads it and its logits equal ours (float32). Skipped where transformers is not installed."""
    transformers = pytest.importorskip("transformers")
    m = engine.model
    save_checkpoint(tmp_path, m.cfg, m.dense, m.experts)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    ids = list(b"Mixture of experts")
    seq = Sequence("hf", ids, SamplingParams(max_tokens=8, temperature=0, min_tokens=8, logprobs=0))
    engine.submit(seq)
    while engine.step():
        pass
    with torch.no_grad():
        logits = hf(torch.tensor([ids + seq.output_ids[:-1]])).logits[0, len(ids) - 1:]  # [8, V]
    lp = torch.log_softmax(logits.double(), -1)
    assert lp.argmax(-1).tolist() == seq.output_ids
    ours = torch.tensor([e[1] for e in seq.extra["logprobs"]], dtype=torch.float64)
    assert torch.allclose(lp.gather(1, torch.tensor(seq.output_ids)[:, None]).squeeze(1), ours, atol=1e-4)


_KERNEL_ATTENTION = r"""
import json, sys
import torch
from moelab.engine.build import build_engine
from moelab.engine.config import ServerConfig
from moelab.engine.scheduler import SamplingParams, Sequence
eng, _ = build_engine(ServerConfig(preset="tiny", device="cpu", backends=("reference", "grouped")))
assert eng.model.kernels and eng.slot_table is not None, "the Triton kernels should be on under the interpreter"
seqs = [Sequence(f"s{i}", p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0))
        for i, p in enumerate([[5, 70, 71, 72], [9] * 11, [100, 101]])]
eng.submit(seqs[0]); eng.submit(seqs[1]); eng.step(); eng.submit(seqs[2])
while eng.step():
    pass
print(json.dumps([[(t, lp) for t, lp, _, _ in s.extra["logprobs"]] for s in seqs]))
"""


@pytest.mark.slow
def test_slot_table_decode_attention_kernel_matches_the_gathered_path(engine):
    """The Triton path of the model (decode attention through lanes + slot table, fused norms, rotary,
    cache writes and router: what CUDA runs and graphs capture), run by Triton's CPU interpreter in a
    child process, gives the same tokens and logprobs as the plain PyTorch path for mixed prefill +
    decode steps."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _KERNEL_ATTENTION], capture_output=True, text=True, timeout=180,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    kernel = json.loads(p.stdout)
    assert engine.slot_table is None  # this process gathers keys for PyTorch's attention
    prompts = [[5, 70, 71, 72], [9] * 11, [100, 101]]
    seqs = [Sequence(f"g{i}", pr, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0))
            for i, pr in enumerate(prompts)]
    engine.submit(seqs[0])
    engine.submit(seqs[1])
    engine.step()
    engine.submit(seqs[2])
    while engine.step():
        pass
    for s, k in zip(seqs, kernel):
        assert [t for t, _ in k] == s.output_ids
        assert [lp for _, lp in k] == pytest.approx([e[1] for e in s.extra["logprobs"]], abs=1e-4)


_FUSED_OPS = r"""
import json, sys
import torch
from moelab.engine.fused import add_rms_norm, qk_norm_rope, router_topk
from moelab.engine.model import apply_rope, rms_norm
dev = torch.device(sys.argv[1])
torch.manual_seed(0)
res = {}
for dt in (torch.float32, torch.bfloat16):
    T, H, nh, kvh, D, E, K = 5, 96, 4, 2, 16, 12, 3
    x, r, w = (torch.randn(*s).to(dt).to(dev) for s in ((T, H), (T, H), (H,)))
    want_res = r + x
    out, r2 = add_rms_norm(x, r.clone(), w, 1e-6)
    res[f"add_rms_norm {dt}"] = [float((out.float() - rms_norm(want_res, w, 1e-6).float()).abs().max()),
                                 float((r2.float() - want_res.float()).abs().max())]
    qkv = torch.randn(T, (nh + 2 * kvh) * D).to(dt).to(dev)
    qw, kw = torch.randn(D).to(dt).to(dev), torch.randn(D).to(dt).to(dev)
    ang = torch.rand(64, D // 2) * 3
    cos, sin = torch.cat([ang, ang], -1).cos().to(dev), torch.cat([ang, ang], -1).sin().to(dev)
    pos, slots = torch.tensor([3, 0, 7, 63, 5], device=dev), torch.tensor([9, 2, 4, 0, 11], device=dev)
    kc, vc = torch.zeros(12, kvh, D, dtype=dt, device=dev), torch.zeros(12, kvh, D, dtype=dt, device=dev)
    q, k, v = (t.view(T, -1, D) for t in qkv.split([nh * D, kvh * D, kvh * D], 1))
    wq = apply_rope(rms_norm(q, qw, 1e-6), cos[pos], sin[pos])
    wk = apply_rope(rms_norm(k, kw, 1e-6), cos[pos], sin[pos])
    wv = v.clone()
    qk_norm_rope(qkv, nh, kvh, D, qw, kw, cos, sin, pos, slots, kc, vc, 1e-6)
    res[f"qk_norm_rope {dt}"] = [float((q.float() - wq.float()).abs().max()), float((k.float() - wk.float()).abs().max()),
                                 float((kc[slots].float() - wk.float()).abs().max()), float((vc[slots].float() - wv.float()).abs().max())]
    logits = torch.randn(T, E).to(dt).to(dev)
    tw, ti = router_topk(logits, K, True)
    pw, pi = torch.topk(torch.softmax(logits.float(), -1), K, -1)
    res[f"router_topk {dt}"] = [float((tw - pw / pw.sum(-1, keepdim=True)).abs().max()), float((ti != pi).sum())]
print(json.dumps(res))
"""


def _check_fused_ops(device: str, interpret: bool) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"} if interpret else {k: v for k, v in os.environ.items()
                                                                     if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _FUSED_OPS, device], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    # bf16 values here are below 16 in magnitude: one bf16 ulp is at most 2**-7 * 8. The interpreter
    # rounds float32 -> bf16 toward zero (a GPU rounds to nearest even), so there the residual sum
    # may differ by one ulp as well.
    ulp = 2 ** -7 * 8
    for name, errs in json.loads(p.stdout).items():
        print(name, errs)
        tol = 1e-5 if "float32" in name else ulp
        if name.startswith("router"):
            assert errs[0] < 1e-6 and errs[1] == 0, (name, errs)
        elif name.startswith("add_rms_norm"):
            assert errs[0] <= tol and errs[1] <= (ulp if interpret and "bfloat16" in name else 0), (name, errs)
        else:
            assert max(errs[:3]) <= tol and errs[3] == 0, (name, errs)


@pytest.mark.slow
def test_fused_triton_ops_match_the_pytorch_ops_they_replace():
    """Each fused kernel (Triton's CPU interpreter) against the PyTorch code it replaces, in float32
    and bfloat16: within one bfloat16 rounding."""
    pytest.importorskip("triton")
    _check_fused_ops("cpu", interpret=True)


@pytest.mark.gpu
def test_fused_triton_ops_match_on_cuda():
    """The same on a GPU, where the residual sum must be exact (round to nearest even, like PyTorch)."""
    _check_fused_ops("cuda", interpret=False)
