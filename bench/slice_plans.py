"""What a new batch size costs a served conv kernel, planned per batch size or per slice.

ResNet-50's costliest conv regions (bf16, batch declared 1-64, example 32, bench/serve_models.py)
each get the expert's default kernel built twice: for the static task (cuDNN plans one entry per
batch size it meets) and for the ranged task (the batch runs in slices of planned sizes,
batch_slice.cuh, and runtime.preplan plans those when the kernel is swapped in). Each kind in a
process of its own, after an eager warm-up conv (cuDNN's own start-up is nobody's first call):

  first_ms   each batch 1..64's first call (ms, synced): the static kernel's, and the ranged
             kernel's after preplan (preplan_ms: what preplan took, once, at load)
  kernel_ms  the median of 20 CUDA-event-timed calls once planned, at the example (32, one slice)
             and at batches cut into several slices (37 = 32 + 4 + 1, 63 = 48 + 12 + 3)

    python3 bench/slice_plans.py --tasks 3

Writes bench/results/slice_plans-<date>.json. GPU machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import record  # noqa: E402
import serve_models  # noqa: E402

SUITE = "slice_plans"
SIZES = range(1, 65)
TIMED = (32, 37, 63)


def first_calls(kernel, sets: dict) -> list[float]:
    """Each size's first call, ms (synced)."""
    import torch
    out = []
    for n in SIZES:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        code = kernel(*sets[n])
        torch.cuda.synchronize()
        out.append(round((time.perf_counter() - t0) * 1e3, 3) if code == 0 else None)
    return out


def kernel_ms(kernel, sets: dict) -> dict[int, float]:
    """Median of 20 CUDA-event-timed calls at each TIMED size (planned by then)."""
    import torch
    res = {}
    for n in TIMED:
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            kernel(*sets[n])
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        res[n] = round(statistics.median(times), 4)
    return res


def probe(kind: str, n_tasks: int) -> list[dict]:
    """In this process: the costliest n_tasks conv tasks' default kernels of one kind ("static"
    or "ranged") built, then each one's first calls and kernel times."""
    import torch
    from torch_htam import build, runtime, verify
    from torch_htam.extract import extract
    from torch_htam.launcher import Kernel
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import ProposalRequest
    from torch_htam.proposers.expert import ExpertProposer
    model, example, dynamic, _ = serve_models.make("resnet50:bf16")
    with torch.inference_mode():
        tasks = [t for t in extract(model, example, dynamic=dynamic).tasks if t.kind == "conv"][:n_tasks]
        torch.nn.functional.conv2d(example[0], torch.randn(8, 3, 3, 3, device="cuda", dtype=example[0].dtype))
    rows = []
    for ranged in tasks:
        task = ranged if kind == "ranged" else static_of(ranged)
        req = ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))
        (b,) = build.build_many([ExpertProposer().propose(req).candidates[0].source])
        gen = torch.Generator().manual_seed(0)
        sets = {n: verify.make_set(ranged, verify.shapes_at(ranged, n), gen, "cuda") for n in SIZES}
        kernel = Kernel(b.so_path)
        row = {"task": task.name, "signature": ranged.signature, "x": list(task.inputs[0].shape)}
        if kind == "ranged":
            t0 = time.perf_counter()   # the bucket as a kept one reads: [input, dim, low, high]
            row["preplan_sizes"] = runtime.preplan(kernel, ranged, [[0, 0, 1, 64]])
            row["preplan_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        row.update(first_ms=first_calls(kernel, sets), kernel_ms=kernel_ms(kernel, sets))
        rows.append(row)
    return rows


def static_of(task):
    """The task at its example's sizes alone (no dynamic dims, no ranges)."""
    def fixed(specs):
        return [dataclasses.replace(s, dynamic=(), ranges=()) for s in specs]
    return dataclasses.replace(task, inputs=fixed(task.inputs), outputs=fixed(task.outputs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=3, help="the costliest conv tasks of ResNet-50 measured")
    ap.add_argument("--probe", choices=("static", "ranged"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=record.RESULTS_DIR)
    a = ap.parse_args()
    if a.probe:
        print(json.dumps(probe(a.probe, a.tasks)))
        return 0
    # NOTE: each kind in a fresh process: cuDNN keeps the kernels its runtime-fusion engines
    # compiled for the process, so a second library planning the same conv would reuse them
    runs = {}
    for kind in ("static", "ranged"):
        run = subprocess.run([sys.executable, __file__, "--probe", kind, "--tasks", str(a.tasks)],
                             capture_output=True, text=True, check=False)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        runs[kind] = json.loads(run.stdout.strip().splitlines()[-1])
    rows = [{"task": s["task"], "signature": s["signature"], "x": s["x"], "static": s, "ranged": r}
            for s, r in zip(runs["static"], runs["ranged"])]
    for r in rows:
        firsts = {k: [v for v in r[k]["first_ms"] if v is not None] for k in ("static", "ranged")}
        print(r["task"], r["x"], "| first call ms (median, max): static",
              statistics.median(firsts["static"]), max(firsts["static"]), "ranged", statistics.median(firsts["ranged"]),
              max(firsts["ranged"]), "after a preplan of", r["ranged"]["preplan_ms"], "ms | kernel ms static",
              r["static"]["kernel_ms"], "ranged", r["ranged"]["kernel_ms"], flush=True)
    record.write(SUITE, {"rows": rows}, results_dir=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
