"""Each verified kernel alone inside torch.compile's graph, against torch.compile alone.

    python3 bench/bench_swaps.py gpt2:bf16 [--budget 60] [--mode reduce-overhead]
    python3 bench/bench_swaps.py resnet50:bf16 --nchw --no-each  # layout optimization off; no per-kernel rows

Fills the cache with a replay-mode search (no Inductor bar, so every kernel that beats eager is
there), then compiles the model once per kernel with only that kernel swapped in (plus once with
all and once with none), times every variant interleaved, and profiles none vs all (device time
per call and the top kernels). Tells which swapped regions cost the compiled model time and why:
wall ms far above device ms means the compiled model is host-bound (the launches, not the kernels,
set its pace), and in reduce-overhead mode "cudagraph skips" counts graphs Inductor ran without
CUDA graphs. Writes bench/results/bench_swaps-<date>.json: suite "bench_swaps", model, mode, rows
(one per variant: variant, swapped sites, ms, p20, p80, vs_compile, device ms, cudagraph skips, the
kernel's eager and Inductor speedups as cached), profile (none and all: top kernels). --nchw adds
"none, nchw" and "all, nchw": Inductor's layout optimization off, so a conv net stays in the NCHW
layout our kernels were verified for (does Inductor's channels-last layout cost copies around our
kernels?).
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_zoo  # noqa: E402
import models  # noqa: E402
import record  # noqa: E402
import torch_htam  # noqa: E402
from torch_htam import gpu, inductor  # noqa: E402
from torch_htam.cache import KernelCache  # noqa: E402
from torch_htam.extract import extract  # noqa: E402
from torch_htam.pipeline import OptimizeConfig  # noqa: E402
from torch_htam.policy import why_not  # noqa: E402
from torch_htam.timing import time_many  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


def kernel_diff(base: dict, other: dict) -> list[dict]:
    """Per kernel name, other's device ms and launches per call less base's, the largest change
    first: what swapping kernels in added around them (copies, layout changes) and took away."""
    a = {x["name"]: x for x in base["all"]}
    b = {x["name"]: x for x in other["all"]}
    out = [{"name": n, "ms_delta": b.get(n, {}).get("ms", 0.0) - a.get(n, {}).get("ms", 0.0),
            "launches_delta": b.get(n, {}).get("launches", 0.0) - a.get(n, {}).get("launches", 0.0)}
           for n in {*a, *b}]
    return sorted(out, key=lambda x: -abs(x["ms_delta"]))


def profile(fn, inputs, calls: int = 5, top: int = 8) -> dict:
    """Device ms per call and the top kernels by device time (name, ms per call, launches per
    call), and every kernel ("all") for kernel_diff."""
    from torch.profiler import ProfilerActivity, profile as prof
    with torch.inference_mode(), prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    rows = [e for e in p.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows) / calls / 1e3
    every = [{"name": e.key[:90], "ms": e.self_device_time_total / calls / 1e3, "launches": e.count / calls}
             for e in rows]
    return {"device_ms": total, "top": every[:top], "all": every}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="gpt2:bf16")
    ap.add_argument("--budget", type=float, default=60.0, help="search seconds")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--mode", default="default", choices=inductor.MODES, help="torch.compile's mode")
    ap.add_argument("--nchw", action="store_true",
                    help="also: none and all with Inductor's layout optimization off (conv nets: "
                         "Inductor computes in channels-last, our kernels take the captured NCHW)")
    ap.add_argument("--no-each", action="store_true",
                    help="only none and all (a conv net holds dozens of kernels: one compile each)")
    ap.add_argument("--inductor-bar", action="store_true",
                    help="search as optimize does in --mode (compile=True) and keep only the kernels "
                         "that beat Inductor's code for their region (default: a replay-mode search, "
                         "every kernel that beats eager)")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_swaps needs a CUDA GPU", file=sys.stderr)
        return 2
    name, dtype = a.model.split(":")
    model, inputs = (model_zoo.make(a.model) if name in model_zoo.MODELS else models.MODELS[name](dtype))
    with torch.inference_mode():
        torch_htam.optimize(copy.deepcopy(model), inputs, OptimizeConfig(
            steps=1, time_budget_s=a.budget, progress=False, compile=a.inductor_bar, mode=a.mode))
    found = extract(model, inputs)
    cache = KernelCache(gpu.detect().arch)
    kernels = {t.signature: e for t in found.tasks
               if why_not(e := cache.get(t.signature), t, against_inductor=a.inductor_bar) is None}
    label = {t.signature: f"{t.name} x{t.count} {t.signature[:8]}" for t in found.tasks}
    fns, backends = {"none": inductor.compile_with(model, None, a.mode)}, {}
    each = [] if a.no_each else [(label[s], {s: e}) for s, e in kernels.items()]
    for variant, subset in [*each, ("all", kernels)]:
        backends[variant] = b = inductor.HtamBackend(subset, a.mode)
        fns[variant] = inductor.compile_with(model, b)
    if a.nchw:
        off = {"layout_optimization": False}
        fns["none, nchw"] = inductor.compile_with(model, None, a.mode, options=off)
        backends["all, nchw"] = b = inductor.HtamBackend(kernels, a.mode, options=off)
        fns["all, nchw"] = inductor.compile_with(model, b)
    skips = {}
    with torch.inference_mode():
        for variant, fn in fns.items():
            t0, before = time.perf_counter(), counters["inductor"]["cudagraph_skips"]
            fn(*inputs)
            skips[variant] = counters["inductor"]["cudagraph_skips"] - before
            print(f"compiled {variant} in {time.perf_counter() - t0:.0f} s "
                  f"({skips[variant]} cudagraph skips)", flush=True)
    arms = time_many(fns, inputs, a.iters, rounds=4)
    prof = {k: profile(fn, inputs) for k, fn in fns.items()}
    base = arms["none"].median_ms
    rows = []
    for variant, t in arms.items():
        sig = next((s for s in kernels if label[s] == variant), None)
        ev = kernels[sig].record.get("evaluation", {}) if sig else {}
        rows.append({"variant": variant, "ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                     "vs_compile": base / t.median_ms, "device_ms": prof[variant]["device_ms"],
                     "cudagraph_skips": skips[variant],
                     "swapped": sum(len(r.swapped) for r in backends[variant].records) if variant in backends else 0,
                     "eager_speedup": ev.get("speedup"), "inductor_speedup": ev.get("compile_speedup")})
        print(f"{variant:60} {t.median_ms:8.3f} ms  {base / t.median_ms:5.2f}x of torch.compile, "
              f"{prof[variant]['device_ms']:.3f} ms of device time", flush=True)
    prof = {k: prof[k] for k in ("none", "all", "none, nchw", "all, nchw") if k in prof}
    for k, p in prof.items():
        print(f"profile {k}: {p['device_ms']:.3f} ms of device time per call; top: "
              + "; ".join(f"{x['name'][:40]} {x['ms']:.3f} ms x{x['launches']:.0f}" for x in p["top"][:4]))
    diff = {k: kernel_diff(prof["none"], prof[k]) for k in prof if k != "none"}
    for k, d in diff.items():
        print(f"device time per call, {k} against none: " + "; ".join(
            f"{x['name'][:50]} {x['ms_delta']:+.3f} ms ({x['launches_delta']:+.0f} launches)" for x in d[:8]))
    if not a.no_record:
        record.write("bench_swaps", {"model": a.model, "mode": a.mode, "budget_s": a.budget, "iters": a.iters,
                                     "inductor_bar": a.inductor_bar, "rows": rows, "profile": prof,
                                     "profile_diff": diff})
    return 0


if __name__ == "__main__":
    sys.exit(main())
