"""Serving a request mix with changing shapes: optimize() against torch.compile, dynamic and
default, on the sizes real traffic brings.

    python3 bench/bench_serve.py --list
    python3 bench/bench_serve.py decoder:bf16 --budget 120 --timeout 570   # one row, one 10-minute call
    python3 bench/bench_serve.py --dtype bf16 --requests 200 --seed 0
    python3 bench/bench_serve.py resnet50:bf16 --no-cold-isolated    # without step 6

Rows are the models of bench/serve_models.py ("decoder", "encoder", "vision", "resnet50", each ":bf16" and
":fp32"; fp32 rows run with TF32 allowed for matmuls and cuDNN, "tf32": true in the row). Each
declares one dynamic dim (the decoder's sequence length, the others' batch) as OptimizeConfig.dynamic
does. Each row runs in a process of its own (this script with --one NAME), under a time limit
(--timeout, default 1.1 x budget + 30 s + 420 s + 180 s for step 6; default_timeout). In that
process, in this order:

  1. build the model (seeded, eval mode, on cuda) and the request mix: --requests sizes of the
     dynamic dim, random.Random(--seed): EXAMPLE_SHARE of them (exactly, at random places) the
     example's size, the rest log-uniform over the declared (low, high), rounded to ints (a batch
     of 1 may occur). The row's "mix" says so in words, "mix_sizes" lists them;
  2. the arms, all from copy.deepcopy()s of the model made BEFORE optimize: "eager" (the model
     itself, reported, not a baseline), "compile_dynamic" (torch.compile(copy, dynamic=True)),
     "compile_default" (torch.compile(copy): specialized on the first shape; Dynamo's automatic
     dynamic shapes recompile after a new size) and "ours" (torch_htam.optimize(copy, example,
     OptimizeConfig(dynamic=..., time_budget_s=--budget)), its wall time "optimize_s"); then,
     for step 6, ours saved as a deployment would load it: a bundle (save_ours; "bundle_s", and
     "cold_isolated_ours" says whether step 6 loads it or runs optimize again, and why);
  3. warm-up: every arm called once on the example inputs, then at the declared range's lowest and
     highest sizes (what a server does at start-up, so compiles for them happen there, not on a
     user's request; "warmup_sizes"; the seconds per arm are "warmup_s", its graphs "warmup_graphs");
  4. the mix served once "cold" (whatever recompiles the mix triggers happen here), then WARM_PASSES
     times "warm" (the same mix again: steady state; its figures over all those passes, so p99 is
     not one request's latency). Request r runs every arm on the same inputs, in the order
     rotated by r (a size's first request: by its rank among the new sizes, so the arms that
     share per-shape caches pay their first calls in equal shares; serve_pass); each call is
     timed alone (torch.cuda.synchronize before and after, perf_counter);
     Python's cyclic GC is off during a pass and runs between passes (collected_between); each
     pass starts once other processes leave the host's cores (bench_floor.quiet_host;
     "host_cores_before": what they still used, per pass);
  5. outputs of both compile arms and ours against eager's at a few of the mix's sizes;
  6. the isolated cold pass (on by default; --no-cold-isolated skips it and step 2's bundle): each
     checked arm (both compile arms and ours; eager is not needed cold) in a process of its own,
     as a deployment runs one arm per process, one after the other and after steps 3-5, so no
     GPU work overlaps (this process waits, holding its memory: a few GB at most for these models).
     Each child (this script with --cold-arm ARM --one NAME; measure_cold) builds the model and
     the mix as step 1 does (same seed, sizes and inputs), builds that arm alone (a compile arm
     as step 2 does; ours: torch_htam.load of the bundle into the model it built, else optimize
     again), warms it up as step 3 does, serves the mix once as step 4 does and writes its calls.
     Each child runs under COLD_ARM_TIMEOUT_S and within what is left of the row's limit; one that
     fails, is cut off or is skipped for want of time is named in "cold_isolated_error" and never
     ends the row (its warm figures stay).
Steps 2-5 (and a child's arm, warm-up and pass) run under torch.inference_mode().

The cold figures, two of them (the warm ones are step 4's, unprefixed):
  "cold_..."           step 4's cold pass: the four arms interleaved in one process, which share its
                       per-shape caches. cuDNN plans a new batch size of ResNet-50's convs in 60-100
                       ms, paid by the first arm that runs that size with those conv parameters: the
                       compile arms run the same convs and split the cost, ours with a conv kernel
                       swapped in shares none and pays every new size. Where the arms' convs differ,
                       this ratio compares the sharing, not the arms (0.38-0.40 on ResNet-50,
                       bench_serve-20261126-212722.json, -214003.json).
  "cold_isolated_..."  step 6's: each arm's first serving of the mix in a process of its own, so the
                       process's own caches (cuDNN's plans, cuBLAS's workspaces, Dynamo's compiled
                       code, loaded CUDA modules) start empty for every arm alike. Inductor's caches on
                       disk (FX graph, AOTAutograd, Triton; $TORCHINDUCTOR_CACHE_DIR) are the host's,
                       as a server restarted on the same host finds them: the row's process filled
                       them for every arm's graphs, so a child's compiles read code where the row
                       compiled the same graph; ours also starts from the Inductor code its bundle
                       ships. Per arm: "arms"[arm]["cold_isolated"] (arm_stats), the ratios
                       "cold_isolated_throughput_vs_compile" and "cold_isolated_p99_vs_compile"
                       (vs_compile, as for the other passes; None unless all three children served
                       the mix), "cold_isolated_recompiles", "cold_isolated_kernel_share",
                       "cold_isolated_runs" (per child: wall and limit seconds, its warm-up, how ours
                       was built, the kernels ours kept), "cold_isolated_s" (the children's wall
                       seconds, all together) and "cold_isolated_error" ({arm: why} or None).


Recompiles: Dynamo graphs compiled during a call, torch._dynamo.utils.counters["stats"]
["unique_graphs"] read before and after it (the counter Dynamo bumps once per graph it compiles,
graph breaks and recompiles included; it is process-global, so the delta goes to the arm whose call
it was: the arms run one at a time). "recompiles" is the cold pass's count per arm (the warm pass's
is "warm_recompiles", expected 0). NOTE: Dynamo keeps compiled code per code object, so every arm's
graphs sit on the model class's one forward (each entry guarded by its backend): the recompile
limit is raised to RECOMPILE_LIMIT in the row's process, or arms would crowd each other out of the
default 8 and fall back to eager unnoticed. Dynamo's automatic-dynamic state is per code object too:
a size change one arm's compile saw makes the next compile of any arm on that forward dynamic (each
arm still recompiles on its own guard failure, counted as its own); the state a previous process
left in torch's cache folder (local PGO) is not read.

Kernel share (ours): the fraction of ours' requests during which torch_htam.fallback.counts().kernel
(calls that ran one of our kernels) grew; "outside_share" likewise for .outside (calls outside a
kernel's verified size buckets, which ran the original region). Null where torch_htam.fallback has
no counts(). "kernels_kept": ours' tasks whose status is "swapped" in model.htam_report (after
inductor.sync_report, which marks the tasks Dynamo's compiles swapped in). "routes": the mix's
requests by the graph ours' splits send them to (torch_htam.serving.route: the example's own
graph, the kernels' graph, outside the kernels' buckets, or the chosen arm where no split
decides), what the kernel share comes from.

Figures per arm and pass ("arms"): requests/s = n / sum of latencies, items/s = sum of sizes / sum
of latencies (items: serve_models.UNITS), p50 / p99 latency (ms, linear interpolation), and
"slowest": the pass's SLOWEST requests as [size, ms], where its tail comes from.
"graph_launches": what ours' kernels' launches did over the passes (plain, as graphs, captures);
"kernel_host": where their host time went (launcher.host_times: launches and launch_ns in the
launcher, runs and run_ns in the kernels' own htam_run), over the passes of every arm running them.
With --graph-launches-ab, a fifth arm "ours_graphs" serves each request with ours' model and its
graph launches switched on around the call (launcher.set_graph_launches: they are off by default;
interleaved with the others like any arm), and "graph_launches_ab" gives it against ours in the
warm pass: "throughput" (ours_graphs' requests/s / ours') and "p99" (ours' p99 / ours_graphs'),
higher is better for the graph launches. The row's
verdict figures, both "higher is better for ours", 0.98 meaning as good within noise:
throughput_vs_compile = ours' requests/s / the better compile arm's; p99_vs_compile = the lower of
the compile arms' p99 / ours' p99 (warm pass; "cold_..." the cold pass's). The results file,
bench/results/bench_serve-<date>.json (bench/record.py: suite "bench_serve", requests, seed,
budget_s, summary, rows), is rewritten after every row; a failing row records "error" and the run
goes on.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import bench_floor  # noqa: E402  (the child-process machinery: _end_group, _write_json, last_line)
import record  # noqa: E402
import serve_models  # noqa: E402

SUITE = "bench_serve"
ARMS = ("eager", "compile_dynamic", "compile_default", "ours", "ours_graphs")   # ours_graphs: --graph-launches-ab
COMPILE_ARMS = ("compile_dynamic", "compile_default")
CHECKED = (*COMPILE_ARMS, "ours")          # the arms whose outputs are checked against eager's
FLOOR = 0.98
EXAMPLE_SHARE = 0.2                        # of requests at the example's size: real traffic has a mode
RECOMPILE_LIMIT = 64                       # torch._dynamo.config.recompile_limit in a row's process
WARM_PASSES = 3                            # the warm pass, served this many times (p99 over all)
# max |out - eager| / max |eager| allowed, by the row's dtype (fp32 runs with TF32 on)
TOLERANCE = {"bf16": 5e-2, "fp32": 1e-2}
# The isolated cold pass: one child process per checked arm (module docstring, step 6).
# COLD_ARM_S, a child's expected wall time, is an estimate, not a measurement: process start and
# imports (~10 s), the model's build (seconds), the warm-up's compiles reading Inductor's on-disk
# code for graphs the row's process compiled (Dynamo and AOTAutograd trace again, Inductor
# generates nothing: ~20-40 s for ResNet-50; the in-process warm-up, which generated code, took
# 26-40 s for compile_default and 59-92 s for compile_dynamic, bench_serve-20261126-*.json), ours'
# bundle load (capture and golden check: seconds), and one pass of the mix (1-4 s an arm).
COLD_ARM_S = 60.0
COLD_ARM_TIMEOUT_S = 180.0                 # a child's own limit: 3 x the estimate
ROW_MARGIN_S = 30.0                        # a child ends this long before the row's limit
MIX_RULE = (f"log-uniform over the declared (low, high), rounded to ints; {EXAMPLE_SHARE:.0%} of requests "
            "(exactly, at random places) forced to the example's size; random.Random(seed)")


def budget_limit(budget_s: float) -> float:
    return bench_floor.budget_limit(budget_s)


def default_timeout(budget_s: float, cold_isolated: bool = True) -> float:
    """A row's process limit: optimize's limit plus 420 s for building, the arms' compiles and
    recompiles, and two passes of the mix over four arms; plus, with the isolated cold pass, its
    children's estimate (COLD_ARM_S per checked arm)."""
    return budget_limit(budget_s) + 420.0 + (len(CHECKED) * COLD_ARM_S if cold_isolated else 0.0)


# ---- the request mix -------------------------------------------------------------------------------

@dataclass
class Mix:
    """The sizes of the dynamic dim, one per request, and how they were drawn."""
    sizes: list[int]
    low: int
    high: int
    example: int
    seed: int

    def describe(self) -> str:
        return (f"log-uniform over [{self.low}, {self.high}] rounded to ints, {EXAMPLE_SHARE:.0%} of "
                f"{len(self.sizes)} requests forced to the example size {self.example}; "
                f"random.Random({self.seed})")

    def summary(self) -> dict:
        s = self.sizes
        return {"distinct": len(set(s)), "min": min(s), "max": max(s), "median": statistics.median(s),
                "at_example": sum(x == self.example for x in s), "ones": s.count(1)}


def request_mix(low: int, high: int, example: int, n: int, seed: int = 0) -> Mix:
    """n sizes in [low, high]: round(n * EXAMPLE_SHARE) of them, at places the seed picks, the
    example's size; the rest exp(uniform(log low, log high)) rounded (clamped into the range)."""
    rng = random.Random(seed)
    forced = set(rng.sample(range(n), round(n * EXAMPLE_SHARE)))
    sizes = []
    for r in range(n):
        x = example if r in forced else round(math.exp(rng.uniform(math.log(low), math.log(high))))
        sizes.append(min(high, max(low, x)))
    return Mix(sizes, low, high, example, seed)


# ---- serving a pass: arms interleaved per request --------------------------------------------------

@dataclass
class Calls:
    """One arm's requests of one pass: each request's size, its synced latency (ms), and how much
    each probe's counter grew during it."""
    sizes: list[int] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    deltas: dict[str, list[int]] = field(default_factory=dict)

    def add(self, size: int, ms: float, deltas: dict[str, int]) -> None:
        self.sizes.append(size)
        self.ms.append(ms)
        for k, v in deltas.items():
            self.deltas.setdefault(k, []).append(v)


def timed_call(fn: Callable, inputs: tuple, sync: Callable, probe: Callable[[], dict] | None = None,
               clock=time.perf_counter) -> tuple[float, dict[str, int]]:
    """(ms of fn(*inputs) with the device idle before it and synchronized after, the growth of each
    of probe()'s counters over the call). The probe is read outside the timed span."""
    before = probe() if probe else {}
    sync()
    t0 = clock()
    fn(*inputs)
    sync()
    ms = (clock() - t0) * 1e3
    after = probe() if probe else {}
    return ms, {k: after.get(k, 0) - v for k, v in before.items()}


def serve_pass(arms: dict[str, Callable], sizes: list[int], inputs_for: Callable[[int], tuple],
               sync: Callable, probes: dict[str, Callable] | None = None, clock=time.perf_counter) -> dict[str, Calls]:
    """Every request of `sizes` served by every arm, on the same inputs (inputs_for(size), built
    outside timing); request r runs the arms in their order rotated by r, so no arm always runs
    first or right after the same one; a size's first request is rotated by the number of sizes
    new before it instead, so each arm runs first on an equal share of the new sizes.

    NOTE: the arms share one process, and with it the per-shape caches under them: cuDNN's plans
    for aten's convs cost 60-100 ms on the first call of a new batch size of ResNet-50 (bf16,
    H100, profiled diagnostics), paid by the first arm that runs that size with those conv
    parameters. Rotated by r alone, which arm went first on a new size was left to where the
    mix's new sizes fell. Arms whose convs differ share nothing: ours with a conv kernel swapped
    in paid the plans on every new size whichever arm went first, so there the cold pass
    compares the sharing, not the arms (README, Known limits)."""
    names, probes = list(arms), probes or {}
    calls = {n: Calls() for n in names}
    first: dict[int, int] = {}          # {size: rotation of its first request}
    for r, size in enumerate(sizes):
        inputs = inputs_for(size)
        turn = r if size in first else first.setdefault(size, len(first))
        for j in range(len(names)):
            n = names[(turn + j) % len(names)]
            calls[n].add(size, *timed_call(arms[n], inputs, sync, probes.get(n), clock))
    return calls


# ---- figures -------------------------------------------------------------------------------------

def percentile(xs: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of xs, linear between the two nearest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _share(deltas: list[int] | None) -> float | None:
    """The fraction of requests during which a counter grew; None where it was not probed."""
    return sum(d > 0 for d in deltas) / len(deltas) if deltas else None


SLOWEST = 8   # the slowest requests a pass lists, to show which sizes its p99 comes from


def arm_stats(calls: Calls) -> dict:
    """One arm's figures for one pass: throughput (requests/s, items/s), latency (ms: p50, p99,
    mean, max), the SLOWEST requests as [size, ms] (slowest first), graphs compiled, and where
    our kernels were probed, their shares."""
    total_s = sum(calls.ms) / 1e3
    d = calls.deltas
    return {
        "requests": len(calls.ms), "items": sum(calls.sizes), "total_s": total_s,
        "requests_per_s": len(calls.ms) / total_s if total_s > 0 else None,
        "items_per_s": sum(calls.sizes) / total_s if total_s > 0 else None,
        "p50_ms": percentile(calls.ms, 0.5), "p99_ms": percentile(calls.ms, 0.99),
        "mean_ms": statistics.fmean(calls.ms) if calls.ms else None, "max_ms": max(calls.ms, default=None),
        "slowest": sorted(([z, ms] for z, ms in zip(calls.sizes, calls.ms)), key=lambda p: -p[1])[:SLOWEST],
        "graphs": sum(d["graphs"]) if "graphs" in d else None,
        "kernel_share": _share(d.get("kernel")), "outside_share": _share(d.get("outside")),
        "kernel_failed": sum(d["failed"]) if "failed" in d else None}


def vs_compile(stats: dict[str, dict]) -> dict:
    """ours against the better torch.compile arm of one pass, both "higher is better for ours":
    throughput = ours' requests/s / the higher compile requests/s; p99 = the lower compile p99 /
    ours' p99. None where a figure is missing."""
    thr = {a: stats[a]["requests_per_s"] for a in COMPILE_ARMS if stats.get(a, {}).get("requests_per_s")}
    p99 = {a: stats[a]["p99_ms"] for a in COMPILE_ARMS if stats.get(a, {}).get("p99_ms")}
    ours = stats.get("ours", {})
    best_thr = max(thr, key=thr.get) if thr else None
    best_p99 = min(p99, key=p99.get) if p99 else None
    return {"throughput_vs_compile": ours["requests_per_s"] / thr[best_thr]
            if best_thr and ours.get("requests_per_s") else None,
            "p99_vs_compile": p99[best_p99] / ours["p99_ms"] if best_p99 and ours.get("p99_ms") else None,
            "best_compile_throughput": best_thr, "best_compile_p99": best_p99}


# Each pass's prefix on the row's ratio and share fields, and its field of graphs compiled per arm.
PASSES = {"warm": ("", "warm_recompiles"), "cold": ("cold_", "recompiles"),
          "cold_isolated": ("cold_isolated_", "cold_isolated_recompiles")}


def pass_fields(passes: dict[str, dict[str, Calls]]) -> dict:
    """A row's figures from its passes ({"cold": {arm: Calls}, "warm": ..., "cold_isolated": ...}):
    per arm and pass, the ratios of each pass (the warm pass's unprefixed; None where a checked
    arm is missing from the pass, as a failed isolated child leaves it: the better compile arm
    cannot be told from one), graphs compiled per arm, ours' kernel shares."""
    stats = {p: {a: arm_stats(c) for a, c in arms.items()} for p, arms in passes.items()}
    out: dict[str, Any] = {"arms": {a: {p: stats[p][a] for p in stats if a in stats[p]}
                                    for a in ARMS if any(a in stats[p] for p in stats)}}
    for p, (prefix, graphs_key) in PASSES.items():
        if p not in stats:
            continue
        ratios = vs_compile(stats[p] if all(a in stats[p] for a in CHECKED) else {})   # {}: all None
        out.update({prefix + k: v for k, v in ratios.items()})
        out[prefix + "kernel_share"] = stats[p].get("ours", {}).get("kernel_share")
        out[graphs_key] = {a: s["graphs"] for a, s in stats[p].items()}
    out["outside_share"] = stats.get("warm", {}).get("ours", {}).get("outside_share")
    warm = stats.get("warm", {})
    if "ours_graphs" in warm and "ours" in warm:
        ours, graphs = warm["ours"], warm["ours_graphs"]
        out["graph_launches_ab"] = {
            "throughput": graphs["requests_per_s"] / ours["requests_per_s"]
            if ours.get("requests_per_s") and graphs.get("requests_per_s") else None,
            "p99": ours["p99_ms"] / graphs["p99_ms"] if ours.get("p99_ms") and graphs.get("p99_ms") else None}
    return out


def verdicts(row: dict) -> dict:
    """floor_ok: both warm ratios >= FLOOR (None where either is unmeasured); within_budget:
    optimize_s <= 1.1 x budget + 30 s (False too when cut off in optimize past that)."""
    thr, p99 = row.get("throughput_vs_compile"), row.get("p99_vs_compile")
    floor_ok = None if thr is None or p99 is None else (thr >= FLOOR and p99 >= FLOOR)
    limit = budget_limit(row["budget_s"])
    if row.get("optimize_s") is not None:
        within = row["optimize_s"] <= limit
    elif (row.get("optimize_s_at_least") or 0) > limit:
        within = False
    else:
        within = None
    return {"floor_ok": floor_ok, "within_budget": within}


# ---- a row: its fields -----------------------------------------------------------------------------

def empty_row(model: str, budget_s: float = 120.0, requests: int = 200, seed: int = 0) -> dict:
    """Every field of a row, unmeasured (None): a failed row keeps the same schema."""
    return {"model": model, "dtype": model.split(":")[-1], "tf32": None, "unit": None, "dynamic": None,
            "example_size": None, "requests": requests, "seed": seed, "mix": None, "mix_sizes": None,
            "mix_summary": None, "budget_s": budget_s, "budget_limit_s": budget_limit(budget_s),
            "optimize_s": None, "warmup_s": None, "warmup_graphs": None, "warmup_sizes": None, "arms": None,
            "throughput_vs_compile": None, "p99_vs_compile": None, "cold_throughput_vs_compile": None,
            "cold_p99_vs_compile": None, "best_compile_throughput": None, "best_compile_p99": None,
            "kernel_share": None, "cold_kernel_share": None, "outside_share": None, "kernels_kept": None,
            "routes": None,
            "tasks": None, "task_status": None, "regions": None, "phases": None, "decision": None,
            "swapped": None, "report_note": None, "outcome": None, "recompiles": None, "warm_recompiles": None,
            "max_err": None, "correct": None,
            "tolerance": None, "check_sizes": None, "floor_ok": None, "within_budget": None,
            # the isolated cold pass (step 6), None where it did not run
            "bundle_s": None, "cold_isolated_ours": None, "cold_isolated_throughput_vs_compile": None,
            "cold_isolated_p99_vs_compile": None, "cold_isolated_best_compile_throughput": None,
            "cold_isolated_best_compile_p99": None, "cold_isolated_kernel_share": None,
            "cold_isolated_recompiles": None, "cold_isolated_runs": None, "cold_isolated_s": None,
            "cold_isolated_error": None}


def build_row(model: str, passes: dict, optimize_s: float | None, budget_s: float, **extra) -> dict:
    """A measured row from its passes (pass_fields), optimize's wall time and any other fields."""
    row = empty_row(model, budget_s)
    row.update(pass_fields(passes))
    row["optimize_s"] = optimize_s
    row.update(extra)
    row.update(verdicts(row))
    return row


def report_fields(model) -> dict:
    """What optimize says it did (model.htam_report): tasks by status, the kept (swapped) ones,
    regions swapped, its note and outcome. inductor.sync_report first: a task in the compiled
    call is marked swapped only once Dynamo's compiles have swapped it in."""
    report = getattr(model, "htam_report", None)
    if report is None:
        return {}
    with contextlib.suppress(Exception):        # an older or replay model has no backend to sync
        from torch_htam import inductor
        inductor.sync_report(model)
    tasks = list(getattr(report, "tasks", None) or [])
    status = Counter(str(getattr(t.status, "value", t.status)) for t in tasks)
    outcome = getattr(report, "outcome", None)
    return {"kernels_kept": status.get("swapped", 0), "tasks": len(tasks), "task_status": dict(status),
            # per task: where a row keeps no kernel, "detail" says whether the search found none,
            # the budget ran out or the end-to-end decision left them out
            "regions": [region(t) for t in tasks],
            "phases": dict(getattr(report, "phases", None) or {}),
            "search_plan": bench_floor.jsonable(getattr(report, "search_plan", None)),
            "skipped": list(getattr(report, "skipped", None) or []),
            "decision": _decision_json(getattr(report, "decision", None)),
            "swapped": getattr(report, "swapped", None), "report_note": getattr(report, "note", None),
            "outcome": getattr(outcome, "value", outcome),
            "kernel_failures": dict(getattr(report, "kernel_failures", None) or {})}


def routes(model, s: Setup) -> dict[str, int] | None:
    """The mix's requests by where ours' splits send them (serving.route), or None where this
    torch_htam has no route()."""
    try:
        from torch_htam.serving import route
    except ImportError:
        return None
    call = getattr(model, "_compiled_call_impl", None)
    return dict(Counter(route(call, s.inputs_for(size)).value for size in s.mix.sizes))


def with_graph_launches(ours: Callable) -> Callable:
    """ours, called with its kernels' graph launches switched on (the A/B arm "ours_graphs")."""
    from torch_htam.launcher import set_graph_launches

    def call(*args):
        before = set_graph_launches(True)
        try:
            return ours(*args)
        finally:
            if before is not None:
                set_graph_launches(before)
    return call


def launcher_counts(what: str, since: dict | None = None) -> dict | None:
    """launcher.<what>() (csrc/launcher.cpp, per kernel: counts and host ns; "graph_launches": the
    GraphStats of graph launches, "host_times": where each launch's host time goes) summed over
    our loaded kernels, less `since`; None where this torch_htam's launcher keeps none."""
    from torch_htam import launcher
    per_kernel = getattr(launcher, what, None)
    if per_kernel is None:
        return None
    per = per_kernel()
    total = Counter()
    for stats in per.values():
        total.update(stats)
    if since:
        total.subtract({k: v for k, v in since.items() if k not in ("graphs", "kernels")})   # gauges
    return {"kernels": len(per), **dict(total)}


def region(t) -> dict:
    """One task of a report (report.TaskReport) as a row's record: what it is, what became of it
    and why, its kernel's speedup over the region in eager and under Inductor, and the region's
    eager ms per call (count: how many times the model runs it) and, for a ranged kernel, the
    buckets it runs in and its per-bucket timings (report.TaskReport.bucket_times), and the
    kernel's settings (which path and tile: "params")."""
    return {"task": t.name, "signature": t.signature[:12], "kind": t.kind, "count": t.count,
            "status": str(t.status), "detail": t.detail, "speedup": t.speedup,
            "vs_inductor": t.vs_inductor, "ref_ms": t.ref_ms,
            "buckets": getattr(t, "buckets", None), "bucket_times": getattr(t, "bucket_times", None),
            "params": getattr(t, "params", None)}


def _decision_json(decision) -> dict | None:
    """decide.Decision.to_json(); None without a decision (a replay, an older report)."""
    to_json = getattr(decision, "to_json", None)
    return to_json() if callable(to_json) else None


# ---- probes: Dynamo's graph count, our kernels' call counts ----------------------------------------

def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (recompiles and graph breaks each count)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def kernel_counts() -> dict[str, int] | None:
    """torch_htam.fallback.counts() as {field: int} (kernel, outside, failed), or None where this
    torch_htam has no counts() yet."""
    try:
        from torch_htam import fallback
    except ImportError:
        return None
    counts = getattr(fallback, "counts", None)
    if counts is None:
        return None
    c = counts()
    items = ({f.name: getattr(c, f.name) for f in dataclasses.fields(c)} if dataclasses.is_dataclass(c)
             else dict(c) if isinstance(c, dict) else vars(c))
    return {k: int(v) for k, v in items.items() if isinstance(v, int)}


def probes_for(arms) -> dict[str, Callable[[], dict]]:
    """Per arm, what to read around each of its calls: the graph count for every arm; ours also
    our kernels' counts, where torch_htam has them."""
    with_kernels = kernel_counts() is not None
    out = {a: (lambda: {"graphs": graphs_compiled()}) for a in arms}
    if with_kernels and "ours" in arms:
        out["ours"] = lambda: {"graphs": graphs_compiled(), **(kernel_counts() or {})}
    return out


# ---- the output check ----------------------------------------------------------------------------

def error(out, ref) -> tuple[float | None, float | None]:
    """(max |out - ref|, that / max |ref|) over every float tensor of the outputs; (None, None)
    where they differ in structure or shape or are not finite."""
    import torch
    from torch.utils._pytree import tree_leaves
    a, b = tree_leaves(out), tree_leaves(ref)
    if len(a) != len(b):
        return None, None
    worst, scale = 0.0, 0.0
    for x, y in zip(a, b):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not y.is_floating_point():
            continue
        if x.shape != y.shape:
            return None, None
        d = (x.detach().float() - y.detach().float()).abs()
        if d.numel() and not bool(torch.isfinite(d).all()):
            return None, None
        worst = max(worst, float(d.max()) if d.numel() else 0.0)
        scale = max(scale, float(y.detach().float().abs().max()) if y.numel() else 0.0)
    return worst, (worst / scale if scale > 0 else worst)


def check_sizes(mix: Mix) -> list[int]:
    """A few of the mix's sizes to check outputs at: its smallest, median, example and largest."""
    s = sorted(mix.sizes)
    return sorted({s[0], s[len(s) // 2], mix.example, s[-1]})


def check_outputs(arms: dict, sizes: list[int], inputs_for: Callable, tol: float) -> dict:
    """Each checked arm's output against eager's at `sizes`: the worst max abs error ("max_err")
    and relative one ("max_rel_err": over eager's max abs), and correct (relative within tol)."""
    abs_err = {a: 0.0 for a in CHECKED if a in arms}
    rel_err = dict(abs_err)
    for size in sizes:
        inputs = inputs_for(size)
        ref = _clone(arms["eager"](*inputs))
        for a in abs_err:
            e, r = error(_clone(arms[a](*inputs)), ref)
            abs_err[a] = None if e is None or abs_err[a] is None else max(abs_err[a], e)
            rel_err[a] = None if r is None or rel_err[a] is None else max(rel_err[a], r)
    return {"max_err": abs_err, "max_rel_err": rel_err, "tolerance": tol, "check_sizes": sizes,
            "correct": {a: r is not None and r <= tol for a, r in rel_err.items()}}


def _clone(out):
    """A copy of an output (a cudagraph arm overwrites its own on the next call)."""
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


# ---- one row, in this process (the --one child) ----------------------------------------------------

@dataclass
class Setup:
    """A row's arms and what they serve: the mix, the example inputs, the declared dynamic dim,
    and inputs per size (built once per size, kept on the device: every arm gets the same)."""
    arms: dict[str, Callable]
    example: tuple
    dynamic: dict
    make_inputs: Callable[[int], tuple]
    mix: Mix
    cache: dict = field(default_factory=dict)

    def inputs_for(self, size: int) -> tuple:
        """Inputs at `size`, made outside inference mode as the example was: an inference tensor
        lacks the ADInplaceOrView dispatch key, and Dynamo's guard on that would recompile every
        arm on its first request."""
        import torch
        if size not in self.cache:
            with torch.inference_mode(False):
                self.cache[size] = self.make_inputs(size)
        return self.cache[size]


def _torch_compile(model, dynamic: bool | None):
    import torch
    return torch.compile(model, dynamic=dynamic)


def _optimize(model, inputs: tuple, dynamic: dict, budget_s: float):
    import torch_htam
    return torch_htam.optimize(model, inputs, torch_htam.OptimizeConfig(dynamic=dynamic, time_budget_s=budget_s))


def _precision(dtype: str):
    """fp32 rows: TF32 on for matmuls and cuDNN (both of torch's APIs; torch's settings back
    after); bf16 rows: torch's settings as they are."""
    if dtype != "fp32":
        return contextlib.nullcontext()
    from torch_htam.policy import tf32_switches
    return tf32_switches(True)


def _dynamo_limits():
    """The recompile limit raised (see the module's docstring), and Dynamo's local profile-guided
    automatic dynamic off (sizes a previous run saw, read back from torch's cache folder, would
    make compile_default start out dynamic and hide its recompiles); torch's settings back after."""
    import torch._dynamo
    return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, automatic_dynamic_local_pgo=False)


def _load_bundle(model, bundle_dir: Path, inputs: tuple):
    import torch_htam
    return torch_htam.load(model, bundle_dir, inputs)


# torch.compile's dynamic= for each compile arm
DYNAMIC_ARG = {"compile_dynamic": True, "compile_default": None}


def build(name: str, opts, device: str) -> tuple[Any, Setup]:
    """Row `name`'s model and its Setup with no arm yet: the example, the declared dim, inputs per
    size and the request mix. Seeded: every process that builds a row builds the same ones."""
    model, example, dynamic, make_inputs = serve_models.make(name, small=opts.small, device=device)
    index, dim, low, high = serve_models.dynamic_dim(dynamic)
    mix = request_mix(low, high, example[index].shape[dim], opts.requests, opts.seed)
    return model, Setup({}, example, dynamic, make_inputs, mix)


def setup(name: str, opts, device: str, compile_fn=_torch_compile) -> tuple[Setup, Any]:
    """Row `name`'s Setup with every arm but ours, and the copy that optimize gets (all copies
    made here, before optimize)."""
    model, s = build(name, opts, device)
    s.arms = {"eager": model, **{a: compile_fn(copy.deepcopy(model), DYNAMIC_ARG[a]) for a in COMPILE_ARMS}}
    return s, copy.deepcopy(model)


def mix_fields(s: Setup, name: str) -> dict:
    index, dim, _, _ = serve_models.dynamic_dim(s.dynamic)
    return {"unit": serve_models.UNITS[name.split(":")[0]], "dynamic": s.dynamic, "example_size": s.mix.example,
            "dynamic_input": index, "dynamic_dim": dim, "mix": s.mix.describe(), "mix_sizes": s.mix.sizes,
            "mix_summary": s.mix.summary()}


def warmup_sizes(s: Setup) -> list[int]:
    """The sizes a server warms up on at start-up: the example's, then the declared range's ends."""
    _, _, low, high = serve_models.dynamic_dim(s.dynamic)
    return list(dict.fromkeys([s.mix.example, low, high]))


def warm_up(s: Setup, sync: Callable) -> dict:
    """Every arm called once at each warmup_sizes() size (the example's own inputs first): its
    seconds and the graphs it compiled, summed over the sizes. Each size's first arm is rotated
    as serve_pass rotates requests.
    NOTE: the arms share one process, so Inductor's caches (FX graph, Triton kernels) are shared:
    the first arm to compile a graph pays for it and an arm compiling the same graph after it pays
    less. Without the range's ends here, that first compile fell on user requests in the cold pass,
    always to the same arm for a given mix (ours, on the first size-1 request of seed 0's mix)."""
    names = [a for a in ARMS if a in s.arms]          # all four in a row; one in a cold child
    secs, graphs, sizes = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0), warmup_sizes(s)
    for k, size in enumerate(sizes):
        inputs = s.example if k == 0 else s.inputs_for(size)
        for j in range(len(names)):
            a = names[(k + j) % len(names)]
            before, t0 = graphs_compiled(), time.perf_counter()
            s.arms[a](*inputs)
            sync()
            secs[a] += time.perf_counter() - t0
            graphs[a] += graphs_compiled() - before
    return {"warmup_s": secs, "warmup_graphs": graphs, "warmup_sizes": sizes}


def serve(row: dict, s: Setup, sync: Callable, stage: Callable[[str], None]) -> dict[str, dict[str, Calls]]:
    """Warm-up, the cold pass and the warm pass into `row` (the figures after each pass, so a row
    cut off in the warm pass keeps the cold one); the passes' calls ({pass: {arm: Calls}})."""
    stage("warmup")
    row.update(warm_up(s, sync))
    probes, passes = probes_for(s.arms), {}
    for p, times in (("cold", 1), ("warm", WARM_PASSES)):
        stage(p)
        # the warm figures over WARM_PASSES passes: a p99 of 200 requests is its 2nd-slowest
        for _ in range(times):
            row.setdefault("host_cores_before", {}).setdefault(p, []).append(bench_floor.quiet_host())
            with collected_between():
                calls = serve_pass(s.arms, s.mix.sizes, s.inputs_for, sync, probes)
            passes[p] = merged(passes[p], calls) if p in passes else calls
        row.update(pass_fields(passes))
    return passes


@contextlib.contextmanager
def collected_between():
    """Python's cyclic GC off during a pass and run before and after it, as timeit does: a
    collection lands on whichever arm's request happens to be running (tens of ms on a process
    holding several compiled models), a tail figure of the process, not of the arm."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def merged(a: dict[str, "Calls"], b: dict[str, "Calls"]) -> dict[str, "Calls"]:
    """Two passes' calls per arm as one pass's."""
    out = {}
    for n in a:
        c = Calls(a[n].sizes + b[n].sizes, a[n].ms + b[n].ms)
        for k in set(a[n].deltas) | set(b[n].deltas):
            c.deltas[k] = a[n].deltas.get(k, []) + b[n].deltas.get(k, [])
        out[n] = c
    return out


# ---- the isolated cold pass (step 6): ours saved, each checked arm in a child of its own ----------

@dataclass
class Saved:
    """How the ours child rebuilds ours: from the bundle at `path`, or (path None) by running
    optimize again, `how` saying why; `seconds` spent saving it in the row's process."""
    path: Path | None
    how: str
    seconds: float


def _write_bundle(ours, original, example: tuple, dynamic: dict, out_dir: Path) -> None:
    """A bundle of what optimize chose for `ours`, written from the model optimize returned:
    torch_htam.precompile's tail without its optimize. precompile optimizes first (its search
    reads the cache, but its decision compiles and times every arm again, then it optimizes a
    third time to put the model back), so this costs a capture of a fresh copy of the original
    model, a golden record per kept kernel and Inductor's code serialized: seconds, nothing new
    measured. Called right after optimize, before any arm is served, so the bundle carries the
    Inductor code optimize compiled (as precompile's does) and none of what the mix makes the row
    compile. Raises where a bundle cannot hold what ours runs."""
    from torch_htam import bundle, inductor
    from torch_htam.report import TaskStatus
    run = bundle.run_of(ours)
    if not run["compile"]:
        outcome = getattr(getattr(getattr(ours, "htam_report", None), "outcome", None), "value", None)
        raise ValueError(f"ours runs {outcome or 'without torch.compile'}: a bundle would load as the replay "
                         "of the captured graph, which serves the example's sizes only")
    inductor.sync_report(ours)       # as precompile: the kernels the compiled graphs swapped in
    used = {t.signature for t in ours.htam_report.tasks if t.status == TaskStatus.SWAPPED}
    # NOTE: the tasks of the ORIGINAL graph (a copy never optimized), as precompile lists them
    bundle.precompile(copy.deepcopy(original), example, out_dir, only=used,
                      run=bundle.with_dynamic_of(run, dynamic, ours),
                      inductor_code=inductor.save_artifacts())


def save_ours(ours, original, s: Setup, out_dir: Path, write=_write_bundle) -> Saved:
    """Ours saved as a deployment would load it (write(ours, original, example, dynamic, out_dir)),
    or, where that fails, why the ours child optimizes again."""
    t0 = time.perf_counter()
    try:
        write(ours, original, s.example, s.dynamic, out_dir)
        return Saved(out_dir, "bundle", time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - the child optimizes again instead
        why = bench_floor.last_line(traceback.format_exc()) or type(e).__name__
        return Saved(None, f"optimize again (same kernel cache): no bundle: {why}", time.perf_counter() - t0)


@dataclass
class ColdRun:
    """One checked arm's isolated cold pass, as the row records it: its calls (None where the
    child failed: `error` says why), the child's wall and limit seconds, and what else it wrote
    (its warm-up, how the arm was built, ours' kernels)."""
    arm: str
    calls: Calls | None = None
    wall_s: float = 0.0
    limit_s: float | None = None
    error: str | None = None
    info: dict = field(default_factory=dict)


def cold_command(name: str, opts, arm: str, out: Path, bundle: Path | None) -> list[str]:
    """This script, to serve row `name`'s mix cold with `arm` alone and write its calls to `out`."""
    return child_command(name, opts, out) + ["--cold-arm", arm] + (["--bundle", str(bundle)] if bundle else [])


def cold_env() -> dict[str, str]:
    """The child's environment: this one, with the kernel cache named (HTAM_CACHE_DIR), so an ours
    child that optimizes again reads the cache this row's optimize filled."""
    from torch_htam import paths
    return {**os.environ, "HTAM_CACHE_DIR": str(paths.cache_root())}


def run_cold_arm(name: str, opts, arm: str, limit_s: float, bundle: Path | None, command=cold_command) -> ColdRun:
    """`arm`'s isolated cold pass, by a child process (command(name, opts, arm, out, bundle)) cut
    off, with whatever it left running, after limit_s."""
    with tempfile.TemporaryDirectory(prefix="bench_serve-cold-") as d:
        out = Path(d) / "calls.json"
        t0 = time.perf_counter()
        why = run_group(command(name, opts, arm, out, bundle), limit_s, "the child", env=cold_env())
        wall = time.perf_counter() - t0
        try:
            got = json.loads(out.read_text())
        except (OSError, ValueError):
            got = {}
    return cold_run_of(arm, got, wall, limit_s, why)


def cold_run_of(arm: str, got: dict, wall_s: float, limit_s: float, why: str | None) -> ColdRun:
    """A ColdRun from what a child wrote (measure_cold's dict, {} for nothing) and why it ended
    early. Calls it wrote whole count even where it then exited badly (a crash at interpreter
    exit costs no figure; "exit" keeps why)."""
    info = {k: v for k, v in got.items() if k not in ("model", "arm", "calls", "error")}
    if got.get("calls") and not got.get("error"):
        return ColdRun(arm, Calls(**got["calls"]), wall_s, limit_s, None, info | ({"exit": why} if why else {}))
    st = got.get("stage")
    error = got.get("error") or (why or "the child wrote no calls") + (f" in stage {st!r}" if st else "")
    return ColdRun(arm, None, wall_s, limit_s, error, info)


def cold_limit(arm: str, opts, bundle: Path | None, deadline: float) -> float:
    """A child's time limit: COLD_ARM_TIMEOUT_S (an ours child that optimizes again, plus
    optimize's limit), but no later than `deadline` (time.monotonic()), so the child has ended
    before the row's own limit ends the row's process."""
    own = COLD_ARM_TIMEOUT_S + (budget_limit(opts.budget) if arm == "ours" and bundle is None else 0.0)
    return min(own, deadline - time.monotonic())


def cold_isolated(row: dict, passes: dict, name: str, opts, saved: Saved, deadline: float,
                  stage: Callable[[str], None], run_cold=run_cold_arm) -> None:
    """Step 6 into `row`: each checked arm's child in turn (run_cold(name, opts, arm, limit_s,
    bundle) -> ColdRun), the row's fields after each. A child that fails, or that the row's limit
    leaves under 10 s for, is recorded; it never ends the row."""
    runs = []
    for arm in CHECKED:
        stage(f"cold_isolated {arm}")
        limit = cold_limit(arm, opts, saved.path, deadline)
        if limit < 10.0:
            run = ColdRun(arm, limit_s=limit, error=f"skipped: {max(limit, 0):.0f} s left of the row's time limit")
        else:
            try:
                run = run_cold(name, opts, arm, limit, saved.path)
            except Exception:  # noqa: BLE001 - a child that cannot start is its arm's failure
                run = ColdRun(arm, limit_s=limit, error=bench_floor.last_line(traceback.format_exc()))
        runs.append(run)
        passes["cold_isolated"] = {r.arm: r.calls for r in runs if r.calls is not None}
        row.update(pass_fields(passes))
        row.update(cold_isolated_fields(runs))


def cold_isolated_fields(runs: list[ColdRun]) -> dict:
    """The row's record of the children: per arm its wall and limit seconds and what it wrote
    ("cold_isolated_runs"), their wall seconds together ("cold_isolated_s"), and {arm: why} for
    those that served no mix ("cold_isolated_error", None where every one did)."""
    errors = {r.arm: r.error for r in runs if r.error}
    return {"cold_isolated_runs": {r.arm: {"wall_s": r.wall_s, "limit_s": r.limit_s, **r.info} for r in runs},
            "cold_isolated_s": sum(r.wall_s for r in runs), "cold_isolated_error": errors or None}


# ---- a cold child (--cold-arm ARM --one NAME) --------------------------------------------------------

def build_arm(arm: str, model, s: Setup, opts, bundle: Path | None, compile_fn=_torch_compile,
              optimize=_optimize, load=_load_bundle) -> tuple[Callable, str]:
    """The one arm a cold child serves, from the model it built, and how it was built: a compile
    arm as setup() compiles it; ours from the row's bundle (load(model, bundle, example)), else
    by optimize again (its search reads the row's kernel cache; its decision is made again, so it
    may keep other kernels than the row's ours: compare "kernels_kept")."""
    if arm in COMPILE_ARMS:
        return compile_fn(model, DYNAMIC_ARG[arm]), f"torch.compile(dynamic={DYNAMIC_ARG[arm]})"
    if bundle is not None:
        return load(model, bundle, s.example), "bundle"
    return optimize(model, s.example, s.dynamic, opts.budget), "optimize again"


def measure_cold(name: str, arm: str, opts, device: str = "cuda", bundle: Path | None = None,
                 compile_fn=_torch_compile, optimize=_optimize, load=_load_bundle,
                 progress=lambda out: None) -> dict:
    """Step 6's child: row `name`'s model and mix built as the row builds them, `arm` alone built
    (build_arm), warmed up as warm_up does, the mix served once (serve_pass, timed_call, with the
    row's probes). Returns {"model", "arm", "stage", "calls": the arm's Calls as a dict (sizes in
    the mix's order, ms, deltas), "built", "build_s", "warmup_s", "warmup_graphs", "warmup_sizes",
    "host_cores_before", ours' "kernels_kept", "report_note", "outcome", "child_s", "error"};
    progress(out) at each stage. Any failure is recorded in "error"."""
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, Any] = {"model": name, "arm": arm, "stage": None, "calls": None, "error": None}
    start = time.perf_counter()

    def stage(st: str) -> None:
        out["stage"] = st
        print(f"[bench_serve] {name} {arm} cold child: {st} (at {time.perf_counter() - start:.0f} s)",
              file=sys.stderr, flush=True)
        progress(out)

    try:
        with _precision(name.split(":")[-1]), _dynamo_limits():
            stage("build")
            model, s = build(name, opts, device)
            with torch.inference_mode():
                s.arms[arm], out["built"] = build_arm(arm, model, s, opts, bundle, compile_fn, optimize, load)
                out["build_s"] = time.perf_counter() - start
                stage("warmup")
                w = warm_up(s, sync)
                out.update(warmup_s=w["warmup_s"][arm], warmup_graphs=w["warmup_graphs"][arm],
                           warmup_sizes=w["warmup_sizes"])
                stage("cold")
                out["host_cores_before"] = bench_floor.quiet_host()
                with collected_between():
                    calls = serve_pass(s.arms, s.mix.sizes, s.inputs_for, sync, probes_for(s.arms))
            out["calls"] = dataclasses.asdict(calls[arm])
            if arm == "ours":
                rf = report_fields(s.arms["ours"])
                out.update({k: rf.get(k) for k in ("kernels_kept", "report_note", "outcome")})
            out["stage"] = "done"
    except Exception:  # noqa: BLE001 - recorded; the row records the arm's failure
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        out["error"] = bench_floor.last_line(text)
    out["child_s"] = time.perf_counter() - start
    return out


def cold_main(a) -> int:
    """The cold child's command line: measure_cold of --one's row and --cold-arm's arm, written to
    --row-out at each stage (or printed when run by hand); 1 where it failed."""
    keep = (lambda out: bench_floor._write_json(a.row_out, out)) if a.row_out else (lambda out: None)
    out = measure_cold(a.one, a.cold_arm, a, device=a.device, bundle=a.bundle, compile_fn=_torch_compile,
                       optimize=_optimize, load=_load_bundle, progress=keep)
    keep(out)
    if a.row_out is None:
        print(json.dumps(out), flush=True)
    return 0 if out["error"] is None else 1


# ---- a row, measured in its process (the --one child) ----------------------------------------------

def measure(name: str, opts, device: str = "cuda", optimize=_optimize, compile_fn=_torch_compile,
            progress=lambda row: None, write_bundle=_write_bundle, run_cold=run_cold_arm) -> dict:
    """Row `name` measured in this process (the steps in the module's docstring). progress(row) is
    called with the row so far at each stage ("stage" names it). Any failure in steps 1-5 ends the
    row with "error"; step 6's children (run_cold, unless opts.no_cold_isolated) run after them,
    each within what is left of the row's limit (--timeout, else default_timeout, counted from
    here: ROW_MARGIN_S covers this process's start-up before it and the end of a child cut off)."""
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row = empty_row(name, opts.budget, opts.requests, opts.seed)
    row.update(tf32=row["dtype"] == "fp32", recompile_limit=RECOMPILE_LIMIT, tolerance=TOLERANCE[row["dtype"]])
    start = time.perf_counter()
    isolated = not opts.no_cold_isolated
    limit = opts.timeout if opts.timeout is not None else default_timeout(opts.budget, isolated)
    deadline = time.monotonic() + limit - ROW_MARGIN_S

    def stage(st: str) -> None:
        row["stage"], row["row_s"] = st, time.perf_counter() - start
        print(f"[bench_serve] {name}: {st} (at {row['row_s']:.0f} s)", file=sys.stderr, flush=True)
        progress(row)

    try:
        # the bundle's folder lives until the children have loaded it
        with _precision(row["dtype"]), _dynamo_limits(), tempfile.TemporaryDirectory(prefix="bench_serve-row-") as tmp:
            stage("build")
            s, for_ours = setup(name, opts, device, compile_fn)
            row.update(mix_fields(s, name))
            with torch.inference_mode():
                row["optimize_started"] = time.time()
                stage("optimize")
                t0 = time.perf_counter()
                s.arms["ours"] = optimize(for_ours, s.example, s.dynamic, opts.budget)
                sync()
                row["optimize_s"] = time.perf_counter() - t0
                if isolated:
                    stage("bundle")     # in optimize's grad mode: its capture gives the same tasks
                    saved = save_ours(s.arms["ours"], s.arms["eager"], s, Path(tmp) / "bundle", write_bundle)
                    row.update(bundle_s=saved.seconds, cold_isolated_ours=saved.how)
                if getattr(opts, "graph_launches_ab", False):
                    s.arms["ours_graphs"] = with_graph_launches(s.arms["ours"])
                launches, host = launcher_counts("graph_launches"), launcher_counts("host_times")
                passes = serve(row, s, sync, stage)
                row["graph_launches"] = launcher_counts("graph_launches", since=launches)
                row["kernel_host"] = launcher_counts("host_times", since=host)
                stage("check")
                row.update(check_outputs(s.arms, check_sizes(s.mix), s.inputs_for, row["tolerance"]))
            row.update(report_fields(s.arms["ours"]))
            row["routes"] = routes(s.arms["ours"], s)
            if isolated:
                cold_isolated(row, passes, name, opts, saved, deadline, stage, run_cold)
            row["stage"] = "done"
    except Exception:  # noqa: BLE001 - one row's failure is its row's, never the run's
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        row["error"] = bench_floor.last_line(text)
    row["row_s"] = time.perf_counter() - start
    row.update(verdicts(row))
    return row


# ---- the run: each row in a child process ----------------------------------------------------------

def child_command(name: str, opts, row_out: Path) -> list[str]:
    """This script, to measure row `name` alone and write it to row_out (with the row's limit, which
    its cold children keep within, and --no-cold-isolated where given)."""
    own = ["--budget", str(opts.budget), "--requests", str(opts.requests), "--seed", str(opts.seed)]
    own += ["--timeout", str(opts.timeout)] if opts.timeout is not None else []
    own += ["--no-cold-isolated"] if opts.no_cold_isolated else []
    own += ["--graph-launches-ab"] if getattr(opts, "graph_launches_ab", False) else []
    return bench_floor.child_args(__file__, name, opts, row_out, own)


def run_group(cmd: list[str], timeout: float, who: str, env: dict | None = None, lane=None) -> str | None:
    """Run cmd in a process group of its own (with a lane, on its GPU, cores and caches:
    bench/lanes.py), ended with whatever it left running after it exits or after `timeout` s;
    None where it exited with status 0, else why not."""
    proc = bench_floor.start_lane(cmd, lane, env)
    try:
        rc = proc.wait(timeout=timeout)
        return f"{who} exited with status {rc}" if rc != 0 else None
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    finally:
        bench_floor._end_group(proc)


def run_child(name: str, opts, timeout: float, command=child_command, lane=None) -> dict:
    """Row `name` measured by a child process, cut off (with whatever it left running) after
    `timeout` s. A child that crashed or was cut off gives the row as far as it got, with "error"
    saying where; cut off in optimize, "optimize_s_at_least" says how long optimize had run."""
    with tempfile.TemporaryDirectory(prefix="bench_serve-") as d:
        row_out = Path(d) / "row.json"
        why = run_group(command(name, opts, row_out), timeout, "the row's process", lane=lane)
        try:
            row = json.loads(row_out.read_text())
        except (OSError, ValueError):
            row = None
    if row is None:
        row, why = empty_row(name, opts.budget, opts.requests, opts.seed), why or "the row's process wrote no row"
    if why is not None and row.get("stage") != "done":
        st = row.get("stage")
        row["error"] = why + (f" in stage {st!r}" if st else "")
        if st == "optimize" and row.get("optimize_started"):
            row["optimize_s_at_least"] = time.time() - row["optimize_started"]
        row.update(verdicts(row))
    return row


def run_rows(names: list[str], opts, run_one, keep=lambda rows: None, lanes=None) -> list[dict]:
    """bench_floor.run_rows with this suite's failed rows and ROW lines."""
    def failed(name: str, exc_text: str) -> dict:
        return dict(empty_row(name, opts.budget, opts.requests, opts.seed), error=bench_floor.last_line(exc_text))
    return bench_floor.run_rows(names, opts, run_one, keep, failed=failed, fmt=format_row, lanes=lanes)


# ---- summary and table -----------------------------------------------------------------------------

def summarize(rows: list[dict]) -> dict:
    """The run's figures: rows, errors, floor_ok count, the worst and geomean ratios (warm and
    cold), ours' kernel share per row, the longest optimize."""
    out = {"rows": len(rows), "errors": sum(1 for r in rows if r.get("error")),
           "floor_ok": sum(1 for r in rows if r.get("floor_ok") is True)}
    for k in ("throughput_vs_compile", "p99_vs_compile", "cold_throughput_vs_compile", "cold_p99_vs_compile",
              "cold_isolated_throughput_vs_compile", "cold_isolated_p99_vs_compile"):
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[f"min_{k}"] = min(vals) if vals else None
        out[f"geomean_{k}"] = bench_floor.geomean(vals)
    out["kernel_share"] = {r["model"]: r.get("kernel_share") for r in rows}
    spent = [r["optimize_s"] for r in rows if r.get("optimize_s") is not None]
    out["max_optimize_s"] = max(spent) if spent else None
    out["all_ok"] = bool(rows) and all(r.get("floor_ok") is True and r.get("within_budget") is True for r in rows)
    return out


def _f(v, fmt: str) -> str:
    return "-" if v is None else ("y" if v else "n") if isinstance(v, bool) else format(v, fmt)


COLUMNS = [("model", "model", "s", 14), ("kept", "kernels_kept", "d", 4), ("share", "kernel_share", ".2f", 5),
           ("thr vsC", "throughput_vs_compile", ".3f", 7), ("p99 vsC", "p99_vs_compile", ".3f", 7),
           ("cold thr", "cold_throughput_vs_compile", ".3f", 8), ("cold p99", "cold_p99_vs_compile", ".3f", 8),
           ("iso thr", "cold_isolated_throughput_vs_compile", ".3f", 7),     # each arm cold in its own process
           ("iso p99", "cold_isolated_p99_vs_compile", ".3f", 7),
           ("rc dyn", "recompiles.compile_dynamic", "d", 6), ("rc def", "recompiles.compile_default", "d", 6),
           ("rc ours", "recompiles.ours", "d", 7), ("opt s", "optimize_s", ".1f", 6), ("floor", "floor_ok", "", 5)]


def _get(row: dict, key: str):
    for part in key.split("."):
        row = row.get(part) if isinstance(row, dict) else None
    return row


def format_row(row: dict) -> str:
    cells = [str(row.get(k)).ljust(w) if k == "model" else _f(_get(row, k), fmt).rjust(w)
             for _, k, fmt, w in COLUMNS]
    return " ".join(cells) + (f"  {row['error']}" if row.get("error") else "")


def format_table(rows: list[dict], summary: dict) -> str:
    head = " ".join(h.ljust(w) if k == "model" else h.rjust(w) for h, k, _, w in COLUMNS)
    g = lambda k: _f(summary.get(k), ".3f")  # noqa: E731
    return "\n".join([head, "-" * len(head), *map(format_row, rows), "",
                      f"{summary['rows']} rows ({summary['errors']} with errors): floor_ok {summary['floor_ok']}; "
                      f"worst vs torch.compile (warm): throughput {g('min_throughput_vs_compile')}x, "
                      f"p99 {g('min_p99_vs_compile')}x; cold, each arm in its own process (iso): "
                      f"throughput {g('min_cold_isolated_throughput_vs_compile')}x, "
                      f"p99 {g('min_cold_isolated_p99_vs_compile')}x; all ok: {_f(summary['all_ok'], '')}"])


# ---- command line ----------------------------------------------------------------------------------

def parse(argv=None):
    ap = bench_floor.row_parser(__doc__)
    ap.add_argument("--dtype", choices=tuple(serve_models.DTYPES), default=None, help="only rows of this dtype")
    ap.add_argument("--requests", type=int, default=200, help="requests in the mix (each pass serves them all)")
    ap.add_argument("--seed", type=int, default=0, help="the mix's seed (random.Random)")
    ap.add_argument("--budget", type=float, default=120.0, help="OptimizeConfig.time_budget_s (s)")
    ap.add_argument("--no-cold-isolated", action="store_true",
                    help="skip the isolated cold pass (each checked arm cold in a process of its own)")
    ap.add_argument("--graph-launches-ab", action="store_true",
                    help="a fifth arm, ours with its graph launches on (off by default), for their A/B in the same run")
    bench_floor.add_run_flags(ap, f"1.1 x budget + 30 + 420 + {len(CHECKED) * COLD_ARM_S:.0f} (isolated cold pass)")
    ap.add_argument("--cold-arm", choices=CHECKED, default=None, help=argparse.SUPPRESS)   # a cold child's arm
    ap.add_argument("--bundle", type=Path, default=None, help=argparse.SUPPRESS)          # ... ours' bundle
    a = ap.parse_args(argv)
    bench_floor.check_rows(ap, a, serve_models.ROWS)
    if a.requests < 1:
        ap.error("--requests must be at least 1")
    if a.cold_arm is not None and a.one is None:
        ap.error("--cold-arm needs --one NAME")
    return a


def selected(a) -> list[str]:
    """The rows named (default all), of --dtype where given."""
    names = a.models or list(serve_models.ROWS)
    return [n for n in names if a.dtype is None or n.endswith(f":{a.dtype}")]


def main(argv=None) -> int:
    a = parse(argv)
    if a.cold_arm is not None:
        return cold_main(a)
    if (code := bench_floor.handled(a, serve_models, measure, "bench_serve")) is not None:
        return code
    timeout = a.timeout if a.timeout is not None else default_timeout(a.budget, not a.no_cold_isolated)
    path = None

    def keep(rows: list) -> None:
        nonlocal path
        if not a.no_record:
            path = record.write(SUITE, {
                "requests": a.requests, "seed": a.seed, "budget_s": a.budget, "budget_limit_s": budget_limit(a.budget),
                "mix_rule": MIX_RULE, "example_share": EXAMPLE_SHARE,
                "arms": [n for n in ARMS if n != "ours_graphs" or a.graph_launches_ab], "floor": FLOOR,
                "recompile_limit": RECOMPILE_LIMIT, "tolerance": TOLERANCE, "row_timeout_s": timeout,
                "cold_isolated": not a.no_cold_isolated, "cold_arm_timeout_s": COLD_ARM_TIMEOUT_S, "lanes": a.lanes,
                "tf32": "fp32 rows: on (matmul and cuDNN); bf16 rows: torch's defaults",
                "summary": summarize(rows), "rows": rows}, results_dir=a.out, path=path)

    rows = run_rows(selected(a), a, lambda name, lane=None: run_child(name, a, timeout, lane=lane), keep,
                    lanes=bench_floor.lanes_of(a, SUITE))
    print("\n" + format_table(rows, summarize(rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
