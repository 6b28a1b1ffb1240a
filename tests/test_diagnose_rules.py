"""Every diagnosis rule on a log excerpt (tier 1: pure, milliseconds).

Two kinds of excerpt: shapes that follow research/moe-backends-and-failures.md §4 and the vLLM CPU
feasibility notes §4 (SGLang's "[time TPn]" prefixes, vLLM's "(EngineCore_DP0 pid=..)" prefixes,
tracebacks followed by wrapper lines), and real logs of the corpus's dev split
(tests/data/real-logs, copied from public threads) for the rule families written against it. A rule
added to generic.yaml or embedded.yaml without an entry in either table fails
test_every_rule_has_a_case.
"""
from __future__ import annotations

import pytest

import functools
import json
import re
from pathlib import Path

from moelab.diagnose import classify, guess_engine, load_rules, strip_prefixes
from moelab.spec import Cause

CORPUS = Path(__file__).parent / "data" / "real-logs"

SG = "[2026-11-30 09:14:20 TP{r}] "
VL = "(EngineCore_DP0 pid=4242) "
SIGQUIT = "[2026-11-30 09:15:10] Received sigquit from a child process. It usually means the child failed."
VLLM_WRAP = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"


def tb(prefix: str, exc: str, frames: int = 2) -> list[str]:
    out = [prefix + "Traceback (most recent call last):"]
    for i in range(frames):
        out += [prefix + f'  File "/sgl/srt/layer_{i}.py", line {100 + i}, in forward', prefix + "    out = op(x)"]
    return out + [prefix + exc]


# (rule id, log lines, classify kwargs, expected cause)
CASES = [
    ("kernel-oom-killer", ["INFO 11-30 09:14:02 [loader.py:77] Loading weights took 40.1 s",
                           "[12345.678] Out of memory: Killed process 4242 (python3) total-vm:91234567kB"],
     {"exit_code": 137}, Cause.host_oom),
    ("cpu-alloc-failed", [VL + "INFO Allocating KV cache", *tb(VL, "RuntimeError: [enforce fail at alloc_cpu.cpp:127] "
                          "err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 6442450944 bytes. "
                          "Error code 12 (Cannot allocate memory)"), VLLM_WRAP], {"exit_code": 1}, Cause.host_oom),
    # a shell's bare `Killed` with no OOM evidence at hand: the OOM killer is the likelier sender
    # (the verdict says so, names killed_external as the alternative, and how to tell them apart)
    ("shell-killed", ["[2026-11-30 09:14:20 TP0] Load weight begin. avail mem=78.50 GB", "Killed"], {}, Cause.host_oom),
    ("cuda-oom", [*tb(SG.format(r=1), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB."),
                  SIGQUIT], {"exit_code": 1}, Cause.gpu_oom),
    ("kv-cache-no-room", [SG.format(r=0) + "Load weight end. avail mem=2.10 GB",
                          *tb(SG.format(r=0), "RuntimeError: Not enough memory. Please try to increase "
                              "--mem-fraction-static. Current value: mem_fraction_static=0.8"), SIGQUIT],
     {"exit_code": 137}, Cause.gpu_oom),
    ("cublas-alloc-failed", tb(VL, "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
     + [VLLM_WRAP], {"exit_code": 1}, Cause.gpu_oom),
    ("illegal-memory-access", [SG.format(r=0) + "Capture cuda graph begin.",
                               *tb(SG.format(r=1), "RuntimeError: CUDA error: an illegal memory access was encountered"),
                               *tb(SG.format(r=0), "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"),
                               SIGQUIT], {"exit_code": -9}, Cause.illegal_memory_access),
    ("cublas-execution-failed", tb(VL, "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling "
                                   "`cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`") + [VLLM_WRAP],
     {"exit_code": 1}, Cause.illegal_memory_access),
    ("no-kernel-image", tb(VL, "torch.AcceleratorError: CUDA error: no kernel image is available for execution "
                           "on the device") + [VLLM_WRAP], {"exit_code": 1}, Cause.unsupported_arch),
    ("arch-gate", tb(SG.format(r=0), "RuntimeError: FlashInfer-CUTLASS MoE kernel does not support current device sm_120")
     + [SIGQUIT], {"exit_code": 1}, Cause.unsupported_arch),
    ("no-tactic", tb(SG.format(r=2), "RuntimeError: [TensorRT-LLM][ERROR] TrtllmGenBatchedGemmRunner: "
                     "No kernel found for the given options") + [SIGQUIT], {"exit_code": 1}, Cause.unsupported_arch),
    ("smem-out-of-resources", tb(SG.format(r=0), "triton.runtime.errors.OutOfResources: out of resource: shared "
                                 "memory, Required: 147456, Hardware limit: 101376. Reducing block sizes or "
                                 "`num_stages` may help.") + [SIGQUIT], {"exit_code": 1}, Cause.kernel_resource_limit),
    ("jit-compile", tb(VL, "triton.compiler.errors.CompilationError: at 12:4: Internal Triton PTX codegen error")
     + [VLLM_WRAP], {"exit_code": 1}, Cause.jit_compile_error),
    ("nccl-watchdog", [SG.format(r=3) + "[rank3]:[E1130 09:25:11 ProcessGroupNCCL.cpp:632] Watchdog caught "
                       "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
                       "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.", SIGQUIT],
     {"exit_code": -6}, Cause.collective_error),
    ("peer-access", tb(SG.format(r=0), "RuntimeError: CUDA error: peer access is not supported between these two "
                       "devices") + [SIGQUIT], {"exit_code": 1}, Cause.collective_error),
    ("nccl-error", tb(VL, "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                      "unhandled system error (run with NCCL_DEBUG=INFO for details)") + [VLLM_WRAP],
     {"exit_code": 1}, Cause.collective_error),
    ("nccl-peer-died", [SG.format(r=0) + "RuntimeError: NCCL error: remote process exited or there was a network error",
                        SIGQUIT], {"exit_code": 1}, Cause.collective_error),
    ("nan-sampling", tb(SG.format(r=0), "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0")
     + [SIGQUIT], {"exit_code": 1}, Cause.numerical_nan),
    ("argparse-error", ["usage: vllm serve [model_tag] [options]",
                        "vllm serve: error: argument --dtype: invalid choice: 'nonsense' (choose from 'auto', 'bfloat16')"],
     {"exit_code": 2}, Cause.bad_args),
    ("argparse-usage", ["usage: llama-server [options]", "llama-server: too many positional values"],
     {"exit_code": 2}, Cause.bad_args),
    ("command-not-found", ["moelab-cg: 1: exec: llama-server: not found"], {"exit_code": 127}, Cause.bad_args),
    ("invalid-combination", tb(SG.format(r=0), "AssertionError: The expert parallel size must be 1 or the same as "
                               "the tensor parallel size"), {"exit_code": 1}, Cause.bad_args),
    ("model-files", ["(APIServer pid=77) INFO 11-30 09:14:02 [api_server.py:1885] vLLM API server version 0.32.0",
                     *tb("(APIServer pid=77) ", "OSError: Repo id must be in the form 'repo_name' or "
                         "'namespace/repo_name': '/tmp/vllmcpu/does-not-exist'")], {"exit_code": 1}, Cause.model_load_error),
    ("unknown-architecture", tb(VL, "ValueError: The checkpoint you are trying to load has model type `qwen3_5_moe` "
                                "but Transformers does not recognize this architecture.") + [VLLM_WRAP],
     {"exit_code": 1}, Cause.model_load_error),
    ("address-in-use", tb("(APIServer pid=77) ", "OSError: [Errno 98] Address already in use"), {"exit_code": 1},
     Cause.port_in_use),
    ("sglang-sigquit", [SG.format(r=0) + "Load weight begin.", SIGQUIT, "Killed"], {"exit_code": 137}, Cause.host_oom),
    ("tgi-shard-failed", ["2023-08-17T10:23:27.032737Z ERROR text_generation_launcher: Shard 0 failed to start",
                          "Error: ShardCannotStart"], {"exit_code": 1}, Cause.unknown),
    ("vllm-engine-core", [VL + "INFO Initializing a V1 LLM engine", VLLM_WRAP], {"exit_code": 1}, Cause.unknown),
    ("capture-cuda-graph", [SG.format(r=0) + "Capture cuda graph failed: see above. Possible solutions: 1. set "
                            "--mem-fraction-static to a smaller value"], {"exit_code": -11}, Cause.native_crash),
    ("harmless-shutdown", ["(APIServer pid=77) WARNING [shutdown] Process manager: force killing remaining process "
                           "EngineCore", "resource_tracker: There appear to be 2 leaked shared_memory objects"],
     {"exit_code": 0}, Cause.unknown),
    ("embedded-bad-args", ["usage: moelab serve [-h] [--quantization {none,fp8,nvfp4}]",
                           "moelab serve: error: argument --quantization: nvfp4 needs --moe-runner-backend triton or reference"],
     {"exit_code": 2, "engine": "embedded"}, Cause.bad_args),
    ("embedded-nan", ["moelab.engine phase=ready port=8000", "moelab.engine error: non-finite logits in layer 3 (nan)"],
     {"exit_code": 1, "engine": "embedded"}, Cause.numerical_nan),
    ("embedded-needs-cuda", ["moelab.engine phase=start pid=23937 model=preset:tiny torch=2.13.0+cpu",
                             "moelab serve: error: argument --moe-runner-backend: 'triton' cannot run here: the triton "
                             "MoE runner needs a CUDA GPU (device is cpu); use --moe-runner-backend auto or one of "
                             "reference, grouped"], {"exit_code": 2, "engine": "embedded"}, Cause.unsupported_arch),
    ("embedded-model-load", ["moelab.engine phase=start pid=23937 model=/models/broken torch=2.13.0+cpu",
                             "moelab serve: error: cannot load the model: /models/broken/config.json: "
                             "Expecting value: line 1 column 1 (char 0)"], {"exit_code": 1, "engine": "embedded"},
     Cause.model_load_error),
    # `moelab serve --tp-size 2`: lines as the ranks printed them (tests/test_parallel_ranks.py makes them for real)
    ("embedded-rank-killed", [SG.format(r=1) + "moelab.engine phase=building_weights layer 1/2",
                              SG.format(r=0) + "moelab.engine error: rank 1 (pid 10743) was killed by signal 9 "
                              "(SIGKILL); stopping the other 1 rank(s)"], {"exit_code": 1, "engine": "embedded"},
     Cause.killed_external),
    ("embedded-rank-crashed", [SG.format(r=0) + "moelab.engine error: rank 1 (pid 812) was killed by signal 11 "
                               "(SIGSEGV); stopping the other 1 rank(s)"], {"exit_code": 1, "engine": "embedded"},
     Cause.native_crash),
    ("embedded-rank-exited", [*tb(SG.format(r=1), "RuntimeError: MOELAB_ENGINE_FAULT: injected failure in rank 1, "
                                  "phase warmup"),
                              SG.format(r=0) + "moelab.engine error: rank 1 (pid 10006) exited with status 1; stopping "
                              "the other 1 rank(s)", SG.format(r=0) + "moelab.engine rank 0: its all_reduce failed as a "
                              "consequence: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:50351"],
     {"exit_code": 1, "engine": "embedded"}, Cause.unknown),
    ("embedded-collective-timeout", [SG.format(r=1) + "moelab.engine MOELAB_ENGINE_FAULT: rank 1 fails in phase warmup "
                                     "(hang)", SG.format(r=0) + "moelab.engine error: collective all_reduce timed out "
                                     "after 3 s (--dist-timeout) on rank 0 while every rank was alive: [gloo/transport/"
                                     "tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete"],
     {"exit_code": 1, "engine": "embedded"}, Cause.collective_error),
    ("embedded-collective-failed", [SG.format(r=0) + "moelab.engine error: collective broadcast failed on rank 0 while "
                                    "every rank was alive: [gloo/transport/tcp/pair.cc:589] Read error: Connection reset"],
     {"exit_code": 1, "engine": "embedded"}, Cause.collective_error),
    ("embedded-gloo-timeout", tb(SG.format(r=1), "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                                 "waiting 60000ms for recv operation to complete"), {"exit_code": 1, "engine": "embedded"},
     Cause.collective_error),
]


@pytest.mark.parametrize("rule_id,lines,kw,cause", CASES, ids=[c[0] for c in CASES])
def test_rule_on_realistic_log(rule_id, lines, kw, cause):
    v = classify(lines, **kw)
    assert v.cause is cause, v
    log_ev = [e for e in v.evidence if e.kind == "log"]
    if cause is not Cause.unknown:
        assert v.advice, "a cause needs advice"
    if v.detail["rule"] is not None:
        # Which rule fired is recorded, and its evidence line points at a line that contains its text.
        if rule_id not in ("sglang-sigquit", "vllm-engine-core", "capture-cuda-graph", "harmless-shutdown"):
            assert v.detail["rule"] == rule_id
        ev = log_ev[0]
        assert ev.text in lines[ev.line - 1]


# rule id -> a real log of the dev split that the rule decides (the case the family was written from)
REAL = {"orchestrator-kill": "kserve-3792", "native-crash": "llama.cpp-3685", "hang-watchdog": "llm-scaler-77",
        "ray-memory-monitor": "lmm-r1-71", "startup-timed-out": "modal-examples-1553",
        "not-enough-system-memory": "ollama-10920", "rendezvous": "pytorch-105782", "jit-link": "triton-1981",
        "driver-too-old": "triton-server-2193"}  # a known cause outside the vocabulary: unknown, with what to do


@pytest.mark.parametrize("rule_id,case", REAL.items(), ids=list(REAL))
def test_rule_on_a_real_log(rule_id, case):
    assert case in json.loads((CORPUS / "split.json").read_text())["dev"], "rules are written on the dev split only"
    meta = json.loads((CORPUS / case / "meta.json").read_text())
    lines = (CORPUS / case / "log.txt").read_text().splitlines()
    v = classify(lines, exit_code=meta.get("exit_code"), engine=guess_engine(lines))
    assert (v.cause.value, v.detail["rule"]) == (meta["expected_cause"], rule_id)


# a rule family met again in another wording: each alternative from the dev case it was written from
ALSO = {"verl-224": "ray-memory-monitor",  # Ray's "Top 10 memory users" table, pasted alone
        "llama.cpp-10378": "invalid-combination",  # one option that needs another, before the load error it led to
        "ollama-14026": "argparse-error",  # an environment variable refused (a warning, then the default used)
        "nccl-1372": "no-kernel-image",  # NCCL's `Cuda failure 'named symbol not found'`: built for sm_80, run on H100
        "ollama-5015": "model-files"}  # llama.cpp's check_tensor_dims: a tensor the loader looks for is not in the GGUF


@pytest.mark.parametrize("case,rule_id", ALSO.items(), ids=list(ALSO))
def test_a_rule_alternative_on_a_real_log(case, rule_id):
    test_rule_on_a_real_log(rule_id, case)


def test_every_rule_has_a_case():
    ids = {r.id for r in load_rules("embedded")}
    assert ids - {c[0] for c in CASES} - set(REAL) == set()


def test_a_bare_kill_says_which_is_likelier_and_how_to_tell():
    v = classify(["Loading checkpoint shards:  50%|#####     | 1/2 [00:10<00:10, 10.0s/it]Killed"])
    assert v.cause is Cause.host_oom and v.alternatives[0].cause is Cause.killed_external
    assert "dmesg" in v.advice and "OOMKilled" in v.advice
    # moelab's own cgroup counted no OOM kill: then it was not one
    from moelab.diagnose import OomEvidence

    v = classify(["Killed"], exit_code=-9, oom=OomEvidence(source="cgroup v2", limit_bytes=1 << 30))
    assert v.cause is Cause.killed_external


def _dev_case(case: str):
    """(lines, verdict) of a real log of the dev split, read as `moelab diagnose` reads it."""
    assert case in json.loads((CORPUS / "split.json").read_text())["dev"], "rules are written on the dev split only"
    lines = (CORPUS / case / "log.txt").read_text().splitlines()
    return lines, classify(lines, engine=guess_engine(lines))


# A pasted answer with no error line: the ways it is not language, each from a real thread of the dev split.
BROKEN = {"levanter-1259": "said again within six words", "llama.cpp-17106": "are no word",
          "mlx-lm-844": "closed by the wrong kind", "gpt-fast-179": "5 times in a row",
          "mistral.rs-956": "letters no language writes",  # with the server's own lines around the answer
          "lmstudio-bug-tracker-1276": "word salad", "ollama-3695": "hold no letter",
          "llama-cpp-turboquant-207": "numbers, no writer writes",  # `1,00080278`, `21446.21466-15-05.19398035`
          "exo-1953": "glued to digits",
          "xinfer-250": "are no word",  # letters and digits run together, the command typed above it aside
          "sglang-3716": "five or more times in a row"}  # `<|>` on line after line


@pytest.mark.parametrize("case,why", BROKEN.items(), ids=list(BROKEN))
def test_a_pasted_answer_that_is_not_language_is_garbage_output(case, why):
    lines, v = _dev_case(case)
    assert v.cause is Cause.garbage_output, v
    ev = v.evidence[0]
    assert why in ev.source and ev.text[:40] in lines[ev.line - 1]
    assert v.detail["weak"], "read from the text's shape: a supervisor must not take it for a live server's root error"


def test_a_command_typed_at_a_prompt_is_not_the_start_of_a_wrapped_line():
    """vllm#27228 pastes its `$ vllm bench latency ...` line, then C++'s terminate: the command ends where its
    user pressed Enter. std::bad_alloc reads as host memory (four threads of the dev split say so), and the
    second reading is the crash this thread confirms, a vLLM build for another torch."""
    lines, v = _dev_case("vllm-27228")
    assert v.evidence[0].text == lines[1] and v.evidence[0].text.startswith("terminate called after throwing")
    assert v.cause is Cause.host_oom and Cause.native_crash in [a.cause for a in v.alternatives]


def test_cuda_out_of_memory_without_a_devices_figures_may_be_pinned_host_memory():
    """llama.cpp#1230: `CUDA error 2 ... out of memory` was cudaMallocHost failing under WSL's limit on
    page-locked memory (fixed by falling back to pageable memory). The log cannot tell it from the device's
    memory: gpu_oom, with host_oom second and how to tell them apart. PyTorch's message, which gives the
    device's figures, has no such second reading."""
    _, v = _dev_case("llama.cpp-1230")
    assert v.cause is Cause.gpu_oom and Cause.host_oom in [a.cause for a in v.alternatives]
    assert "cudaMallocHost" in v.advice
    v = classify(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                  "capacity of 79.19 GiB of which 1.02 GiB is free."])
    assert v.cause is Cause.gpu_oom and Cause.host_oom not in [a.cause for a in v.alternatives]


def test_broken_text_reads_only_answers():
    """No dev-split log of another cause reads as a broken answer (compiler output, process listings, tracebacks),
    and a printed NaN tensor is the NaN check's, not broken text."""
    from moelab.diagnose import structure

    split = json.loads((CORPUS / "split.json").read_text())
    wrong = []
    for case in split["dev"]:
        meta = json.loads((CORPUS / case / "meta.json").read_text())
        texts = [strip_prefixes(x)[0] for x in (CORPUS / case / "log.txt").read_text(errors="replace").splitlines()]
        if structure.broken_text(texts) and meta["expected_cause"] != "garbage_output":
            wrong.append(case)
    assert wrong == []
    assert structure.broken_text(["tensor([[nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan]])"]) == []


def test_written_prose_is_not_broken_text():
    """Paragraphs people wrote -- this repository's README and docs (markdown, figures, acronyms, commands) and
    every case note of the corpus -- never read as a broken answer."""
    from moelab.diagnose import structure

    root = Path(__file__).parent.parent
    paras = [p.splitlines() for f in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
             for p in f.read_text().split("\n\n") if p.strip() and "```" not in p and not p.startswith(("|", "    "))]
    paras += [[json.loads(m.read_text())["note"]] for m in sorted(CORPUS.glob("*/meta.json"))]
    assert len(paras) > 500
    assert [p[0][:80] for p in paras if structure.broken_text(p)] == []


# (case, the exception line's text after the type, the cause its message names or None)
MESSAGES = [("vllm-52435", "AssertionError", Cause.bad_args), ("Orpheus-TTS-44", "ValueError", Cause.unsupported_arch),
            ("text-generation-inference-1354", "ValueError", Cause.bad_args), ("slime-1741", "AttributeError", None)]


@pytest.mark.parametrize("case,etype,cause", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_an_exception_message_names_its_cause_when_its_type_does_not(case, etype, cause):
    """The exception lines of real logs: a setting held to a constraint is a refused configuration, the cause
    words of a message decide over that, and a plain bug's message names nothing."""
    from moelab.diagnose import structure

    line = next(t for t in (strip_prefixes(x)[0] for x in (CORPUS / case / "log.txt").read_text().splitlines())
                if t.startswith(etype + ": "))
    assert structure.message_cause(line.split(": ", 1)[1]) is cause


# Structure the classifier reads in real logs of the dev split: (case, cause, words of the deciding evidence's source)
STRUCTURE = {"AMD-SHARK-Studio-965": ("port_in_use", "address-in-use"),  # a chained exception names the first
             # a paste that ends at `raise RuntimeError(message) from e` in torch's ninja build, its frame
             # paths padded where a terminal wrapped them: the package of the frames decides
             "exllama-65": ("jit_compile_error", "raised from torch/utils/cpp_extension"),
             # torch elastic's agent got a SIGHUP (the run was under nohup, the terminal closed)
             "Chinese-LLaMA-Alpaca-3-47": ("killed_external", "stopped from outside"),
             "vllm-34816": ("orphan_leak", "engine's worker process"),  # fuser / rocm-smi rows of VLLM::EngineCore
             "ollama-12360": ("garbage_output", "chat-template markers"),
             "llama.cpp-9352": ("gpu_oom", "cuda-oom"),  # ggml's ROCm0 buffer, before the load error it caused
             "trax-270": ("gpu_oom", "cuda-oom"),  # XLA on TPU: HBM, not CUDA
             # a short pasted answer: a loop shows even in a line or two
             "ik_llama.cpp-2214": ("garbage_output", "twice in a row"),
             "llama.cpp-25402": ("garbage_output", "stuttered inside a word"),
             "mlxcel-717": ("garbage_output", "the rest left out"),
             "unsloth-10613": ("garbage_output", "one symbol repeated"),
             # the source line that raised reads a setting: its value was refused
             "GenAIInfra-612": ("bad_args", "environment variable VLLM_PORT"),
             "koboldcpp-1782": ("bad_args", "the setting 'contextsize'"),
             # a cause said in words, then a plain bug's exception it led to
             "mlx-examples-1172": ("model_load_error", "cause words before the exception"),
             # no progress: requests queue and none is scheduled; one request's context shifted again and again
             "vllm-8378": ("hang", "nothing is scheduled"),
             "ollama-2805": ("hang", "context shifted"),
             "xoscar-97": ("orphan_leak", "process listing"),  # ps after terminate-model: the model's workers
             # a bare AssertionError under the assert it failed: a size of the model by the parallel size
             "vllm-1581": ("bad_args", "divides by the parallel size"),
             # a scheduler's CANCELLED with the cgroup's OOM kill count beside it: the OOM ended the job
             "3DRS-7": ("host_oom", "OOM-killer"),
             # a gdb backtrace whose innermost frame is no wait: the crash's own stack
             "server-7472": ("native_crash", "gdb backtrace of a crash"),
             # bash's `Killed` in a zh_CN locale, glued to a progress bar
             "TaPA-1": ("host_oom", "SIGKILL"),
             # a progress bar as wide as the terminal, then the shell's `Killed`: no wrapped line
             "Video-LLaVA-13": ("host_oom", "SIGKILL")}


@pytest.mark.parametrize("case,want", STRUCTURE.items(), ids=list(STRUCTURE))
def test_structure_of_real_logs(case, want):
    _, v = _dev_case(case)
    assert v.cause.value == want[0] and want[1] in v.evidence[0].source, v
    assert v.detail["weak"] is (want[0] in ("orphan_leak", "garbage_output"))


def test_workers_listed_as_left_behind_after_the_end_are_the_leak_and_the_end_its_second_reading():
    _, v = _dev_case("vllm-44751")  # a startup timeout ended the launcher; "orphaned procs:" and the worker
    assert v.cause is Cause.orphan_leak and "VLLM::Worker_DP1_EP1" in v.evidence[0].text, v
    assert v.alternatives[0].cause is Cause.startup_timeout


def test_a_gdb_backtrace_of_a_waiting_process_is_no_crash():
    # the shape of `thread apply all bt` on a stuck server (not a real log): its innermost frames wait
    stuck = ["#0  0x00007f2c1a4d8e96 in __futex_abstimed_wait_common64 (private=0, cancel=true) at ./nptl/futex-internal.c:57",
             "#1  0x00007f2c1a4db9c0 in __pthread_cond_wait_common (cond=0x55d0) at ./nptl/pthread_cond_wait.c:503",
             "#2  0x00007f2bf0a1c2de in ncclGroupEnd () from /usr/lib/libnccl.so.2"]
    from moelab.diagnose import structure

    assert structure.native_reports(stuck, lambda t: None) == []
    crashed = [stuck[0].replace("__futex_abstimed_wait_common64", "Context::IsCancelled"),
               "#1  0x00005c9ffbc00b8a in ModelInferHandler::Process (this=0x7332757b7f70) at infer_handler.cc:706"]
    assert structure.native_reports(crashed, lambda t: None)[0].cause is Cause.native_crash


def test_macos_one_line_terminate_is_read_like_linux_terminate():
    """libc++abi says the exception's type and what() on one line; what() decides, as after `terminate called`."""
    from moelab.diagnose import structure

    texts = [strip_prefixes(x)[0] for x in (CORPUS / "vmlx-58" / "log.txt").read_text().splitlines()]
    from moelab.diagnose.classify import _matcher

    found = structure.native_reports(texts, _matcher(load_rules(None)).root_cause)
    assert found and found[0].cause is Cause.gpu_oom and "what() says gpu_oom" in found[0].source


# Cause words (and a launcher's kill line) that decide where no rule does, each on a real log of the dev split:
# (case, cause, words of the deciding line)
WORDED = {"exllamav2-383": ("gpu_oom", "Insufficient VRAM"),  # exllamav2's own words, no CUDA OOM line
          "onnxruntime-16307": ("gpu_oom", "BFCArena"),  # a device allocator's arena that could not grow
          "TensorRT-LLM-1671": ("unsupported_arch", "not supported on Volta"),  # a GPU generation named
          "djl-serving-1725": ("bad_args", "not supported for this model"),  # a feature switched on for a model
          "tensorrtllm_backend-271": ("bad_args", "When KV cache block reuse is set"),  # a setting's requirement
          "ollama-8761": ("bad_args", "no such host"),  # OLLAMA_HOST with a full-width colon: a malformed address
          "ollama-6839": ("bad_args", "invalid port"),
          "Halide-8288": ("kernel_resource_limit", "shared memory"),  # Vulkan's limit, worded as a spec violation
          "TensorRT-LLM-346": ("gpu_oom", "OutOfMemory"),  # TensorRT's engine builder
          "ktransformers-637": ("host_oom", "killed as a result of limit of host"),  # an older kernel's cgroup OOM
          "autotrain-advanced-456": ("host_oom", "SIGKILL"),  # a launcher's error that its child was SIGKILLed
          # rocBLAS has no kernels for gfx1032, then the abort it led to: the generic crash rule says only how it ended
          "ollama-2823": ("unsupported_arch", "for GPU arch : gfx1032")}


@pytest.mark.parametrize("case,want", WORDED.items(), ids=list(WORDED))
def test_cause_words_of_real_logs(case, want):
    _, v = _dev_case(case)
    assert v.cause.value == want[0] and want[1] in v.evidence[0].text, v


# The general layers alone (structure and cause words, every signature rule taken away) on real logs of the dev
# split, each worded unlike the others: what carries to a log no rule was written for. (case, cause, words of the
# deciding line)
UNRULED = {"AFProfile-8": ("gpu_oom", "RESOURCE_EXHAUSTED"),  # memory that names no place: an accelerator's allocator
           "vllm-5677": ("bad_args", "does not match"),  # a flag's value against the checkpoint's config
           "tt-inference-server-2563": ("hang", "Read timed out"),  # a client that reached the server, waited in vain
           "llama.cpp-4492": ("native_crash", "SIGSEGV"),  # grammar-parse errors before the crash are no flag refusal
           "ollama-644": ("native_crash", "illegal instruction"),
           "xla-2569": ("gpu_oom", "Resource exhausted"),  # the place is on the line (HBM1)
           "RWKV-Runner-97": ("host_oom", "DefaultCPUAllocator"),
           "enunu_training_kit-8": ("host_oom", "paging file"),  # a page file too small, loading a CUDA DLL
           "darkflow-962": ("host_oom", "std::bad_alloc"),  # the C++ exception's type, not "it aborted"
           "ollama-8261": ("port_in_use", "bind:"),  # Go's listen error, the rest in Turkish
           "lmdeploy-687": ("port_in_use", "bind on address"),
           "text-generation-inference-1456": ("bad_args", "unexpected argument"),  # clap
           "mlx-vlm-1096": ("bad_args", "usage:"),  # a usage line naming --trust-remote-code is no load error
           "vllm-13980": ("bad_args", "tensor parallel size"),
           "gpustack-4769": ("bad_args", "not divisible"),
           "exllamav2-786": ("unsupported_arch", "too old"),
           "ollama-4334": ("native_crash", "0xc0000005"),  # Windows' access violation
           "deepgemm-405": ("illegal_memory_access", "illegal instruction was encountered"),  # the GPU's, not the CPU's
           "llama-node-72": ("native_crash", "Illegal instruction"),
           "sglang-3830": ("jit_compile_error", "compilation terminated"),  # gcc's, no outside kill
           "pytorch-118369": ("collective_error", "Watchdog caught collective"),
           "llm.c-106": ("kernel_resource_limit", "too many resources"),
           "mesh-llm-112": ("startup_timeout", "failed to become healthy"),
           "lmdeploy-3806": ("unsupported_arch", "no kernel image"),  # before the abort it caused
           "vllm-44185": ("hang", "shared memory broadcast"),  # shared memory waited on is no memory run out
           "vllm-29233": ("gpu_oom", "KV cache"),
           "llama.cpp-6861": ("gpu_oom", "must not exceed"),  # one Metal buffer over the device's limit
           "mlx-vlm-1799": ("kernel_resource_limit", "Thread group size"),  # Metal's threads per threadgroup
           "llama.cpp-19949": ("unsupported_arch", "No compatible code objects"),  # ROCm, before the segfault it caused
           "server-7259": ("bad_args", "requires setting"),  # a flag that needs another
           "dynamo-101": ("bad_args", "Pass --model-name"),
           "ollama-8252": ("bad_args", "unknown parameter"),
           "instructlab-2286": ("bad_args", "Too large swap space"),  # a settings check, worded like memory
           "kserve-944": ("bad_args", "missing required field"),  # kubectl's schema
           "llama.cpp-9007": ("bad_args", "(stoi)"),  # a number flag given a word
           "text-generation-inference-563": ("gpu_oom", "panicked at"),  # a Rust panic's message
           "AnomalyGPT-43": ("host_oom", "return code = -9"),  # a launcher's SIGKILLed rank, no memory word
           "qwen38-27b-rtx3090-39": ("host_oom", "available RAM"),  # the loader said it would not fit, then died
           "vllm-ascend-5020": ("gpu_oom", "NPU out of memory"),
           "tt-inference-server-2886": ("gpu_oom", "Out of Memory"),  # no place named: an accelerator's allocator
           "llama.cpp-8101": ("host_oom", "cpu_buffer"),  # the host buffer first, then the KV cache it was for
           "ArcticInference-29": ("bad_args", "error: argument --speculative-config"),  # argparse's own refusal
           "vector-inference-157": ("bad_args", "error: argument --compilation-config"),  # ... not a compile error
           "HunyuanImage-3.0-54": ("model_load_error", "validation error"),  # a model's architectures, not the GPU's
           "sglang-552": ("collective_error", "peer access"),  # GPUs without P2P: no architecture refusal
           "lit-llama-306": ("illegal_memory_access", "Assertion"),  # a kernel's assert, then the abort it raised
           "vllm-50859": ("illegal_memory_access", "Memory access fault by GPU"),  # ROCm's words, then the abort
           "vllm-13150": ("model_load_error", "No supported config format found"),
           "ollama-6998": ("model_load_error", "wrong number of tensors"),  # the loader's words, then terminate
           "llm-scaler-77": ("hang", "RPC call to execute_model timed out"),  # a running engine's workers
           "mlxstudio-83": ("gpu_oom", "maximum allowed buffer size"),  # Metal's one-buffer cap
           "mlc-llm-974": ("gpu_oom", "VK_ERROR_OUT_OF_DEVICE_MEMORY"),  # not the build folder's name
           "legacy-rocm-build-1269": ("unsupported_arch", "hipErrorNoBinaryForGpu"),
           "sglang-25484": ("kernel_resource_limit", "too much shared data"),  # ptxas's words, no compile error
           "sglang-1691": ("hang", "without making progress"),  # a watchdog's count, said with the abort it led to
           "pytorch-15592": ("collective_error", "gloo::IoException"),  # a collective library's C++ exception
           "ipex-llm-11877": ("collective_error", "CCL_ERROR"),  # oneCCL's own marks
           "Qwen-TensorRT-LLM-123": ("bad_args", "mpiSize == tp * pp"),  # processes launched vs parallel sizes
           "server-1105": ("bad_args", "Invalid argument"),  # the innermost clause of a wrapped load error
           "ollama-1686": ("bad_args", "bad origin"),  # names OLLAMA_ORIGINS, set on the command line
           "sglang-14383": ("garbage_output", "Accuracy: 0.000"),  # an eval scored nothing; the command's
           "vllm-17005": ("garbage_output", "exact_match"),  # --trust-remote-code is no load error
           "vllm-33620": ("garbage_output", "Accuracy: 0.016"),  # not its progress bar, which repeats by design
           "vllm-8017": ("garbage_output", "\ufffd2/"),
           "RTD-Action-31": ("killed_external", "Received 2 death signal"),  # older torch elastic: the number
           "ultralytics-918": ("killed_external", "Received 1 death signal"),  # SIGHUP, glued to a progress bar
           "vllm-19793": ("model_load_error", "does not recognize this architecture"),
           "ollama-3010": ("model_load_error", "invalid file magic"),  # a git-lfs pointer where the GGUF should be
           "tabbyAPI-217": ("model_load_error", "Could not find model.embed_tokens.* in model"),  # a weight's name
           "ollama-14026": ("bad_args", "invalid environment variable"),  # a setting refused, the default used
           "OpenRLHF-728": ("bad_args", "Valid placement group indexes"),  # a value refused, the valid ones listed
           "sglang-2796": ("bad_args", "cannot be converted to 'Sequence'")}  # a Rust router's argument, PyO3's words  # half a character among whole ones, not the bar above


@pytest.mark.parametrize("case,want", UNRULED.items(), ids=list(UNRULED))
def test_the_general_layers_alone_name_the_cause_of_real_logs(case, want):
    assert case in json.loads((CORPUS / "split.json").read_text())["dev"], "rules are written on the dev split only"
    lines = (CORPUS / case / "log.txt").read_text().splitlines()
    v = classify(lines, rules=())
    assert v.cause.value == want[0] and want[1] in v.evidence[0].text, v


# Plain bugs whose logs hold other causes' words (a launcher's `Killed`, NCCL, fp4 on an H100, a model's layers):
# each confirmed a software bug by its thread, each read as one, the exception kept as evidence (dev split)
PLAIN_BUGS = {"sglang-9614": "AttributeError", "text-generation-inference-2139": "AttributeError",
              "vllm-2875": "AttributeError", "vllm-8556": "TypeError", "TensorRT-LLM-2737": "AttributeError"}


@pytest.mark.parametrize("case,etype", PLAIN_BUGS.items(), ids=list(PLAIN_BUGS))
def test_a_plain_bug_among_other_causes_words_stays_unknown(case, etype):
    _, v = _dev_case(case)
    assert v.cause is Cause.unknown and v.evidence[0].text.startswith(etype + ":"), v


def test_a_go_panic_is_read_like_an_exception():
    """Go turns a nil dereference's SIGSEGV into a panic and prints the signal after it: a native crash by the
    table (ollama's scheduler), while a Rust panic whose message names a cause says that cause (TGI's warmup;
    without the signature rules too, in UNRULED)."""
    _, v = _dev_case("ollama-4187")
    assert v.cause is Cause.native_crash and "Go panic on SIGSEGV" in v.evidence[0].source
    _, v = _dev_case("text-generation-inference-563")
    assert v.cause is Cause.gpu_oom


def test_a_well_formed_unknown_host_is_no_flag_error():
    """A host name that could be real and is not found is the network's business, not a malformed setting."""
    v = classify(['Error: Head "http://ollama.internal:11434/": dial tcp: lookup ollama.internal: no such host'])
    assert v.cause is not Cause.bad_args


def test_a_signal_name_in_angle_brackets_is_no_setting_held_to_a_bound():
    """`<Signals.SIGKILL: 9>` is Python's repr of a signal, not a comparison: no flag refusal is read from it,
    while real bounds still are."""
    from moelab.diagnose import structure

    assert structure.message_cause("Command '['python3', '-m', 'x', '--training_config', 'p.json']' died with "
                                   "<Signals.SIGKILL: 9>.") is None
    assert structure.message_cause("`max_num_seqs` must be <= 256, got 512") is Cause.bad_args


# What launchers and log collectors put before each line of an engine's log
WRAPPERS = {"journald": lambda t: f"Jan 26 17:48:20 gpu-node-3 python3[1418]: {t}",
            "docker compose": lambda t: f"vllm-server-1  | {t}",
            "kubectl --timestamps": lambda t: f"2025-03-04T10:11:12.123456789Z {t}",
            "kubectl --prefix": lambda t: f"[pod/vllm-0/server] {t}",
            "srun --label": lambda t: f"0: {t}",
            "ANSI colours": lambda t: re.sub(r"\b(ERROR|WARNING|INFO|Error|error)\b", "\x1b[31m\\1\x1b[0m", t),
            "CRLF": lambda t: t + "\r",
            "quoted in a reply": lambda t: "> " + t}


@functools.cache
def _dev_verdicts() -> tuple[tuple[dict, list[str], Cause], ...]:
    """(meta, lines, verdict) of every dev-split log as given, read once for the tests that change how it arrives."""
    out = []
    for case in json.loads((CORPUS / "split.json").read_text())["dev"]:
        meta = json.loads((CORPUS / case / "meta.json").read_text())
        lines = (CORPUS / case / "log.txt").read_text(errors="replace").splitlines()
        out.append((meta, lines, classify(lines, exit_code=meta.get("exit_code"), engine=guess_engine(lines)).cause))
    return tuple(out)


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=list(WRAPPERS))
def test_every_dev_log_reads_the_same_through_a_launchers_prefix(wrapper):
    """A log collected by journald, docker compose, kubectl or srun, coloured, or quoted, reads as the log itself: the verdict
    on every dev-split log is unchanged."""
    wrap = WRAPPERS[wrapper]
    changed = []
    for meta, lines, plain in _dev_verdicts():
        wrapped = [wrap(t) for t in lines]
        through = classify(wrapped, exit_code=meta.get("exit_code"), engine=guess_engine(wrapped)).cause
        if through is not plain:
            changed.append(f"{meta['source']}: {plain.value} -> {through.value}")
    assert changed == []


def test_a_log_pasted_as_one_inline_code_span_reads_as_the_log():
    """A log pasted between two single backticks (intel-extension-for-transformers#846's "`Special tokens ...",
    "Killed`") keeps them on its first and last lines; every dev-split log reads the same that way."""
    changed = []
    for meta, lines, plain in _dev_verdicts():
        if not lines:
            continue
        spanned = [f"`{lines[0]}", *lines[1:]]
        spanned[-1] += "`"
        through = classify(spanned, exit_code=meta.get("exit_code"), engine=guess_engine(spanned)).cause
        if through is not plain:
            changed.append(f"{meta['source']}: {plain.value} -> {through.value}")
    assert changed == []


@pytest.mark.parametrize("width,kept", [(120, 0.99), (80, 0.97)])
def test_a_log_hard_wrapped_at_a_terminals_width_reads_as_the_log(width, kept):
    """Pasted from a terminal that breaks long lines at its width, a real log still gets its verdict: the
    wrapped lines are joined again before they are read (classify.unwrap)."""
    same = total = 0
    for meta, lines, plain in _dev_verdicts():
        wrapped = [t[i:i + width] for t in lines for i in range(0, max(len(t), 1), width)]
        if wrapped == lines:
            continue
        total += 1
        same += classify(wrapped, exit_code=meta.get("exit_code"), engine=guess_engine(wrapped)).cause is plain
    assert total > 100 and same >= kept * total, f"{same} of {total} wrapped logs kept their verdict"


def test_an_evaluation_that_scored_is_no_garbage():
    """Only a score of (near) nothing reads as garbage answers; the same eval after its fix (vllm#33620's
    0.780) says nothing."""
    for line in ("Accuracy: 0.780", "metrics={'accuracy': 0.5, 'invalid': 0.0}", "acc: 0.31"):
        assert classify([line]).cause is not Cause.garbage_output, line
    assert classify(["Accuracy: 0.016"]).cause is Cause.garbage_output
