"""Tier 2: `run_probe` / `moelab probe` against real small HTTP servers that misbehave."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fakes"))
from spawn import serve  # noqa: E402

from moelab.probe import ServerUnreachable, record_reference, run_probe  # noqa: E402
from moelab.spec import Cause  # noqa: E402

pytestmark = pytest.mark.process


@pytest.mark.parametrize("mode,cause", [("healthy", Cause.ok), ("nan", Cause.numerical_nan),
                                        ("repeat", Cause.garbage_output), ("garbage", Cause.garbage_output),
                                        ("drift", Cause.ok)])
def test_absolute_checks(mode, cause):
    with serve(mode) as url:
        rep = run_probe(url, timeout_s=10)
    assert rep.verdict.cause is cause, rep.verdict.evidence
    assert rep.model == "bad-moe" and not rep.reference_used and "only the absolute checks" in rep.note
    assert len(rep.prompts) == 8 and all(r.error is None for r in rep.prompts)
    long = next(r for r in rep.prompts if r.id == "long")
    assert long.kind == "long_context"


def test_reference_catches_what_absolute_checks_cannot(tmp_path):
    ref = tmp_path / "ref.json"
    with serve("healthy") as url:
        rec = record_reference(url, None, ref, timeout_s=10)
        same = run_probe(url, reference=ref, timeout_s=10)
    assert rec.verdict.ok and ref.is_file()
    doc = json.loads(ref.read_text())
    assert set(doc["answers"]) == {p["id"] for p in doc["prompts"]}
    assert same.verdict.ok and same.reference_used and all(r.comparison.identical for r in same.prompts)
    with serve("drift") as url:
        bad = run_probe(url, reference=ref, timeout_s=10, weight_format="nvfp4")
    assert bad.verdict.cause is Cause.garbage_output  # even the loosest tolerance
    assert any("differ from the reference" in e.text for e in bad.verdict.evidence)


def test_recording_refuses_a_broken_server(tmp_path):
    ref = tmp_path / "ref.json"
    with serve("repeat") as url:
        rep = record_reference(url, None, ref, timeout_s=10)
    assert rep.verdict.cause is Cause.garbage_output and not ref.exists()


def test_chat_mode():
    with serve("healthy") as url:
        ok = run_probe(url, chat=True, timeout_s=10)
    with serve("nan") as url:
        nan = run_probe(url, chat=True, timeout_s=10)
    assert ok.verdict.ok and ok.prompts[0].answer.tokens
    assert nan.verdict.cause is Cause.numerical_nan


def test_http_errors_are_evidence_not_crashes():
    with serve("error") as url:
        rep = run_probe(url, timeout_s=10)
    errs = [r for r in rep.prompts if r.error]
    assert errs and "HTTP 500" in errs[0].error
    assert any("request failed" in e.text for e in rep.verdict.evidence)


def test_unreachable_url_raises(free_port):
    with pytest.raises(ServerUnreachable, match="cannot reach"):
        run_probe(f"http://127.0.0.1:{free_port}", timeout_s=2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moelab.cli", *args], capture_output=True, text=True, timeout=60)


def test_cli_exit_codes_and_json(tmp_path, free_port):
    ref = tmp_path / "ref.json"
    with serve("healthy") as url:
        rec = _cli("probe", "--url", url, "--record", str(ref))
        ok = _cli("probe", "--url", url, "--against", str(ref), "--format", "fp8", "--json")
    assert rec.returncode == 0, rec.stderr
    assert "recorded 8 answers" in rec.stdout
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["verdict"]["cause"] == "ok" and doc["reference_used"] and doc["weight_format"] == "fp8"
    with serve("nan") as url:
        nan = _cli("probe", "--url", url, "--json")
    assert nan.returncode == 1 and json.loads(nan.stdout)["verdict"]["cause"] == "numerical_nan"
    down = _cli("probe", "--url", f"http://127.0.0.1:{free_port}")
    assert down.returncode == 2 and "cannot reach" in down.stderr
    missing = _cli("probe", "--url", "http://127.0.0.1:1", "--against", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "no such reference file" in missing.stderr
    badfmt = _cli("probe", "--url", "http://127.0.0.1:1", "--format", "int3")
    assert badfmt.returncode == 2 and "unknown weight format" in badfmt.stderr
