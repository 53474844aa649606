"""Autotuning sweep: every setting of the expert's tuning grid for each task, verified and timed.

    python3 bench/sweep.py bench/tasks/rw_rmsnorm_bf16.py bench/tasks/rw_softmax_bf16.py
    python3 bench/sweep.py bench/tasks --kinds rowwise conv --top 5 --out /tmp/sweep.json
    python3 bench/sweep.py bench/tasks/conv_bn_add_relu_fp32.py --limit 96 --where tiled=True

Where the search tries a handful of settings per step, this builds the whole grid
(proposers.expert.proposer.tuning_grid), runs each through the same Evaluator as the search
(static check, nvcc, the full verification protocol, timing against the reference in the same
worker), and prints per task the best settings, the defaults' rank and each one's share of the
measured copy bandwidth. It is how the expert's defaults and strategy moves are chosen from
measurements; it does not touch the kernel cache. The raw figures go to
bench/results/sweep-<date>.json (bench/record.py): suite "sweep", kinds, limit, where, tasks = one
dict per task (task, kind, policy, bytes, settings, seconds, rows = every setting: params, default,
reason, detail, kernel_ms, ref_ms, speedup, bw).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

SHOWN = ("tpr", "rows_per_block", "vec", "nv", "online", "welford", "lazy", "packed", "occ", "rpg", "memo",
         "block", "unroll", "waves", "fast", "fused", "graph", "lt_epilogue", "tf32", "algo", "tiled", "bm", "bn", "stages", "ju", "split", "minb", "pre", "persist", "vec32")


def task_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.py")) if p.is_dir() else [p]
    return out


def short(params: dict, base: dict) -> str:
    """The params that differ from the defaults (all shown keys for the defaults themselves)."""
    keys = [k for k in SHOWN if k in params and (params is base or params[k] != base.get(k))]
    return " ".join(f"{k}={int(params[k]) if isinstance(params[k], bool) else params[k]}" for k in keys) or "defaults"


def sweep_task(path: Path, ev, kinds: set[str] | None, limit: int = 48, where: dict | None = None
               ) -> dict | None:
    from torch_htam import timing
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import match_task, tuning_grid
    from torch_htam.extract import task_from_source
    task = task_from_source(path.read_text(), path.stem)
    pol = policy_for(task)
    tgt = match_task(task, pol)
    if kinds and tgt.kind not in kinds:
        return None
    grid = tuning_grid(task, pol, limit)
    if where:     # the defaults stay first, as the row to compare with
        grid = grid[:1] + [p for p in grid[1:] if all(str(p.get(k)) == v for k, v in where.items())]
    t0 = time.time()
    srcs = []
    for p in list(grid):           # a setting the generator declines (e.g. too much shared memory)
        try:
            srcs.append(tgt.render(p))
        except Unsupported:
            grid.remove(p)
    evals = ev.evaluate_many(task, srcs, pol)
    copy_bps = timing.measure_ceilings().bandwidth if ev.gpu else None
    rows = []
    for i, (p, e) in enumerate(zip(grid, evals)):
        bw = task.bytes / (e.kernel_ms * 1e-3) / copy_bps if (e.correct and e.kernel_ms and copy_bps) else None
        rows.append({"params": p, "default": i == 0, "reason": e.reason, "detail": e.detail[:600],
                     "kernel_ms": e.kernel_ms, "ref_ms": e.ref_ms, "speedup": e.speedup, "bw": bw})
    return {"task": path.stem, "kind": tgt.kind, "policy": pol.name, "bytes": task.bytes,
            "settings": len(grid), "seconds": round(time.time() - t0, 1), "rows": rows}


def report(res: dict, top: int) -> list[str]:
    ok = sorted((r for r in res["rows"] if r["kernel_ms"]), key=lambda r: r["kernel_ms"])
    base = res["rows"][0]["params"]
    bad = [r["reason"] for r in res["rows"] if not r["kernel_ms"]]
    rank = next((i + 1 for i, r in enumerate(ok) if r["default"]), None)
    lines = [f"### {res['task']} ({res['kind']}, {res['policy']}): {len(ok)}/{res['settings']} verified, "
             f"defaults rank {rank or '-'}, {res['seconds']} s" + (f"; rejected: {', '.join(sorted(set(bad)))}" if bad else ""),
             "", "| setting | ms | ref ms | speedup | bw |", "|---|---|---|---|---|"]
    shown = ok[:top] + [r for r in ok[top:] if r["default"]]
    for r in shown:
        bw = f"{r['bw']:.0%}" if r["bw"] else "-"
        name = ("(defaults) " if r["default"] else "") + short(r["params"], base if not r["default"] else r["params"])
        lines.append(f"| {name} | {r['kernel_ms']:.4f} | {r['ref_ms']:.4f} | {r['speedup']:.2f}x | {bw} |")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=[str(Path(__file__).with_name("tasks"))])
    ap.add_argument("--kinds", nargs="*", help="only these plan kinds (elementwise rowwise gemm conv)")
    ap.add_argument("--top", type=int, default=4, help="settings shown per task")
    ap.add_argument("--out", help="write every row as JSON here")
    ap.add_argument("--limit", type=int, default=48, help="settings of the grid per task, defaults first")
    ap.add_argument("--where", nargs="*", default=[], metavar="KEY=VALUE",
                    help="only settings with these params (e.g. tiled=True), besides the defaults")
    ap.add_argument("--no-write", action="store_true", help="do not write a file to bench/results/")
    args = ap.parse_args(argv)
    import torch
    from torch_htam.evaluation import Evaluator
    if not torch.cuda.is_available():
        print("bench/sweep.py needs a CUDA GPU (candidates are verified and timed on it).", file=sys.stderr)
        return 2
    results = []
    with Evaluator() as ev:
        for path in task_files(args.paths):
            try:
                res = sweep_task(path, ev, set(args.kinds) if args.kinds else None, args.limit,
                                 dict(w.split("=", 1) for w in args.where))
            except Exception as e:    # one task's failure is reported and the sweep goes on
                print(f"### {path.stem}: failed: {type(e).__name__}: {e}", flush=True)
                continue
            if res is None:
                continue
            results.append(res)
            print("\n".join(report(res, args.top)), flush=True)
            if args.out:    # after every task: a sweep cut by a time limit keeps what it measured
                Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    if results and not args.no_write:
        record.write("sweep", {"kinds": args.kinds, "limit": args.limit, "where": args.where,
                               "tasks": json.loads(json.dumps(results, default=str))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
