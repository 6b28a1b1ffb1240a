"""Check the real-log corpus (tests/data/real-logs/): every case well formed; counts per cause and engine.

    python3 scripts/corpus_check.py            # problems (exit 1 if any), then the counts
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "data" / "real-logs"
CAUSES = ("bad_args unsupported_arch kernel_resource_limit host_oom gpu_oom illegal_memory_access "
          "jit_compile_error collective_error numerical_nan garbage_output model_load_error port_in_use "
          "startup_timeout hang killed_external native_crash orphan_leak unknown").split()
SOURCE = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


def problems(case: Path) -> list[str]:
    out = []
    log, meta = case / "log.txt", case / "meta.json"
    if not log.is_file() or not log.read_text(errors="replace").strip():
        out.append("log.txt missing or empty")
    try:
        m = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        return out + [f"meta.json unreadable: {e}"]
    for key in ("source", "engine", "expected_cause", "note"):
        if not m.get(key):
            out.append(f"meta.json lacks {key!r}")
    if m.get("source") and not SOURCE.match(m["source"]):
        out.append(f"source {m['source']!r} is not owner/repo#N")
    if m.get("expected_cause") and m["expected_cause"] not in CAUSES:
        out.append(f"expected_cause {m['expected_cause']!r} is not a moelab cause")
    if "exit_code" in m and not isinstance(m["exit_code"], int):
        out.append("exit_code must be an integer (leave it out unless the thread states one)")
    extra = set(m) - {"source", "engine", "expected_cause", "exit_code", "note", "url"}
    if extra:
        out.append(f"meta.json has unknown keys {sorted(extra)}")
    return out


def split_problems(names: set[str]) -> list[str]:
    """What is wrong with split.json against the cases on disk: every case in exactly one split, and
    each later batch's cases where its record says."""
    doc = json.loads((ROOT / "split.json").read_text())
    dev, check = set(doc["dev"]), set(doc["check"])
    out = [f"{n}: in both splits" for n in sorted(dev & check)]
    out += [f"{n}: in no split (scripts/corpus_split.py --add-batch NAME)" for n in sorted(names - dev - check)]
    out += [f"{n}: in split.json, no folder" for n in sorted((dev | check) - names)]
    for b in doc.get("batches", []):
        out += [f"{n}: batch {b['batch']} puts it in {side}, split.json does not"
                for side, have in (("check", check), ("dev", dev)) for n in b[side] if n not in have]
    return out


def main() -> int:
    cases = sorted(p for p in ROOT.iterdir() if p.is_dir())
    bad = 0
    for p in split_problems({c.name for c in cases}):
        print(f"split.json: {p}")
        bad += 1
    causes, engines, sources = Counter(), Counter(), Counter()
    for c in cases:
        for p in problems(c):
            print(f"{c.name}: {p}")
            bad += 1
        try:
            m = json.loads((c / "meta.json").read_text())
            causes[m.get("expected_cause")] += 1
            engines[m.get("engine")] += 1
            sources[m.get("source")] += 1
        except (OSError, ValueError):
            pass
    print(f"{len(cases)} cases, {bad} problems")
    print("by cause: " + ", ".join(f"{c} {causes.get(c, 0)}" for c in CAUSES))
    print("by engine: " + ", ".join(f"{e} {n}" for e, n in engines.most_common()))
    dup = [s for s, n in sources.items() if n > 2]
    if dup:
        print("sources with more than 2 cases: " + ", ".join(dup))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
