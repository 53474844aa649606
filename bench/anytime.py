"""Anytime curves: the best verified kernel against candidates evaluated, per memory arm.

    python3 bench/anytime.py                                  # GPU: measure the tables, then the arms
    python3 bench/anytime.py bench/tasks/rw_*.py --limit 24 --budget 24 --table-only --out t.json
    python3 bench/anytime.py --replay t1.json t2.json         # CPU: the arms from measured tables

Measure (GPU): every setting of each task's search space (the expert's tuning_grid: the defaults,
every strategy move from them, the kind's knob grid; the first --limit settings) is built, verified
and timed like a search's candidate, and each verified one timed a second time
(Evaluation.retime_ms). That is the table, and its best is the oracle.

Replay (CPU, deterministic): four arms walk the same tables, through the real search loop
(search.search) and proposer (ExpertProposer limited to the measured settings), each candidate's
verdict read from the table (TableEvaluator), so arms differ only in the order they try settings:
  htg_warm  the HTG, after searching every other task first (leave one task out)
  htg_cold  the HTG fresh from the shipped prior
  flat      flat memory (the same prior, no transitions), fresh
  none      no memory: the space in random order (per task the median over --perms orders)
Curve point k: of the first k candidates, the one a search keeps (the fastest by its first timing)
as its second timing reports it (the winner's curse stays out of the figure); the oracle is the
same rule over the whole space. Stops other than the budget are off (stagnation, roofline).

Per arm: median_to_95 = the median over tasks of the first k whose curve reaches 95% of the
oracle (a task that never does within --budget counts as past it; None when over half never do),
geomean speedup and geomean share of the oracle at 4, 8 and 16 candidates, and budget_95: the
fewest candidates at which the geomean share reaches 95%. Writes bench/results/anytime-<date>.json
(bench/record.py): suite "anytime", limit, budget, perms, arms, tables.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

HERE = Path(__file__).resolve().parent
ARMS = ("htg_warm", "htg_cold", "flat", "none")
POINTS = (4, 8, 16)
TO_ORACLE = 0.95     # the bar; NEAR_ORACLE is reported beside it (where the defaults already
NEAR_ORACLE = 0.99   # hold 95%, only a stricter bar shows whether memory finds the rest sooner)


# ---- measure (GPU) --------------------------------------------------------------------------------

def task_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.py")) if p.is_dir() else [p]
    return out


def measure(path: Path, evaluator, limit: int) -> dict:
    """One task's table: every setting of its (limited) search space, verified and timed twice."""
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import match_task, tuning_grid
    task = task_from_source(path.read_text(), path.stem)
    pol = policy_for(task)
    tm = match_task(task, pol)
    t0 = time.time()
    settings, sources = [], []
    for p in tuning_grid(task, pol, limit):
        try:
            sources.append(tm.render(p))
        except Unsupported:     # a setting the generator declines (e.g. too much shared memory)
            continue
        settings.append(p)
    evals = evaluator.evaluate_many(task, sources, pol)
    rows = [{"params": p, "correct": e.correct, "reason": e.reason, "speedup": e.speedup,
             "kernel_ms": e.kernel_ms, "retime_ms": e.retime_ms, "ref_ms": e.ref_ms,
             "roofline_fraction": e.roofline_fraction} for p, e in zip(settings, evals)]
    return {"task": path.stem, "path": str(path), "kind": tm.kind, "policy": pol.name, "limit": limit,
            "seconds": round(time.time() - t0, 1), "rows": rows}


# ---- replay (CPU) ---------------------------------------------------------------------------------

def table_keys(task, table: dict) -> dict[str, dict]:
    """source_key of each row's setting, rendered here as measure() rendered it -> the row."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import source_key
    from torch_htam.proposers.expert.proposer import match_task
    tm = match_task(task, policy_for(task))
    return {source_key(tm.render(r["params"])): r for r in table["rows"]}


class TableEvaluator:
    """Answers evaluate_many from one task's measured table (by_key: table_keys); `log` holds the
    rows in the order the search asked for them. A source outside the table is an error: the arms
    must propose from the measured space only."""

    def __init__(self, by_key: dict[str, dict], gpu=None):
        self.by_key, self.gpu = by_key, gpu
        self.log: list[dict] = []

    def evaluate_many(self, task, sources: list[str], policy=None, inductor: bool = False) -> list:
        from torch_htam.evaluation import Evaluation
        from torch_htam.proposers.base import source_key
        out = []
        for src in sources:
            r = self.by_key.get(source_key(src))
            if r is None:
                raise KeyError(f"{task.name}: a candidate outside the measured table (is --limit the "
                               "one the table was measured with, and the commit the same?)")
            self.log.append(r)
            out.append(Evaluation(r["correct"], r["reason"], speedup=r["speedup"], kernel_ms=r["kernel_ms"],
                                  ref_ms=r["ref_ms"], retime_ms=r["retime_ms"],
                                  roofline_fraction=r["roofline_fraction"]))
        return out


def kept(rows: list[dict]) -> float | None:
    """What a search that evaluated `rows` reports: its best by first timing, re-timed."""
    ok = [r for r in rows if r["correct"] and r["speedup"] and r["retime_ms"]]
    if not ok:
        return None
    best = max(ok, key=lambda r: r["speedup"])
    return best["ref_ms"] / best["retime_ms"]


def curve(log: list[dict], budget: int) -> list[float | None]:
    """Point k-1 = kept(first k candidates); a search that stopped early holds its last value."""
    pts = [kept(log[:k]) for k in range(1, min(len(log), budget) + 1)]
    return pts + [pts[-1] if pts else None] * (budget - len(pts))


def to_oracle(c: list[float | None], oracle: float | None, share: float = TO_ORACLE) -> int | None:
    """The first k whose point reaches `share` of the oracle (None: not within the budget)."""
    if oracle is None:
        return None
    return next((k + 1 for k, v in enumerate(c) if v is not None and v >= share * oracle), None)


def search_log(task, by_key: dict, memory, mode: str, budget: int, limit: int, gpu, seed: int = 0) -> list[dict]:
    """The rows one search of `task` evaluated, in order (real loop, table verdicts; by_key:
    table_keys of its table)."""
    from torch_htam.proposers.expert import ExpertProposer
    from torch_htam.search import SearchConfig, search
    ev = TableEvaluator(by_key, gpu)
    cfg = SearchConfig(steps=budget, candidates_per_step=4, stagnation=0, roofline_stop=None,
                       memory=mode, seed=seed)
    search(task, ExpertProposer(space_limit=limit), ev, memory, cfg, gpu=gpu)
    return ev.log[:budget]


def replay(tables: list[dict], budget: int, perms: int, gpu=None, arms=ARMS, progress=None) -> dict:
    """Every arm's curves over the tables; the per-arm summary (module docstring)."""
    from torch_htam.extract import task_from_source
    from torch_htam.htg import HTG
    tasks = [task_from_source(Path(t["path"]).read_text() if Path(t["path"]).exists()
                              else (HERE / "tasks" / f"{t['task']}.py").read_text(), t["task"]) for t in tables]
    limit = {t["task"]: t["limit"] for t in tables}
    keys = {task.name: table_keys(task, table) for task, table in zip(tasks, tables)}   # rendered once
    oracle = {t["task"]: kept(t["rows"]) for t in tables}
    curves: dict[str, dict[str, list]] = {a: {} for a in arms}
    for i, (task, table) in enumerate(zip(tasks, tables)):
        if progress:
            progress(f"[{i + 1}/{len(tasks)}] {task.name}")
        if "htg_warm" in arms:   # leave one out: experience from every other task, then this one
            mem = HTG.from_prior()
            for other in tasks:
                if other is not task:
                    search_log(other, keys[other.name], mem, "htg", budget, limit[other.name], gpu)
            curves["htg_warm"][task.name] = curve(search_log(task, keys[task.name], mem, "htg", budget,
                                                             limit[task.name], gpu), budget)
        for arm, mode in (("htg_cold", "htg"), ("flat", "flat")):
            if arm in arms:
                log = search_log(task, keys[task.name], HTG.from_prior(), mode, budget, limit[task.name], gpu)
                curves[arm][task.name] = curve(log, budget)
        if "none" in arms:
            curves["none"][task.name] = _random_curve(table["rows"], budget, perms)
    return {"arms": {a: summarize(curves[a], oracle, budget) for a in arms},
            "oracle": oracle}


def _random_curve(rows: list[dict], budget: int, perms: int) -> list[float | None]:
    """No memory: the pointwise median over `perms` random orders of the space (seeded)."""
    rng = random.Random(0)
    runs = []
    for _ in range(perms):
        order = list(rows)
        rng.shuffle(order)
        runs.append(curve(order, budget))
    return [statistics.median(v if v is not None else 0.0 for v in col) or None for col in zip(*runs)]


def summarize(curves: dict[str, list], oracle: dict[str, float | None], budget: int) -> dict:
    """One arm's figures over the tasks (module docstring)."""
    def median_to(hits):   # a task not reaching it within the budget counts as past the budget
        steps = sorted(k if k is not None else math.inf for k in hits.values())
        med = statistics.median(steps) if steps else math.inf
        return None if math.isinf(med) else med

    hits = {t: to_oracle(c, oracle[t]) for t, c in curves.items() if oracle[t] is not None}
    near = {t: to_oracle(c, oracle[t], NEAR_ORACLE) for t, c in curves.items() if oracle[t] is not None}

    def gmean(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None

    def share(k):      # a task with no verified kernel yet keeps eager: speedup 1.0
        return [min((c[k - 1] or 1.0) / oracle[t], 1.0) for t, c in curves.items() if oracle[t]]

    points = [k for k in POINTS if k <= budget]
    budget_95 = next((k for k in range(1, budget + 1) if gmean(share(k)) >= TO_ORACLE), None)
    return {"median_to_95": median_to(hits), "mean_to_95": _mean_to(hits, budget),
            "median_to_99": median_to(near), "mean_to_99": _mean_to(near, budget),
            "reached": sum(k is not None for k in hits.values()), "tasks": len(hits),
            "geomean": {k: gmean([c[k - 1] or 1.0 for c in curves.values()]) for k in points},
            "of_oracle": {k: gmean(share(k)) for k in points},
            "budget_95": budget_95, "to_95": hits, "to_99": near, "curves": curves}


def _mean_to(hits: dict, budget: int) -> float | None:
    """Mean candidates to the bar, a task that never reaches it counted at budget + 1."""
    return statistics.mean(k if k is not None else budget + 1 for k in hits.values()) if hits else None


def table_lines(res: dict) -> list[str]:
    lines = ["| arm | candidates to 95% of oracle: median (mean) | to 99%: median (mean) | tasks reaching 95% | "
             + " | ".join(f"geomean @{k} (of oracle)" for k in POINTS) + " | budget for 95% |",
             "|---" * (5 + len(POINTS)) + "|"]
    for arm, a in res["arms"].items():
        cells = [f"{a['geomean'][k]:.3f}x ({a['of_oracle'][k]:.1%})" if a["geomean"].get(k) else "-"
                 for k in POINTS]
        lines.append(f"| {arm} | {_n(a['median_to_95'])} ({a['mean_to_95']:.1f}) | {_n(a['median_to_99'])} "
                     f"({a['mean_to_99']:.1f}) | {a['reached']}/{a['tasks']} | " + " | ".join(cells)
                     + f" | {a['budget_95'] or '-'} |")
    return lines


def _n(v) -> str:
    return ">budget" if v is None else f"{v:g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=[str(HERE / "tasks")])
    ap.add_argument("--limit", type=int, default=24, help="settings of each task's search space")
    ap.add_argument("--budget", type=int, default=24, help="candidates per search")
    ap.add_argument("--perms", type=int, default=21, help="random orders for the no-memory arm")
    ap.add_argument("--table-only", action="store_true", help="measure and write the tables only")
    ap.add_argument("--out", help="also write the tables (JSON list) here, after every task")
    ap.add_argument("--replay", nargs="*", help="tables written by --out or a results file: no GPU")
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    args = ap.parse_args(argv)
    from torch_htam.gpu import GpuInfo
    if args.replay:
        tables, sources = [], []
        for f in args.replay:
            d = json.loads(Path(f).read_text())
            tables += d["tables"] if isinstance(d, dict) else d
            if isinstance(d, dict):     # a results file: where its tables were measured
                sources.append({k: d.get(k) for k in ("date", "commit", "device", "command")} | {"file": f})
        gpu = GpuInfo(**tables[0]["gpu"]) if tables and tables[0].get("gpu") else None
    else:
        import torch
        from torch_htam.evaluation import Evaluator
        if not torch.cuda.is_available():
            print("bench/anytime.py measures on a CUDA GPU; --replay TABLES runs the arms without one",
                  file=sys.stderr)
            return 2
        tables, sources, written = [], [], None
        with Evaluator(retime=True) as ev:
            gpu = ev.gpu
            for path in task_files(args.paths):
                t = measure(path, ev, args.limit)
                t["gpu"] = gpu.to_json() if gpu else None
                tables.append(t)
                ok = sum(r["correct"] for r in t["rows"])
                print(f"{t['task']}: {ok}/{len(t['rows'])} verified, oracle "
                      f"{kept(t['rows']) or 0:.2f}x, {t['seconds']} s", flush=True)
                # after every task: a run cut by a time limit keeps what it measured
                if args.out:
                    Path(args.out).write_text(json.dumps(tables))
                if args.table_only and not args.no_record:
                    written = record.write("anytime_table", {"limit": args.limit, "tables": tables},
                                           path=written)
        if args.table_only:
            return 0
    res = replay(tables, args.budget, args.perms, gpu, progress=lambda m: print(m, file=sys.stderr))
    print("\n".join(table_lines(res)))
    if not args.no_record:
        record.write("anytime", {"limit": tables[0]["limit"] if tables else args.limit, "budget": args.budget,
                                 "perms": args.perms, "to_oracle": TO_ORACLE, "measured": sources, **res,
                                 "tables": tables})
    return 0


if __name__ == "__main__":
    sys.exit(main())
