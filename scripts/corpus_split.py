"""Set aside the check split of the real-log corpus: a seeded, per-cause random 30 %.

    python3 scripts/corpus_split.py              # writes tests/data/real-logs/split.json
    python3 scripts/corpus_split.py --add-to-dev # later cases join the dev split; check is kept

Run once, before any rule is written against the corpus; the committed split.json is what every
later measurement uses (bench/diagnose_accuracy.py). Re-running with the same cases and seed gives
the same split. Stratified by expected cause, so every cause has cases on both sides. Once rules
exist, the check split never changes again: cases gathered later only grow the dev split.
"""
from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "data" / "real-logs"
SEED, CHECK = 20261201, 0.30


def add_to_dev() -> None:
    path = ROOT / "split.json"
    doc = json.loads(path.read_text())
    have = set(doc["dev"]) | set(doc["check"])
    new = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in have)
    doc["dev"] = sorted(doc["dev"] + new)
    doc["added_to_dev_later"] = sorted(set(doc.get("added_to_dev_later", [])) | set(new))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(new)} cases added to dev: dev {len(doc['dev'])}, check {len(doc['check'])} (unchanged)")


def main() -> None:
    if "--add-to-dev" in sys.argv[1:]:
        return add_to_dev()
    by_cause: dict[str, list[str]] = defaultdict(list)
    for case in sorted(p for p in ROOT.iterdir() if p.is_dir()):
        by_cause[json.loads((case / "meta.json").read_text())["expected_cause"]].append(case.name)
    rng = random.Random(SEED)
    check = []
    for cause in sorted(by_cause):
        names = sorted(by_cause[cause])
        rng.shuffle(names)
        check += names[:max(1, round(CHECK * len(names)))]
    dev = sorted(n for names in by_cause.values() for n in names if n not in check)
    doc = {"seed": SEED, "check_fraction": CHECK, "stratified_by": "expected_cause",
           "made_before_any_rule": True, "dev": dev, "check": sorted(check)}
    (ROOT / "split.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"dev {len(dev)}, check {len(check)}")


if __name__ == "__main__":
    main()
