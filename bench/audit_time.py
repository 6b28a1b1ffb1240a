"""How long does `moelab audit` take on a whole engine install, against parsing it once?

One run prints, for the SGLang source of scripts/install-engine-sources.sh (or --python PATH):
  1. baseline: `ast.parse` of every .py file of the audited packages (sglang, flashinfer,
     sgl_kernel), once, no analysis: the floor any source reader pays;
  2. the audit itself (run_audit: locate, parse what can test a flag, follow and evaluate gates);
  3. the ratio audit / baseline, and what the audit parsed.
The audit parses fewer files than the baseline (only modules that name a backend flag, and the
library modules a gate leads to), so the ratio can be below 1. The last line is one JSON document.
Usage: python bench/audit_time.py [--python PATH] [--engine sglang|vllm]
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import tempfile
import time
from pathlib import Path


def parse_all(paths: list[Path]) -> tuple[int, int, float]:
    t0, files, size = time.perf_counter(), 0, 0
    for root in paths:
        for p in root.rglob("*.py"):
            text = p.read_bytes()
            try:
                ast.parse(text)
            except (SyntaxError, ValueError):
                continue
            files, size = files + 1, size + len(text)
    return files, size, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="sglang")
    ap.add_argument("--python", default=str(Path(os.environ.get("MOELAB_ENGINE_SRC", "/tmp/moelab-engine-src"))
                                            / "bin" / "python"))
    a = ap.parse_args()
    os.environ["MOELAB_CACHE"] = tempfile.mkdtemp(prefix="moelab-bench-audit-")  # a cold audit, no cache

    from moelab.audit.profile import with_libraries
    from moelab.audit.run import run_audit
    from moelab.audit.source import locate

    found = locate(a.python, [p for pr in with_libraries(a.engine) for p in pr.packages])
    files, size, base_s = parse_all([p.path for p in found.values()])
    print(f"baseline  ast.parse of every file: {files:,} files, {size / 2**20:.0f} MiB in {base_s:.1f} s")
    t0 = time.perf_counter()
    audit = run_audit(a.engine, a.python)
    audit_s = time.perf_counter() - t0
    gated = len({(f.flag, f.value) for f in audit.findings})
    print(f"audit     {a.engine} {audit.version}: {audit.files_parsed:,} files parsed, {len(audit.findings)} gates for "
          f"{gated} of {len(audit.rows)} backend choices in {audit_s:.1f} s")
    print(f"ratio     audit / baseline = {audit_s / base_s:.2f}")
    t0 = time.perf_counter()  # again, nothing changed: the cached audit, after a stat of every file
    again = run_audit(a.engine, a.python)
    again_s = time.perf_counter() - t0
    assert again.reused_from and again.model_dump(exclude={"reused_from"}) == audit.model_dump(exclude={"reused_from"})
    print(f"again     unchanged source: the cached audit in {again_s:.2f} s (audit / again = {audit_s / again_s:.0f}x)")
    print(json.dumps({"engine": a.engine, "version": audit.version,
                      "packages": {p.dist or p.name: p.version for p in audit.packages},
                      "baseline_files": files, "baseline_s": round(base_s, 2), "audit_files": audit.files_parsed,
                      "audit_s": round(audit_s, 2), "ratio": round(audit_s / base_s, 3), "gates": len(audit.findings),
                      "again_s": round(again_s, 3)}))


if __name__ == "__main__":
    main()
