"""The floor: optimize() never leaves a model slower than torch.compile of it, and stays within its
time budget.

    python3 bench/bench_floor.py --list
    python3 bench/bench_floor.py kb_convt3d_ln:fp32 cnn_small:fp32 graph_break:fp32 --budget 30
    python3 bench/bench_floor.py                       # every row (more than one 10-minute call)

Rows are the models and KernelBench-style problems of bench/floor_models.py (several written to hit
the paths where the floor broke before). Each row runs in a process of its own (this script with
--one NAME), so Dynamo/Inductor state and GPU memory do not leak between rows, under a time limit
(--timeout, default 1.1 x budget + 30 s + 240 s). In that process, in this order:

  1. build the model and inputs (seeded, eval mode, on cuda);
  2. two copy.deepcopy()s of it BEFORE optimize: the eager arm, and the torch.compile arm
     (torch.compile(copy, mode=--mode));
  3. torch_htam.optimize on the original with OptimizeConfig(time_budget_s=--budget, mode=--mode),
     its wall time (time.perf_counter) is "optimize_s";
  4. every arm warmed (--warmup calls: compiling happens outside timing), ours' and torch.compile's
     outputs checked against eager's (max abs error; allclose at fp32 1e-3 with TF32 off, bf16 2e-2);
  5. once other processes leave the host's cores (quiet_host, "host_cores_before"), the three
     arms timed interleaved, in --rounds rounds, each round every arm in a rotated order,
     two ways: "latency", per call with a synchronize before and after it (median over all calls),
     and "throughput", --calls back-to-back calls then one synchronize, time / calls (median over
     rounds).
Steps 3-5 run under the caller's grad mode (--grad-mode, default torch.inference_mode()); TF32 is
off throughout (--tf32 leaves torch's defaults).

A row passes when floor_ok (vs_compile >= 0.98 both ways: compile ms / ours ms) and within_budget
(optimize_s <= 1.1 x budget + 30 s). A failing row records "error" (its traceback's last line) and
the run goes on. The results file, bench/results/bench_floor-<date>.json (bench/record.py: suite
"bench_floor", budget_s, mode, grad_mode, summary, rows), is rewritten after every row, so a run cut
short keeps the rows it measured.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import enum
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import floor_models  # noqa: E402
import record  # noqa: E402
from lanes import run as run_lanes, split as split_lanes, start as start_lane  # noqa: E402

SUITE = "bench_floor"
ARMS = ("eager", "compile", "ours")
FLOOR = 0.98            # "at least 0.98x of torch.compile": the same kernel's median moves ~2% run to run
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
GRAD_MODES = ("inference", "no_grad", "plain")
# allclose rtol = atol by the output's dtype; fp32 with TF32 on (--tf32) gets TF32's
TOLERANCE = {"fp32": 1e-3, "tf32": 5e-3, "fp16": 2e-2, "bf16": 2e-2}
REQUIRED = ("model", "vs_compile_latency", "vs_compile_throughput", "optimize_s", "budget_s")


def budget_limit(budget_s: float) -> float:
    """The most optimize may take: 1.1 x its time budget + 30 s."""
    return 1.1 * budget_s + 30.0


def default_timeout(budget_s: float) -> float:
    """A row's process limit: optimize's limit plus 240 s for start-up, compiling and timing."""
    return budget_limit(budget_s) + 240.0


# ---- timing: callables and a sync function (the CPU tests pass stand-ins) ----------------------

def time_latency(fn, sync, calls: int, clock=time.perf_counter) -> list[float]:
    """ms of each of `calls` calls, each with the device idle before it and synchronized after."""
    out = []
    for _ in range(calls):
        sync()
        t0 = clock()
        fn()
        sync()
        out.append((clock() - t0) * 1e3)
    return out


def time_throughput(fn, sync, calls: int, clock=time.perf_counter) -> float:
    """ms per call of `calls` back-to-back calls and one synchronize at the end."""
    sync()
    t0 = clock()
    for _ in range(calls):
        fn()
    sync()
    return (clock() - t0) * 1e3 / calls


def quiet_host() -> float | None:
    """Wait (up to timing.QUIET_MAX_S) for other processes to leave the host's cores before a
    timing: Inductor's compile workers start up after a compile (they quiesce after 60 s idle),
    and a host-bound arm's calls carry their load (torch_htam/timing.py). The CPU cores they
    still used, None where /proc/stat is not readable; rows keep it as "host_cores_before"."""
    from torch_htam.timing import wait_for_quiet_host
    load = wait_for_quiet_host()
    return None if load.others_cores is None else round(load.others_cores, 2)


def time_interleaved(arms: dict, sync, rounds: int = 10, calls: int = 20, clock=time.perf_counter) -> dict:
    """Each arm timed both ways in `rounds` rounds; round r runs the arms in order rotated by r, so
    no arm always runs first (or right after the same one). Per arm: "latency_ms" (median of every
    call), "throughput_ms" (median over rounds), and each round's figures ("latency_round_ms": the
    round's median call; "throughput_round_ms")."""
    names = list(arms)
    lat = {n: [] for n in names}
    per_round = {n: {"latency_round_ms": [], "throughput_round_ms": []} for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            calls_ms = time_latency(arms[n], sync, calls, clock)
            lat[n] += calls_ms
            per_round[n]["latency_round_ms"].append(statistics.median(calls_ms))
            per_round[n]["throughput_round_ms"].append(time_throughput(arms[n], sync, calls, clock))
    return {n: {"latency_ms": statistics.median(lat[n]),
                "throughput_ms": statistics.median(per_round[n]["throughput_round_ms"]), **per_round[n]}
            for n in names}


# ---- a row: its fields and verdicts ------------------------------------------------------------

def empty_row(model: str, mode: str = "default", budget_s: float = 30.0, grad_mode: str = "inference") -> dict:
    """Every field of a row, unmeasured (None): a failed row keeps the same schema."""
    row = {"model": model, "mode": mode, "grad_mode": grad_mode}
    for way in ("latency", "throughput"):
        row.update({f"{arm}_ms_{way}": None for arm in ARMS})
    row.update({"vs_compile_latency": None, "vs_compile_throughput": None, "vs_eager_latency": None,
                "vs_eager_throughput": None, "optimize_s": None, "budget_s": budget_s,
                "budget_limit_s": budget_limit(budget_s), "within_budget": None, "floor_ok": None,
                "max_abs_err": None, "correct": None, "compile_max_abs_err": None, "compile_correct": None,
                "tolerance": None, "report_note": None, "swapped": None, "decision": None})
    return row


def ratio(base, ours):
    """base / ours (how many times faster ours is), None where either is missing or not positive."""
    return base / ours if base and ours and base > 0 and ours > 0 else None


def timed_fields(times: dict) -> dict:
    """A row's ms and ratio fields from time_interleaved()'s result over ARMS."""
    out = {}
    for way in ("latency", "throughput"):
        for arm in ARMS:
            out[f"{arm}_ms_{way}"] = times[arm][f"{way}_ms"]
        out[f"vs_compile_{way}"] = ratio(times["compile"][f"{way}_ms"], times["ours"][f"{way}_ms"])
        out[f"vs_eager_{way}"] = ratio(times["eager"][f"{way}_ms"], times["ours"][f"{way}_ms"])
        # NOTE: the median of each round's own ratio: a round's arms ran next to each other, so a
        # host disturbance that moves whole rounds (a host-bound model's) cancels out of it
        pairs = [c / o for c, o in zip(times["compile"][f"{way}_round_ms"], times["ours"][f"{way}_round_ms"]) if o]
        out[f"vs_compile_{way}_paired"] = statistics.median(pairs) if pairs else None
    out["rounds_ms"] = {arm: {k: v for k, v in times[arm].items() if k.endswith("_round_ms")} for arm in ARMS}
    return out


def verdicts(row: dict) -> dict:
    """floor_ok: vs_compile >= FLOOR both ways (None if either is unmeasured); within_budget:
    optimize_s <= 1.1 x budget + 30 s (False too when a row was cut off in optimize past that)."""
    lat, thr = row.get("vs_compile_latency"), row.get("vs_compile_throughput")
    floor_ok = None if lat is None or thr is None else (lat >= FLOOR and thr >= FLOOR)
    limit = budget_limit(row["budget_s"])
    if row.get("optimize_s") is not None:
        within = row["optimize_s"] <= limit
    elif row.get("optimize_s_at_least") is not None and row["optimize_s_at_least"] > limit:
        within = False
    else:
        within = None
    return {"floor_ok": floor_ok, "within_budget": within}


def build_row(model: str, times: dict, optimize_s: float | None, budget_s: float, mode: str = "default",
              grad_mode: str = "inference", check: dict | None = None, report=None) -> dict:
    """A measured row: times from time_interleaved() over ARMS, optimize's wall time, the output
    check (compare()) and optimize's report."""
    row = empty_row(model, mode, budget_s, grad_mode)
    row.update(timed_fields(times))
    row["optimize_s"] = optimize_s
    row.update(check or {})
    row.update(report_fields(report))
    row.update(verdicts(row))
    return row


def jsonable(x, limit: int = 200):
    """x as JSON can hold it: a dataclass as the dict of its fields (what dataclasses.asdict gives,
    but without its deep copy: a decision's fields hold the model's call and Inductor backends),
    enums as str(), containers recursively, callables by name, anything else as str() cut at
    `limit` characters (a module's repr is its whole tree)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name, None), limit) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v, limit) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v, limit) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if callable(x):
        return f"<{getattr(x, '__qualname__', type(x).__qualname__)}>"
    s = str(x)
    return s if len(s) <= limit else s[:limit] + "..."


def report_fields(report) -> dict:
    """What optimize said it did (model.htam_report): its note, regions swapped, and its decision
    where the report has one."""
    if report is None:
        return {"report_note": None, "swapped": None, "decision": None}
    return {"report_note": getattr(report, "note", None), "swapped": getattr(report, "swapped", None),
            "decision": jsonable(getattr(report, "decision", None))}


def last_line(exc_text: str) -> str:
    """A traceback's last non-empty line (the exception and its message)."""
    lines = [x for x in exc_text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "unknown error"


# ---- the output check --------------------------------------------------------------------------

def tolerance(dtype, tf32: bool = False) -> float:
    import torch
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "tf32" if tf32 else "fp32")
    return TOLERANCE[name]


def compare(out, ref, tf32: bool = False) -> dict:
    """ours (or torch.compile's) output against eager's: the largest absolute difference over all
    float tensors, and whether every tensor is allclose at its dtype's tolerance (integer and other
    leaves: equal)."""
    import torch
    from torch.utils._pytree import tree_leaves
    a, b = tree_leaves(out), tree_leaves(ref)
    if len(a) != len(b):
        return {"max_abs_err": None, "correct": False, "tolerance": None}
    worst, ok, tol = 0.0, True, None
    for x, y in zip(a, b):
        if not isinstance(y, torch.Tensor) or not isinstance(x, torch.Tensor):
            ok = ok and x == y
        elif x.shape != y.shape:
            ok = False
        elif not y.is_floating_point():
            ok = ok and torch.equal(x.cpu(), y.cpu())
        else:
            tol = tolerance(y.dtype, tf32)
            d = (x.detach().float() - y.detach().float()).abs()
            if d.numel() and not bool(torch.isfinite(d).all()):
                return {"max_abs_err": None, "correct": False, "tolerance": tol, "nonfinite": True}
            worst = max(worst, float(d.max()) if d.numel() else 0.0)
            ok = ok and torch.allclose(x.detach().float(), y.detach().float(), rtol=tol, atol=tol)
    return {"max_abs_err": worst, "correct": bool(ok), "tolerance": tol}


# ---- one row, in this process (the --one child) ------------------------------------------------

def _grad_mode(name: str):
    import torch
    return {"inference": torch.inference_mode, "no_grad": torch.no_grad,
            "plain": contextlib.nullcontext}[name]()


def _precision(tf32: bool):
    """TF32 off for fp32 matmuls and cuDNN convs (the fp32 tolerance assumes it), torch's settings
    back after; --tf32 leaves torch's defaults."""
    if tf32:
        return contextlib.nullcontext()
    from torch_htam.policy import tf32_switches
    return tf32_switches(False)


def _torch_compile(model, mode: str):
    import torch
    return torch.compile(model, mode=mode)


def _optimize(model, inputs, budget_s: float, mode: str):
    import torch_htam
    return torch_htam.optimize(model, inputs, torch_htam.OptimizeConfig(time_budget_s=budget_s, mode=mode))


def _clone(out):
    """A copy of an output (cudagraph arms overwrite theirs on the next call)."""
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


def measure(name: str, opts, device: str = "cuda", optimize=_optimize, compile_fn=_torch_compile,
            progress=lambda row: None) -> dict:
    """Row `name` measured in this process (the steps in the module's docstring). progress(row) is
    called with the row so far at each stage ("stage" names it), so a parent that must cut this
    process off knows how far it got. Any failure ends the row with "error"; a row that cannot be
    built here (floor_models.Unavailable) ends with "skipped"."""
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row = empty_row(name, opts.mode, opts.budget, opts.grad_mode)
    row["tf32"] = bool(opts.tf32)
    start = time.perf_counter()

    def stage(s: str) -> None:
        row["stage"], row["row_s"] = s, time.perf_counter() - start
        print(f"[bench_floor] {name}: {s} (at {row['row_s']:.0f} s)", file=sys.stderr, flush=True)
        progress(row)

    try:
        with _precision(opts.tf32):
            stage("build")
            model, inputs = floor_models.make(name, small=opts.small, device=device)
            eager = copy.deepcopy(model)                              # both copies BEFORE optimize
            compiled = compile_fn(copy.deepcopy(model), opts.mode)
            with _grad_mode(opts.grad_mode):
                row["optimize_started"] = time.time()
                stage("optimize")
                t0 = time.perf_counter()
                model = optimize(model, inputs, opts.budget, opts.mode)
                sync()
                row["optimize_s"] = time.perf_counter() - t0
                row.update(report_fields(getattr(model, "htam_report", None)))
                stage("warm")
                arms = {"eager": lambda: eager(*inputs), "compile": lambda: compiled(*inputs),
                        "ours": lambda: model(*inputs)}
                for arm in ARMS:
                    for _ in range(opts.warmup):
                        arms[arm]()
                sync()
                stage("check")
                ref = _clone(arms["eager"]())
                row.update(compare(_clone(arms["ours"]()), ref, opts.tf32))
                row.update({f"compile_{k}": v for k, v in compare(_clone(arms["compile"]()), ref, opts.tf32).items()
                            if k in ("max_abs_err", "correct")})
                del ref
                stage("time")
                row["host_cores_before"] = quiet_host()
                row.update(timed_fields(time_interleaved(arms, sync, opts.rounds, opts.calls)))
                row["stage"] = "done"
    except floor_models.Unavailable as e:
        row["skipped"] = str(e)
    except Exception:  # noqa: BLE001 - one row's failure is its row's, never the run's
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        row["error"] = last_line(text)
    row["row_s"] = time.perf_counter() - start        # the whole row in this process, for planning runs
    row.update(verdicts(row))
    return row


def _write_json(path: Path, data: dict) -> None:
    """Written whole or not at all (a process killed mid-write leaves the previous file)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


# ---- the run: each row in a child process ------------------------------------------------------

def child_command(name: str, opts, row_out: Path) -> list[str]:
    """This script, to measure row `name` alone and write it to row_out."""
    own = ["--budget", str(opts.budget), "--mode", opts.mode, "--grad-mode", opts.grad_mode,
           "--rounds", str(opts.rounds), "--calls", str(opts.calls), "--warmup", str(opts.warmup)]
    return child_args(__file__, name, opts, row_out, own + ["--tf32"] * bool(opts.tf32))


def child_args(script: str, name: str, opts, row_out: Path, own: list[str]) -> list[str]:
    """A row-per-process bench's child command line: `script` --one name --row-out row_out, the
    bench's own flags, then the CPU tests' --small and --device where set (add_child_flags)."""
    cmd = [sys.executable, str(Path(script).resolve()), "--one", name, "--row-out", str(row_out), *own]
    if opts.small:
        cmd.append("--small")
    if opts.device != "cuda":
        cmd += ["--device", opts.device]
    return cmd


def _end_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End the row's process and whatever it left running (compile workers, a search's workers):
    its process group, of which it is the leader (start_new_session). SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()                      # reap the leader, or the group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            continue
        break
    proc.wait()


def run_child(name: str, opts, timeout: float, command=child_command, lane=None) -> dict:
    """Row `name` measured by a child process (command(name, opts, row_out)), cut off after
    `timeout` seconds; with a lane (bench/lanes.py) on its GPU, cores and caches. A child that
    crashed or was cut off gives the row as far as it got, with "error" saying where; cut off in
    optimize, the row's "optimize_s_at_least" says how long optimize had run."""
    with tempfile.TemporaryDirectory(prefix="bench_floor-") as d:
        row_out = Path(d) / "row.json"
        proc = start_lane(command(name, opts, row_out), lane)
        why = None
        try:
            rc = proc.wait(timeout=timeout)
            if rc != 0:
                why = f"the row's process exited with status {rc}"
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout:.0f} s"
        finally:
            _end_group(proc)
        try:
            row = json.loads(row_out.read_text())
        except (OSError, ValueError):
            row = None
    if row is None:
        row = empty_row(name, opts.mode, opts.budget, opts.grad_mode)
        why = why or "the row's process wrote no row"
    if why is not None and row.get("stage") != "done":
        stage = row.get("stage")
        row["error"] = why + (f" in stage {stage!r}" if stage else "")
        if stage == "optimize" and row.get("optimize_started"):
            row["optimize_s_at_least"] = time.time() - row["optimize_started"]
        row.update(verdicts(row))
    return row


def failed_row(name: str, opts, exc_text: str) -> dict:
    row = empty_row(name, opts.mode, opts.budget, opts.grad_mode)
    row["error"] = last_line(exc_text)
    return row


def run_rows(names: list[str], opts, run_one, keep=lambda rows: None, failed=None, fmt=None,
             lanes: list | None = None) -> list[dict]:
    """run_one(name) -> row for each name; a row that raises is recorded with "error" and the run
    goes on. keep(rows) gets every row so far after each one (the results file is rewritten).
    failed(name, traceback text) -> row and fmt(row) -> its ROW line are the suite's (default this
    one's: failed_row, format_row); bench_serve and bench_zoo pass theirs. With lanes
    (bench/lanes.py), run_one(name, lane) runs one row per lane at once; rows keep the names'
    order, each with its "lane"."""
    failed = failed or (lambda name, text: failed_row(name, opts, text))
    fmt = fmt or format_row
    done: dict[int, dict] = {}

    def one(name: str, *lane) -> dict:
        try:
            row = run_one(name, *lane)
        except Exception:  # noqa: BLE001
            row = failed(name, traceback.format_exc())
        if lane:
            row["lane"] = lane[0].to_json()
        return row

    def finished(i: int, row: dict) -> None:
        done[i] = row
        keep([done[k] for k in sorted(done)])
        print(f"ROW {fmt(row)}", flush=True)

    if lanes:
        run_lanes(names, lanes, one, finished)
    else:
        for i, name in enumerate(names):
            finished(i, one(name))
    return [done[k] for k in sorted(done)]


# ---- summary and table -------------------------------------------------------------------------

geomean = record.geomean    # (bench_serve reads it here)


def summarize(rows: list[dict]) -> dict:
    """The run's figures: rows, how many passed each check, geomean and worst vs_compile both ways.
    all_ok: every row that was not skipped has floor_ok and within_budget true."""
    counted = [r for r in rows if not r.get("skipped")]
    out = {"rows": len(rows), "skipped": len(rows) - len(counted),
           "errors": sum(1 for r in rows if r.get("error")),
           "floor_ok": sum(1 for r in counted if r.get("floor_ok") is True),
           "within_budget": sum(1 for r in counted if r.get("within_budget") is True),
           "correct": sum(1 for r in counted if r.get("correct") is True)}
    for way in ("latency", "throughput"):
        vals = [r.get(f"vs_compile_{way}") for r in counted if r.get(f"vs_compile_{way}") is not None]
        out[f"geomean_vs_compile_{way}"] = geomean(vals)
        out[f"min_vs_compile_{way}"] = min(vals) if vals else None
    spent = [r["optimize_s"] for r in counted if r.get("optimize_s") is not None]
    out["max_optimize_s"] = max(spent) if spent else None
    out["all_ok"] = bool(counted) and all(r.get("floor_ok") is True and r.get("within_budget") is True
                                          for r in counted)
    return out


def _f(v, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "y" if v else "n"
    return format(v, fmt)


COLUMNS = [("model", "model", "s", 24), ("eager", "eager_ms_latency", ".3f", 8),
           ("compile", "compile_ms_latency", ".3f", 8), ("ours", "ours_ms_latency", ".3f", 8),
           ("vsC lat", "vs_compile_latency", ".3f", 7), ("vsC thr", "vs_compile_throughput", ".3f", 7),
           ("vsE lat", "vs_eager_latency", ".2f", 7), ("opt s", "optimize_s", ".1f", 6),
           ("budget", "within_budget", "", 6), ("floor", "floor_ok", "", 5), ("ok", "correct", "", 3),
           ("swapped", "swapped", "", 7)]


def format_row(row: dict) -> str:
    cells = [_f(row.get(k), fmt).rjust(w) if k != "model" else str(row.get(k)).ljust(w)
             for _, k, fmt, w in COLUMNS]
    tail = row.get("error") or (f"skipped: {row['skipped']}" if row.get("skipped") else row.get("report_note") or "")
    return " ".join(cells) + (f"  {tail}" if tail else "")


def format_table(rows: list[dict], summary: dict) -> str:
    """The rows (latency ms per arm, ratios, checks), then the summary."""
    head = " ".join(h.ljust(w) if k == "model" else h.rjust(w) for h, k, _, w in COLUMNS)
    lines = [head, "-" * len(head)] + [format_row(r) for r in rows]
    g = lambda k: _f(summary.get(k), ".3f")  # noqa: E731
    lines += ["", f"{summary['rows']} rows ({summary['skipped']} skipped, {summary['errors']} with errors): "
              f"floor_ok {summary['floor_ok']}, within_budget {summary['within_budget']}, "
              f"correct {summary['correct']}; geomean vs torch.compile latency {g('geomean_vs_compile_latency')}x, "
              f"throughput {g('geomean_vs_compile_throughput')}x (worst {g('min_vs_compile_latency')}x, "
              f"{g('min_vs_compile_throughput')}x); all ok: {_f(summary['all_ok'], '')}"]
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------

def parse(argv=None):
    ap = row_parser(__doc__)
    ap.add_argument("--budget", type=float, default=30.0, help="OptimizeConfig.time_budget_s (s)")
    ap.add_argument("--mode", default="default", choices=MODES, help="torch.compile mode, both arms")
    ap.add_argument("--grad-mode", default="inference", choices=GRAD_MODES,
                    help="the caller's grad mode around optimize and every call")
    ap.add_argument("--tf32", action="store_true", help="leave torch's TF32 settings (default: TF32 off)")
    add_timing_flags(ap, rounds=20)
    add_run_flags(ap, "1.1 x budget + 30 + 240")
    a = ap.parse_args(argv)
    check_rows(ap, a, floor_models.ROWS)
    return a


def row_parser(doc: str) -> argparse.ArgumentParser:
    """The parser every row-per-process bench (bench_floor, bench_serve, bench_zoo) starts from:
    its rows and --list."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="row names (default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="print the row names and exit")
    return ap


def add_timing_flags(ap: argparse.ArgumentParser, rounds: int) -> None:
    """The interleaved timing's rounds, calls and warm-up (bench_floor, bench_zoo)."""
    ap.add_argument("--rounds", type=int, default=rounds, help="interleaved timing rounds")
    ap.add_argument("--calls", type=int, default=20, help="calls per arm per round, each way")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per arm before timing")


def add_run_flags(ap: argparse.ArgumentParser, timeout_default: str) -> None:
    """--timeout (per row's process; timeout_default: its default in words), --out, --no-record,
    and the child's flags (add_child_flags)."""
    ap.add_argument("--timeout", type=float, default=None,
                    help=f"seconds per row's process (default {timeout_default})")
    ap.add_argument("--out", type=Path, default=record.RESULTS_DIR, help="results folder")
    ap.add_argument("--no-record", action="store_true", help="write no results file")
    ap.add_argument("--lanes", type=int, default=1,
                    help="rows measured at once, one per GPU (0..N-1), each on 1/N of the cores with "
                         "caches of its own (bench/lanes.py); default 1: one row at a time")
    add_child_flags(ap)


def lanes_of(opts, suite: str, gpus: int | None = None) -> list | None:
    """--lanes' lanes (bench/lanes.py), their caches under a new folder of this run; None for one.
    Each lane is one GPU, so more lanes than the GPUs this process sees (`gpus`, default
    torch.cuda.device_count()) end the run before any row: their rows would each fail minutes in,
    at "No CUDA GPUs are available"."""
    if opts.lanes <= 1:
        return None
    if gpus is None:
        import torch
        gpus = torch.cuda.device_count()
    if opts.lanes > gpus:
        raise SystemExit(f"--lanes {opts.lanes} needs {opts.lanes} GPUs, one a lane, and this host shows {gpus} "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): "
                         "run the rows one at a time (--lanes 1) or on a host with more GPUs")
    return split_lanes(opts.lanes, tempfile.mkdtemp(prefix=f"{suite}-lanes-"))


def add_child_flags(ap: argparse.ArgumentParser) -> None:
    """The child's (--one NAME --row-out FILE) and the CPU tests' flags, for every bench that
    measures each row in a process of its own (bench_floor, bench_serve, bench_zoo)."""
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--row-out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true", help=argparse.SUPPRESS)


def handled(a, models, measure, bench: str) -> int | None:
    """What every row-per-process bench does before its rows: --list (models.ROWS with
    models.describe), the child's --one NAME (measure(name, opts, device=, progress=) of that row,
    written to --row-out at every stage, so a child killed by its time limit leaves its row so far,
    or printed when run by hand), or no CUDA GPU. The exit code, or None: measure the rows."""
    if a.list:
        width = max(map(len, models.ROWS)) + 2
        for name in models.ROWS:
            print(f"{name:{width}} {models.describe(name)}")
        return 0
    if a.one is not None:
        keep = (lambda row: _write_json(a.row_out, row)) if a.row_out else (lambda row: None)
        row = measure(a.one, a, device=a.device, progress=keep)
        keep(row)
        if a.row_out is None:
            print(json.dumps(jsonable(row)), flush=True)
        return 0
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"{bench} needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    return None


def check_rows(ap: argparse.ArgumentParser, a, rows) -> None:
    """An argparse error naming each row asked for (positional or --one) that `rows` lacks."""
    unknown = [n for n in a.models + ([a.one] if a.one else []) if n not in rows]
    if unknown:
        ap.error(f"unknown row(s) {', '.join(unknown)}; see --list")


def main(argv=None) -> int:
    a = parse(argv)
    if (code := handled(a, floor_models, measure, "bench_floor")) is not None:
        return code
    names = a.models or list(floor_models.ROWS)
    timeout = a.timeout if a.timeout is not None else default_timeout(a.budget)
    path = None

    def keep(rows: list) -> None:
        nonlocal path
        if not a.no_record:
            path = record.write(SUITE, {
                "budget_s": a.budget, "budget_limit_s": budget_limit(a.budget), "mode": a.mode,
                "grad_mode": a.grad_mode, "tf32": a.tf32, "floor": FLOOR, "rounds": a.rounds,
                "calls": a.calls, "warmup": a.warmup, "row_timeout_s": timeout, "lanes": a.lanes,
                "summary": summarize(rows), "rows": rows}, results_dir=a.out, path=path)

    rows = run_rows(names, a, lambda name, lane=None: run_child(name, a, timeout, lane=lane), keep,
                    lanes=lanes_of(a, SUITE))
    print("\n" + format_table(rows, summarize(rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
