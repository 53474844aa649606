"""Search and precompile on 1 GPU vs N GPUs through Ray: the same models' tasks, the same budgets.

Each arm is its own process with its own empty cache (no arm reuses another's builds, kernels or
HTG experience), run one after the other on the same machine. An arm captures every model, then
times the fleet search (fleet.precompile_fleet over the distinct tasks of all models, each searched
once) on a Ray cluster started with that many GPUs, one search per GPU at once:

    python3 bench/bench_ray.py gpt_block:bf16 resnet18:bf16 mlp_mixer:fp32 gqa_decoder:bf16 --gpus 1 2

Models are bench/floor_models.py rows (seeded). Writes bench/results/bench_ray-<date>.json: per
arm the wall time of the search phase (the Ray cluster's start and the captures are reported
beside it, not in it), tasks, kernels kept; top level "wall_1gpu_s", "wall_2gpu_s" (the first two
arms' GPU counts), "speedup" and the tasks whose verdict differs between the arms.
CPU smoke test: --cpu-workers N --runner test_ray:job (PYTHONPATH=tests; jobs on Ray CPU actors).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

SUITE = "bench_ray"


def arm(a) -> dict:
    """One arm in this process: capture, start Ray with a.arm GPUs, search every distinct task."""
    import floor_models
    from torch_htam import fleet, gpu as gpu_mod
    from torch_htam.config import OptimizeConfig
    from torch_htam.extract import extract
    cpu = a.cpu_workers > 0
    t0 = time.monotonic()
    models = {}
    for name in a.models:
        model, inputs = floor_models.make(name, small=cpu, device="cpu" if cpu else "cuda")
        models[name] = extract(model, tuple(inputs))
    capture_s = time.monotonic() - t0
    info = gpu_mod.detect()
    arch = info.arch if info else os.environ.get("HTAM_ARCH", "sm_90a")
    cfg = OptimizeConfig(steps=a.steps, candidates_per_step=a.candidates)
    tasks = {name: found.tasks[: a.max_tasks] for name, found in models.items()}

    import ray
    from torch_htam.ray_pool import RayPool
    t0 = time.monotonic()
    kw = {"runner": a.runner} if a.runner else {}
    if cpu:
        ray.init(num_cpus=a.cpu_workers + 2, num_gpus=0, include_dashboard=False)
        pool = RayPool(n=a.cpu_workers, num_gpus=0, cpus_per_worker=1, **kw)
    else:
        ray.init(num_gpus=a.arm, include_dashboard=False)
        pool = RayPool(arch=arch, **kw)
    start_s = time.monotonic() - t0
    try:
        with _examples_of(models, tasks):
            search = fleet.searcher(arch, cfg, pool, gpu=info)
            t0 = time.monotonic()
            prog = fleet.precompile_fleet(tasks, search, lambda m, k: None, None,
                                          parallel=len(pool.workers), arch=arch)
            wall = time.monotonic() - t0
    finally:
        pool.close()
        ray.shutdown()
    per_task = {s: {k: r.get(k) for k in ("name", "kept", "speedup", "stop", "seconds")}
                for s, r in prog.data["tasks"].items()}
    return {"gpus": a.arm, "workers": len(pool.workers), "device": info.name if info else "cpu",
            "wall_s": round(wall, 2), "ray_start_s": round(start_s, 2), "capture_s": round(capture_s, 2),
            "tasks": len(per_task), "kept": sum(bool(r["kept"]) for r in per_task.values()),
            "counts": prog.counts(), "per_task": per_task}


def _examples_of(models: dict, tasks: dict):
    """Every model's real inputs for verification (Task.example), for the whole search."""
    import contextlib
    from torch_htam.pipeline import _examples
    stack = contextlib.ExitStack()
    for name, found in models.items():
        stack.enter_context(_examples(found, tasks[name]))
    return stack


def compare(arms: list[dict]) -> dict:
    """The first two arms side by side: wall times, speedup, and every task whose verdict differs."""
    a, b = arms[0], arms[1]
    differ = []
    for sig, ra in a["per_task"].items():
        rb = b["per_task"].get(sig, {})
        if bool(ra["kept"]) != bool(rb.get("kept")):
            differ.append({"task": ra["name"], "signature": sig, f"kept_{a['gpus']}gpu": ra["kept"],
                           f"kept_{b['gpus']}gpu": rb.get("kept"), f"speedup_{a['gpus']}gpu": ra["speedup"],
                           f"speedup_{b['gpus']}gpu": rb.get("speedup")})
    return {f"wall_{a['gpus']}gpu_s": a["wall_s"], f"wall_{b['gpus']}gpu_s": b["wall_s"],
            "speedup": round(a["wall_s"] / b["wall_s"], 3) if b["wall_s"] else None,
            "same_kept": not differ, "kept_differs": differ}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="bench/floor_models.py rows, e.g. gpt_block:bf16")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="one arm per count, in order")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--max-tasks", type=int, default=None, help="per model, costliest first")
    ap.add_argument("--cpu-workers", type=int, default=0, help="CPU smoke test: Ray CPU actors")
    ap.add_argument("--runner", default=None, help="a stand-in job runner (CPU smoke test)")
    ap.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=record.RESULTS_DIR, help="results folder")
    a = ap.parse_args()
    if a.arm is not None:
        Path(a.arm_out).write_text(json.dumps(arm(a)))
        return 0
    arms, path = [], None
    payload = {"models": a.models, "steps": a.steps, "candidates": a.candidates, "max_tasks": a.max_tasks}
    with tempfile.TemporaryDirectory(prefix="bench_ray_") as tmp:
        for n in a.gpus:
            out = Path(tmp) / f"arm{n}.json"
            env = dict(os.environ, HTAM_CACHE_DIR=str(Path(tmp) / f"cache{n}"))
            cmd = [sys.executable, __file__, *a.models, "--arm", str(n), "--arm-out", str(out),
                   "--steps", str(a.steps), "--candidates", str(a.candidates),
                   "--cpu-workers", str(a.cpu_workers)]
            cmd += ["--max-tasks", str(a.max_tasks)] if a.max_tasks else []
            cmd += ["--runner", a.runner] if a.runner else []
            subprocess.run(cmd, env=env, check=True)
            arms.append(json.loads(out.read_text()))
            print(json.dumps({k: arms[-1][k] for k in ("gpus", "workers", "wall_s", "ray_start_s",
                                                       "tasks", "kept")}), flush=True)
            summary = compare(arms) if len(arms) >= 2 else {}
            # after every arm: a run cut short keeps the arms it measured
            path = record.write(SUITE, {**payload, **summary, "arms": arms}, results_dir=a.out, path=path)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
