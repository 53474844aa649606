"""The expert's cuBLASLt GEMM space with the lt_tile knob, on the probe's H200 times (CPU, #35).

Each GEMM shape's space as gemm.grid offers it on sm_90a, without the fused-epilogue knob (the probe
timed plain GEMMs): the heuristic's ranked algorithms 0-7 (the `algo` knob; rank 0 the defaults),
then its first algorithm forced onto each tile of torch_htam/proposers/expert/lt_tiles.json, split-K
1, the heuristic's swizzle. A forced tile the probe did not time for the shape counts as refused
(cuBLASLt rejects it, or the probe's first 400 left it out): a candidate spent, never the best.
lt_tiles.json comes from the train shapes (tiles.py), so the test shapes' figures are held out.

Per test shape: what the tiles add over the ranks alone (the best of the whole space against the
best rank, and against the best the probe timed), and candidates to 99% of the space's best in
three orders: none (the defaults, then a seeded random order), neighbours (the defaults, then by the
train shapes' shares of their best, each weighted 2^-distance in log2 (M, N, K): recall's rule) and
list (the defaults, the ranks, then the tiles in the file's order: the grid's own order).

    python3 docs/experiments/lt_space/knob_space.py
"""
import collections
import gzip
import json
import math
import random
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
TILES = json.loads((HERE.parents[2] / "torch_htam" / "proposers" / "expert" / "lt_tiles.json").read_text())["sm_90a"]
SEEDS, BOOT = 20, 10_000


def spaces() -> dict:
    """shape -> {"set", "times": {setting: us or None (refused)}}, setting ("rank", i) or ("tile", t)."""
    rows = [json.loads(line) for line in gzip.open(HERE / "probe-h200.jsonl.gz", "rt")]
    sets = {tuple(map(int, x.split()[:3])): x.split()[3] for x in (HERE / "shapes.txt").read_text().splitlines()}
    ok = lambda r: r["us"] > 0 and r["err"] <= 2e-2    # noqa: E731
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["M"], r["N"], r["K"])].append(r)
    out = {}
    for shape, rs in by.items():
        heur = {r["idx"]: r for r in rs if r["src"] == "heur"}
        if 0 not in heur or not ok(heur[0]):
            continue
        times = {("rank", i): (heur[min(i, max(heur))]["us"] if ok(heur[min(i, max(heur))]) else None)
                 for i in range(8)}
        grid = {r["tile"]: r["us"] for r in rs if r["src"] == "grid" and r["idx"] == 0 and r["splitk"] == 1
                and r["swz"] == heur[0]["swz"] and ok(r)}
        times.update({("tile", t): grid.get(t) for t in TILES})
        out[shape] = {"set": sets[shape], "times": times, "probe_best": min(r["us"] for r in rs if ok(r))}
    return out


def shares(sp) -> dict:
    best = min(t for t in sp["times"].values() if t)
    return {k: (best / t if t else 0.0) for k, t in sp["times"].items()}


def to99(order, sh) -> int:
    return next(i + 1 for i, k in enumerate(order) if sh[k] >= 0.99)


def prior(shape, train) -> dict:
    score, weight = collections.defaultdict(float), collections.defaultdict(float)
    for s, sp in train.items():
        w = 2.0 ** -math.dist([math.log2(x) for x in shape], [math.log2(x) for x in s])
        for k, v in shares(sp).items():
            score[k] += w * v
            weight[k] += w
    return {k: score[k] / weight[k] for k in score}


def main():
    sp = spaces()
    train = {s: v for s, v in sp.items() if v["set"] == "train"}
    test = {s: v for s, v in sp.items() if v["set"] == "test"}
    gm = lambda xs: math.exp(statistics.mean(math.log(x) for x in xs))    # noqa: E731
    ranks = {s: min(t for k, t in v["times"].items() if k[0] == "rank" and t) for s, v in test.items()}
    whole = {s: min(t for t in v["times"].values() if t) for s, v in test.items()}
    first = {s: v["times"][("rank", 0)] for s, v in test.items()}
    print(f"{len(TILES)} tiles; {len(train)} train shapes, {len(test)} test shapes")
    print(f"test shapes, geomean: the defaults over the best rank {gm(first[s] / ranks[s] for s in test):.4f}x, "
          f"over the best of ranks + tiles {gm(first[s] / whole[s] for s in test):.4f}x, over the probe's best "
          f"{gm(first[s] / test[s]['probe_best'] for s in test):.4f}x")
    print(f"tiles beat every rank by over 1% on {sum(ranks[s] > 1.01 * whole[s] for s in test)} of {len(test)} "
          f"test shapes (at most {max(ranks[s] / whole[s] for s in test):.3f}x); refused tiles: median "
          f"{statistics.median(sum(t is None for k, t in v['times'].items() if k[0] == 'tile') for v in test.values())} "
          f"of {len(TILES)} a shape")
    per = collections.defaultdict(dict)
    for s, v in test.items():
        sh, d = shares(v), ("rank", 0)
        rest = [k for k in v["times"] if k != d]
        pri = prior(s, train)
        per["list"][s] = [to99([d, *rest], sh)] * SEEDS
        for seed in range(SEEDS):
            shuffled = rest[:]
            random.Random(seed).shuffle(shuffled)
            per["none"].setdefault(s, []).append(to99([d, *shuffled], sh))
            per["neighbours"].setdefault(s, []).append(to99([d, *sorted(shuffled, key=lambda k: -pri.get(k, 0.0))], sh))
    shapes, rng = sorted(test), random.Random(0)
    for name in ("list", "neighbours"):
        a = {s: sum(per[name][s]) for s in shapes}
        b = {s: sum(per["none"][s]) for s in shapes}
        boot = sorted(1 - sum(a[s] for s in pick) / sum(b[s] for s in pick)
                      for pick in ([rng.choice(shapes) for _ in shapes] for _ in range(BOOT)))
        print(f"{name:10} mean to99 {statistics.mean(a.values()) / SEEDS:.2f} against none "
              f"{statistics.mean(b.values()) / SEEDS:.2f}: saving {1 - sum(a.values()) / sum(b.values()):+.1%} "
              f"[{boot[int(0.025 * BOOT)]:+.1%}, {boot[int(0.975 * BOOT)]:+.1%}]")
    print("\n| M | N | K | defaults' share | best rank's share | none | list | neighbours |\n|---|---|---|---|---|---|---|---|")
    for s in shapes:
        sh = shares(test[s])
        print(f"| {s[0]} | {s[1]} | {s[2]} | {sh[('rank', 0)]:.3f} | {whole[s] / ranks[s]:.3f} | "
              + " | ".join(f"{statistics.mean(per[n][s]):.1f}" for n in ("none", "list", "neighbours")) + " |")


if __name__ == "__main__":
    main()
