"""How far a memory of which settings won could carry across models: an upper-bound check on the
held-out HTG protocol's own tables (#35), CPU only.

Each task's measured table (bench/anytime.py: every setting of the expert's space, timed on an
H100) is walked in a fixed order, defaults first, and we count the candidates until one is within
1% of the table's best ("to99"). The orders:
  table      the space's own order (defaults, strategy moves, the kind's grid)
  knob_log   by the mean log gain, on the train tables, of each knob=value a setting changes
  knob_hit   by how often, on the train tables, a setting changing that knob=value was within 1%
  setting    by how often the same change (the whole set of knob=values) was within 1% on the train
             tables of the kind
Each learned order sees the test tables only to be walked: it is what a memory that had learned
those statistics perfectly from the train models would propose, with no search noise.

    python3 docs/experiments/htg_prior/setting_prior.py     # a table, per kind after it
"""
import collections
import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
# the held-out protocol's tables (bench/results/anytime-20261127-004934.json's command)
TEST = ["anytime_table-20261126-231543.json", "anytime_table-20261126-231545.json",
        "anytime_table-20261126-231601.json", "anytime_table-20261126-231602.json"]
TRAIN = ["anytime_table-20261126-232056.json", "anytime_table-20261126-232123.json",
         "anytime_table-20261126-232126.json", "anytime_table-20261126-232128.json"]


def load(files):
    return [t for f in files for t in json.loads((RESULTS / f).read_text())["tables"]]


def changes(p: dict, d: dict) -> tuple:
    """The knob=values a setting changes from the defaults."""
    return tuple(sorted((k, p.get(k)) for k in set(p) | set(d) if p.get(k) != d.get(k)))


def best(t) -> float:
    return max(r["speedup"] for r in t["rows"] if r["correct"])


def near_best(t, r) -> float:
    return 1.0 if r["correct"] and r["speedup"] >= 0.99 * best(t) else 0.0


def learn(train) -> dict:
    """Per kind: {order name: {key: mean}} for the three learned orders."""
    log, hit, whole = (collections.defaultdict(list) for _ in range(3))
    for t in train:
        d = t["rows"][0]
        if not d["correct"] or not any(r["correct"] for r in t["rows"]):
            continue
        for r in t["rows"][1:]:
            gain = math.log(max(r["speedup"] if r["correct"] else 0.5 * d["speedup"], 1e-3) / d["speedup"])
            ch = changes(r["params"], d["params"])
            for kv in ch:
                log[(t["kind"], kv)].append(gain)
                hit[(t["kind"], kv)].append(near_best(t, r))
            whole[(t["kind"], ch)].append(near_best(t, r))
    mean = lambda m: {k: statistics.mean(v) for k, v in m.items()}       # noqa: E731
    return {"knob_log": mean(log), "knob_hit": mean(hit), "setting": mean(whole)}


def order(t, name: str, learned: dict) -> list[dict]:
    rows = t["rows"]
    if name == "table":
        return [r["params"] for r in rows]
    d, w = rows[0]["params"], learned[name]

    def score(r):
        ch = changes(r["params"], d)
        if name == "setting":
            return w.get((t["kind"], ch), 0.0)
        return statistics.mean(w.get((t["kind"], kv), 0.0) for kv in ch)
    rest = sorted(rows[1:], key=lambda r: (-score(r), len(changes(r["params"], d))))
    return [d] + [r["params"] for r in rest]


def to99(t, walk: list[dict]) -> int:
    rows = {json.dumps(r["params"], sort_keys=True): r for r in t["rows"]}
    for i, p in enumerate(walk, 1):
        if near_best(t, rows[json.dumps(p, sort_keys=True)]):
            return i
    return len(walk)


def main():
    train, test = load(TRAIN), load(TEST)
    learned = learn(train)
    names = ["table", "knob_log", "knob_hit", "setting"]
    got = {n: [to99(t, order(t, n, learned)) for t in test] for n in names}
    print(f"{len(train)} train tables, {len(test)} test tables (H100); candidates to 99% of each table's best")
    print("| order | mean | median | saving vs table order |\n|---|---|---|---|")
    for n in names:
        m = statistics.mean(got[n])
        print(f"| {n} | {m:.2f} | {statistics.median(got[n]):g} | {1 - m / statistics.mean(got['table']):+.1%} |")
    kinds = sorted({t["kind"] for t in test})
    print("\n| kind | tasks (train) | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
    for k in kinds:
        idx = [i for i, t in enumerate(test) if t["kind"] == k]
        n_train = sum(t["kind"] == k for t in train)
        print(f"| {k} | {len(idx)} ({n_train}) | " + " | ".join(f"{statistics.mean(got[n][i] for i in idx):.2f}" for n in names) + " |")


if __name__ == "__main__":
    main()
