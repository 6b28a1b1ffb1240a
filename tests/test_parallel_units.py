"""The pieces of a multi-rank launch that need no second process (tier 1, and torch on CPU).

Which rank holds what, the shards of every weight format against the whole layer, the attention
of sharded ranks against one rank, rank 0's commands and the other ranks' copies of its
sequences, the fault syntax, flag refusals, and the rank log prefix.
"""
from __future__ import annotations

import io

import pytest

from moelab.engine.parallel.layout import Parallelism

torch = pytest.importorskip("torch")

from moelab.engine.config import PRESETS, ConfigError, ServerConfig  # noqa: E402
from moelab.engine.parallel import faults  # noqa: E402
from moelab.engine.parallel import plan as P  # noqa: E402
from moelab.engine.parallel.moe import local_experts_moe  # noqa: E402
from moelab.engine.parallel.ranklog import RankStream  # noqa: E402
from moelab.engine.parallel.ranks import describe_exit  # noqa: E402
from moelab.engine.parallel.shard import shard_dense, shard_experts  # noqa: E402

TINY = PRESETS["tiny"]


def test_layout_of_the_tiny_preset_matches_the_worked_example():
    ep = Parallelism(tp=2, ep=2)
    assert [list(ep.heads(r, 4)) for r in (0, 1)] == [[0, 1], [2, 3]]
    assert [list(ep.kv_heads(r, 2)) for r in (0, 1)] == [[0], [1]]
    assert [list(ep.experts(r, 8)) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ep.intermediate(1, 32) == range(0, 32)
    tp = Parallelism(tp=2)
    assert tp.experts(1, 8) == range(0, 8) and tp.intermediate(1, 32) == range(16, 32)
    # four ranks, two KV heads: each KV head is copied to two ranks, as SGLang does
    assert [list(Parallelism(tp=4).kv_heads(r, 2)) for r in range(4)] == [[0], [0], [1], [1]]
    # two expert groups of two ranks: whole experts per group, each sliced two ways
    mixed = Parallelism(tp=4, ep=2)
    assert [(mixed.experts(r, 8).start, mixed.intermediate(r, 32).start) for r in range(4)] == \
        [(0, 0), (0, 16), (4, 0), (4, 16)]


def test_layout_says_why_a_model_does_not_split():
    assert Parallelism(tp=2).problems(4, 2, 8, 32) == []
    p = Parallelism(tp=3).problems(4, 2, 8, 32)
    assert any("4 attention heads do not split over 3" in s for s in p)
    assert any("16" in s for s in Parallelism(tp=4).problems(4, 2, 8, 32, granule=16))  # nvfp4: 8-wide slices
    with pytest.raises(ValueError, match="must divide"):
        Parallelism(tp=2, ep=4)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("tp,ep", [(2, 1), (2, 2), (4, 2), (4, 4)])
def test_rank_shards_of_a_moe_layer_sum_to_the_whole_layer(fmt, tp, ep):
    from moelab.moe import RUNNERS, quantize_experts

    g = torch.Generator().manual_seed(0)
    E, H, I, T, K = 8, 64, 32, 6, 2
    w13, w2 = torch.randn(E, 2 * I, H, generator=g) / 8, torch.randn(E, H, I, generator=g) / 6
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    wts = torch.rand(T, K, generator=g)
    whole = quantize_experts(w13, w2, fmt, **({"dtype": torch.float32} if fmt == "bf16" else {}))
    runner = RUNNERS.create("reference")
    want = runner(x, wts, ids, whole)
    par, got = Parallelism(tp, ep), torch.zeros_like(want)
    for rank in range(tp):
        part = shard_experts(whole, par, rank)
        assert part.shape == (E // ep, H, I // par.moe_tp)
        got += (local_experts_moe(runner, x, wts, ids, part, par.experts(rank, E).start) if ep > 1
                else runner(x, wts, ids, part))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # the stored numbers are the same, only summed in parts
    for name in ("w13", "w2"):  # the stored values are split, never copied (scales may be: per-row, global)
        assert sum(getattr(shard_experts(whole, par, r), name).numel() for r in range(tp)) == getattr(whole, name).numel()


def test_a_rank_with_no_routed_pair_contributes_zeros():
    from moelab.moe import RUNNERS, quantize_experts

    whole = quantize_experts(torch.randn(4, 16, 8), torch.randn(4, 8, 8), "bf16", dtype=torch.float32)
    part = shard_experts(whole, Parallelism(2, 2), 1)  # experts 2-3; every token goes to 0-1
    out = local_experts_moe(RUNNERS.create("reference"), torch.randn(3, 8), torch.ones(3, 1), torch.zeros(3, 1,
                            dtype=torch.long), part, 2)
    assert out.shape == (3, 8) and not out.any()


def _model(par: Parallelism, rank: int):
    from moelab.engine.checkpoint import random_weights
    from moelab.engine.model import Qwen3Moe
    from moelab.moe import RUNNERS, quantize_experts

    dense, raw = random_weights(TINY, 0, torch.float32, torch.device("cpu"))
    experts = [shard_experts(quantize_experts(a, b, "bf16", dtype=torch.float32), par, rank) for a, b in raw]
    return Qwen3Moe(TINY, shard_dense(dense, TINY, par, rank), experts, RUNNERS.create("reference"), par, rank)


def _steps(n_steps: int):
    """A scheduler's real steps over three requests (one admitted late), tokens made up."""
    from moelab.engine.scheduler import SamplingParams, Scheduler, Sequence

    sched = Scheduler(max_running=4, max_total_tokens=256, max_queued=8)
    for i, n in enumerate((5, 3)):
        sched.add(Sequence(f"r{i}", list(range(10 + i, 10 + i + n)), SamplingParams(max_tokens=6)))
    for step in range(n_steps):
        if step == 2:
            sched.add(Sequence("late", [40, 41, 42, 43], SamplingParams(max_tokens=6)))
        prefill, decode = sched.schedule()
        yield prefill, decode
        for s in prefill + decode:
            s.output_ids.append(60 + step)


def test_the_attention_of_two_ranks_sums_to_one_rank():
    from moelab.engine.batch import build_step

    whole, parts = _model(Parallelism(), 0), [_model(Parallelism(2), r) for r in (0, 1)]
    assert (parts[1].nh, parts[1].kvh) == (2, 1)
    caches = [m.new_kv_cache(256) for m in (whole, *parts)]
    for prefill, decode in _steps(4):  # prefills and decodes against each rank's own KV cache
        b = build_step(prefill, decode, torch.device("cpu"))
        x = torch.randn(b.input_ids.numel(), TINY.hidden_size)
        want = whole._attention(x, 0, b, caches[0][0])
        got = sum(m._attention(x, 0, b, c[0]) for m, c in zip(parts, caches[1:]))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_commands_round_trip_and_shadows_build_the_same_step():
    from moelab.engine.batch import build_step

    shadows = P.Shadows()
    for prefill, decode in _steps(6):
        header, payload = P.encode(P.step_command(prefill, decode))
        assert header.numel() == P.HEADER and P.payload_size(header) == payload.numel()
        cmd = P.decode(header, payload)
        want = build_step(prefill, decode, torch.device("cpu"))
        got = build_step(*shadows.step(cmd), torch.device("cpu"))
        for f in ("input_ids", "positions", "write_slots", "decode_rows", "last_index", "decode_slots", "decode_mask"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
        assert got.prefills == want.prefills
    idle = P.decode(*P.encode(P.Command(P.Kind.IDLE)))
    assert idle.kind is P.Kind.IDLE and not idle.prefills and not idle.decodes


def test_shadows_refuse_a_step_that_does_not_follow():
    shadows = P.Shadows()
    shadows.step(P.Command(P.Kind.STEP, [(0, [1, 2], [0, 1, 2, 3])], []))
    with pytest.raises(RuntimeError, match="diverged"):
        shadows.step(P.Command(P.Kind.STEP, [], [(0, 7, 5)]))  # rank 0 says position 5; this copy is at 2


def test_fault_syntax():
    assert faults.parse("rank=1 phase=warmup action=raise") == faults.Fault(1, "warmup", "raise")
    assert faults.parse("rank=0,phase=loading_weights,action=alloc").action == "alloc"
    for bad in ("rank=one phase=warmup action=raise", "rank=1 action=raise", "rank=1 phase=warmup action=explode"):
        with pytest.raises(ValueError, match=faults.ENV):
            faults.parse(bad)


@pytest.mark.parametrize("kw,flag", [({"tp_size": 2, "ep_size": 4}, "--ep-size"), ({"tp_size": 0}, "--tp-size"),
                                     ({"tp_size": 2, "dist_timeout": 0.5}, "--dist-timeout"),
                                     ({"tp_size": 2, "save": "/tmp/x"}, "--save"), ({"nccl_port": 70000}, "--nccl-port")])
def test_parallel_flags_are_refused_with_the_flag_named(kw, flag):
    with pytest.raises(ConfigError) as e:
        ServerConfig(preset="tiny", **kw)
    assert e.value.flag == flag


def test_ep_size_alone_sets_the_ranks():
    assert ServerConfig(preset="tiny", ep_size=2).parallelism == Parallelism(tp=2, ep=2)
    assert ServerConfig(preset="tiny").parallelism.ranks == 1


def test_a_split_the_model_cannot_take_names_the_flag():
    from moelab.engine.build import check_parallel

    with pytest.raises(ConfigError, match="attention heads do not split over 3") as e:
        check_parallel(Parallelism(tp=3), TINY, "bf16")
    assert e.value.flag == "--tp-size"
    with pytest.raises(ConfigError) as e:
        check_parallel(Parallelism(tp=8, ep=8), TINY, "bf16")
    check_parallel(Parallelism(tp=2), TINY, "nvfp4")


def test_rank_lines_carry_sglang_prefixes_that_the_classifier_strips():
    from moelab.diagnose.classify import strip_prefixes

    out = io.StringIO()
    s = RankStream(out, "TP1", clock=lambda: "2026-12-01 10:11:12")
    s.write("Traceback (most recent call last):\n  File \"x.py\"")
    s.write(", line 1\nRuntimeError: boom\n")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[2026-12-01 10:11:12 TP1] Traceback (most recent call last):"
    assert [strip_prefixes(ln) for ln in lines][-1] == ("RuntimeError: boom", "TP1")


def test_exit_descriptions():
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)"
    assert describe_exit(1) == "exited with status 1"


@pytest.mark.parametrize("tp,ep", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_the_memory_forecast_is_what_each_rank_holds(tp, ep):
    from moelab.engine.memory import rank_forecast

    par = Parallelism(tp, ep)
    fc = rank_forecast(ServerConfig(preset="tiny", tp_size=tp, ep_size=ep), TINY, "float32", "bf16")
    for rank in range(tp):
        m = _model(par, rank)
        qkv = sum(t.nbytes for t in m.qkv)  # the fused q/k/v, whose HF names are views of it
        dense = sum(t.nbytes for k, t in m.dense.items() if not k.endswith(("q_proj.weight", "k_proj.weight",
                                                                             "v_proj.weight"))) + qkv
        assert fc.weight_bytes_per_gpu == dense + sum(w.nbytes() for w in m.experts)
        kv = m.new_kv_cache(1)
        assert fc.kv_bytes_per_token_per_gpu == sum(k.nbytes + v.nbytes for k, v in kv)
    if tp == 2:
        one = rank_forecast(ServerConfig(preset="tiny"), TINY, "float32", "bf16")
        assert fc.kv_bytes_per_token_per_gpu == one.kv_bytes_per_token_per_gpu // 2
        assert one.weight_bytes_per_gpu / 2 < fc.weight_bytes_per_gpu < one.weight_bytes_per_gpu


def test_backends_and_devices_of_ranks():
    from moelab.engine.parallel.group import backend_for, rank_device

    assert backend_for("cpu") == "gloo" and backend_for("cuda:1") == "nccl"
    assert rank_device("cuda", 1, 2) == "cuda:1" and rank_device("cuda", 0, 1) == "cuda"
    assert rank_device("cpu", 1, 2) == "cpu"


def test_more_ranks_than_gpus_is_refused_before_any_rank_starts(monkeypatch):
    from moelab.engine.config import resolve

    # a machine with one GPU, as torch reports it (the check itself is moelab's)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="2 ranks need 2 GPUs") as e:
        resolve(ServerConfig(preset="tiny", tp_size=2, device="cuda"))
    assert e.value.flag == "--tp-size"


def _stars(ranks: int, timeout_s: float = 5.0):
    """Every rank's Star of one launch, made in threads of this process over a real store and sockets."""
    import threading

    from moelab.engine.parallel.group import open_store
    from moelab.engine.parallel.star import Star

    lead = open_store("127.0.0.1", 0, ranks, True, timeout_s)
    stores = [lead] + [open_store("127.0.0.1", lead.port, ranks, False, timeout_s) for _ in range(ranks - 1)]
    stars: dict[int, object] = {}
    threads = [threading.Thread(target=lambda r=r: stars.__setitem__(r, Star(r, ranks, stores[r], timeout_s)))
               for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [stars[r] for r in range(ranks)]


def test_the_socket_all_reduce_gives_every_rank_the_same_sum_in_rank_order():
    import threading

    stars = _stars(3)
    parts = [torch.full((2, 3), v, dtype=torch.float32) for v in (1.0, 2.0, 4.0)]
    parts[1][0, 0] = 1e-8  # rank order matters in float32: (1 + 1e-8) + 4 is not 1 + (1e-8 + 4) bit for bit
    want = parts[0] + parts[1] + parts[2]
    threads = [threading.Thread(target=s.all_reduce, args=(t,)) for s, t in zip(stars, parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in parts:
        assert torch.equal(t, want)
    header = torch.arange(P.HEADER, dtype=torch.long)  # a command from rank 0 arrives whole
    stars[0].send(header)
    got = torch.zeros(P.HEADER, dtype=torch.long)
    stars[2].recv_into(got)
    assert torch.equal(got, header)
    for s in stars:
        s.close()


def test_the_socket_all_reduce_fails_at_once_on_a_dead_peer_and_in_time_on_a_silent_one():
    import time

    from moelab.engine.parallel.star import PeerGone

    stars = _stars(2, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # rank 1 is alive and never sends
        stars[0].all_reduce(torch.zeros(4))
    assert time.monotonic() - t0 < 3
    stars[1].close()  # rank 1's process ended
    with pytest.raises(PeerGone):
        stars[0].all_reduce(torch.zeros(4))
    stars[0].close()
