"""Memory ablation: the HTAM loop with the expert proposer under memory htg / flat / none.

    python3 bench/bench_memory.py                       # on the GPU machine; writes bench/results/
    python3 bench/bench_memory.py --limit 6 --steps 3 --warm-passes 0 --no-record   # quick look

Every arm gets a fresh HTG from the shipped prior, is warmed the same way (`--warm-passes` passes
over the same tasks, results discarded; "none" learns nothing from them, by definition), then runs
the measured pass with the same candidate budget: steps x candidates per task, stagnation stop off
(and the roofline stop off unless asked for), so arms differ only in what memory chooses.

Per arm: correct = tasks whose best candidate verified; fast@1 = tasks whose best candidate is
correct and faster than eager (HTAM's metric); geomean = geometric mean over all tasks of the best
verified speedup, a task with none counting 1.0 (torch_htam keeps eager there); cand ok = share of
all candidates that verified. Arms run one after another in one process, on one GPU state.

The search's best speedup is the max of many noisy timings (the winner's curse), and an outlier in
one arm decides its geomean; so after all arms, every arm's best kernel for a task is re-verified and
re-timed in one batch (the same sources get the same figure): the "re-timed" columns compare arms.

The raw figures go to bench/results/bench_memory-<date>.json (bench/record.py): suite
"bench_memory", the run's settings, rows = one dict per arm (metrics() and retime(), without the
kernel sources).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record as provenance  # noqa: E402
from torch_htam.htg import HTG, MODES  # noqa: E402
from torch_htam.search import SearchConfig, search_many  # noqa: E402

HERE = Path(__file__).resolve().parent


def load_tasks(folder: Path, limit: int | None) -> list:
    """Every KernelBench-style *.py in `folder` as a Task named after its file."""
    from torch_htam.extract import task_from_source
    files = sorted(folder.glob("*.py"))[:limit]
    if not files:
        raise SystemExit(f"no task files (*.py) in {folder}; pass --tasks DIR")
    return [task_from_source(f.read_text(), f.stem) for f in files]


def run_arm(mode: str, tasks, evaluator, args, traj_root: Path | None) -> dict:
    """Warm a fresh HTG, then the measured pass; the arm's metrics."""
    memory = HTG.from_prior()
    cfg = dict(steps=args.steps, candidates_per_step=args.candidates, memory=mode, stagnation=0,
               roofline_stop=args.roofline_stop, max_wall_s=args.task_time)
    for p in range(args.warm_passes):
        print(f"[{mode}] warm-up pass {p + 1}/{args.warm_passes}", file=sys.stderr)
        search_many(tasks, _expert, evaluator, memory, SearchConfig(**cfg, seed=1000 + p),
                    progress=args.progress)
    print(f"[{mode}] measured pass", file=sys.stderr)
    t0 = time.perf_counter()
    results = search_many(tasks, _expert, evaluator, memory, SearchConfig(**cfg, seed=args.seed),
                          progress=args.progress,
                          trajectory_dir=traj_root / mode if traj_root else None)
    wall = time.perf_counter() - t0
    if args.save_memory:
        memory.save(Path(args.save_memory) / f"htg_{mode}.json")
    return metrics(mode, list(results.values()), wall)


def retime(tasks, rows: list[dict], evaluator) -> None:
    """Re-verify and re-time each arm's best source per task, all arms' sources in one batch;
    adds fast1_rt / geomean_rt / per_task_rt to each row."""
    got: dict[tuple[str, str], float | None] = {}
    for t in tasks:
        srcs = sorted({r["best_src"][t.name] for r in rows if r["best_src"].get(t.name)})
        for src, ev in zip(srcs, evaluator.evaluate_many(t, srcs) if srcs else []):
            got[(t.name, src)] = ev.speedup if ev.correct and ev.speedup else None
    for r in rows:
        sp = {t.name: got.get((t.name, r["best_src"].get(t.name))) for t in tasks}
        r["per_task_rt"] = sp
        r["fast1_rt"] = sum(v is not None and v > 1.0 for v in sp.values()) / max(len(sp), 1)
        r["geomean_rt"] = math.exp(sum(math.log(v or 1.0) for v in sp.values()) / max(len(sp), 1))


def metrics(mode: str, results: list, wall_s: float) -> dict:
    n = len(results)
    best = [r.best.speedup if r.best else None for r in results]
    cands = sum(r.candidates for r in results)
    return {"arm": mode, "tasks": n, "candidates": cands,
            "cand_ok": sum(r.correct for r in results) / max(cands, 1),
            "correct": sum(b is not None for b in best) / max(n, 1),
            "fast1": sum(b is not None and b > 1.0 for b in best) / max(n, 1),
            "geomean": math.exp(sum(math.log(b or 1.0) for b in best) / max(n, 1)),
            "wall_s": wall_s,
            "per_task": {r.task: (r.best.speedup if r.best else None) for r in results},
            "best_src": {r.task: (r.best.source if r.best else None) for r in results},
            "errors": [f"{r.task}: {r.stop}" for r in results if r.stop.startswith("error")]}


def table(rows: list[dict]) -> list[str]:
    lines = ["| arm | tasks | candidates | cand ok | correct | fast@1 | geomean | fast@1 re-timed | "
             "geomean re-timed | wall |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rt = (f"{r['fast1_rt']:.1%} | {r['geomean_rt']:.3f}x" if "geomean_rt" in r else "- | -")
        lines.append(f"| {r['arm']} | {r['tasks']} | {r['candidates']} | {r['cand_ok']:.1%} | "
                     f"{r['correct']:.1%} | {r['fast1']:.1%} | {r['geomean']:.3f}x | {rt} | {r['wall_s']:.0f} s |")
    return lines


def per_task_table(rows: list[dict]) -> list[str]:
    names = list(rows[0]["per_task"])
    lines = ["| task | " + " | ".join(f"{r['arm']} (search) | {r['arm']} (re-timed)" for r in rows) + " |",
             "|---" * (2 * len(rows) + 1) + "|"]
    for name in names:
        cells = [f"{_x(r['per_task'].get(name))} | {_x(r.get('per_task_rt', {}).get(name))}" for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _expert():
    from torch_htam.proposers.expert import ExpertProposer
    return ExpertProposer()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=Path, default=HERE / "tasks", help="folder of KernelBench *.py files")
    p.add_argument("--limit", type=int, default=None, help="only the first N task files")
    p.add_argument("--arms", default=",".join(MODES), help="comma-separated memory modes")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--candidates", type=int, default=4, help="candidates per step")
    p.add_argument("--warm-passes", type=int, default=1, help="warm-up passes over the tasks per arm")
    p.add_argument("--roofline-stop", type=float, default=None, help="stop a task at this roofline fraction")
    p.add_argument("--task-time", type=float, default=None, help="wall seconds per task and pass")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trajectories", type=Path, default=None, help="write JSONL trajectories here")
    p.add_argument("--save-memory", default=None, help="folder to save each arm's final HTG")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in MODES]
    if bad:
        raise SystemExit(f"unknown arm(s) {bad}; choose from {MODES}")

    import torch
    from torch_htam.evaluation import Evaluator
    if not torch.cuda.is_available():
        raise SystemExit("bench_memory needs a CUDA GPU: every candidate is verified and timed on it")
    device = torch.cuda.get_device_name()
    tasks = load_tasks(args.tasks, args.limit)
    print(f"{len(tasks)} tasks from {args.tasks}, arms {arms}, {args.steps} steps x "
          f"{args.candidates} candidates, {args.warm_passes} warm-up pass(es), device {device}",
          file=sys.stderr)
    rows = []
    with Evaluator() as evaluator:
        for mode in arms:
            rows.append(run_arm(mode, tasks, evaluator, args, args.trajectories))
            # NOTE: each arm's row as soon as it ends: two H100 runs were cut by their time
            # limit before the final table and left nothing behind (docs/RESULTS_LOG.md).
            print(f"[{mode}] done: " + table(rows)[-1], flush=True)
        print("re-timing every arm's best kernels together", file=sys.stderr)
        retime(tasks, rows, evaluator)

    lines = table(rows)
    print("\n".join(lines))
    print("\n".join(per_task_table(rows)))
    for r in rows:
        for e in r["errors"]:
            print(f"[{r['arm']}] {e}", file=sys.stderr)
    if not args.no_record:
        provenance.write("bench_memory", payload(rows, len(tasks), args))


def payload(rows: list[dict], n_tasks: int, args) -> dict:
    """The run's raw figures: per arm its metrics, per-task speedups (search and re-timed) and
    errors; the kernel sources (best_src) stay out of the file."""
    return {"tasks": n_tasks, "tasks_dir": str(args.tasks), "limit": args.limit, "steps": args.steps,
            "candidates": args.candidates, "warm_passes": args.warm_passes,
            "roofline_stop": args.roofline_stop, "task_time": args.task_time, "seed": args.seed,
            "proposer": "expert", "rows": [{k: v for k, v in r.items() if k != "best_src"} for r in rows]}


if __name__ == "__main__":
    main()
