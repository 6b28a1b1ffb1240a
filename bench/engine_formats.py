#!/usr/bin/env python3
"""Does `moelab serve --moe-runner-backend triton` answer like the reference backend, in every format?

For each expert format (bf16, fp8, nvfp4) it serves the preset twice on the same device: with the
reference MoE runner (plain PyTorch, one expert at a time), recording that server's answers to
moelab's probe prompts, then with the fused Triton runner, probing it against that recording with
the format's tolerances. The quantized Triton servers are also probed against the bf16 reference
(how far quantization itself moves the answers). The last line is one JSON document.

    python bench/engine_formats.py --preset small --device cuda      # on a GPU machine
    python bench/engine_formats.py --preset tiny --device cpu --triton-interpret   # CPU, slow
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_throughput import Server  # `moelab serve` in its own session, ready on phase=ready (same folder)


def probe(url: str, fmt: str, env: dict, record: Path | None = None, against: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "moelab.cli", "probe", "--url", url, "--format", fmt, "--json", "--timeout", "300"]
    cmd += ["--record", str(record)] if record else ["--against", str(against)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    d = json.loads(p.stdout)
    v = d["verdict"]
    return {"cause": v["cause"], "compared": v["detail"].get("compared"),
            "failed_comparisons": v["detail"].get("failed_comparisons"),
            "evidence": [e["text"] for e in v["evidence"]][:6], "exit": p.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=["tiny", "small"])
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--formats", default="bf16,fp8,nvfp4")
    ap.add_argument("--triton-interpret", action="store_true", help="run the Triton runner through Triton's CPU "
                    "interpreter (TRITON_INTERPRET=1; slow, for checking this script without a GPU)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="moelab-formats-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    tri_env = {**env, "TRITON_INTERPRET": "1"} if a.triton_interpret else env
    common = ["--preset", a.preset, "--device", a.device, "--max-running-requests", "8"]
    rows = []
    for fmt in a.formats.split(","):
        q = {"bf16": "none"}.get(fmt, fmt)
        t0 = time.perf_counter()
        ref = Server([*common, "--moe-runner-backend", "reference", "--quantization", q], work / f"ref-{fmt}.log",
                     600, env)
        try:
            rec = probe(ref.url, fmt, env, record=work / f"ref-{fmt}.json")
        finally:
            ref.stop()
        tri = Server([*common, "--moe-runner-backend", "triton", "--quantization", q], work / f"triton-{fmt}.log",
                     600, tri_env)
        try:
            graphs = [ln.split("phase=cuda_graph ", 1)[1] for ln in tri.log.read_text().splitlines()
                      if "phase=cuda_graph " in ln]
            same = probe(tri.url, fmt, env, against=work / f"ref-{fmt}.json")
            vs_bf16 = (probe(tri.url, fmt, env, against=work / "ref-bf16.json")
                       if fmt != "bf16" and (work / "ref-bf16.json").exists() else None)
        finally:
            tri.stop()
        row = {"format": fmt, "reference_record": rec, "triton_vs_reference_same_format": same,
               "triton_vs_bf16_reference": vs_bf16, "cuda_graph": graphs[-1] if graphs else None,
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"{fmt:>6}: reference probe {rec['cause']}; triton vs {fmt} reference: {same['cause']} "
              f"({same['compared']} compared, {same['failed_comparisons']} failed)"
              + (f"; vs bf16 reference: {vs_bf16['cause']} ({vs_bf16['failed_comparisons']} failed)" if vs_bf16 else "")
              + f"; cuda graph: {row['cuda_graph']}", flush=True)
        for e in same["evidence"]:
            print(f"        {e}")
    print(f"server logs and recorded answers: {work}")
    print(json.dumps({"preset": a.preset, "device": a.device, "rows": rows}))
    sys.exit(0 if all(r["triton_vs_reference_same_format"]["cause"] == "ok" for r in rows) else 1)


if __name__ == "__main__":
    main()
