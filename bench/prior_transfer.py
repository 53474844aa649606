"""Does the setting that won on one model's tasks win on another model's? The ceiling of any memory
that orders the expert's settings from experience, read off measured tables (CPU, seconds).

    python3 bench/prior_transfer.py --test bench/results/anytime_table-20261126-23154*.json \\
        bench/results/anytime_table-20261126-23160*.json \\
        --train bench/results/anytime_table-20261126-232056.json bench/results/anytime_table-20261126-2321*.json

Each table (bench/anytime.py --table-only) holds every setting of one task's search space, its
defaults first, each verified one timed twice. A setting's share is its second timing's speedup
over the table's best. The prior learned from a set of tables scores each (kind, setting) by a
RULE over the tables it appears in:
  mean    its mean share
  hit99   the fraction of them where it came within 1% of the best
  hit95   the same within 5%
  rank    its mean rank percentile (1: the best)
Two orders walk each test table: "random" (the defaults, then the rest in a seeded random order:
a search with no memory) and "prior" (the defaults, then the settings the prior has seen, best
score first, then the rest in the same random order). The figure per order is the number of
settings walked until one is within 1% of the table's best (to99), over --seeds orders, and the
saving = 1 - sum(prior) / sum(random).

Two protocols:
  held out    the prior from the train tables, walked on the test tables (other models)
  train LOMO  leave one model out: each train model's tables walked with the prior from the other
              train models' (bench/heldout/manifest.json names each task's model). Leaving one
              task out instead lets a model's repeated layers teach each other.
NOTE: a full-table walk is not the search (which moves from the defaults by strategy); it bounds
what ordering the same settings can save, and the search's replay (bench/anytime.py) measures it.

Writes bench/results/prior_transfer-<date>.json: rows (per protocol and rule: saving, per kind
the mean to99 of both orders and the task count, per model its saving), the tables read, seeds.
"""
from __future__ import annotations

import argparse
import glob
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

HERE = Path(__file__).resolve().parent
RULES = ("mean", "hit99", "hit95", "rank")


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def shares(table: dict) -> dict[str, float]:
    """{setting: its second timing's speedup / the table's best} over the verified settings."""
    ok = [r for r in table["rows"] if r.get("correct") and r.get("retime_ms")]
    if not ok:
        return {}
    speed = {_key(r["params"]): r["ref_ms"] / r["retime_ms"] for r in ok}
    best = max(speed.values())
    return {k: v / best for k, v in speed.items()}


def learn(tables: list[dict], rule: str) -> dict[tuple[str, str], float]:
    """{(kind, setting): its score under `rule`} over the tables it appears in."""
    seen: dict[tuple[str, str], list[float]] = {}
    for t in tables:
        sh = shares(t)
        ranked = sorted(sh, key=lambda k: -sh[k])
        for i, k in enumerate(ranked):
            score = {"mean": sh[k], "hit99": float(sh[k] >= 0.99), "hit95": float(sh[k] >= 0.95),
                     "rank": 1 - i / max(1, len(ranked) - 1)}[rule]
            seen.setdefault((t["kind"], k), []).append(score)
    return {k: statistics.mean(v) for k, v in seen.items()}


def to99(order: list[str], sh: dict[str, float]) -> int:
    """Settings walked until one is within 1% of the best (len + 1: never)."""
    for i, k in enumerate(order):
        if sh.get(k, 0.0) >= 0.99:
            return i + 1
    return len(order) + 1


def walk(table: dict, prior: dict, seeds: int) -> tuple[float, float] | None:
    """(prior's, random's) mean to99 over the seeds; None for a table with nothing verified."""
    sh = shares(table)
    if not sh:
        return None
    keys = [_key(r["params"]) for r in table["rows"]]
    first, rest = keys[0], keys[1:]
    known = sorted((k for k in rest if (table["kind"], k) in prior), key=lambda k: -prior[(table["kind"], k)])
    unknown = set(rest) - set(known)
    a, b = [], []
    for s in range(seeds):
        shuffled = rest[:]
        random.Random(s).shuffle(shuffled)
        b.append(to99([first, *shuffled], sh))
        a.append(to99([first, *known, *(k for k in shuffled if k in unknown)], sh))
    return statistics.mean(a), statistics.mean(b)


def measure(test: list[dict], train: list[dict], rule: str, seeds: int) -> dict:
    """The saving of the prior learned from `train` on `test`, overall and per kind."""
    prior, per = learn(train, rule), {}
    for t in test:
        got = walk(t, prior, seeds)
        if got is not None:
            per.setdefault(t["kind"], []).append(got)
    a = sum(x for v in per.values() for x, _ in v)
    b = sum(y for v in per.values() for _, y in v)
    return {"saving": 1 - a / b if b else None, "tasks": sum(len(v) for v in per.values()),
            "kinds": {k: {"prior_to99": statistics.mean(x for x, _ in v),
                          "random_to99": statistics.mean(y for _, y in v), "tasks": len(v)}
                      for k, v in sorted(per.items())}}


def model_of(manifest: dict) -> dict[str, str]:
    """{task file name: its model's row} from bench/heldout/manifest.json."""
    return {Path(e["file"]).name: e["row"] for entries in manifest["sets"].values() for e in entries}


def load(patterns: list[str]) -> tuple[list[dict], list[str]]:
    files = sorted({f for p in patterns for f in glob.glob(p)})
    return [t for f in files for t in json.loads(Path(f).read_text())["tables"]], files


def by_model(tables: list[dict], models: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in tables:
        out.setdefault(models.get(Path(t["path"]).name, "?"), []).append(t)
    return out


def run(test: list[dict], train: list[dict], models: dict[str, str], seeds: int) -> list[dict]:
    rows = []
    for rule in RULES:
        held = measure(test, train, rule, seeds)
        held["models"] = {m: measure(ts, train, rule, seeds)["saving"]
                          for m, ts in sorted(by_model(test, models).items())}
        rows.append({"protocol": "held out", "rule": rule, **held})
        split = by_model(train, models)
        parts = [measure(ts, [u for m2, us in split.items() if m2 != m for u in us], rule, seeds)
                 for m, ts in split.items()]
        a = sum(k["prior_to99"] * k["tasks"] for p in parts for k in p["kinds"].values())
        b = sum(k["random_to99"] * k["tasks"] for p in parts for k in p["kinds"].values())
        rows.append({"protocol": "train LOMO", "rule": rule, "saving": 1 - a / b if b else None,
                     "tasks": sum(p["tasks"] for p in parts),
                     "models": {m: p["saving"] for m, p in zip(split, parts)}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test", nargs="+", required=True, help="test tables (globs)")
    ap.add_argument("--train", nargs="+", required=True, help="train tables (globs)")
    ap.add_argument("--manifest", type=Path, default=HERE / "heldout" / "manifest.json")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args(argv)
    (test, test_files), (train, train_files) = load(a.test), load(a.train)
    rows = run(test, train, model_of(json.loads(a.manifest.read_text())), a.seeds)
    for r in rows:
        print(f"{r['protocol']:10} {r['rule']:6} saving {100 * r['saving']:5.1f}%  ({r['tasks']} tasks)")
    if not a.no_record:
        record.write("prior_transfer", {"seeds": a.seeds, "test": test_files, "train": train_files, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
