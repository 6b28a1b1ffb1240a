"""Tier 3: `moelab demo` end to end on the embedded engine, and a study file checked against the
embedded engine's own flags."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.embedded


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.slow
def test_demo_runs_a_staged_study_with_a_real_failure_and_a_prune(tmp_path):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "demo", "--json", "--out", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout)
    assert took < 300 and s["status"] == "done"
    stages = {t["stage"] for t in s["trials"]}
    assert {"reference", "screen", "tune", "final"} <= stages
    ok = [t for t in s["trials"] if t["stage"] == "screen" and t["cause"] == "ok"]
    assert len(ok) >= 6  # reference and grouped in every weight format, each with a throughput
    assert all(t["output_tps"] and t["output_tps"] > 0 for t in ok)
    if not _has_cuda():  # on a CPU machine the engine refuses triton itself; the rest are pruned
        triton = [t for t in s["trials"] if "moe-runner-backend=triton" in t["label"]]
        assert [(t["status"], t["cause"]) for t in triton] == [("done", "unsupported_arch"),
                                                               ("pruned", "unsupported_arch"),
                                                               ("pruned", "unsupported_arch")]
        assert "triton" in triton[0]["reason"] and f"trial {triton[0]['id']}" in triton[1]["reason"]
    rec = s["recommendation"]
    assert rec["command"].startswith("moelab serve --preset digits") and rec["n"] >= 3
    assert rec["ci95"][0] <= rec["output_tps"] <= rec["ci95"][1]
    assert rec["accuracy"] >= 0.95  # the trained preset answers its held-out items
    html = open(s["report_html"]).read()
    assert "<script" not in html and "Recommended launch command" in html and "<th>accuracy</th>" in html
    md = open(s["report_md"]).read()
    assert md.startswith("# moelab study: demo") and "Task accuracy of the pick" in md


def test_axis_the_engine_does_not_accept_is_refused(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("engine: embedded\nmodel: tiny\naxes: {--moe-runner-backnd: [grouped]}\n")
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "study", str(p), "--store", str(tmp_path / "s.db")],
                       capture_output=True, text=True, timeout=60)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "does not accept --moe-runner-backnd" in err
    assert not (tmp_path / "s.db").exists()
