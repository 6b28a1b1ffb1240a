"""Report rendering: Markdown, self-contained HTML with inline SVG, and a real headless browser.

The store is filled through the Store API with trials shaped like the runner's (the runner itself
is exercised in test_study_process.py / test_demo.py). The browser test needs Debian's chromium:
`apt-get install -y chromium`; it skips with that line when chromium is missing.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.report import report_data, write_reports
from moelab.store import Store

FP = {"engine": "embedded", "engine_version": "0.1.0", "torch": "2.13.0+cpu", "gpu": None}
SPEC = {"name": "r", "engine": "embedded", "strategy": "staged", "slo": {"ttft_ms": None},
        "base": {"--moe-runner-backend": "reference", "--quantization": "none"},
        "axes": {"--moe-runner-backend": ["reference", "grouped", "triton"], "--quantization": ["none", "fp8"]}}


def _points(tps: float) -> dict:
    return {"points": [{"concurrency": c, "output_tps": tps * c / 4, "e2e_p90_ms": 20 + 3 * c, "tpot_p50_ms": 2.0,
                        "ttft_p90_ms": 9.0, "valid": True} for c in (1, 2, 4)], "repeats": [tps, tps * 1.02, tps * 0.98]}


def make_store(path: Path) -> None:
    cells = [("reference", "none", "ok", 900.0), ("reference", "fp8", "ok", 700.0), ("grouped", "none", "ok", 880.0),
             ("grouped", "fp8", "garbage_output", None), ("triton", "none", "bad_args", None),
             ("triton", "fp8", "bad_args", None)]
    with Store(path) as st:
        sid, _ = st.open_study("report-test", SPEC, FP)
        for i, (b, q, cause, tps) in enumerate(cells):
            flags = {"--moe-runner-backend": b, "--quantization": q}
            tid = st.begin_trial(sid, seq=i, stage="screen", rep=0, label=f"moe-runner-backend={b} quantization={q}",
                                 key=f"k{i}", engine="embedded", model="tiny", changes=[[k, v] for k, v in flags.items()],
                                 flags=flags, args=["--preset", "tiny", "--moe-runner-backend", b, "--quantization", q],
                                 env={}, fingerprint=FP)
            pruned = b == "triton" and q == "fp8"
            ev = [{"kind": "log", "line": 3, "text": "moelab serve: error: argument --moe-runner-backend: <triton> "
                   "needs a CUDA GPU", "source": "rule bad_args"}] if cause == "bad_args" else []
            st.finish_trial(tid, status="pruned" if pruned else "done",
                            verdict={"cause": cause, "phase": "preflight" if pruned else "load" if tps else "launch",
                                     "evidence": ev, "advice": "use reference or grouped" if ev else ""},
                            metrics=_points(tps) if tps else None,
                            paths={"repro": f"/tmp/t{tid}/repro.sh", "log": f"/tmp/t{tid}/server.log"},
                            command=["python", "-m", "moelab.cli", "serve", "--preset", "tiny", "--moe-runner-backend",
                                     b, "--quantization", q, "--port", "40001"])
        st.finish_study(sid, None)


def test_markdown_puts_the_recommendation_first(tmp_path):
    make_store(tmp_path / "s.db")
    md = write_reports(tmp_path / "s.db", md=tmp_path / "r.md") and (tmp_path / "r.md").read_text()
    first = md.index("**Recommended:**")
    assert first < md.index("## Verdicts") < md.index("## Trials")
    assert "`moe-runner-backend=reference quantization=none`" in md  # tied with grouped: fewest changes wins
    assert "Statistically tied with: `moe-runner-backend=grouped quantization=none`" in md
    assert "the pick is also the fastest of them" in md  # not "fewest changes": that did not decide it
    # the user's command again: not the port moelab picked for the trial (the engine's default applies)
    assert "moelab serve --preset tiny --moe-runner-backend reference --quantization none\n" in md
    assert "--port 40001" not in md.split("## Trials")[0]
    assert "| moe-runner-backend=reference quantization=none **(recommended)** | 900.0 |" in md
    assert "| triton | bad_args | bad_args (pruned) |" in md


def test_html_is_self_contained_and_escaped(tmp_path):
    make_store(tmp_path / "s.db")
    write_reports(tmp_path / "s.db", html=tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "<script" not in html and not re.search(r"(src|href)=['\"]?https?:", html)
    assert html.index("Recommended launch command") < html.index("Verdicts:") < html.index("<svg") < html.index("Trials")
    assert "&lt;triton&gt;" in html and "<triton>" not in html  # evidence is escaped
    assert html.count("<details>") == 6 and "Pareto front" in html and "sh /tmp/t1/repro.sh" in html


def test_report_cli_json_and_errors(tmp_path):
    make_store(tmp_path / "s.db")
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "report", str(tmp_path / "s.db"), "--json"],
                       capture_output=True, text=True, timeout=60)
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["recommendation"]["tie"][0]["label"].startswith("moe-runner-backend=grouped")
    assert doc["matrix"]["cells"]["triton|fp8"]["status"] == "pruned" and len(doc["trials"]) == 6
    r = subprocess.run([sys.executable, "-m", "moelab.cli", "report", str(tmp_path / "none.db")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no store at" in r.stderr
    assert report_data(tmp_path / "s.db")["causes"] == {"ok": 3, "garbage_output": 1, "bad_args": 2}


def test_the_matrix_never_hides_a_failure_behind_a_cell_that_worked(tmp_path):
    spec = {**SPEC, "axes": {**SPEC["axes"], "--attention-backend": ["fa3", "flashinfer"]}}
    rows = [("fa3", "ok", 900.0), ("flashinfer", "illegal_memory_access", None)]
    with Store(tmp_path / "s.db") as st:
        sid, _ = st.open_study("third-axis", spec, FP)
        for i, (attn, cause, tps) in enumerate(rows):
            flags = {"--moe-runner-backend": "grouped", "--quantization": "none", "--attention-backend": attn}
            tid = st.begin_trial(sid, seq=i, stage="screen", rep=0, label=f"attention={attn}", key=f"k{i}",
                                 engine="embedded", model="tiny", changes=[[k, v] for k, v in flags.items()],
                                 flags=flags, args=[], env={}, fingerprint=FP)
            st.finish_trial(tid, status="done", verdict={"cause": cause, "phase": "load", "evidence": []},
                            metrics=_points(tps) if tps else None)
        st.finish_study(sid, None)
    data = report_data(tmp_path / "s.db")
    cell = data["matrix"]["cells"]["grouped|none"]
    assert (cell["cause"], cell["n"], cell["ok"]) == ("ok", 2, 1)
    assert cell["failures"] == {"illegal_memory_access": [2]}
    md = write_reports(tmp_path / "s.db", md=tmp_path / "r.md") and (tmp_path / "r.md").read_text()
    assert "ok 900 tok/s [1/2 ok]; also illegal_memory_access x1 (trial 2)" in md
    assert "best of its trials over --attention-backend" in md
    write_reports(tmp_path / "s.db", html=tmp_path / "r.html")
    assert "also illegal_memory_access x1 (trial 2)" in (tmp_path / "r.html").read_text()


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium: apt-get update && apt-get install -y chromium")
def test_html_renders_in_a_headless_browser(tmp_path):
    make_store(tmp_path / "s.db")
    write_reports(tmp_path / "s.db", html=tmp_path / "r.html")
    shot = Path(os.environ.get("MOELAB_SCREENSHOT_DIR", tmp_path)) / "report.png"
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,1600",
                        (tmp_path / "r.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses to a few KB


def test_curves_past_the_palette_do_not_look_like_earlier_ones():
    from moelab.report.svg import PALETTE, tradeoff

    curves = [{"label": f"c{i}", "points": [{"concurrency": 1, "output_tps": 10.0 + i, "e2e_p90_ms": 50.0},
                                            {"concurrency": 4, "output_tps": 30.0 + i, "e2e_p90_ms": 80.0}]}
              for i in range(len(PALETTE) + 2)]
    svg = tradeoff(curves, [])
    lines = [ln for ln in svg.splitlines() if ln.startswith("<polyline")]
    styles = [(ln.split('stroke="')[1].split('"')[0], "stroke-dasharray" in ln) for ln in lines]
    assert len(styles) == len(curves) and len(set(styles)) == len(curves)
