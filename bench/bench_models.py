"""End-to-end: eager, torch.compile and torch_htam on real architectures, side by side.

    python3 bench/bench_models.py gpt2:fp32 gpt2:bf16 resnet50:fp32 [--budget 120] [--steps 1] [--arms eager,compile,htam]
    python3 bench/bench_models.py gpt2:bf16 --split-modes    # each mode's arms in a process of its own

Each model is timed in this one process, every arm interleaved on the same inputs
(torch_htam.benchmark.ARMS: eager, torch.compile default and reduce-overhead, torch_htam replay,
torch_htam inside Inductor default and reduce-overhead); with --split-modes, each mode's arms in a
child process of their own, with eager beside them, and each ratio within one process (merge()).
The search budget per model is small here (the point is the end-to-end effect of what the built-in
proposer finds); kernels land in the cache, so a second run measures the warm path. Writes the
run's raw figures to bench/results/bench_models-<date>.json (bench/record.py): suite "bench_models",
budget_s, steps, iters, rows = one dict per model (data()).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
import record  # noqa: E402
from torch_htam.benchmark import ARMS, bench_model, format_table  # noqa: E402
from torch_htam.pipeline import OptimizeConfig  # noqa: E402
from torch_htam.timing import paired_ratio  # noqa: E402


def data(name: str, res) -> dict:
    """One model's row as measured: the ratios the issue asks for, then every arm's figures.

    vs_compile: torch.compile default ms / ours (torch_htam inside Inductor, default) ms;
    vs_compile_ro: the same in reduce-overhead mode; vs_eager: eager ms / ours (default) ms;
    vs_compile_paired, vs_compile_ro_paired: the same by rounds (timing.paired_ratio), which a
    noisy host moves less;
    max_rel_err: the worst relative error of our arms against eager on the example inputs;
    fresh_rel_err, batch2_rel_err: the same on fresh values and at a second batch size;
    within_policy: all three within tolerance (benchmark.end_to_end_tolerance).
    """
    from dataclasses import asdict
    a = res.arms
    ratio = lambda x, y: a[x].median_ms / a[y].median_ms if x in a and y in a else None  # noqa: E731
    paired = lambda x, y: paired_ratio(a[x].round_ms, a[y].round_ms) if x in a and y in a else None  # noqa: E731
    row = {"model": name, "device": res.device,
           "vs_compile": ratio("compile", "htam"), "vs_compile_ro": ratio("compile_ro", "htam_ro"),
           "vs_compile_paired": paired("compile", "htam"), "vs_compile_ro_paired": paired("compile_ro", "htam_ro"),
           "vs_eager": ratio("eager", "htam"), "replay_vs_eager": ratio("eager", "htam_replay"),
           "ms": {k: v.median_ms for k, v in a.items()}, "setup_s": {k: v.setup_s for k, v in a.items()},
           "swapped": res.swapped_by_arm, "tasks": len(res.tasks), "note": res.note,
           "arms": {k: asdict(v) for k, v in a.items()}, "rel_err": dict(res.max_rel_err),
           "check_rel_err": res.check_err, "tolerance": res.tolerance, "task_rows": res.tasks}
    return {**row, **verdict(row)}


OURS = ("htam", "htam_ro", "htam_replay")


def verdict(row: dict) -> dict:
    """The row's error figures over our arms, and whether all are within its tolerance."""
    worst = lambda errs: max((e for k, e in errs.items() if k in OURS), default=None)  # noqa: E731
    out = {"max_rel_err": worst(row["rel_err"])}
    for label in ("fresh", "batch2"):
        out[f"{label}_rel_err"] = worst(row.get("check_rel_err", {}).get(label, {}))
    errs = [e for e in out.values() if e is not None]
    tol = row.get("tolerance")
    out["within_policy"] = None if tol is None or not errs else max(errs) <= tol
    return out


# --split-modes: the arms each process times, eager (the reference) in each.
MODE_ARMS = (("eager", "compile", "htam_replay", "htam"), ("eager", "compile_ro", "htam_ro"))


def merge(rows: list[dict]) -> dict:
    """One model's row from rows timed in separate processes (--split-modes): each arm as the
    process that timed it measured it (eager: the first process's), each ratio from the process
    that timed both of its arms, the worst errors of all."""
    out = dict(rows[0])
    for key in ("ms", "setup_s", "swapped", "arms", "rel_err"):
        out[key] = {k: v for r in reversed(rows) for k, v in r[key].items()}   # the first row's last
    for key in ("vs_compile", "vs_compile_ro", "vs_compile_paired", "vs_compile_ro_paired", "vs_eager",
                "replay_vs_eager"):
        out[key] = next((r[key] for r in rows if r.get(key) is not None), None)
    out["check_rel_err"] = {label: {k: v for r in rows for k, v in r.get("check_rel_err", {}).get(label, {}).items()}
                            for label in ("fresh", "batch2")}
    out.update(verdict(out))
    out["processes"] = [list(r["ms"]) for r in rows]
    return out


def _in_process(spec: str, arms: tuple, a) -> dict:
    """One model benched in this process: its table printed, its row returned."""
    name, dtype = spec.split(":")
    t0 = time.perf_counter()
    model, inputs = models.MODELS[name](dtype)
    cfg = OptimizeConfig(steps=a.steps, time_budget_s=a.budget, progress=False)
    res = bench_model(model, inputs, spec, cfg, iters=a.iters, arms=arms)
    print(format_table(res), f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
    del model, inputs
    torch.cuda.empty_cache()
    return data(spec, res)


def _in_children(spec: str, arms: tuple, a, keep=lambda row: None) -> dict:
    """One model benched by one child process per mode (MODE_ARMS), their rows merged. keep(row)
    gets the merged row after each child, so a run cut during a later mode keeps the earlier ones."""
    rows = []
    for group in MODE_ARMS:
        mine = [x for x in group if x in arms]
        if len(mine) < 2:
            continue
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "row.json"
            subprocess.run([sys.executable, __file__, spec, "--arms", ",".join(mine), "--budget", str(a.budget),
                            "--steps", str(a.steps), "--iters", str(a.iters), "--no-record",
                            "--row-out", str(out)], check=True)
            rows.append(json.loads(out.read_text()))
        keep(merge(rows))
    return merge(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["gpt2:fp32", "gpt2:bf16", "resnet50:fp32"])
    ap.add_argument("--budget", type=float, default=120.0, help="search seconds per model")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--iters", type=int, default=100, help="timed calls per arm (host-bound models need many)")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"comma-separated arms to time (default: all of {','.join(ARMS)})")
    ap.add_argument("--split-modes", action="store_true",
                    help="time each torch.compile mode's arms in a process of its own (MODE_ARMS)")
    ap.add_argument("--row-out", type=Path, default=None, help=argparse.SUPPRESS)   # --split-modes' children
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    a = ap.parse_args()
    arms = tuple(x for x in a.arms.split(",") if x)
    if "eager" not in arms or not set(arms) <= set(ARMS):
        ap.error(f"--arms: a subset of {','.join(ARMS)} with eager in it (the reference)")
    if not torch.cuda.is_available():
        print("bench_models needs a CUDA GPU", file=sys.stderr)
        return 2
    raw, path = [], None

    def keep(rows: list) -> None:
        # NOTE: written after every model (and every mode's child), so a cut run keeps what it measured
        nonlocal path
        if not a.no_record:
            path = record.write("bench_models", {"budget_s": a.budget, "steps": a.steps, "iters": a.iters,
                                                 "arms": list(arms), "split_modes": a.split_modes,
                                                 "proposer": "expert", "rows": rows}, path=path)

    for spec in a.models:
        if a.split_modes:
            r = _in_children(spec, arms, a, keep=lambda row: keep(raw + [row]))
        else:
            r = _in_process(spec, arms, a)
        raw.append(r)
        if a.row_out is not None:
            a.row_out.write_text(json.dumps(r))
        # a run cut by a time limit still shows its rows
        print(f"ROW {spec} vs_compile={r['vs_compile']} vs_compile_ro={r['vs_compile_ro']} "
              f"vs_eager={r['vs_eager']} max_rel_err={r['max_rel_err']}", flush=True)
        keep(raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
