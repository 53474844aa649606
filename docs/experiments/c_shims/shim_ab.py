"""Launch_o1 in Inductor's C++ wrapper: C shim (launcher.export_shims) against the dispatcher, interleaved.

Chains of 1 and 21 calls (per call = (t21 - t1) / 20, medians of 300 calls, synced and issue time), four
rounds with the arms alternating: aten_site, ours_site1 (shims), ours_site1_disp (the dispatcher,
launch_cost.NO_SHIMS), ours_site2, canary (shims), canary_disp. Then launcher.host_times over 200
forwards of the 21-site chain. Run as `PYTHONPATH=. python3 docs/experiments/c_shims/shim_ab.py` on a
GPU machine (log: shim_ab-b486e85.log; the run printed "3 reps" and ran four)."""
import os, sys, time, statistics, json, glob, shutil
sys.path.insert(0, "bench")
import torch
import launch_cost as lc
from torch_htam import build, launcher, inductor
out = os.environ.get("OUT", "/tmp/out")
opts = dict(inductor.WRAPPER_OPTIONS)
handles = {}
for n in (1, 2):
    r = build.build(f"#define SITE_LAUNCHES {n}\n" + lc.SITE_CU.read_text()); assert r.ok, r.error
    handles[n] = launcher.Kernel(r.so_path).handle
res = build.build(open(inductor.CANARY_CU).read()); assert res.ok
ch = launcher.Kernel(res.so_path).handle
chains, x = lc._site_chains(handles)
fns = {}
variants = [(c, c, opts) for c in chains] + [("ours_site1_disp", "ours_site1", {**opts, **lc.NO_SHIMS})]
for call, src, o in variants:
    for k in (1, 21):
        torch._dynamo.reset()
        f = torch.compile(chains[src](k), options=o, fullgraph=True)
        f(x); f(x)
        fns[(call, k)] = f
# canary 2-input chain
n_, args = launcher.stable_args(ch, [], [0, 1, 8]); one = list(args[1:1 + n_ * launcher.STABLE_META_SLOTS])
op1 = launcher.stable_op(1); b8 = torch.ones(8, device="cuda"); a8 = torch.arange(8.0, device="cuda")
def can(k):
    def f(a):
        for _ in range(k): a = op1(ch, *one, a, b8)
        return a
    return f
for name, o in (("canary", opts), ("canary_disp", {**opts, **lc.NO_SHIMS})):
  for k in (1, 21):
    torch._dynamo.reset(); f = torch.compile(can(k), options=o, fullgraph=True); f(a8); f(a8); fns[(name, k)] = f
def med(f, a, iters=300):
    for _ in range(20): f(a)
    torch.cuda.synchronize(); ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); f(a); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(ts)
def issue(f, a, iters=300):
    for _ in range(20): f(a)
    torch.cuda.synchronize(); ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); f(a); ts.append(time.perf_counter() - t0); torch.cuda.synchronize()
    return 1e6 * statistics.median(ts)
rows = {}
for rep in range(4):
    for call in ("aten_site", "ours_site1", "ours_site1_disp", "ours_site2", "canary", "canary_disp"):
        a = a8 if call.startswith("canary") else x
        s = (med(fns[(call, 21)], a) - med(fns[(call, 1)], a)) / 20
        i = (issue(fns[(call, 21)], a) - issue(fns[(call, 1)], a)) / 20
        rows.setdefault(call, []).append((round(s, 2), round(i, 2)))
print("per call (synced, issue) us, 3 reps:")
for c, v in rows.items(): print(" ", c, v)
h0 = launcher.host_times()
for _ in range(200): fns[("ours_site1", 21)](x)
torch.cuda.synchronize()
h1 = launcher.host_times()
for hd, v in h1.items():
    b = h0.get(hd, {}); d = {k: v[k] - b.get(k, 0) for k in v}
    if d["launches"]: print("host_times handle", hd % 1000, "launch_us", round(d["launch_ns"] / d["launches"] / 1e3, 2), "run_us", round(d["run_ns"] / max(d["runs"], 1) / 1e3, 2), d["launches"])
