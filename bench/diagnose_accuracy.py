"""How often `moelab diagnose` names the cause a real thread confirmed, on logs nobody here wrote.

    python3 bench/diagnose_accuracy.py                 # both splits: accuracy, per cause, confusion, time
    python3 bench/diagnose_accuracy.py --misses dev    # also every dev-split miss (never the check split's)
    python3 bench/diagnose_accuracy.py --split dev     # the dev split alone (while rules are written)
    python3 bench/diagnose_accuracy.py --json
    python3 bench/diagnose_accuracy.py --no-rules      # the general layers alone: every signature rule taken away

The corpus is tests/data/real-logs/ (real cases from public issue threads, labelled from the thread's
confirmed cause); split.json set the check split aside before any rule was written against the
corpus, and misses are only ever listed for the dev split. From the fourteenth batch on, each new batch
sets aside its own seeded 30 % as check cases when it arrives (scripts/corpus_split.py --add-batch);
the check line says how each part fares. Each log is classified the way
`moelab diagnose LOG` would: the engine guessed from the log, the exit status only where the
thread states one. The baseline is `unknown` for every case (what a tool with no rules says),
measured in the same run. The time per log is the classifier alone, and one 1 MB log is timed too.
`--no-rules` measures what carries to a wording no rule was written for: the structure of the log and
the cause words alone (layers 2-4), with the same splits and baseline.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "data" / "real-logs"


def cases() -> list[dict]:
    out = []
    for d in sorted(p for p in ROOT.iterdir() if p.is_dir()):
        meta = json.loads((d / "meta.json").read_text())
        out.append({"id": d.name, "lines": (d / "log.txt").read_text(errors="replace").splitlines(), **meta})
    return out


def classify_case(c: dict, no_rules: bool = False):
    from moelab.diagnose import classify
    from moelab.diagnose.engine_guess import guess_engine

    return classify(c["lines"], exit_code=c.get("exit_code"), engine=guess_engine(c["lines"]),
                    rules=() if no_rules else None)


def wilson(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion: what `right` of `n` says about the accuracy on
    logs like these, so a split of 64 cases is read with its width (one case is 1.6 points there)."""
    if n == 0:
        return 0.0, 1.0
    p, d = right / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def megabyte_log() -> tuple[list[str], str]:
    """About 1 MB: real engine output from tests/logs (vLLM and SGLang, mostly healthy phases),
    repeated, then a real failure at the end; (lines, the cause it must be)."""
    logs = sorted((ROOT.parent.parent / "logs").glob("*.log"))
    body = [ln for p in logs if "ok" in p.name or "phases" in p.name for ln in p.read_text().splitlines()]
    out, size = [], 0
    while size < 1 << 20:
        out += body
        size += sum(len(x) + 1 for x in body)
    tail = (ROOT.parent.parent / "logs" / "sglang-4330-not-enough-memory.log").read_text().splitlines()
    return out + tail, "gpu_oom"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--misses", choices=["dev"], help="list the misses of the dev split (the check split stays unread)")
    ap.add_argument("--split", choices=["dev", "check"], help="measure one split only (while rules are written: dev)")
    ap.add_argument("--no-rules", action="store_true", help="take every signature rule away: the general layers alone")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    split = json.loads((ROOT / "split.json").read_text())
    where = {n: s for s in ("dev", "check") for n in split[s]}
    all_cases = cases()
    results: dict[str, list[tuple[dict, str, float]]] = defaultdict(list)
    for c in all_cases:
        t0 = time.perf_counter()
        v = classify_case(c, a.no_rules)
        results[where.get(c["id"], "unsplit")].append((c, v.cause.value, time.perf_counter() - t0))
    from moelab.diagnose import classify

    big, want = megabyte_log()
    t0 = time.perf_counter()
    big_got = classify(big, rules=() if a.no_rules else None).cause.value
    mb_s = time.perf_counter() - t0
    doc = {"cases": len(all_cases), "signature_rules": not a.no_rules, "one_mb_log_s": round(mb_s, 3), "one_mb_log_lines": len(big),
           "one_mb_log_right": big_got == want, "splits": {}}
    for name in ("dev", "check", "unsplit"):
        rows = results.get(name)
        if not rows or a.split and name != a.split:
            continue
        right = sum(got == c["expected_cause"] for c, got, _ in rows)
        base = sum(c["expected_cause"] == "unknown" for c, _, _ in rows)
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        confusion: Counter = Counter()
        for c, got, _ in rows:
            per[c["expected_cause"]][1] += 1
            per[c["expected_cause"]][0] += got == c["expected_cause"]
            if got != c["expected_cause"]:
                confusion[(c["expected_cause"], got)] += 1
        doc["splits"][name] = {
            "n": len(rows), "right": right, "accuracy": round(right / len(rows), 4),
            "accuracy_ci95": [round(x, 4) for x in wilson(right, len(rows))],
            "baseline_all_unknown": round(base / len(rows), 4),
            "unknown_answers_on_known_causes": sum(got == "unknown" != c["expected_cause"] for c, got, _ in rows),
            "ms_per_log_mean": round(1000 * sum(t for *_, t in rows) / len(rows), 2),
            "ms_per_log_max": round(1000 * max(t for *_, t in rows), 2),
            "per_cause": {k: f"{r}/{n}" for k, (r, n) in sorted(per.items())},
            "confusion": [{"expected": e, "got": g, "n": n} for (e, g), n in confusion.most_common()],
        }
        if name == "check" and split.get("batches"):
            # the first 30 %, set aside before any rule, and each later batch's own 30 %, set aside on arrival
            later = {n for b in split["batches"] for n in b["check"]}
            parts = {"set_aside_first": [r for r in rows if r[0]["id"] not in later],
                     "set_aside_from_batches": [r for r in rows if r[0]["id"] in later]}
            doc["splits"][name]["parts"] = {k: f"{sum(g == c['expected_cause'] for c, g, _ in v)}/{len(v)}"
                                            for k, v in parts.items()}
        if a.misses == name:
            doc["splits"][name]["misses"] = [{"id": c["id"], "expected": c["expected_cause"], "got": got}
                                             for c, got, _ in rows if got != c["expected_cause"]]
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    if a.no_rules:
        print("signature rules taken away: structure and cause words alone")
    print(f"{doc['cases']} real logs; one 1 MB log ({len(big):,} lines of real engine output, a real failure at "
          f"the end) classified in {mb_s:.3f} s as {big_got} ({'right' if big_got == want else 'WRONG, expected ' + want})")
    for name, s in doc["splits"].items():
        lo, hi = s["accuracy_ci95"]
        print(f"\n{name}: {s['right']}/{s['n']} right = {100 * s['accuracy']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}) "
              f"(baseline, `unknown` for every log: {100 * s['baseline_all_unknown']:.1f}%; "
              f"ratio {s['accuracy'] / max(s['baseline_all_unknown'], 1e-9):.1f}x); "
              f"`unknown` where a cause exists: {s['unknown_answers_on_known_causes']}; "
              f"{s['ms_per_log_mean']:.2f} ms per log (max {s['ms_per_log_max']:.1f})")
        if "parts" in s:
            print(f"  set aside before any rule: {s['parts']['set_aside_first']}; set aside from later batches on "
                  f"arrival, never read: {s['parts']['set_aside_from_batches']}")
        print("  per cause: " + ", ".join(f"{k} {v}" for k, v in s["per_cause"].items()))
        if s["confusion"]:
            print("  confusion (expected -> got): " + ", ".join(f"{x['expected']}->{x['got']} {x['n']}"
                                                             for x in s["confusion"]))
        for m in s.get("misses", []):
            print(f"  miss {m['id']}: expected {m['expected']}, got {m['got']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
