"""End-to-end: eager vs torch.compile vs torch_htam on real architectures (issue 8).

    python3 bench/bench_models.py gpt2:fp32 gpt2:bf16 resnet50:fp32 [--budget 120] [--steps 1]

Each model is timed in this one process, all three arms on the same inputs (torch_htam.benchmark).
The search budget per model is small here (the point is the end-to-end effect of what the built-in
proposer finds); kernels land in the cache, so a second run measures the warm path. Writes the
run's raw figures to bench/results/bench_models-<date>.json (bench/record.py): suite "bench_models",
budget_s, steps, iters, rows = one dict per model (data()).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
import record  # noqa: E402
from torch_htam.benchmark import bench_model, format_table  # noqa: E402
from torch_htam.pipeline import OptimizeConfig  # noqa: E402


def row(name: str, res) -> str:
    """One markdown row. With nothing swapped the optimized model runs its original forward, so
    its ratio to eager is noise and the row says "same forward" instead."""
    a = res.arms
    e, c, h = a["eager"], a["compile"], a["htam"]
    vs_eager = f"{e.median_ms / h.median_ms:.2f}x" if res.swapped else "same forward"
    return (f"| {name} | {e.median_ms:.2f} | {c.median_ms:.2f} | {h.median_ms:.2f} | "
            f"{vs_eager} | {c.median_ms / h.median_ms:.2f}x | "
            f"{res.swapped}/{len(res.tasks)} | {h.setup_s:.0f} | {res.max_rel_err.get('htam', 0):.1e} | "
            f"{res.fallback_calls} |")


def data(name: str, res) -> dict:
    """One model's figures as measured: per arm median / p20 / p80 ms and setup seconds, tasks
    swapped, max relative error per arm, fallback calls, and the per-task table of the report."""
    from dataclasses import asdict
    a = res.arms
    e, c, h = a["eager"], a["compile"], a["htam"]
    return {"model": name, "device": res.device, "eager_ms": e.median_ms, "compile_ms": c.median_ms,
            "htam_ms": h.median_ms,
            # with nothing swapped the ratio to eager is noise: None (see row())
            "vs_eager": e.median_ms / h.median_ms if res.swapped else None,
            "vs_compile": c.median_ms / h.median_ms, "swapped": res.swapped, "tasks": len(res.tasks),
            "optimize_s": h.setup_s, "compile_s": c.setup_s, "rel_err": res.max_rel_err.get("htam", 0.0),
            "fallbacks": res.fallback_calls, "note": res.note,
            "arms": {k: asdict(v) for k, v in a.items()}, "max_rel_err": dict(res.max_rel_err),
            "task_rows": res.tasks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["gpt2:fp32", "gpt2:bf16", "resnet50:fp32"])
    ap.add_argument("--budget", type=float, default=120.0, help="search seconds per model")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_models needs a CUDA GPU", file=sys.stderr)
        return 2
    rows, raw = [], []
    for spec in a.models:
        name, dtype = spec.split(":")
        t0 = time.perf_counter()
        model, inputs = models.MODELS[name](dtype)
        cfg = OptimizeConfig(steps=a.steps, time_budget_s=a.budget, progress=False)
        res = bench_model(model, inputs, spec, cfg, iters=a.iters)
        print(format_table(res), f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
        rows.append(row(spec, res))
        raw.append(data(spec, res))
        print("ROW " + rows[-1], flush=True)     # a run cut by a time limit still shows its rows
        del model, inputs
        torch.cuda.empty_cache()
    head = ("| model | eager ms | compile ms | htam ms | vs eager | vs compile | tasks swapped | "
            "optimize s | rel err | fallbacks |\n|---|---|---|---|---|---|---|---|---|---|")
    table = head + "\n" + "\n".join(rows)
    print(table)
    if not a.no_record:
        record.write("bench_models", {"budget_s": a.budget, "steps": a.steps, "iters": a.iters,
                                      "proposer": "expert", "rows": raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
