"""Where a conv site's host time goes in Inductor's C++ wrapper (a diagnostic, not a benchmark
row; issue #36): served vision bf16 (bench/serve_models.py) at batch B (default 16), static
shapes. optimize (check_end_to_end=False: every kernel that beat Inductor's code for its region)
finds the kernels; then two arms compile with Inductor's C++ wrapper (inductor.WRAPPER_OPTIONS):
torch.compile alone ("compile_cpp") and with those kernels ("ours_cpp"). Prints per arm the host
issue time and the synced time per forward (medians), the GPU time per forward (profiler), each
kernel's launcher host ns per launch (launcher.host_times: launch_with's whole and the kernel's
own htam_run), and torch.profiler's table.

    cd <repo> && PYTHONPATH=.:bench python3 docs/experiments/site_host/site_host.py > site.log
"""
import copy, os, sys, time
import torch
sys.path[:0] = ["bench", "docs/experiments"]   # run from the repository root
from host_diag import issue_us, served_vision, synced_us
import torch_htam
from torch_htam import inductor, launcher
from torch_htam.config import OptimizeConfig

model, base, x = served_vision()
t0 = time.time()
with torch.inference_mode():
    ours = torch_htam.optimize(copy.deepcopy(model), x, OptimizeConfig(
        check_end_to_end=False, time_budget_s=float(os.environ.get("BUDGET", "150"))))
print("optimize", round(time.time() - t0, 1), "s", ours.htam_report.outcome, flush=True)
print(ours.htam_report.format(), flush=True)
kernels = ours.__dict__["_htam_backend"].kernels
print("kernels:", len(kernels), flush=True)
# our launches under the C++ wrapper need warm_cpp_wrapper's check (inductor.stable_launches);
# here it runs in this process rather than beside it, so that ours_cpp compiles with that wrapper
checked = inductor._markers()[1]
if not os.path.exists(checked) and inductor.check_stable_launches():
    open(checked, "w").close()
opts = dict(inductor.WRAPPER_OPTIONS)
b = inductor.HtamBackend(kernels, options=opts)
arms = {"compile_cpp": inductor.compile_with(base, None, options=opts),
        "ours_cpp": inductor.compile_with(copy.deepcopy(model), b)}
with torch.inference_mode():
    for n, f in arms.items():
        t = time.time()
        for _ in range(5): f(*x)
        torch.cuda.synchronize()
        print(n, "first calls", round(time.time() - t, 1), "s", flush=True)
    print("records:", [(r.sites, len(r.swapped), r.cpp_wrapper, r.python_wrapper_why, r.note) for r in b.records])

    for r in range(3):
        for n, f in arms.items():
            print(f"round {r} {n}: issue {issue_us(f, x):.0f} us/forward, synced {synced_us(f, x, 200):.0f} us", flush=True)
    before = launcher.host_times()
    N = 200
    for _ in range(N): arms["ours_cpp"](*x)
    torch.cuda.synchronize()
    after = launcher.host_times()
    print("per kernel, over", N, "forwards: launches per forward, launch_with us, htam_run us")
    for h, a in sorted(after.items()):
        p = before.get(h, {"launches": 0, "launch_ns": 0, "runs": 0, "run_ns": 0})
        dl, dr = a["launches"] - p["launches"], a["runs"] - p["runs"]
        if dl:
            print(f"  handle {h}: {dl / N:.1f}, {(a['launch_ns'] - p['launch_ns']) / dl / 1e3:.2f}, "
                  f"{(a['run_ns'] - p['run_ns']) / max(dr, 1) / 1e3:.2f}")
    from torch.profiler import profile, ProfilerActivity
    for n, f in arms.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(20): f(*x)
            torch.cuda.synchronize()
        ev = p.key_averages()
        gpu = sum(e.self_device_time_total for e in ev) / 20
        calls = {e.key: e.count / 20 for e in ev if "aunch" in e.key or "htam" in e.key or "convolution" == e.key[6:]}
        print(f"==== {n}: GPU {gpu:.0f} us/forward; per forward: {calls}")
        print(ev.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
        # every op and GPU kernel per forward: what the two graphs run differently
        for e in sorted(ev, key=lambda e: e.key):
            print(f"  {n} per forward: {e.count / 20:5.1f} x {e.key[:110]}  cpu {e.cpu_time_total / max(e.count, 1):.1f} us, "
                  f"gpu {e.self_device_time_total / max(e.count, 1):.1f} us")
