"""Where the host time of one forward goes (a diagnostic, not a benchmark row): served vision bf16
(bench/serve_models.py) at batch B (default 16), static shapes: torch.compile with Inductor's C++
wrapper, torch.compile, and ours (optimize with steps=0 and check_end_to_end=False, so every kernel
that beat Inductor's code is in; its graph took the Python wrapper), and ours with its graph
launches on ("ours_graphs", launcher.set_graph_launches; they are off by default since 5ae931c). Prints the host issue time
and the synced time per forward (median of rounds), the launcher's graph-launch counts, then
torch.profiler's table per arm.

    cd <repo> && PYTHONPATH=.:bench python3 docs/experiments/launch_replays/host_profile.py > host.log

Run at a763f29 on one H200: hostprof-a763f29.log beside this file."""
import copy, sys, time, json, os
import torch
sys.path[:0] = ["bench", "docs/experiments"]   # run from the repository root
from host_diag import issue_us, served_vision, synced_us
import torch_htam
from torch_htam import inductor
from torch_htam.config import OptimizeConfig

model, base, x = served_vision()
t0 = time.time()
with torch.inference_mode():
    ours = torch_htam.optimize(model, x, OptimizeConfig(steps=0, check_end_to_end=False,
                                                        time_budget_s=float(os.environ.get("BUDGET", "150"))))
print("optimize", round(time.time() - t0, 1), "s", ours.htam_report.outcome, flush=True)
rep = ours.htam_report
print(rep.format(), flush=True)
from torch_htam import launcher


def graphs(*args):    # ours with its graph launches on (launcher.set_graph_launches)
    before = launcher.set_graph_launches(True)
    try:
        return ours(*args)
    finally:
        if before is not None:
            launcher.set_graph_launches(before)


with torch.inference_mode():
    arms = {"compile_cpp": torch.compile(base, options=dict(inductor.WRAPPER_OPTIONS)),
            "compile": torch.compile(copy.deepcopy(base)), "ours": ours, "ours_graphs": graphs}
    for n, f in arms.items():
        for _ in range(5): f(*x)
    torch.cuda.synchronize()
    launcher.set_graph_launches(True)
    print("settled in", launcher.settle_graphs(lambda: ours(*x)), "calls;", flush=True)
    launcher.set_graph_launches(False)

    for r in range(2):
        for n, f in arms.items():
            print(f"round {r} {n}: issue {issue_us(f, x):.0f} us/forward, synced {synced_us(f, x, 100):.0f} us", flush=True)
    print("graph launches:", launcher.graph_launches(), flush=True)
    from torch.profiler import profile, ProfilerActivity
    for n, f in arms.items():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(20): f(*x)
            torch.cuda.synchronize()
        print(f"==== {n}")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
