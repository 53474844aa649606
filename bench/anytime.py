"""Anytime curves: the best verified kernel against candidates evaluated, per memory arm.

    python3 bench/anytime.py                                  # GPU: measure the tables, then the arms
    python3 bench/anytime.py bench/tasks/rw_*.py --limit 24 --budget 24 --table-only --out t.json
    python3 bench/anytime.py bench/tasks/rw_*.py --table-only --out t.json --resume   # the tasks t.json lacks
    python3 bench/anytime.py bench/heldout/test --table-only --limit-kind gemm=48    # GEMMs' ranks and tiles
    python3 bench/anytime.py --replay t1.json t2.json         # CPU: the arms from measured tables
    python3 bench/anytime.py --replay t.json --seeds 5 --jobs 8   # 5 runs per arm and task, 8 processes
    python3 bench/anytime.py --replay test.json --train train.json  # htg_warm learns from train only
    python3 bench/anytime.py --train train.json --save-memory warm.json   # that memory, as a file

Measure (GPU): every setting of each task's search space (the expert's tuning_grid: the defaults,
every strategy move from them, the kind's knob grid; the first --limit settings) is built, verified
and timed like a search's candidate, and each verified one timed a second time
(Evaluation.retime_ms); --passes 2 (the default) does it all twice and keeps the second, timed with
the settings already built. That is the table, and its best is the oracle.

Replay (CPU, deterministic): four arms walk the same tables, through the real search loop
(search.search) and proposer (ExpertProposer limited to the measured settings), each candidate's
verdict read from the table (TableEvaluator), so arms differ only in the order they try settings:
  htg_warm  the HTG with experience first: without --train, from searching every other task
            (leave one task out: the task is held out of the experience it is searched with); with
            --train, from searching every train task (none of them a test task); in a seeded order
  htg_cold  the HTG fresh from the shipped prior
  flat      flat memory (the same prior, no transitions), fresh
  none      no memory: the search loop with memory="none", as optimize runs it: the defaults
            first (step 0), then strategies in a seeded random order
NOTE: "none" used to shuffle the whole table, so unlike the other arms it did not try the defaults
first; run as the loop runs it, it tied the memory arms. Every arm runs --seeds times per task
(seed s: SearchConfig.seed, which orders "none"'s strategies, and the order of htg_warm's other
tasks; htg_cold and flat do not depend on it, so their seeds repeat one run).
Curve point k: of the first k candidates, the one a search keeps (the fastest by its first timing)
as its second timing reports it (the winner's curse stays out of the figure); the oracle is the
same rule over the whole space. Stops other than the budget are off (stagnation, roofline).

Per arm: median_to_95 = the median over tasks of the first k whose curve reaches 95% of the
oracle (a task that never does within --budget counts as past it; None when over half never do),
geomean speedup and geomean share of the oracle at 4, 8 and 16 candidates, and budget_95: the
fewest candidates at which the geomean share reaches 95%; these are over each task's pointwise
median curve across seeds.

Held-out figures (the question: does memory save candidates over a fair no-memory search?):
  every arm is measured on the test tables (the positional/--replay ones). What htg_warm has seen:
  without --train, every other test task (leave one out: the figures' tasks also taught it, each
  once, just not the one measured); with --train, only the train tables' tasks (the issue's
  held-out protocol: memory trained on the regions of one set of models, measured on the regions
  of models it never saw; a train task also in the test set is refused). "train" in the results
  lists the train tasks (empty: leave one out). Every search, train or test, runs on the GPU its
  table was measured on (the table's "gpu"): train tables from an H100 and test tables from an
  H200 measure memory carried to a sibling device; "devices" names both sets' GPUs.
  rows[i]["to99"][arm]  per seed, the candidates until the arm's curve reaches 99% of "best", the
                        best point any arm and seed reached on the task (budget + 1: never)
  savings[arm]          1 - sum(arm's to99) / sum(none's to99) over every task and seed: the
                        share of candidates the arm saves, with ci_low / ci_high, a paired
                        bootstrap 95% interval (tasks resampled with their seeds, both arms
                        together; BOOTSTRAP resamples, seeded)
  saving_vs_none, ci_low, ci_high   savings["htg_warm"]'s, at the top level
space (space_facts: the defaults' share of each table's best, ties within 1%, timing noise):
  what an order has to find, the same for every arm.
Writes bench/results/anytime-<date>.json (bench/record.py): suite "anytime", limit, budget, seeds,
arms, rows, savings, saving_vs_none, ci_low, ci_high, space, train, train_measured, devices, tables.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
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
MODE = {"htg_warm": "htg", "htg_cold": "htg", "flat": "flat", "none": "none"}   # SearchConfig.memory
BOOTSTRAP = 10_000   # resamples of the saving's interval


# ---- measure (GPU) --------------------------------------------------------------------------------

def task_files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.py")) if p.is_dir() else [p]
    return out


def measure(path: Path, evaluator, limit: int, passes: int = 2, kind_limits: dict | None = None) -> dict:
    """One task's table: every setting of its (limited) search space, verified and timed twice.
    kind_limits: a limit per task kind in place of `limit` ({"gemm": 48}: cuBLASLt's ranks and
    tiles, past the 24 settings of the other kinds).

    passes: the whole space evaluated this many times, the last pass kept. NOTE: on an H200 host
    the first pass (each setting built, then timed) gave 4 of 64 settings two timings over 5% apart,
    a second pass over the built settings 0 of 64 (docs/experiments/timing_noise/twice-h200.txt);
    the tables order a space, so they keep the quieter figures."""
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import match_task, tuning_grid
    task = task_from_source(path.read_text(), path.stem)
    pol = policy_for(task)
    if task.kind == "attention":    # the whole space: cuDNN's attention too, its library built first
        from torch_htam import build
        build.library("cudnn_sdpa", build.default_arch())
    tm = match_task(task, pol)
    limit = (kind_limits or {}).get(tm.kind, limit)
    t0 = time.time()
    settings, sources = [], []
    for p in tuning_grid(task, pol, limit):
        try:
            sources.append(tm.render(p))
        except Unsupported:     # a setting the generator declines (e.g. too much shared memory)
            continue
        settings.append(p)
    for _ in range(max(1, passes)):
        evals = evaluator.evaluate_many(task, sources, pol)
    rows = [{"params": p, "correct": e.correct, "reason": e.reason, "speedup": e.speedup,
             "kernel_ms": e.kernel_ms, "retime_ms": e.retime_ms, "ref_ms": e.ref_ms,
             "kernel_event_ms": e.kernel_event_ms, "kernel_drain_ms": e.kernel_drain_ms,
             "roofline_fraction": e.roofline_fraction} for p, e in zip(settings, evals)]
    return {"task": path.stem, "path": str(path), "kind": tm.kind, "policy": pol.name, "limit": limit,
            "passes": max(1, passes), "seconds": round(time.time() - t0, 1), "rows": rows}


# ---- replay (CPU) ---------------------------------------------------------------------------------

def table_keys(task, table: dict) -> dict[str, dict]:
    """source_key of each row's setting, rendered by this commit's expert -> the row.

    A table measured before a knob was added lacks that knob in its params; the setting is
    completed with the knob's default and made canonical, as the proposer writes it today. NOTE:
    without this the replay of bench/results/anytime-20261123-*.json raised "candidate outside
    the measured table" on its bf16 row tasks (rw_rmsnorm_bf16 first): the proposer's settings
    had rowwise knobs the table's lacked, and the two rendered different sources. The row's
    verdict is read as that of the completed setting: the replay measures the order in which arms
    try a space, and a table measured at this commit (--table-only) refreshes the timings.
    A row this commit's expert declines to render is left out: the proposer cannot propose it.
    Each row comes with its "setting" (proposer.setting_key of the completed setting): the replay's
    proposer walks only those (ExpertProposer within=), so a setting this commit's space has and
    the table lacks is never asked for, and two rows this commit makes one setting are one."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import source_key
    from torch_htam.proposers.expert.ir import Unsupported
    from torch_htam.proposers.expert.proposer import match_task, setting_key
    tm = match_task(task, policy_for(task))
    t, region = tm.target, tm.region
    out = {}
    for r in table["rows"]:
        p = t.canonical(region, dict(tm.defaults, **r["params"]))
        try:
            out[source_key(t.render(region, p))] = dict(r, setting=setting_key(p))
        except Unsupported:
            continue
    return out


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


def search_log(task, by_key: dict, memory, mode: str, budget: int, limit: int, gpu, seed: int = 0,
               recall: int | None = None) -> list[dict]:
    """The rows one search of `task` evaluated, in order (real loop, table verdicts; by_key:
    table_keys of its table). recall: SearchConfig.recall where not None (its default otherwise)."""
    from torch_htam.proposers.expert import ExpertProposer
    from torch_htam.search import SearchConfig, search
    ev = TableEvaluator(by_key, gpu)
    cfg = SearchConfig(steps=budget, candidates_per_step=4, stagnation=0, roofline_stop=None,
                       memory=mode, seed=seed)
    if recall is not None:
        cfg = dataclasses.replace(cfg, recall=recall)
    within = {r["setting"] for r in by_key.values()}
    search(task, ExpertProposer(space_limit=limit, within=within), ev, memory, cfg, gpu=gpu)
    return ev.log[:budget]


def replay(tables: list[dict], budget: int, seeds: int = 1, gpu=None, arms=ARMS, progress=None,
           jobs: int = 1, train: list[dict] | None = None) -> dict:
    """Every arm's runs over the tables, `seeds` per task; the per-arm summary, the held-out rows
    and savings (module docstring). train: tables htg_warm learns from instead of the other test
    tasks (none may be a test task). jobs > 1: the (seed, task) runs in that many processes (the
    leave-one-out arm searches every other task first, so the work grows with tasks squared:
    85 tasks took 11 minutes a seed on 2 cores); the result does not depend on it."""
    names = [t["task"] for t in tables]
    train = list(train or [])
    held_out(names, train)
    oracle = {t["task"]: kept(t["rows"]) for t in tables}
    work = [(seed, i) for seed in range(seeds) for i in range(len(tables))]
    runs: dict[str, dict[str, list]] = {a: {t: [] for t in names} for a in arms}
    for n, ((seed, i), curves) in enumerate(zip(work, _map_runs(work, (tables, budget, gpu, arms, train), jobs))):
        if progress:
            progress(f"[{n + 1}/{len(work)}] seed {seed}, {names[i]}")
        for arm in arms:    # work is seed-major: each task's list is in seed order
            runs[arm][names[i]].append(curves[arm])
    summary = {a: dict(summarize({t: median_curve(cs) for t, cs in runs[a].items()}, oracle, budget),
                       runs=runs[a]) for a in arms}
    rows = held_out_rows(runs, budget)
    out = {"arms": summary, "oracle": oracle, "seeds": seeds, "rows": rows, "train": [t["task"] for t in train],
           "devices": {"test": devices(tables, gpu), "train": devices(train, gpu)}}
    if "none" in arms:
        out["savings"] = {a: saving(rows, a, "none") for a in arms if a != "none"}
        if "htg_warm" in arms:
            warm = out["savings"]["htg_warm"]
            out.update(saving_vs_none=warm["saving"], ci_low=warm["ci_low"], ci_high=warm["ci_high"])
    return out


def table_gpu(table: dict, default=None):
    """The GPU a table was measured on (its "gpu" record), else `default`: a search replayed on a
    table sees that GPU's roofline, so memory learned from H100 tables and searched on H200 tables
    is the issue's sibling-device transfer."""
    from torch_htam.gpu import GpuInfo
    return GpuInfo(**table["gpu"]) if table.get("gpu") else default


def devices(tables: list[dict], default=None) -> list[str]:
    """The names of the GPUs `tables` were measured on, sorted ([] where none is known)."""
    return sorted({g.name for g in (table_gpu(t, default) for t in tables) if g is not None})


def held_out(test: list[str], train: list[dict]) -> None:
    """Refuses train tables whose task is also tested: its experience would not be held out."""
    both = sorted({t["task"] for t in train} & set(test))
    if both:
        raise ValueError(f"train tables include test tasks {both}: the train set must be held out "
                         "of the test set (drop them from one of the two)")


_REPLAY: dict = {}    # one process's replay inputs (_prepare), read by _one_run


def task_path(table: dict) -> Path:
    """A table's task file here: its recorded path; else, where it was measured in another
    checkout (a GPU machine's), the same path under this repository's bench/; else bench/tasks/."""
    path = Path(table["path"])
    if path.exists():
        return path
    parts = path.parts
    if "bench" in parts:
        here = HERE.joinpath(*parts[len(parts) - parts[::-1].index("bench"):])
        if here.exists():
            return here
    return HERE / "tasks" / f"{table['task']}.py"


def _task(table: dict):
    from torch_htam.extract import task_from_source
    return task_from_source(task_path(table).read_text(), table["task"])


def _prepare(tables: list[dict], budget: int, gpu, arms, train: list[dict] = ()) -> None:
    """Tasks built and tables rendered once per process (table_keys is the slow part); the train
    tables only where htg_warm, their one reader, runs."""
    train = list(train) if "htg_warm" in arms else []
    tasks, train_tasks = [_task(t) for t in tables], [_task(t) for t in train]
    _REPLAY.update(tasks=tasks, train=train_tasks, budget=budget, arms=arms,
                   gpus={t["task"]: table_gpu(t, gpu) for t in tables + train},
                   limit={t["task"]: t["limit"] for t in tables + train},
                   keys={task.name: table_keys(task, table)
                         for task, table in zip(tasks + train_tasks, tables + train)},
                   trained={})


def _worker(*inputs) -> None:
    """A forked replay process's start. NOTE: a forked worker whose parent ran torch ops hangs in
    its first op on the inherited intra-op thread pool; one thread runs ops inline (the replay's
    ops are tiny)."""
    import torch
    torch.set_num_threads(1)
    _prepare(*inputs)


def _one_run(work: tuple[int, int]) -> dict[str, list]:
    """Every arm's curve for one (seed, task index)."""
    seed, i = work
    r = _REPLAY
    task = r["tasks"][i]
    memory = _trained(seed) if r["train"] else None
    return {arm: curve(arm_log(arm, task, r["tasks"], r["keys"], r["limit"], r["budget"], r["gpus"], seed,
                               trained=memory),
                       r["budget"]) for arm in r["arms"]}


def _trained(seed: int):
    """The HTG after the train tasks, once per seed and process: with a train set the experience
    does not depend on the test task, so searching it again per test task would only cost time."""
    r = _REPLAY
    if seed not in r["trained"]:
        from torch_htam.htg import HTG
        memory = HTG.from_prior()
        learn(memory, r["train"], r["keys"], r["limit"], r["budget"], r["gpus"], seed)
        r["trained"][seed] = memory
    return r["trained"][seed]


def _map_runs(work: list, inputs: tuple, jobs: int):
    """_one_run over `work`, in order; in `jobs` forked processes when jobs > 1."""
    if jobs <= 1:
        _prepare(*inputs)
        return map(_one_run, work)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    # NOTE: fork: workers inherit this module as loaded (a script's __main__, a test's spec);
    # spawn would import it again by a name bench/ does not provide
    pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker, initargs=inputs)

    def results():
        with pool:
            yield from pool.map(_one_run, work)
    return results()


def learn(memory, tasks: list, keys: dict, limit: dict, budget: int, gpus: dict, seed: int) -> None:
    """Experience into `memory`: every one of `tasks` searched once, in an order seeded by `seed`,
    each on the GPU its table was measured on (gpus: task name -> GpuInfo or None)."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    for o in order:
        search_log(o, keys[o.name], memory, "htg", budget, limit[o.name], gpus[o.name], seed)


def trained_memory(train: list[dict], budget: int, seed: int = 0):
    """htg_warm's memory as optimize would load it: the shipped prior plus the search of every
    train table (in seed's order), each on the GPU its table was measured on."""
    from torch_htam.htg import HTG
    tasks = [_task(t) for t in train]
    memory = HTG.from_prior()
    learn(memory, tasks, {task.name: table_keys(task, t) for task, t in zip(tasks, train)},
          {t["task"]: t["limit"] for t in train}, budget, {t["task"]: table_gpu(t) for t in train}, seed)
    return memory


def arm_log(arm: str, task, tasks: list, keys: dict, limit: dict, budget: int, gpus: dict, seed: int,
            trained=None) -> list[dict]:
    """The rows one arm's search of `task` evaluated, in order, on its table's GPU (gpus). trained:
    htg_warm's memory after the train tasks (searched on a copy, so one test task's search never
    teaches another's); None: htg_warm learns leave one out, from every other task of `tasks`."""
    from torch_htam.htg import HTG
    memory = HTG.from_prior()
    if arm == "htg_warm" and trained is not None:
        memory = copy.deepcopy(trained)
    elif arm == "htg_warm":
        learn(memory, [o for o in tasks if o is not task], keys, limit, budget, gpus, seed)
    return search_log(task, keys[task.name], memory, MODE[arm], budget, limit[task.name], gpus[task.name], seed)


def median_curve(curves: list[list[float | None]]) -> list[float | None]:
    """The pointwise median of a task's curves over seeds (a point without a kernel counts as 0)."""
    return [statistics.median(v if v is not None else 0.0 for v in col) or None for col in zip(*curves)]


def held_out_rows(runs: dict[str, dict[str, list]], budget: int, share: float = NEAR_ORACLE) -> list[dict]:
    """Per task: "best", the best point of any arm and seed, and per arm "to99", the candidates each
    seed's curve took to reach `share` of it (budget + 1: never; None: no arm verified a kernel).
    NOTE: the bar is what the arms found, not the table's oracle, so a task where every arm stops
    short of the oracle still separates the arms."""
    rows = []
    for task in next(iter(runs.values())):
        best = max((v for arm in runs.values() for c in arm[task] for v in c if v is not None), default=None)
        to99 = {a: [None if best is None else (to_oracle(c, best, share) or budget + 1) for c in arm[task]]
                for a, arm in runs.items()}
        rows.append({"task": task, "best": best, "to99": to99})
    return rows


def saving(rows: list[dict], arm: str, base: str, resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """How many fewer candidates `arm` needs than `base` to reach 99% of the best (held_out_rows),
    with a paired bootstrap 95% interval; tasks where no arm verified a kernel are left out."""
    pairs = [(r["to99"][arm], r["to99"][base]) for r in rows if r["best"] is not None]
    est, low, high = paired_bootstrap([a for a, _ in pairs], [b for _, b in pairs], resamples, seed)
    return {"arm": arm, "base": base, "saving": est, "ci_low": low, "ci_high": high,
            "tasks": len(pairs), "runs": sum(len(a) for a, _ in pairs), "resamples": resamples}


def relative_saving(arm_total: float, base_total: float) -> float:
    """1 - arm / base: the share of the base's candidates the arm does without (negative: it needs more)."""
    return 1.0 - arm_total / base_total


def paired_bootstrap(arm: list[list[float]], base: list[list[float]], resamples: int = BOOTSTRAP,
                     seed: int = 0, level: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """(estimate, low, high) of relative_saving(sum(arm), sum(base)), and the percentile interval at
    `level` over `resamples` resamples of the units (one unit per task: its values under both arms,
    every seed). Resampling tasks, not runs, keeps a task's seeds together: they share its space
    and are not independent evidence. Seeded: the same data gives the same interval."""
    import numpy as np
    if not arm:
        return None, None, None
    a = np.array([sum(x) for x in arm], dtype=float)
    b = np.array([sum(x) for x in base], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    stats = relative_saving(a[idx].sum(axis=1), b[idx].sum(axis=1))
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return float(relative_saving(a.sum(), b.sum())), float(low), float(high)


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


DRAIN_OVER = 1.05   # a drain this far past the events decided a timing (timing.Timing)


def space_facts(tables: list[dict]) -> dict:
    """What the tables say of their spaces, whatever order walks them (speedups by second timing;
    a task with no verified setting is left out): on how many tasks the defaults (each table's
    first row) reach 95% and 99% of the table's best; the median share of a task's verified
    settings within 1% of its best (many such: 99% is reached by luck); the median and 90th
    percentile of |second timing / first - 1| over every verified setting (the timing's noise); the
    share of those whose first timing the host's drain decided over the events by more than 5%
    (host noise or work off the stream; None where the rows predate the two series)."""
    def second(r):
        return r["ref_ms"] / r["retime_ms"] if r["correct"] and r["retime_ms"] else None
    near, noise, defaults, drained = [], [], [], []
    for t in tables:
        sp = [x for x in map(second, t["rows"]) if x]
        if not sp:
            continue
        best = max(sp)
        near.append(sum(x >= NEAR_ORACLE * best for x in sp) / len(sp))
        defaults.append((second(t["rows"][0]) or 0.0) / best)
        noise += [abs(r["kernel_ms"] / r["retime_ms"] - 1) for r in t["rows"] if second(r) and r["kernel_ms"]]
        drained += [r["kernel_drain_ms"] > DRAIN_OVER * r["kernel_event_ms"] for r in t["rows"]
                    if second(r) and r.get("kernel_event_ms")]
    noise.sort()
    return {"tasks": len(defaults), "defaults_95": sum(d >= TO_ORACLE for d in defaults),
            "defaults_99": sum(d >= NEAR_ORACLE for d in defaults),
            "median_share_within_1pct": statistics.median(near) if near else None,
            "retime_noise_median": statistics.median(noise) if noise else None,
            "retime_noise_p90": noise[int(0.9 * (len(noise) - 1))] if noise else None,
            "drain_decided": sum(drained) / len(drained) if drained else None}


def space_lines(f: dict) -> list[str]:
    return [f"defaults at 95% / 99% of the table's best: {f['defaults_95']} / {f['defaults_99']} of {f['tasks']} "
            f"tasks; median share of settings within 1% of the best: {_pct(f['median_share_within_1pct'])}; "
            f"second timing vs first: median {_pct(f['retime_noise_median'], 2)}, "
            f"90th percentile {_pct(f['retime_noise_p90'], 2)}"
            + (f"; first timing decided by the host's drain (over 5% past the events): "
               f"{_pct(f['drain_decided'])} of settings" if f.get("drain_decided") is not None else "")]


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}%}"


def held_out_lines(res: dict) -> list[str]:
    """Mean candidates to 99% of the best any arm found, and each memory arm's saving over none."""
    lines = ["| arm | mean candidates to 99% of the best found | saving vs none [95% CI] |", "|---|---|---|"]
    for arm in res["arms"]:
        ks = [k for r in res["rows"] for k in r["to99"][arm] if k is not None]
        s = res.get("savings", {}).get(arm)
        ci = (f"{s['saving']:+.1%} [{s['ci_low']:+.1%}, {s['ci_high']:+.1%}]"
              if s and s["saving"] is not None else "-")
        lines.append(f"| {arm} | {statistics.mean(ks):.2f} | {ci} |" if ks else f"| {arm} | - | {ci} |")
    dev = res.get("devices", {})
    if dev.get("train"):
        lines.append(f"memory learned on {', '.join(dev['train'])}; tested on {', '.join(dev['test']) or '?'}")
    return lines


def _n(v) -> str:
    return ">budget" if v is None else f"{v:g}"


def load_tables(files: list[str]) -> tuple[list[dict], list[dict]]:
    """The tables in `files` (a JSON list of tables, or a results file with "tables"), and where the
    results files' tables were measured. A task's table in a later file replaces its table in an
    earlier one, in the earlier one's place: a space re-measured (a new knob's settings) is named
    after the tables it updates, and the replay sees each task once."""
    by_task, sources = {}, []
    for f in files:
        d = json.loads(Path(f).read_text())
        for t in d["tables"] if isinstance(d, dict) else d:
            by_task[t["task"]] = t
        if isinstance(d, dict):
            sources.append({k: d.get(k) for k in ("date", "commit", "device", "command")} | {"file": f})
    return list(by_task.values()), sources


def resumed(out: str | None) -> list[dict]:
    """The tables an earlier run wrote to --out (none where it wrote nothing yet)."""
    if not out:
        raise SystemExit("bench/anytime.py: --resume continues the tables in --out FILE; give --out")
    return load_tables([out])[0] if Path(out).exists() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=[str(HERE / "tasks")])
    ap.add_argument("--limit", type=int, default=24, help="settings of each task's search space")
    ap.add_argument("--limit-kind", action="append", default=[], metavar="KIND=N",
                    help="the limit for one task kind (repeatable), e.g. gemm=48")
    ap.add_argument("--budget", type=int, default=24, help="candidates per search")
    ap.add_argument("--seeds", type=int, default=5, help="runs per arm and task (seeds 0..N-1)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for the replay")
    ap.add_argument("--passes", type=int, default=2,
                    help="times each table's space is evaluated, the last kept (the first builds it)")
    ap.add_argument("--table-only", action="store_true", help="measure and write the tables only")
    ap.add_argument("--out", help="also write the tables (JSON list) here, after every task")
    ap.add_argument("--resume", action="store_true",
                    help="with --out: keep the tables already in it and measure only the other tasks "
                         "(a run cut by a time limit goes on where it stopped)")
    ap.add_argument("--replay", nargs="*", help="tables written by --out or a results file: no GPU")
    ap.add_argument("--train", nargs="+", metavar="TABLES",
                    help="tables (as --replay reads) htg_warm learns from; the others are the test set")
    ap.add_argument("--save-memory", metavar="FILE",
                    help="with --train only: write htg_warm's memory (seed 0) as an HTG memory file, "
                         "for bench/optimize_time.py --memory FILE; no replay")
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    args = ap.parse_args(argv)
    try:
        kind_limits = {k: int(n) for k, n in (x.split("=") for x in args.limit_kind)}
    except ValueError:
        ap.error(f"--limit-kind takes KIND=N (e.g. gemm=48), not {args.limit_kind}")
    train, train_sources = load_tables(args.train or [])
    if args.train and not train:    # an empty train set would fall back to leave one out unnoticed
        ap.error("--train: no tables in " + " ".join(args.train))
    if args.save_memory:
        if not train:
            ap.error("--save-memory learns from --train TABLES")
        print(f"wrote {trained_memory(train, args.budget).save(args.save_memory)}")
        return 0
    if args.replay:
        tables, sources = load_tables(args.replay)
        gpu = None     # each table's own (table_gpu)
    else:
        import torch
        from torch_htam.evaluation import Evaluator
        if not torch.cuda.is_available():
            print("bench/anytime.py measures on a CUDA GPU; --replay TABLES runs the arms without one",
                  file=sys.stderr)
            return 2
        tables, sources, written = resumed(args.out) if args.resume else [], [], None
        done = {t["task"] for t in tables}
        with Evaluator(retime=True) as ev:
            gpu = ev.gpu
            for path in task_files(args.paths):
                if path.stem in done:
                    continue
                t = measure(path, ev, args.limit, args.passes, kind_limits)
                t["gpu"] = gpu.to_json() if gpu else None
                tables.append(t)
                ok = sum(r["correct"] for r in t["rows"])
                print(f"{t['task']}: {ok}/{len(t['rows'])} verified, oracle "
                      f"{kept(t['rows']) or 0:.2f}x, {t['seconds']} s", flush=True)
                # after every task: a run cut by a time limit keeps what it measured
                if args.out:
                    tmp = Path(args.out + ".tmp")   # replaced whole: a run killed mid-write keeps the last
                    tmp.write_text(json.dumps(tables))
                    tmp.replace(args.out)
                if args.table_only and not args.no_record:
                    written = record.write("anytime_table", {"limit": args.limit, "tables": tables},
                                           path=written)
        if args.table_only:
            return 0
    res = replay(tables, args.budget, args.seeds, gpu, progress=lambda m: print(m, file=sys.stderr),
                 jobs=args.jobs, train=train)
    res["space"] = space_facts(tables)
    print("\n".join(table_lines(res) + [""] + held_out_lines(res) + [""] + space_lines(res["space"])))
    if not args.no_record:
        record.write("anytime", {"limit": tables[0]["limit"] if tables else args.limit, "budget": args.budget,
                                 "to_oracle": TO_ORACLE, "measured": sources, "train_measured": train_sources,
                                 **res,
                                 "tables": tables})
    return 0


if __name__ == "__main__":
    sys.exit(main())
