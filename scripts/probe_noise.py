"""Probe: is the 0.91-0.93x of a 0-swap optimized model against torch.compile (default mode) noise,
or host cost of our installed call path? Arms: eager, two identical torch.compile's (a control),
torch.compile(model) as a user writes it, the install path (model._compiled_call_impl) and
torch_htam.optimize. Per-call-synced timing (timing.time_many) and pipelined (20 calls, one sync).
--ro adds two reduce-overhead compiles (CUDA graph trees) to the same process: does their presence
widen the default-mode arms' spreads, as bench_models' do (bench/findings.md)?

    python3 scripts/probe_noise.py gpt2:bf16 resnet50:bf16 [--ro]"""
import copy, json, os, statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, "bench"); sys.path.insert(0, ".")
import models
import torch_htam
from torch_htam import inductor
from torch_htam.pipeline import OptimizeConfig
from torch_htam.timing import time_many

def pipelined(fns, inputs, per=20, rounds=15):
    out = {k: [] for k in fns}
    order = list(fns)
    with torch.inference_mode():
        for r in range(rounds):
            turn = order[r % len(order):] + order[:r % len(order)]
            for k in (turn if r % 2 == 0 else turn[::-1]):
                for _ in range(3): fns[k](*inputs)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(per): fns[k](*inputs)
                torch.cuda.synchronize()
                out[k].append((time.perf_counter() - t0) * 1e3 / per)
    return {k: statistics.median(v) for k, v in out.items()}

def host_only(fns, inputs, n=50):
    out = {}
    with torch.inference_mode():
        for k, f in fns.items():
            ts = []
            for _ in range(n):
                torch.cuda.synchronize()
                t0 = time.perf_counter(); f(*inputs); ts.append((time.perf_counter() - t0) * 1e3)
            out[k] = statistics.median(ts)
    torch.cuda.synchronize()
    return out

res = {}
ro = "--ro" in sys.argv
for spec in [a for a in sys.argv[1:] if not a.startswith("--")]:
    name, dt = spec.split(":")
    model, inputs = models.MODELS[name](dt)
    fns, setup = {"eager": model}, {}
    t0 = time.perf_counter()
    fns["compile_a"] = inductor.compile_with(model, None); fns["compile_b"] = inductor.compile_with(model, None)
    fns["compile_module"] = torch.compile(model)
    if ro:
        fns["ro_a"] = inductor.compile_with(model, None, "reduce-overhead")
        fns["ro_b"] = inductor.compile_with(model, None, "reduce-overhead")
    m2 = copy.deepcopy(model); m2._compiled_call_impl = inductor.compile_with(m2, None); fns["installed"] = m2
    opt = torch_htam.optimize(copy.deepcopy(model), inputs, OptimizeConfig(steps=0, time_budget_s=20, progress=False))
    fns["optimized"] = opt
    with torch.inference_mode():
        for f in fns.values():
            for _ in range(3): f(*inputs)
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    synced = time_many(fns, inputs, iters=300, rounds=30)
    pipe = pipelined(fns, inputs)
    host = host_only(fns, inputs)
    # device time of one call: profile compile_a
    from torch.profiler import profile, ProfilerActivity
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5): fns["compile_a"](*inputs)
        torch.cuda.synchronize()
    dev_ms = sum(e.device_time_total for e in prof.key_averages()) / 5 / 1e3
    row = {"synced_ms": {k: [a.median_ms, a.p20_ms, a.p80_ms] for k, a in synced.items()},
           "pipelined_ms": pipe, "host_issue_ms": host, "device_ms_compile": dev_ms,
           "optimized_note": opt.htam_report.note, "optimized_swapped": opt.htam_report.swapped,
           "optimized_e2e": opt.htam_report.e2e, "setup_s": setup_s}
    res[spec] = row
    print(spec, json.dumps(row, indent=1), flush=True)
    print(f"{'arm':16} {'synced':>8} {'p20':>7} {'p80':>7} {'piped':>8} {'host':>8}")
    for k in fns:
        s = synced[k]
        print(f"{k:16} {s.median_ms:8.3f} {s.p20_ms:7.3f} {s.p80_ms:7.3f} {pipe[k]:8.3f} {host[k]:8.3f}", flush=True)
    del fns, model, opt, m2
    torch.cuda.empty_cache()
Path(os.environ.get("OUT", "/tmp"), f"probe_noise{'_ro' if ro else ''}.json").write_text(json.dumps(res, indent=1))
