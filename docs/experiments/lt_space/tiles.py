"""Writes torch_htam/proposers/expert/lt_tiles.json: the cuBLASLt tiles the expert's GEMM space
forces (gemm.py's lt_tile knob), per arch, from the probe's train shapes only (the held-out test
shapes stay unseen).

A tile is listed when, forced on the heuristic's first algorithm (split-K 1, either CTA swizzle),
it ran within 1% of the best configuration the probe timed for some train shape; listed by how
many train shapes that held on, most first. The two swizzles tie wherever either wins (lt_prior's
data), so the knob is the tile alone.

    python3 docs/experiments/lt_space/tiles.py
"""
import collections
import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[2] / "torch_htam" / "proposers" / "expert" / "lt_tiles.json"
NEAR = 1.01


def main() -> None:
    rows = [json.loads(line) for line in gzip.open(HERE / "probe-h200.jsonl.gz", "rt")]
    sets = {tuple(map(int, x.split()[:3])): x.split()[3] for x in (HERE / "shapes.txt").read_text().splitlines()}
    by = collections.defaultdict(list)
    for r in rows:
        if r["us"] > 0 and r["err"] <= 2e-2:
            by[(r["M"], r["N"], r["K"])].append(r)
    count, shapes = collections.Counter(), 0
    for shape, v in sorted(by.items()):
        if sets.get(shape) != "train":
            continue
        shapes += 1
        first = next(r for r in v if r["src"] == "heur" and r["idx"] == 0)
        best = min(r["us"] for r in v)
        near = {r["tile"] for r in v if r["src"] == "grid" and r["algo"] == first["algo"] and r["splitk"] == 1
                and r["us"] <= NEAR * best}
        count.update(near)
    tiles = [t for t, _ in sorted(count.items(), key=lambda kv: (-kv[1], kv[0]))]
    OUT.write_text(json.dumps({
        "about": "cuBLASLt tiles (cublasLtMatmulTile_t) worth forcing, per arch, most often near-best "
                 "first; written by docs/experiments/lt_space/tiles.py from probe-h200.jsonl.gz's "
                 f"{shapes} train shapes",
        "sm_90a": tiles}, indent=1) + "\n")
    print(f"{len(tiles)} tiles from {shapes} train shapes -> {OUT}")


if __name__ == "__main__":
    main()
