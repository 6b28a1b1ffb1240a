"""Set aside the check split of the real-log corpus: a seeded, per-cause random 30 %.

    python3 scripts/corpus_split.py              # writes tests/data/real-logs/split.json
    python3 scripts/corpus_split.py --add-to-dev # later cases join the dev split; check is kept
    python3 scripts/corpus_split.py --add-batch fourteenth   # a new batch: its own seeded 30 % to check
    python3 scripts/corpus_split.py --add-batch fifteenth --dropped a-1,b-2   # cases staged, then dropped

Run once, before any rule is written against the corpus; the committed split.json is what every
later measurement uses (bench/diagnose_accuracy.py). Re-running with the same cases and seed gives
the same split. Stratified by expected cause, so every cause has cases on both sides. Once rules
exist, no case of the check split ever leaves it, and no case that has been read joins it.

Batches up to the thirteenth joined the dev split whole, each measured before it was read. From the
fourteenth on, a batch is split when it arrives, before it is measured or read: a seeded random 30 %
of it (`batch_split`, seeded by the batch's name) joins the check split unread, the rest joins dev.
So the check split keeps growing with logs no rule was written against, as the issue asks of 30 %
of the corpus.
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


def batch_split(names: list[str], batch: str) -> tuple[list[str], list[str]]:
    """(dev, check) of a new batch: a random 30 % of it to check, seeded by the batch's name, so
    the same cases and name always give the same split.

    >>> batch_split(["a-1", "b-2", "c-3", "d-4", "e-5", "f-6", "g-7"], "x")
    (['b-2', 'c-3', 'd-4', 'e-5', 'g-7'], ['a-1', 'f-6'])
    """
    names = sorted(names)
    rng = random.Random(f"{SEED}:{batch}")
    picked = rng.sample(names, round(CHECK * len(names)))
    return [n for n in names if n not in picked], sorted(picked)


def add_batch(batch: str, dropped: list[str]) -> None:
    """The batch's new folders join the splits as `batch_split` put them when the batch arrived: the
    split is made over every staged case, the ones a second reader dropped included, so dropping a
    case later never moves another from one side to the other."""
    path = ROOT / "split.json"
    doc = json.loads(path.read_text())
    have = set(doc["dev"]) | set(doc["check"])
    new = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in have)
    if not new:
        raise SystemExit("no new cases: copy the batch's folders into tests/data/real-logs first")
    dev, check = batch_split(new + dropped, batch)
    dev, check = [n for n in dev if n not in dropped], [n for n in check if n not in dropped]
    doc["dev"], doc["check"] = sorted(doc["dev"] + dev), sorted(doc["check"] + check)
    doc.setdefault("batches", []).append({"batch": batch, "seed": f"{SEED}:{batch}", "dev": dev, "check": check,
                                          "dropped_on_second_reading": sorted(dropped)})
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"batch {batch}: {len(dev)} to dev, {len(check)} to check: dev {len(doc['dev'])}, check {len(doc['check'])}")


def main() -> None:
    if "--add-to-dev" in sys.argv[1:]:
        return add_to_dev()
    if "--add-batch" in sys.argv[1:]:
        dropped = sys.argv[sys.argv.index("--dropped") + 1].split(",") if "--dropped" in sys.argv else []
        return add_batch(sys.argv[sys.argv.index("--add-batch") + 1], dropped)
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
