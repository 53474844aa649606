"""1 GPU vs 2 GPUs through Ray for the same tasks: the fleet search of one model's tasks, timed.

Run each arm in its own process with its own empty cache (so no arm reuses another's builds or
kernels), on the same machine, one after the other:

    HTAM_CACHE_DIR=/tmp/c-w1 python3 ray_scaling.py examples/gpt_block.py --pool worker --gpus 1 --out w1.json
    HTAM_CACHE_DIR=/tmp/c-r1 python3 ray_scaling.py examples/gpt_block.py --gpus 1 --out r1.json
    HTAM_CACHE_DIR=/tmp/c-r2 python3 ray_scaling.py examples/gpt_block.py --gpus 2 --out r2.json

--pool worker: the single-host WorkerPool on the first --gpus GPUs (the Ray overhead baseline).
--gpus N with Ray: ray.init(num_gpus=N) so the pool gets N actors; N searches run at once.
CPU smoke test: --num-gpus 0 --runner test_ray:job (from tests/, PYTHONPATH=tests).
"""
import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--pool", choices=("ray", "worker"), default="ray")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--max-tasks", type=int, default=None)
    ap.add_argument("--num-gpus", type=float, default=1, help="per actor; 0: CPU smoke test")
    ap.add_argument("--runner", default=None, help="stand-in runner for a CPU smoke test")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from torch_htam import fleet, gpu as gpu_mod
    from torch_htam.config import OptimizeConfig
    from torch_htam.extract import extract
    from torch_htam.modelspec import load_model_spec
    device = "cuda" if a.num_gpus > 0 else "cpu"
    model, inputs = load_model_spec(a.model, device)
    found = extract(model, tuple(inputs))
    tasks = found.tasks[: a.max_tasks]
    info = gpu_mod.detect()
    arch = info.arch if info else os.environ.get("HTAM_ARCH", "sm_90a")
    cfg = OptimizeConfig(steps=a.steps, candidates_per_step=a.candidates)
    kw = {"runner": a.runner} if a.runner else {}

    t0 = time.monotonic()
    if a.pool == "worker":
        from torch_htam.worker import WorkerPool
        pool = WorkerPool(devices=[str(i) for i in range(a.gpus)] if a.num_gpus > 0 else [None] * a.gpus, **kw)
    else:
        import ray
        from torch_htam.ray_pool import RayPool
        ray.init(num_gpus=a.gpus if a.num_gpus > 0 else 0, include_dashboard=False)
        pool = (RayPool(arch=arch, **kw) if a.num_gpus > 0 else
                RayPool(n=a.gpus, num_gpus=0, cpus_per_worker=0, **kw))
    start_s = time.monotonic() - t0
    from torch_htam.pipeline import _examples
    with _examples(found, tasks):
        search = fleet.searcher(arch, cfg, pool, gpu=info)
        prog = fleet.precompile_fleet({"m": tasks}, search, lambda m, k: None, None, parallel=a.gpus, arch=arch)
    pool.close()
    res = {"pool": a.pool, "gpus": a.gpus, "device": info.name if info else "cpu", "tasks": len(tasks),
           "pool_start_s": round(start_s, 2), "phases": prog.data["phases"], "counts": prog.counts(),
           "per_task": {r["name"] + ":" + s[:8]: {k: r.get(k) for k in ("kept", "speedup", "stop", "seconds")}
                        for s, r in prog.data["tasks"].items()}}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("pool", "gpus", "device", "tasks", "pool_start_s", "phases", "counts")}))


if __name__ == "__main__":
    sys.exit(main())
