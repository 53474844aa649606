"""GPU-only times of gn_cl.cuh's kernels against Inductor's code for the same region, on the
diffusion UNet's group norm shapes (bf16): each arm captured 20 calls to a CUDA graph and replayed
(median of 10 replays, us a call; no host time, L2 not flushed, as reduce-overhead runs them), and
the split between gn_cl_stats and gn_cl_apply (torch.profiler, us a call). GPU machine:

    python3 docs/experiments/gn_cl/graph_times.py
"""
import sys
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_gn_cl import ConvNormSilu, ConvNormTokens, _norm_task
from torch_htam import build
from torch_htam.golden import make_inputs
from torch_htam.launcher import Kernel
from torch_htam.policy import policy_for
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import load_reference

def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps)
    return sorted(ts)[len(ts)//2]

def kernel_split(fn):
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20): fn()
        torch.cuda.synchronize()
    return {e.key[:40]: round(e.device_time_total / 20, 1) for e in prof.key_averages() if e.device_time_total > 0}

SHAPES = [("silu", 128, (8, 128, 64, 64)), ("silu", 384, (8, 384, 64, 64)), ("silu", 512, (8, 512, 16, 16)),
          ("tokens", 256, (8, 256, 32, 32)), ("silu", 1024, (8, 1024, 16, 16))]
VARIANTS = [{}, {"onepass": False}, {"onepass": False, "waves": 1}, {"tpr": 512}]
for kind, c, shape in SHAPES:
    model = (ConvNormSilu(c, 32) if kind == "silu" else ConvNormTokens(c, 32)).to(torch.bfloat16)
    task = _norm_task(model, torch.randn(shape, dtype=torch.bfloat16))
    pol = policy_for(task); tm = match_task(task, pol)
    params = [dict(tm.defaults, **v) for v in VARIANTS]
    res = build.build_many([tm.render(p) for p in params])
    ref = load_reference(task).cuda()
    ins = make_inputs(task, "cuda")
    comp = torch.compile(ref)
    ind = graph_ms(lambda: comp(*ins))
    eag = graph_ms(lambda: ref(*ins))
    outs = [torch.empty_strided(o.shape, o.stride, dtype=o.torch_dtype, device="cuda") for o in task.outputs]
    mb = sum(t.numel() * t.element_size() for t in ins + outs) / 1e6
    print(f"== {kind} {shape}: {mb:.1f} MB moved once; eager {eag*1e3:.1f} us, inductor {ind*1e3:.1f} us")
    for p, r in zip(params, res):
        if not r.ok: print("  build failed", p, r.error[:200]); continue
        k = Kernel(r.so_path)
        ms = graph_ms(lambda: k(ins, outs))
        print(f"  {str({a: b for a, b in p.items() if tm.defaults.get(a) != b}) or 'defaults':36} {ms*1e3:7.1f} us  vs inductor {ind/ms:.2f}x  {kernel_split(lambda: k(ins, outs))}")
