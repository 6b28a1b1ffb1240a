"""The audit's decisions as pure functions on plain data: a cell from findings, drift, the weighing
of curated matrix, source and launches. Milliseconds; the findings are shaped like real ones
(tests/test_audit.py reads them from installed source)."""
from __future__ import annotations

from moelab.audit.knowledge import Trial, launches, one
from moelab.audit.matrix import Audit, Finding, Row, cell, drift, rows
from moelab.engines.support import lookup

ARCHS = ["sm_80", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120", "sm_121"]


def finding(value, refused=(), conditional=(), formats=(), at="x.py:1", flag="--moe-runner-backend", model=None):
    archs = {a: "refused" if a in refused else "conditional" if a in conditional else "allowed" for a in ARCHS}
    return Finding(flag=flag, value=value, kind="raise", at=at, archs=archs, formats=list(formats), model=model,
                   when={a: ["cfg.kv_cache_dtype == 'fp8_e4m3'"] for a in conditional})


def test_cell_order_refused_then_allowed_then_conditional():
    hpc = [finding("hpc_ops", refused=set(ARCHS) - {"sm_90"}, at="runner.py:155")]
    assert cell("sm_100", hpc).status == "refused" and cell("sm_100", hpc).at == "runner.py:155"
    assert cell("sm_90", hpc).status == "allowed"
    mha = [finding("trtllm_mha", refused={"sm_80"}, at="hook.py:203"),
           finding("trtllm_mha", refused={"sm_80"}, conditional={"sm_120"}, at="hook.py:218")]
    c = cell("sm_120", mha)
    assert c.status == "allowed" and c.when == ["hook.py:218: cfg.kv_cache_dtype == 'fp8_e4m3'"]
    only_cond = cell("sm_120", mha[1:2] and [finding("x", conditional={"sm_120"})])
    assert (only_cond.status, only_cond.unconditional) == ("refused", False)
    assert cell("sm_90", []).status == "no gate found"


def test_format_and_model_specific_code_refuses_only_under_that_condition():
    nvfp4 = [finding("deep_gemm", refused={"sm_80", "sm_89", "sm_90"}, formats=["nvfp4"])]
    assert (cell("sm_90", nvfp4).status, cell("sm_90", nvfp4).unconditional) == ("refused", False)
    assert "the weights are nvfp4" in cell("sm_90", nvfp4).when[0]
    assert cell("sm_90", nvfp4, "nvfp4").unconditional and cell("sm_90", nvfp4, "fp8").status == "no gate found"
    ocr = [finding("FLASH_ATTN", refused={"sm_80"}, model="config: UnlimitedOCRConfig.verify", flag="--attention-backend")]
    assert not cell("sm_80", ocr).unconditional


def test_drift_only_where_the_source_decides():
    fs = [finding("flashinfer_trtllm", refused={"sm_80", "sm_89", "sm_90"}, at="jit/fused_moe.py:385"),
          finding("hpc_ops", refused=set(ARCHS) - {"sm_90"}),
          finding("triton", conditional={"sm_120"})]
    r = rows({"--moe-runner-backend": ("moe_runner", ["flashinfer_trtllm", "hpc_ops", "triton"])}, fs)
    d = {(x.value, x.arch) for x in drift("sglang", r, fs)}
    # the matrix says trtllm-gen MoE fails on SM12x; this source lets it through there
    assert {("flashinfer_trtllm", "sm_120"), ("flashinfer_trtllm", "sm_121")} <= d
    assert not {x for x in d if x[0] in ("hpc_ops", "triton")}  # agrees, or only conditional


def test_launches_win_and_disagreements_are_named():
    curated = lookup("sglang", "moe_runner", "flashinfer_trtllm", "sm_120", "nvfp4")
    audit = Audit(engine="sglang", version="0.5.23", python="py", packages=[], choices_from="c",
                  rows=[Row(flag="--moe-runner-backend", kind="moe_runner", value="flashinfer_trtllm", cells={})],
                  findings=[finding("flashinfer_trtllm", refused={"sm_90"}, at="jit/fused_moe.py:385")])
    died = [Trial(id=4, arch="sm_120", values={"--moe-runner-backend": "flashinfer_trtllm"}, cause="unsupported_arch"),
            Trial(id=5, arch="sm_120", values={"--moe-runner-backend": "flashinfer_trtllm"}, cause="gpu_oom"),
            Trial(id=6, arch="sm_90", values={"--moe-runner-backend": "flashinfer_trtllm"}, cause="ok")]
    k = one("--moe-runner-backend", "moe_runner", "flashinfer_trtllm", "sm_120", "nvfp4", curated, audit, "a",
            died, "s.db")
    assert (k.decision, k.decided_by) == ("no", "launches")
    assert k.launches.failed == {"unsupported_arch": [4]} and k.launches.other == 1 and not k.launches.ok
    assert "the source lets it through (jit/fused_moe.py:385) but a launch died: unsupported_arch (trial 4)" \
        in k.disagreements
    ran = [Trial(id=7, arch="sm_120", values={"--moe-runner-backend": "flashinfer_trtllm"}, cause="ok")]
    k = one("--moe-runner-backend", "moe_runner", "flashinfer_trtllm", "sm_120", "nvfp4", curated, audit, "a",
            ran, "s.db")
    assert (k.decision, k.decided_by) == ("yes", "launches")
    assert any("curated matrix says it fails" in s and "launched here: trial 7" in s for s in k.disagreements)
    k = one("--moe-runner-backend", "moe_runner", "flashinfer_trtllm", "sm_90", "nvfp4", curated, audit, "a", [], None)
    assert (k.decision, k.decided_by) == ("no", "source") and k.source.at == "jit/fused_moe.py:385"


def test_launch_status_words():
    t = [Trial(id=1, arch="sm_90", values={"--f": "a"}, cause="ok"),
         Trial(id=2, arch="sm_90", values={"--f": "a"}, cause="illegal_memory_access")]
    assert launches(t, "--f", "a", "sm_90", None).status == "mixed"
    assert launches(t, "--f", "a", "sm_100", None).status == "none"
    assert launches(t[:1], "--f", "A", "sm_90", None).status == "works"  # values compare as the engine does
