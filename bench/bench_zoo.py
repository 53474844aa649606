"""The zoo (issue #34): optimize() against torch.compile in three modes, on real model families at
realistic inference shapes.

    python3 bench/bench_zoo.py --list
    python3 bench/bench_zoo.py resnet50:bf16 convnext:fp32 --budget 120
    python3 bench/bench_zoo.py --budget 120                 # every row (many 10-minute calls)
    python3 bench/bench_zoo.py ROWS --lanes 4              # four rows at once, one per GPU (bench/lanes.py)

Rows are the models of bench/model_zoo.py ("<family>:<dtype>", dtype fp32 or bf16; fp32 rows run
with TF32 allowed for matmuls and cuDNN, as bench_serve's fp32 rows do, "tf32": true in the row).
Each row runs in a process of its own (this script with --one NAME; bench_floor.run_child), so
Dynamo/Inductor state and GPU memory do not leak between rows, under a time limit (--timeout,
default 2 x (1.1 x budget + 30 s) + 600 s: two optimizes, three compiles, timing). In that
process, in this order:

  1. build the model and inputs (model_zoo.make: seeded, eval mode, on cuda), the inputs copied
     under --grad-mode as a user's requests are made (inference tensors under inference_mode);
  2. five copy.deepcopy()s of it, all made BEFORE any optimize: "eager", "compile"
     (torch.compile(copy)), "compile_ro" (mode="reduce-overhead"), "compile_ma"
     (mode="max-autotune"), and the copy that "ours_ro" optimizes;
  3. "ours": torch_htam.optimize(model, inputs, OptimizeConfig(time_budget_s=--budget)), then
     "ours_ro": the same with mode="reduce-overhead", each's wall time "optimize_s" /
     "ours_ro_optimize_s" ("optimizing" names the one running). NOTE: ours_ro runs second in the
     process, so it may reuse kernels the first optimize put in torch_htam's cache: the cold figure
     is "optimize_s". An optimize that fails records "<arm>_error" (and the row's "error") and
     "<arm>_failed_after_s", and the other arms are still measured;
  4. every arm warmed (--warmup calls; the first call's seconds are "first_call_s", where
     torch.compile compiles; ours first, whose reports are read then, max-autotune last; --skip
     leaves compile arms out, "skipped_arms"), each arm's output checked against eager's (bench_floor.compare: max
     abs error, allclose at bf16 2e-2, fp32-with-TF32 5e-3: "<arm>_max_abs_err", "<arm>_correct";
     an ours arm outside it but as close to eager as its mode's torch.compile arm:
     "<arm>_close_as_compile", close_as_compile);
     an arm whose warm-up fails records "<arm>_error" and is left out of timing; the ours arms'
     reports are read after their first calls (bench_serve.report_fields syncs Inductor's swaps);
  5. once other processes leave the host's cores (bench_floor.quiet_host, "host_cores_before"),
     the arms timed interleaved (bench_floor.time_interleaved), --rounds rounds, each round every
     arm in a rotated order, two ways: latency (a synchronize before and after each call, median
     over all calls) and back-to-back throughput (--calls calls then one synchronize, time / calls,
     median over rounds). Steps 4-5 run first for every arm but max-autotune, then for it, and the
     arms are timed again beside it: a row cut off while max-autotune compiles (400+ s on some
     models) keeps the other arms' figures.
--modes default runs the default mode's arms alone (ours, compile, compile_ma; "modes" in the row):
a change to the default mode's decision is measured in half the time, and bench/render.py shows the
model's reduce-overhead figures from its previous row, naming both runs. --modes reduce-overhead
runs that mode's arms alone (ours_ro, compile_ro, compile_ma) and render.py shows the default mode's
figures from the previous row. --split-modes runs each row's modes as rows of their own, so with
--lanes 2 a row's two modes run at once on a two-GPU host.
Steps 3-5 run under torch.inference_mode() (--grad-mode), with Dynamo's recompile limit raised
(bench_serve._dynamo_limits: every arm's graphs sit on the model class's one forward).

Fields (a row has every one; null where unmeasured): "<arm>_ms_latency" / "<arm>_ms_throughput"
for arm in ARMS; "vs_compile" = compile ms / ours ms, "vs_max_autotune" = compile_ma ms / ours ms,
"vs_max_autotune_ro" = compile_ma ms / ours_ro ms (max-autotune runs CUDA graphs, as ours_ro does),
"vs_compile_ro" = compile_ro ms / ours_ro ms (each pair in the same mode), "vs_eager" = eager ms /
ours ms, all from latency, and the same from throughput as "..._b2b"; each also from the arms'
20th-percentile rounds as "..._low" and "..._low_b2b" (LOW_QUANTILE); "kernels_kept" / "ours_ro_
kernels_kept" (tasks with status swapped in model.htam_report, bench_serve.report_fields),
"outcome" / "ours_ro_outcome" (report.outcome), "report_note" / "ours_ro_report_note",
"decision_reason", "decision" (the decision, as JSON); "regions" / "ours_ro_regions" (per task:
kind, count, status and why, speedup over eager and over Inductor's code for the region, its eager
ms, and "share_of_eager", add_shares); "optimize_s", "ours_ro_optimize_s",
"first_call_s" per arm, "tf32", "<arm>_max_abs_err" / "<arm>_correct". bench_floor's names
("vs_compile_latency", "vs_compile_throughput", "floor_ok", "within_budget") are kept too.

The results file, bench/results/zoo-<date>.json (bench/record.py: suite "zoo", budget_s, summary,
rows), is rewritten after every row; a failing row records "error" and the run goes on. Its summary
(zoo_figures.summarize; RESULTS.md gives the same over each model's latest row):
geomean and minimum of vs_compile, vs_compile_ro, vs_max_autotune (and their _b2b) over the rows
that measured them, the rows with kernels kept, the rows whose optimize took over 600 s (the
issue: a cold optimize within 10 minutes), and "beat_inductor": per region kind, the kernels that
ran and beat Inductor's code for their region, with their share of the model's eager time.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import bench_floor as bf  # noqa: E402  (timing, checks, the child process, rows' run, geomean)
import bench_serve as bs  # noqa: E402  (report_fields, TF32 policy, Dynamo's limits)
import record  # noqa: E402
import model_zoo  # noqa: E402
from zoo_figures import (COLD_LIMIT_S, HEADLINE, OURS_ARMS, WAYS, beat_inductor,  # noqa: E402,F401
                         summarize, prefix as _prefix)

SUITE = "zoo"
# arm -> torch.compile mode (ours: OptimizeConfig.mode); eager has none
ARMS = {"eager": None, "compile": "default", "compile_ro": "reduce-overhead", "compile_ma": "max-autotune",
        "ours": "default", "ours_ro": "reduce-overhead"}
COMPILE_ARMS = ("compile", "compile_ro", "compile_ma")
MODES = ("default", "reduce-overhead")   # the modes of the ours arms (--modes)
WARM_ORDER = OURS_ARMS + ("eager",) + COMPILE_ARMS   # max-autotune's compile (the longest) last
# ratio field -> (baseline arm, ours arm); "_b2b" the same from back-to-back throughput
RATIOS = {"vs_compile": ("compile", "ours"), "vs_compile_ro": ("compile_ro", "ours_ro"),
          "vs_max_autotune": ("compile_ma", "ours"), "vs_max_autotune_ro": ("compile_ma", "ours_ro"),
          "vs_eager": ("eager", "ours")}
# NOTE: mode="max-autotune" runs CUDA graphs too, as reduce-overhead does: against ours in default
# mode it compares the CUDA graphs as much as the kernels, so it is also paired with ours_ro
REQUIRED = ("model", "vs_compile", "vs_compile_ro", "vs_max_autotune", "kernels_kept", "optimize_s")
# "<ratio>_low" / "<ratio>_low_b2b": the ratio of each arm's 20th-percentile round. NOTE: on
# host-bound rows whole rounds swing (ConvNeXt and ViT bf16, H100: 2.1-2.7 ms a call, rounds up to
# 3.5-5 ms), and two compiles of one program read 0.936-1.016x by their medians
# (zoo-20261127-041012, -041945); the headline ratios stay the medians.
LOW_QUANTILE = 0.2


def default_timeout(budget_s: float) -> float:
    """A row's process limit: two optimizes' limits plus 600 s for start-up, three compiles
    (max-autotune's among them) and timing."""
    return 2 * bf.budget_limit(budget_s) + 600.0


def empty_row(model: str, budget_s: float = 120.0, grad_mode: str = "inference") -> dict:
    """Every field of a row, unmeasured (None); bench_floor's row underneath (its verdicts and
    table read it)."""
    row = bf.empty_row(model, "default", budget_s, grad_mode)
    row["dtype"] = model.split(":")[-1]
    row["tf32"] = row["dtype"] == "fp32"
    for arm in ARMS:
        row.update({f"{arm}_ms_latency": None, f"{arm}_ms_throughput": None,
                    f"{arm}_max_abs_err": None, f"{arm}_correct": None})
    for name in RATIOS:
        row.update({name: None, f"{name}_b2b": None, f"{name}_low": None, f"{name}_low_b2b": None})
    for arm in OURS_ARMS:
        p = _prefix(arm)
        row.update({f"{p}kernels_kept": None, f"{p}outcome": None, f"{p}report_note": None,
                    f"{p}tasks": None, f"{p}task_status": None, f"{p}regions": None})
    row.update({"ours_ro_optimize_s": None, "ours_ro_swapped": None, "decision_reason": None,
                "ours_ro_decision_reason": None, "first_call_s": {}, "skipped_arms": [], "modes": list(MODES)})
    return row


def ratio_fields(times: dict) -> dict:
    """A row's ms and ratio fields from time_interleaved()'s result over the arms it timed (an
    arm that failed is missing: its fields stay None)."""
    from torch_htam.timing import quantile
    out = {}
    for way, suffix in WAYS.items():
        ms = {arm: times[arm][f"{way}_ms"] for arm in times}
        out.update({f"{arm}_ms_{way}": v for arm, v in ms.items()})
        for name, (base, ours) in RATIOS.items():
            out[f"{name}{suffix}"] = bf.ratio(ms.get(base), ms.get(ours))
        # the same from each arm's LOW_QUANTILE round: host noise only adds time, in whole rounds
        low = {arm: quantile(times[arm][f"{way}_round_ms"], LOW_QUANTILE) for arm in times
               if times[arm].get(f"{way}_round_ms")}
        for name, (base, ours) in RATIOS.items():
            out[f"{name}_low{suffix}"] = bf.ratio(low.get(base), low.get(ours))
    # bench_floor's names, for its verdicts and table (ours-default vs compile-default)
    out["vs_compile_latency"], out["vs_compile_throughput"] = out["vs_compile"], out["vs_compile_b2b"]
    out["vs_eager_latency"], out["vs_eager_throughput"] = out["vs_eager"], out["vs_eager_b2b"]
    out["rounds_ms"] = {arm: {k: v for k, v in t.items() if k.endswith("_round_ms")} for arm, t in times.items()}
    return out


def add_shares(regions: list[dict] | None, eager_ms: float | None) -> None:
    """Each region's "share_of_eager": count x its eager ms per call (from its verification, the
    region alone) / the eager model's synced ms: about how much of the model's time its kernel
    can act on (the model's own time includes the host's; the regions' do not)."""
    for r in regions or ():
        r["share_of_eager"] = (r["count"] * r["ref_ms"] / eager_ms
                               if r.get("ref_ms") and eager_ms and eager_ms > 0 else None)


def ours_fields(arm: str, model) -> dict:
    """What optimize said it did for ours arm `arm` (bench_serve.report_fields: kernels kept,
    tasks by status, outcome, note), its decision's reason, and its decision (ours only)."""
    p, report = _prefix(arm), getattr(model, "htam_report", None)
    out = {f"{p}{k}": v for k, v in bs.report_fields(model).items()}
    decision = getattr(report, "decision", None)
    out[f"{p}decision_reason"] = getattr(decision, "reason", None)
    if arm == "ours":
        out["decision"] = bf.report_fields(report)["decision"]
    return out


# ---- one row, in this process (the --one child) ------------------------------------------------

def arms_for(opts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the ours arms of the modes asked for, in OURS_ARMS' order; the compile arms left out:
    --skip's, and those of a mode not asked for, whose ours arm is not run)."""
    ours = tuple(a for a in OURS_ARMS if ARMS[a] in opts.modes)
    skip = tuple(dict.fromkeys([*opts.skip, *(a for a in ("compile", "compile_ro") if ARMS[a] not in opts.modes)]))
    return ours, skip


def measure(name: str, opts, device: str = "cuda", optimize=bf._optimize, compile_fn=bf._torch_compile,
            progress=lambda row: None, sync=None, time_fn=bf.time_interleaved) -> dict:
    """Row `name` measured in this process (the steps in the module's docstring).
    optimize(model, inputs, budget_s, mode) and compile_fn(model, mode) as bench_floor's; sync
    (default: torch.cuda.synchronize on cuda) and time_fn(arms, sync, rounds, calls) (default:
    bench_floor.time_interleaved) for stand-in timing. progress(row) gets the row at
    each stage ("stage"). A failing optimize or arm records "<arm>_error" and the row's "error";
    the other arms are still measured. A failure outside an arm ends the row with "error"."""
    import torch
    from torch.utils import _pytree as pytree
    if sync is None:
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row = empty_row(name, opts.budget, opts.grad_mode)
    start = time.perf_counter()
    errors = []

    def stage(s: str) -> None:
        row["stage"], row["row_s"] = s, time.perf_counter() - start
        print(f"[bench_zoo] {name}: {s} (at {row['row_s']:.0f} s)", file=sys.stderr, flush=True)
        progress(row)

    def failed(arm: str) -> None:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        row[f"{arm}_error"] = bf.last_line(text)
        errors.append(f"{arm}: {row[f'{arm}_error']}")
        row["error"] = "; ".join(errors)

    try:
        with bs._precision(row["dtype"]), bs._dynamo_limits():
            stage("build")
            model, inputs = model_zoo.make(name, small=opts.small, device=device)
            with bf._grad_mode(opts.grad_mode):    # made as requests are: inference tensors
                inputs = pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, inputs)
            models = {"eager": copy.deepcopy(model)}          # every copy BEFORE any optimize
            ours_arms, skip = arms_for(opts)
            row["skipped_arms"], row["modes"] = list(skip), list(opts.modes)
            for arm in COMPILE_ARMS:
                if arm not in skip:
                    models[arm] = compile_fn(copy.deepcopy(model), ARMS[arm])
            pending = {"ours_ro": copy.deepcopy(model)} if "ours_ro" in ours_arms else {}
            pending["ours"] = model
            with bf._grad_mode(opts.grad_mode):
                for arm in ours_arms:
                    row["optimize_started"] = time.time()     # run_child: how long a cut-off one ran
                    row["optimizing"] = arm
                    stage("optimize")                         # run_child reads this stage's name
                    t0 = time.perf_counter()
                    try:
                        models[arm] = optimize(pending.pop(arm), inputs, opts.budget, ARMS[arm])
                        sync()
                        row["optimize_s" if arm == "ours" else f"{arm}_optimize_s"] = time.perf_counter() - t0
                    except Exception:  # noqa: BLE001 - this arm's failure, not the row's
                        row[f"{arm}_failed_after_s"] = time.perf_counter() - t0
                        failed(arm)
                row.pop("optimize_started", None)
                row.pop("optimizing", None)
                del pending
                # ours first, each report read after its first calls (Dynamo's compiles swap the
                # kernels in) and the row passed on. Max-autotune compiles last (minutes on a model
                # of many GEMM shapes: MobileNetV3 and T5 bf16 over 400 s on an H100,
                # zoo-20261127-221751 / -221750): the other arms are checked and timed before it,
                # so a row cut off there keeps their figures, then timed again beside it
                calls = {arm: (lambda m=models[arm]: m(*inputs)) for arm in WARM_ORDER if arm in models}
                first, warmed = [arm for arm in calls if arm != "compile_ma"], []
                for group in (first, [arm for arm in calls if arm not in first]):
                    if not group:
                        continue
                    for arm in group:
                        stage(f"warm {arm}")
                        t0 = time.perf_counter()
                        try:
                            calls[arm]()
                            sync()
                            row["first_call_s"][arm] = time.perf_counter() - t0
                            for _ in range(max(opts.warmup - 1, 0)):
                                calls[arm]()
                            sync()
                        except Exception:  # noqa: BLE001
                            failed(arm)
                            del calls[arm]
                        if arm in ours_arms:
                            row.update(ours_fields(arm, models[arm]))
                    warmed += [arm for arm in group if arm in calls]
                    stage("check")
                    check(row, calls, group)
                    stage("time")
                    row["host_cores_before"] = bf.quiet_host()
                    row.update(ratio_fields(time_fn({a: calls[a] for a in warmed}, sync, opts.rounds, opts.calls)))
                    for arm in ours_arms:
                        add_shares(row.get(f"{_prefix(arm)}regions"), row.get("eager_ms_latency"))
                row["stage"] = "done"
    except Exception:  # noqa: BLE001 - one row's failure is its row's, never the run's
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        errors.append(bf.last_line(text))
        row["error"] = "; ".join(errors)
    row["row_s"] = time.perf_counter() - start
    row.update(bf.verdicts(row))
    return row


def check(row: dict, calls: dict, arms: list[str]) -> None:
    """Each of `arms` still in `calls` checked against eager's output ("<arm>_max_abs_err",
    "<arm>_correct"; bench_floor.compare), then close_as_compile and bench_floor's names for
    ours-default."""
    if "eager" not in calls:
        return
    ref = bf._clone(calls["eager"]())
    for arm in arms:
        if arm in calls:
            c = bf.compare(bf._clone(calls[arm]()), ref, row["tf32"])
            row[f"{arm}_max_abs_err"], row[f"{arm}_correct"] = c["max_abs_err"], c["correct"]
            row["tolerance"] = c["tolerance"]
    del ref
    row.update(close_as_compile(row))
    ours = "ours" if "default" in (row.get("modes") or MODES) else "ours_ro"   # the run's first ours arm
    row["max_abs_err"], row["correct"] = row[f"{ours}_max_abs_err"], row[f"{ours}_correct"]


# ---- the run: each row in a child process (bench_floor.run_child) ------------------------------

def child_command(name: str, opts, row_out: Path) -> list[str]:
    """This script, to measure row `name` alone and write it to row_out."""
    return bf.child_args(__file__, name, opts, row_out, [
        "--budget", str(opts.budget), "--grad-mode", opts.grad_mode, "--rounds", str(opts.rounds),
        "--calls", str(opts.calls), "--warmup", str(opts.warmup), "--modes", ",".join(opts.modes),
        *(("--skip", ",".join(opts.skip)) if opts.skip else ())])


def run_child(name: str, opts, timeout: float, command=child_command, lane=None) -> dict:
    """bench_floor.run_child with this script's child; a row the child never wrote gets this
    suite's empty fields under bench_floor's."""
    row = bf.run_child(name, opts, timeout, command=command, lane=lane)
    return {**empty_row(name, opts.budget, opts.grad_mode), **row}


# An ours arm outside the dtype's tolerance is still as close to eager as torch.compile is where
# its largest error is at most this many times that of the torch.compile arm of its mode, itself
# outside the tolerance. NOTE: T5-small bf16 differs from eager by up to 0.035 under torch.compile
# (tolerance 0.02), and by 0.039 with our kernels (zoo-20261127-035914): 6 + 6 layers of bf16
# rounding, each in another order.
CLOSE_AS_COMPILE = 1.5


def close_as_compile(row: dict) -> dict:
    """"<arm>_close_as_compile" for each ours arm: correct at the tolerance, or no further from
    eager than CLOSE_AS_COMPILE x its mode's torch.compile arm (None where either was not checked)."""
    out = {}
    for arm, base in (("ours", "compile"), ("ours_ro", "compile_ro")):
        err, base_err = row.get(f"{arm}_max_abs_err"), row.get(f"{base}_max_abs_err")
        if row.get(f"{arm}_correct") is True:
            out[f"{arm}_close_as_compile"] = True
        elif err is None or base_err is None:
            out[f"{arm}_close_as_compile"] = None
        else:
            out[f"{arm}_close_as_compile"] = (row.get(f"{base}_correct") is False
                                              and err <= CLOSE_AS_COMPILE * base_err)
    return out


# ---- summary and table -------------------------------------------------------------------------

COLUMNS = [("model", "model", "s", 18), ("eager", "eager_ms_latency", ".3f", 8),
           ("compile", "compile_ms_latency", ".3f", 8), ("ours", "ours_ms_latency", ".3f", 8),
           ("vsC", "vs_compile", ".3f", 6), ("vsRO", "vs_compile_ro", ".3f", 6),
           ("vsMA", "vs_max_autotune", ".3f", 6), ("vsC b2b", "vs_compile_b2b", ".3f", 7),
           ("kept", "kernels_kept", "d", 4), ("keptRO", "ours_ro_kernels_kept", "d", 6),
           ("opt s", "optimize_s", ".1f", 6), ("optRO s", "ours_ro_optimize_s", ".1f", 7),
           ("ok", "ours_correct", "", 3), ("~C", "ours_close_as_compile", "", 3)]


def format_row(row: dict) -> str:
    cells = [bf._f(row.get(k), fmt).rjust(w) if k != "model" else str(row.get(k)).ljust(w)
             for _, k, fmt, w in COLUMNS]
    tail = row.get("error") or row.get("outcome") or ""
    return " ".join(cells) + (f"  {tail}" if tail else "")


def format_table(rows: list[dict], summary: dict) -> str:
    head = " ".join(h.ljust(w) if k == "model" else h.rjust(w) for h, k, _, w in COLUMNS)
    lines = [head, "-" * len(head)] + [format_row(r) for r in rows]
    g = lambda k: bf._f(summary.get(k), ".3f")  # noqa: E731
    lines += ["", f"{summary['rows']} rows ({summary['errors']} with errors), ours correct {summary['correct']} "
              f"(as close to eager as torch.compile: {summary.get('close_as_compile', '-')}); "
              f"geomean (min) latency: vs compile {g('geomean_vs_compile')}x ({g('min_vs_compile')}), "
              f"vs compile reduce-overhead {g('geomean_vs_compile_ro')}x ({g('min_vs_compile_ro')}), "
              f"vs max-autotune {g('geomean_vs_max_autotune')}x ({g('min_vs_max_autotune')}); "
              f"back-to-back: {g('geomean_vs_compile_b2b')}x, {g('geomean_vs_compile_ro_b2b')}x, "
              f"{g('geomean_vs_max_autotune_b2b')}x; by each arm's 20th-percentile round (min): "
              f"{g('geomean_vs_compile_low')}x ({g('min_vs_compile_low')}), "
              f"{g('geomean_vs_compile_ro_low')}x ({g('min_vs_compile_ro_low')})",
              f"kernels kept in: {', '.join(summary['kernels_kept_rows']) or 'none'}; "
              f"optimize over {COLD_LIMIT_S:.0f} s: {', '.join(summary['over_600_s']) or 'none'}"]
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------

def parse(argv=None):
    ap = bf.row_parser(__doc__)
    ap.add_argument("--budget", type=float, default=120.0, help="OptimizeConfig.time_budget_s (s), both ours arms")
    ap.add_argument("--grad-mode", default="inference", choices=bf.GRAD_MODES,
                    help="the caller's grad mode around optimize and every call")
    ap.add_argument("--skip", type=lambda v: tuple(x for x in v.split(",") if x), default=(),
                    help="compile arms left out (e.g. compile_ma where its autotuning would not fit the "
                         "row's limit); their ratios stay null and the row's skipped_arms names them")
    ap.add_argument("--modes", type=lambda v: tuple(x for x in v.split(",") if x), default=MODES,
                    help="the modes whose ours arm runs: default,reduce-overhead (the default), or one"
                         " alone, which leaves out the other mode's arms (bench/render.py then shows"
                         " their figures from the model's previous row, naming both runs)")
    ap.add_argument("--split-modes", action="store_true",
                    help="each row's modes as rows of their own (--modes one at a time): with --lanes 2"
                         " a row's two modes run at once, one a GPU")
    bf.add_timing_flags(ap, rounds=30)   # 30 x 20 calls a way: host-bound rows swing 2x between rounds
    bf.add_run_flags(ap, "2 x (1.1 x budget + 30) + 600")
    a = ap.parse_args(argv)
    a.mode, a.tf32 = "default", False          # bench_floor.run_child's empty row and failed rows read them
    bf.check_rows(ap, a, model_zoo.ROWS)
    if not a.modes or set(a.modes) - set(MODES):
        ap.error(f"--modes takes default, reduce-overhead or both, not {','.join(a.modes)}")
    if unknown := set(a.skip) - set(COMPILE_ARMS):
        ap.error(f"--skip takes compile arms ({', '.join(COMPILE_ARMS)}), not {', '.join(sorted(unknown))}")
    return a


def _job(job: str, opts) -> tuple:
    """(row name, options) of a job: "NAME" runs opts.modes; "NAME MODE" (--split-modes) that mode
    alone."""
    name, *mode = job.split()
    return name, (argparse.Namespace(**{**vars(opts), "modes": tuple(mode)}) if mode else opts)


def main(argv=None) -> int:
    a = parse(argv)
    if (code := bf.handled(a, model_zoo, measure, "bench_zoo")) is not None:
        return code
    names = a.models or list(model_zoo.ROWS)
    timeout = a.timeout if a.timeout is not None else default_timeout(a.budget)
    path = None

    def keep(rows: list) -> None:
        nonlocal path
        if not a.no_record:
            path = record.write(SUITE, {
                "budget_s": a.budget, "budget_limit_s": bf.budget_limit(a.budget), "grad_mode": a.grad_mode,
                "tf32": "fp32 rows: on (matmul and cuDNN); bf16 rows: torch's defaults",
                "arms": ARMS, "rounds": a.rounds, "calls": a.calls, "warmup": a.warmup,
                "row_timeout_s": timeout, "lanes": a.lanes, "summary": summarize(rows), "rows": rows},
                results_dir=a.out, path=path)

    def failed(name: str, exc_text: str) -> dict:   # this suite's fields
        return dict(empty_row(name, a.budget, a.grad_mode), error=bf.last_line(exc_text))

    jobs = [f"{n} {m}" for n in names for m in a.modes] if a.split_modes else names
    rows = bf.run_rows(jobs, a, lambda job, lane=None: run_child(*_job(job, a), timeout, lane=lane), keep,
                       failed=lambda job, text: failed(job.split()[0], text), fmt=format_row,
                       lanes=bf.lanes_of(a, SUITE))
    print("\n" + format_table(rows, summarize(rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
