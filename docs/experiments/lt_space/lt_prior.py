"""Would a memory of cuBLASLt tiles carry from one model's GEMMs to another's? A CPU study on the
probe's H200 times (lt_probe.cu, probe-h200.jsonl.gz), #35.

Each GEMM shape's space: the heuristic's first algorithm with each tile id its algo lists
(CAP_TILE_IDS: 634 for algo 66, every bf16 shape's first but one) x CTA swizzle {0, 1}, split-K 1,
where cublasLtMatmulAlgoCheck accepts it (the probe times the first 400 accepted per algo): 4 to
372 settings, the heuristic's own choice first (the defaults). Shapes come from bench/heldout's GEMM tasks (shapes.txt: train =
llama, bert, resnet50, swin, unet, whisper; test = gpt2, t5, convnext, mobilenetv3, vit,
mlp_mixer, resnet18). Orders walk each test shape's space until a setting is within 1% of its best:
  none        the defaults, then a seeded random order (a search with no memory)
  neighbours  the defaults, then by the mean share of the best each setting had on the train
              shapes, each weighted 2^-distance in log2 (M, N, K) (bench/prior_transfer.py's rule)
  kind        the same, every train shape weighted 1
saving = 1 - sum(order's to99) / sum(none's to99), with a paired bootstrap 95% interval over shapes;
and the geomean share of the best reached within the first k settings.
Times are GPU time (a CUDA graph of 20 launches, replayed), so cuBLASLt's host call is out of them.

    python3 docs/experiments/lt_space/lt_prior.py
"""
import collections
import gzip
import json
import math
import random
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS, BOOT = 20, 10_000
AT = (1, 2, 4, 8, 16)


def headroom():
    """Geomean over every probed shape of the heuristic's first pick's time over (a) the best of its
    first 8 results (what the expert's `algo` knob reaches) and (b) the best the probe timed."""
    rows = [json.loads(line) for line in gzip.open(HERE / "probe-h200.jsonl.gz", "rt")]
    by = collections.defaultdict(list)
    for r in rows:
        if r["us"] > 0 and r["err"] <= 2e-2:
            by[(r["M"], r["N"], r["K"])].append(r)
    top1 = {s: next(r["us"] for r in v if r["src"] == "heur" and r["idx"] == 0) for s, v in by.items()}
    gm = lambda xs: math.exp(statistics.mean(math.log(x) for x in xs))    # noqa: E731
    top8 = gm(top1[s] / min(r["us"] for r in v if r["src"] == "heur" and r["idx"] < 8) for s, v in by.items())
    every = gm(top1[s] / min(r["us"] for r in v) for s, v in by.items())
    return len(by), top8, every


def spaces():
    rows = [json.loads(line) for line in gzip.open(HERE / "probe-h200.jsonl.gz", "rt")]
    sets = {tuple(map(int, x.split()[:3])): x.split()[3] for x in (HERE / "shapes.txt").read_text().splitlines()}
    out = {}
    for r in rows:
        shape = (r["M"], r["N"], r["K"])
        sp = out.setdefault(shape, {"set": sets[shape], "times": {}, "default": None})
        if r["src"] == "heur" and r["idx"] == 0:
            sp["default"] = (r["tile"], r["swz"])
        if r["src"] == "grid" and r["idx"] == 0 and r["splitk"] == 1 and r["us"] > 0 and r["err"] <= 2e-2:
            sp["times"][(r["tile"], r["swz"])] = r["us"]
    return {s: sp for s, sp in out.items() if sp["default"] in sp["times"]}


def shares(sp):
    best = min(sp["times"].values())
    return {k: best / t for k, t in sp["times"].items()}


def to99(order, sh):
    return next((i + 1 for i, k in enumerate(order) if sh[k] >= 0.99), len(order) + 1)


def share_at(order, sh, k):
    """The best share of the table's best among the first k settings walked."""
    return max(sh[x] for x in order[:k])


def prior(shape, train, weighted):
    score, weight = collections.defaultdict(float), collections.defaultdict(float)
    for s, sp in train.items():
        w = 2.0 ** -math.dist([math.log2(x) for x in shape], [math.log2(x) for x in s]) if weighted else 1.0
        for k, v in shares(sp).items():
            score[k] += w * v
            weight[k] += w
    return {k: score[k] / weight[k] for k in score}


def main():
    n, top8, every = headroom()
    print(f"{n} shapes: the heuristic's first pick against the best of its first 8 {top8:.3f}x, against the "
          f"best the probe timed {every:.3f}x (geomean)")
    sp = spaces()
    train = {s: v for s, v in sp.items() if v["set"] == "train"}
    test = {s: v for s, v in sp.items() if v["set"] == "test"}
    per = {"none": {}, "kind": {}, "neighbours": {}}
    at = {n: {k: [] for k in AT} for n in per}
    for s, v in test.items():
        sh, d = shares(v), v["default"]
        rest = [k for k in v["times"] if k != d]
        pri = {"kind": prior(s, train, False), "neighbours": prior(s, train, True)}
        for seed in range(SEEDS):
            shuffled = rest[:]
            random.Random(seed).shuffle(shuffled)
            orders = {"none": [d, *shuffled]}
            orders.update({name: [d, *sorted(shuffled, key=lambda k: -p.get(k, 0.0))] for name, p in pri.items()})
            for name, order in orders.items():
                per[name].setdefault(s, []).append(to99(order, sh))
                for k in AT:
                    at[name][k].append(math.log(share_at(order, sh, k)))
    shapes = sorted(test)
    print(f"{len(train)} train shapes, {len(test)} test shapes; settings per shape: median "
          f"{statistics.median(len(v['times']) for v in test.values())}; defaults within 1% of the best on "
          f"{sum(shares(v)[v['default']] >= 0.99 for v in test.values())} of {len(test)}")
    rng = random.Random(0)
    for name in ("kind", "neighbours"):
        a = {s: sum(per[name][s]) for s in shapes}
        b = {s: sum(per["none"][s]) for s in shapes}
        saving = 1 - sum(a.values()) / sum(b.values())
        boot = []
        for _ in range(BOOT):
            pick = [rng.choice(shapes) for _ in shapes]
            boot.append(1 - sum(a[s] for s in pick) / sum(b[s] for s in pick))
        boot.sort()
        print(f"{name:10} mean to99 {statistics.mean(a.values()) / SEEDS:.2f} against none "
              f"{statistics.mean(b.values()) / SEEDS:.2f}: saving {saving:+.1%} "
              f"[{boot[int(0.025 * BOOT)]:+.1%}, {boot[int(0.975 * BOOT)]:+.1%}]")
    print("\ngeomean share of the best within the first k settings (test shapes x seeds):")
    for name in per:
        print(f"{name:10} " + "  ".join(f"k={k}: {math.exp(statistics.mean(at[name][k])):.4f}" for k in AT))
    print("\n| M | N | K | settings | defaults' share | none | kind | neighbours |\n|---|---|---|---|---|---|---|---|")
    for s in shapes:
        v = test[s]
        print(f"| {s[0]} | {s[1]} | {s[2]} | {len(v['times'])} | {shares(v)[v['default']]:.3f} | "
              + " | ".join(f"{statistics.mean(per[n][s]):.1f}" for n in ("none", "kind", "neighbours")) + " |")


if __name__ == "__main__":
    main()
