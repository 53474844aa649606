"""Where a zoo model's GPU time goes under torch.compile and under ours with our kernels in (issue #34).

Per-region timings said our kernels beat Inductor's code for their regions (1.1-3x) on ResNet-18,
ResNet-50 and MobileNetV3 bf16, yet the whole model with them in ran no faster than torch.compile
in reduce-overhead mode (zoo-20261130-051953, -052802). This names the difference kernel by kernel:

  compile  torch.compile(model, mode=--mode)
  ours     torch_htam.optimize(model, inputs, OptimizeConfig(time_budget_s=--budget, mode=--mode,
           check_end_to_end=False)): every kernel that beat Inductor's code for its region, in,
           whatever the whole model's time (the arm the decision would time against compile)

Both warmed, then timed interleaved (bench_floor.time_interleaved: synced latency and back-to-back
ms a call), then each profiled over --calls calls (torch.profiler, CUDA activity): per kernel name,
launches and GPU us a call. Rows: one per kernel name with "compile_us", "ours_us", "compile_n",
"ours_n" (a call's launches) and "delta_us" (ours - compile), largest |delta| first; the summary
has both arms' ms a call, their GPU us a call and launches a call.

    python3 bench/arm_profile.py mobilenetv3:bf16 --mode reduce-overhead --budget 150

GPU machine. Writes bench/results/arm_profile-<date>.json.
"""
from __future__ import annotations

import argparse
import copy
import sys
from collections import defaultdict
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import bench_floor as bf   # noqa: E402  (timing, the compile arm)
import bench_serve as bs   # noqa: E402  (precision, Dynamo's limits, report fields)
import model_zoo           # noqa: E402
import record              # noqa: E402

# rows kept in the file: the kernel names whose time differs most between the arms
TOP = 60


def kernel_times(fn, calls: int) -> dict[str, tuple[float, float]]:
    """{kernel name: (launches a call, GPU us a call)} over `calls` calls of fn."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if us > 0 and e.device_type.name == "CUDA":
            out[e.key][0] += e.count / calls
            out[e.key][1] += us / calls
    return {k: (n, us) for k, (n, us) in out.items()}


def diff_rows(compile_k: dict, ours_k: dict) -> list[dict]:
    """One row per kernel name in either arm, largest |ours - compile| GPU us first."""
    rows = []
    for name in set(compile_k) | set(ours_k):
        (cn, cus), (on, ous) = compile_k.get(name, (0.0, 0.0)), ours_k.get(name, (0.0, 0.0))
        rows.append({"kernel": name[:160], "compile_n": round(cn, 2), "ours_n": round(on, 2),
                     "compile_us": round(cus, 2), "ours_us": round(ous, 2), "delta_us": round(ous - cus, 2)})
    return sorted(rows, key=lambda r: -abs(r["delta_us"]))


def measure(name: str, mode: str, budget_s: float, calls: int) -> dict:
    import torch
    import torch_htam
    dtype = name.split(":")[-1]
    with bs._precision(dtype), bs._dynamo_limits(), torch.inference_mode():
        model, inputs = model_zoo.make(name)
        compiled = bf._torch_compile(copy.deepcopy(model), mode)
        cfg = torch_htam.OptimizeConfig(time_budget_s=budget_s, mode=mode, check_end_to_end=False)
        ours = torch_htam.optimize(model, inputs, cfg)
        arms = {"compile": lambda: compiled(*inputs), "ours": lambda: ours(*inputs)}
        for fn in arms.values():
            for _ in range(5):
                fn()
        torch.cuda.synchronize()
        fields = bs.report_fields(ours)
        times = bf.time_interleaved(arms, torch.cuda.synchronize, rounds=10, calls=20)
        kernels = {arm: kernel_times(fn, calls) for arm, fn in arms.items()}
    summary = {"model": name, "mode": mode, "budget_s": budget_s, "kernels_kept": fields.get("kernels_kept")}
    for arm in arms:
        summary[f"{arm}_ms_latency"] = times[arm]["latency_ms"]
        summary[f"{arm}_ms_throughput"] = times[arm]["throughput_ms"]
        summary[f"{arm}_gpu_us"] = round(sum(us for _, us in kernels[arm].values()), 1)
        summary[f"{arm}_launches"] = round(sum(n for n, _ in kernels[arm].values()), 1)
    return {"summary": summary, "regions": fields.get("regions"), "rows": diff_rows(kernels["compile"], kernels["ours"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(model_zoo.ROWS), help="a zoo row, e.g. mobilenetv3:bf16")
    ap.add_argument("--mode", default="reduce-overhead", choices=("default", "reduce-overhead"))
    ap.add_argument("--budget", type=float, default=150.0, help="optimize's time_budget_s (s)")
    ap.add_argument("--calls", type=int, default=20, help="calls profiled per arm")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    data = measure(a.model, a.mode, a.budget, a.calls)
    data["rows"] = data["rows"][:TOP]
    record.write("arm_profile", data, results_dir=a.out)
    s = data["summary"]
    print(" ".join(f"{k}={v}" for k, v in s.items()))
    for r in data["rows"][:25]:
        print(f"{r['delta_us']:+9.1f} us  compile {r['compile_us']:8.1f} us x{r['compile_n']:<5} "
              f"ours {r['ours_us']:8.1f} us x{r['ours_n']:<5} {r['kernel'][:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
