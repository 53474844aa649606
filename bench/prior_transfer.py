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

Two priors (--by, both by default; each row names its "prior"):
  kind        the score of each (kind, setting) over all train tables of that kind (the baseline)
  neighbours  per test task, the same RULE over the train tables of its kind, each weighted
              2^-distance between the two tasks' sizes (log2 features read from the task files: a
              GEMM's M, N, K; a conv's output pixels, out channels, reduction and groups; a row
              op's rows and row length; else the largest input's elements and innermost extent),
              so a table one doubling away counts half: which setting wins depends on the task's
              sizes, which the kind alone does not say. --k keeps only the k nearest (default all:
              chosen on train LOMO, where k = 2..6 saved less than all tables weighted)

Two protocols:
  held out    the prior from the train tables, walked on the test tables (other models)
  train LOMO  leave one model out: each train model's tables walked with the prior from the other
              train models' (bench/heldout/manifest.json names each task's model). Leaving one
              task out instead lets a model's repeated layers teach each other.
NOTE: a full-table walk is not the search (which moves from the defaults by strategy); it bounds
what ordering the same settings can save, and the search's replay (bench/anytime.py) measures it.

Writes bench/results/prior_transfer-<date>.json: rows (per protocol, prior and rule: saving, per
kind the mean to99 of both orders and the task count, per model its saving), the tables read,
seeds, k.
"""
from __future__ import annotations

import argparse
import ast
import functools
import glob
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

HERE = Path(__file__).resolve().parent
RULES = ("mean", "hit99", "hit95", "rank")
BYS = ("kind", "neighbours")
PROTOCOLS = ("held out", "train LOMO")
K = None      # neighbours per test task (None: all, weighted), chosen on train LOMO alone


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


def learn(tables: list[dict], rule: str, weights: list[float] | None = None) -> dict[tuple[str, str], float]:
    """{(kind, setting): its score under `rule`} over the tables it appears in: the mean, or the
    mean weighted by `weights` (one per table)."""
    seen: dict[tuple[str, str], list[float]] = {}
    wseen: dict[tuple[str, str], list[float]] = {}
    for j, t in enumerate(tables):
        sh = shares(t)
        ranked = sorted(sh, key=lambda k: -sh[k])
        for i, k in enumerate(ranked):
            score = {"mean": sh[k], "hit99": float(sh[k] >= 0.99), "hit95": float(sh[k] >= 0.95),
                     "rank": 1 - i / max(1, len(ranked) - 1)}[rule]
            seen.setdefault((t["kind"], k), []).append(score)
            wseen.setdefault((t["kind"], k), []).append(1.0 if weights is None else weights[j])
    if weights is None:
        return {k: statistics.mean(v) for k, v in seen.items()}
    return {k: statistics.fmean(v, wseen[k]) for k, v in seen.items()}


def _task_file(table: dict) -> Path:
    """The table's task file: its path, else the same name under bench/heldout/<its folder>/."""
    p = Path(table["path"])
    return p if p.exists() else HERE / "heldout" / p.parent.name / p.name


@functools.lru_cache(maxsize=None)
def _read_task(path: Path) -> tuple[list[tuple[int, ...]], list[tuple[str, list]]]:
    """(the input shapes of get_inputs(), [(aten op, its arguments) of forward(), in order]) from a
    task file (KernelBench format); an argument naming a value is its name ("in1", "v3")."""
    tree = ast.parse(path.read_text())
    fn = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    ret = next(n for n in ast.walk(fn["get_inputs"]) if isinstance(n, ast.Return))
    shapes = [tuple(ast.literal_eval(c.args[0])) for c in ret.value.elts]
    ops = []
    for c in ast.walk(fn["forward"]):
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Attribute):
            ops.append((c.func.value.attr, [_arg(a) for a in c.args]))
    return shapes, ops


def _arg(node: ast.AST):
    """An op's argument as a value: a name as its string, a list of them as a list, else a literal."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_arg(e) for e in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def features(table: dict) -> tuple[float, ...]:
    """The task's sizes, log2 (so a doubling is one unit whatever the size), that decide which
    setting wins: the table's own "features" where it has them, else read from its task file.
      gemm (linear)   M, N, K: the tile and split shapes that fill the GPU follow them
      conv            output pixels (the implicit GEMM's M), out channels (N), in channels per
                      group x kernel area (K), groups (depthwise convs want other kernels)
      row ops         rows and row length (layer/group norm, mean, adaptive pool): threads per
                      row and rows per block follow the row length, waves the rows
      else            the largest input's elements and its innermost extent (vector width)"""
    if "features" in table:
        return tuple(table["features"])
    shapes, ops = _read_task(_task_file(table))
    op = dict(reversed(ops))                           # each op's first call

    def shape(arg):                                    # an input's shape ("in1"), else None
        return shapes[int(arg[2:])] if isinstance(arg, str) and arg.startswith("in") else None

    def lg(*sizes):
        return tuple(math.log2(max(1, n)) for n in sizes)

    x = shapes[0]
    numel = math.prod(x)
    if "linear" in op and shape(op["linear"][0]) and shape(op["linear"][1]):
        a, w = shape(op["linear"][0]), shape(op["linear"][1])
        return lg(math.prod(a[:-1]), w[0], a[-1])
    if "conv2d" in op and shape(op["conv2d"][0]) and shape(op["conv2d"][1]):
        args = op["conv2d"] + [None] * 7
        (n, c, h, w), (o, cg, kh, kw) = shape(args[0]), shape(args[1])
        s, p, d = args[3] or [1, 1], args[4] or [0, 0], args[5] or [1, 1]
        ho, wo = ((size + 2 * p[i] - d[i] * (k - 1) - 1) // s[i] + 1
                  for i, (size, k) in enumerate(((h, kh), (w, kw))))
        return lg(n * ho * wo, o, cg * kh * kw, c // cg)
    row = (math.prod(op["layer_norm"][1]) if "layer_norm" in op else
           numel // (x[0] * op["group_norm"][1]) if "group_norm" in op else
           math.prod(x[i] for i in op["mean"][1]) if "mean" in op else
           x[-2] * x[-1] if "adaptive_avg_pool2d" in op else None)
    if row:
        return lg(numel // row, row)
    big = max(shapes, key=math.prod)
    return lg(math.prod(big), big[-1] if big else 1)


def neighbours(table: dict, train: list[dict], k: int | None = None) -> tuple[list[dict], list[float]]:
    """The k (None: all) train tables of the table's kind with a verified setting, nearest first in
    features() (Euclidean), and their weights 2^-distance: a table one doubling away counts half."""
    feats = features(table)
    near = sorted((math.dist(feats, features(t)), i) for i, t in enumerate(train)
                  if t["kind"] == table["kind"] and shares(t))[:k]
    return [train[i] for _, i in near], [2.0 ** -d for d, _ in near]


def learn_near(table: dict, train: list[dict], rule: str, k: int | None = None) -> dict[tuple[str, str], float]:
    """The prior for one task: learn() over its nearest train tables, weighted by nearness."""
    near, weights = neighbours(table, train, k)
    return learn(near, rule, weights)


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


def measure(test: list[dict], train: list[dict], rule: str, seeds: int, by: str = "kind",
            k: int | None = K) -> dict:
    """The saving of the prior learned from `train` on `test`, overall and per kind; by "kind": one
    prior for all, by "neighbours": each test table's own, from the train tables nearest to it."""
    prior, per = learn(train, rule), {}
    for t in test:
        got = walk(t, prior if by == "kind" else learn_near(t, train, rule, k), seeds)
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


def pooled(parts: list[dict]) -> dict:
    """measure()'s results on several test sets as one: its saving, tasks and kinds over them all."""
    kinds: dict[str, list[dict]] = {}
    for p in parts:
        for kind, v in p["kinds"].items():
            kinds.setdefault(kind, []).append(v)
    out = {kind: {o: sum(v[o] * v["tasks"] for v in vs) / sum(v["tasks"] for v in vs)
                  for o in ("prior_to99", "random_to99")} | {"tasks": sum(v["tasks"] for v in vs)}
           for kind, vs in sorted(kinds.items())}
    a = sum(v["prior_to99"] * v["tasks"] for v in out.values())
    b = sum(v["random_to99"] * v["tasks"] for v in out.values())
    return {"saving": 1 - a / b if b else None, "tasks": sum(v["tasks"] for v in out.values()), "kinds": out}


def run(test: list[dict], train: list[dict], models: dict[str, str], seeds: int,
        bys: tuple[str, ...] = BYS, k: int | None = K, protocols: tuple[str, ...] = PROTOCOLS) -> list[dict]:
    rows = []
    for by in bys:
        for rule in RULES:
            if "held out" in protocols:
                held = measure(test, train, rule, seeds, by, k)
                held["models"] = {m: measure(ts, train, rule, seeds, by, k)["saving"]
                                  for m, ts in sorted(by_model(test, models).items())}
                rows.append({"protocol": "held out", "prior": by, "rule": rule, **held})
            if "train LOMO" in protocols:
                split = by_model(train, models)
                parts = [measure(ts, [u for m2, us in split.items() if m2 != m for u in us], rule, seeds, by, k)
                         for m, ts in split.items()]
                rows.append({"protocol": "train LOMO", "prior": by, "rule": rule, **pooled(parts),
                             "models": {m: p["saving"] for m, p in zip(split, parts)}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test", nargs="+", required=True, help="test tables (globs)")
    ap.add_argument("--train", nargs="+", required=True, help="train tables (globs)")
    ap.add_argument("--manifest", type=Path, default=HERE / "heldout" / "manifest.json")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--by", nargs="+", choices=BYS, default=list(BYS), help="the priors to measure")
    ap.add_argument("--k", type=int, default=K,
                    help="neighbours: keep the k nearest train tables (default all, weighted)")
    ap.add_argument("--protocol", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS),
                    help="tune on train LOMO alone, so the test tables stay held out")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args(argv)
    (test, test_files), (train, train_files) = load(a.test), load(a.train)
    rows = run(test, train, model_of(json.loads(a.manifest.read_text())), a.seeds, tuple(a.by), a.k,
               tuple(a.protocol))
    for r in rows:
        print(f"{r['protocol']:10} {r['prior']:10} {r['rule']:6} saving {100 * r['saving']:5.1f}%  "
              f"({r['tasks']} tasks)  to99 prior/random: "
              + " ".join(f"{kind} {v['prior_to99']:.2f}/{v['random_to99']:.2f}" for kind, v in r["kinds"].items()))
    if not a.no_record:
        record.write("prior_transfer", {"seeds": a.seeds, "k": a.k, "test": test_files, "train": train_files,
                                        "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
