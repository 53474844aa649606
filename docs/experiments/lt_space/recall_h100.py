"""Recall's rule applied straight to the H100 GEMM tables with cuBLASLt's tiles (CPU, #35).

The held-out replay (bench/anytime.py --replay ... --train ...) runs recall inside the search; this
reads what recall's ranking alone is worth on the same tables, to tell the rule from its use:
recall.Recall holds every verified setting of the 15 train GEMM tables (its share as the search
would record it), and each of the 12 test GEMM tables is walked in three orders, counting the
candidates to the first setting within 1% of the table's best (first timing):

    recall   the defaults, then recall's ranking for the task's sizes, then the rest (seeded order)
    random   the defaults, then a seeded random order (the "none" arm without the search's walk)

20 seeds each. Tables: bench/results/anytime_table-20261202-183051.json and -183742-2 (test),
-183742 (train), H100, f9ae414.

    python3 docs/experiments/lt_space/recall_h100.py
"""
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import anytime  # noqa: E402
from torch_htam import recall  # noqa: E402
from torch_htam.policy import policy_for  # noqa: E402
from torch_htam.proposers.expert.proposer import match_task  # noqa: E402

R = ROOT / "bench" / "results"
SEEDS = 20


def settings(table: dict):
    """(task, {change id: first-timing speedup or None}) of one table, changes named as recall names them."""
    task = anytime._task(table)
    tm = match_task(task, policy_for(task))
    canon = lambda p: tm.target.canonical(tm.region, dict(tm.defaults, **p))    # noqa: E731
    start = canon({})
    return task, {recall.change_id(recall.change(canon(r["params"]), start)): (r["speedup"] if r["correct"] else None)
                  for r in table["rows"]}


def to99(order: list, speed: dict) -> int:
    best = max(s for s in speed.values() if s)
    return next((i + 1 for i, c in enumerate(order) if (speed.get(c) or 0) >= 0.99 * best), len(order) + 1)


def main() -> None:
    test, _ = anytime.load_tables([str(R / "anytime_table-20261202-183051.json"),
                                   str(R / "anytime_table-20261202-183742-2.json")])
    train, _ = anytime.load_tables([str(R / "anytime_table-20261202-183742.json")])
    memory = recall.Recall()
    for t in train:
        task, speed = settings(t)
        memory.record("gemm", task.signature, recall.features(task), {c: s for c, s in speed.items() if s})
    print("| task | recall | random |\n|---|---|---|")
    rows = []
    for t in test:
        task, speed = settings(t)
        ranked = [c for c, _ in memory.ranked("gemm", recall.features(task)) if c in speed and c != "{}"]
        rest = [c for c in speed if c not in ranked and c != "{}"]
        rec, rnd = [], []
        for seed in range(SEEDS):
            r = list(rest)
            random.Random(seed).shuffle(r)
            rec.append(to99(["{}", *ranked, *r], speed))
            o = [c for c in speed if c != "{}"]
            random.Random(seed).shuffle(o)
            rnd.append(to99(["{}", *o], speed))
        rows.append((statistics.mean(rec), statistics.mean(rnd)))
        print(f"| {t['task']} | {rows[-1][0]:.2f} | {rows[-1][1]:.2f} |")
    a, b = statistics.mean(r[0] for r in rows), statistics.mean(r[1] for r in rows)
    print(f"\nmean candidates to 99% of the table's best: recall {a:.2f}, random {b:.2f} ({1 - a / b:+.1%})")


if __name__ == "__main__":
    main()
