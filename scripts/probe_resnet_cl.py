"""One-off probe: ResNet-50 with every channels-last conv region on its default fused cuDNN kernel
(no search, no verification: the end-to-end error is printed).

Default mode: torch.compile against the backend with the kernels called through the dispatcher's
op and through the launcher's binding (inductor.direct_call), timed round-robin, and a profiler
table of host time per op. Reduce-overhead: the kernels inside cudagraph trees, in a child
process each (a failed capture breaks the process's CUDA generator), printing the whole
exception chain; on failure, each half of the kernels again.

    python3 scripts/probe_resnet_cl.py --dtype bf16 [--no-ro] [--no-default]
    python3 scripts/probe_resnet_cl.py --dtype bf16 --per-task   # host and device us per call, per engine
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def setup(dtype: str, batch: int, out_dir: str):
    from models import get_resnet50
    from torch_htam.build import build_many
    from torch_htam.extract import extract
    from torch_htam.launcher import Kernel
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.proposer import match_task
    model, inputs = get_resnet50(dtype, batch)
    found = extract(model, inputs)
    cl = [t for t in found.tasks if any(s.channels_last for s in [*t.inputs, *t.outputs])]
    srcs = []
    for t in cl:
        tm = match_task(t, policy_for(t))
        srcs.append(tm.render(tm.target.canonical(tm.region, dict(tm.defaults))))
    t0 = time.time()
    res = build_many(srcs, out_dir=out_dir)
    kernels = {t.signature: Kernel(r.so_path) for t, r in zip(cl, res) if r.ok}
    bad = [(t.name, r.error[:200]) for t, r in zip(cl, res) if not r.ok]
    print(f"{len(found.tasks)} tasks, {len(found.sites)} sites, {len(cl)} channels-last conv tasks, "
          f"{len(kernels)} built in {time.time() - t0:.0f} s; failed: {bad}", flush=True)
    return model, inputs, found, cl, kernels


def rel(out, ref) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-12))


def default_mode(model, inputs, kernels) -> None:
    from torch_htam import inductor, timing
    from torch_htam.runtime import Provider, launcher_provider
    torch._inductor.config.fx_graph_cache = False   # each arm's own code, not another's
    with torch.inference_mode():
        ref = model(*inputs)
    load = launcher_provider().load
    arms = {}
    # the op arm compiles first: direct_call() is process-wide once set
    arms["ours_op"] = inductor.compile_with(model, inductor.HtamBackend(
        kernels, provider=Provider(torch.ops.htam.launch.default, load)))
    with torch.inference_mode():
        e_op = rel(arms["ours_op"](*inputs), ref)
    print("direct_call hook available:", inductor.direct_call(), flush=True)
    arms["ours_direct"] = inductor.compile_with(model, inductor.HtamBackend(kernels))
    arms["compile"] = inductor.compile_with(model, None)
    errs = {"ours_op": e_op}
    with torch.inference_mode():
        for k in ("ours_direct", "compile"):
            errs[k] = rel(arms[k](*inputs), ref)
    t = timing.time_many(arms, inputs, iters=200, rounds=10)
    base = t["compile"].median_ms
    print("\n| arm | ms | p20 | p80 | vs compile | paired | rel err |\n|---|---|---|---|---|---|---|")
    for k, a in t.items():
        pr = timing.paired_ratio(t["compile"].round_ms, a.round_ms)
        print(f"| {k} | {a.median_ms:.3f} | {a.p20_ms:.3f} | {a.p80_ms:.3f} | {base / a.median_ms:.2f}x "
              f"| {pr:.2f}x | {errs[k]:.1e} |")
    for k in ("compile", "ours_direct"):
        profile(k, arms[k], inputs)


def profile(name: str, fn, inputs, iters: int = 10) -> None:
    from torch.profiler import ProfilerActivity, profile as prof
    with torch.inference_mode():
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(iters):
                fn(*inputs)
            torch.cuda.synchronize()
    rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]
    print(f"\n{name}: host (self CPU) and device time per forward, top ops by self CPU")
    print("| op | calls/fwd | self CPU us/fwd | CPU total us/fwd | device us/fwd |\n|---|---|---|---|---|")
    for e in rows:
        dev = getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))
        print(f"| {e.key[:60]} | {e.count / iters:.0f} | {e.self_cpu_time_total / iters:.0f} | "
              f"{e.cpu_time_total / iters:.0f} | {dev / iters:.0f} |")
    tot_dev = sum(getattr(e, "self_device_time_total", 0) for e in p.key_averages()) / iters
    print(f"device time per forward (sum of kernels): {tot_dev:.0f} us", flush=True)


def per_call(fn, n: int = 100) -> tuple[float, float]:
    """(host us, device us) per call: host = the time to enqueue n calls behind a sleeping GPU;
    device = a CUDA graph of n calls replayed."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(60e6))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(3):
        g.replay()
    b.record()
    b.synchronize()
    return host, a.elapsed_time(b) / (3 * n) * 1e3


def per_task(dtype: str, batch: int, out_dir: str, algos: int = 5):
    """Prints the table; returns (model, inputs, {sig: (count, compiled device us, algo-0 device us)},
    {sig: algo-0 Kernel})."""
    from models import get_resnet50
    from torch_htam.build import build_many
    from torch_htam.extract import extract
    from torch_htam.golden import make_inputs
    from torch_htam.launcher import Kernel, encode_out_meta, fast_launch
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import conv
    from torch_htam.proposers.expert.proposer import match_task
    model, inputs = get_resnet50(dtype, batch)
    found = extract(model, inputs)
    counts = {}
    for site in found.sites:
        counts[site.task.signature] = counts.get(site.task.signature, 0) + 1
    cl = [t for t in found.tasks if any(s.channels_last for s in [*t.inputs, *t.outputs])]
    jobs = []
    for t in cl:
        tm = match_task(t, policy_for(t))
        for algo in range(algos):
            jobs.append((t, algo, tm.render(dict(conv.defaults(tm.region), algo=algo))))
    t0 = time.time()
    built = build_many([src for _, _, src in jobs], out_dir=out_dir)
    print(f"{len(jobs)} variants ({len({src for *_, src in jobs})} sources) built in {time.time() - t0:.0f} s", flush=True)
    print("| task | x | w | eager host/dev us | compiled host/dev us | ours host/dev us by algo 0..4 |\n|---|---|---|---|---|---|")
    tot = {"eager": [0.0, 0.0], "compiled": [0.0, 0.0], "best_dev": [0.0, 0.0], "algo0": [0.0, 0.0]}
    dev, algo0 = {}, {}
    for t in cl:
        xs = make_inputs(t, "cuda")
        meta = encode_out_meta(t.outputs)
        n = counts.get(t.signature, 1)
        with torch.inference_mode():
            eager = per_call(lambda: t.graph(*xs))
            comp_fn = torch.compile(t.graph)
            compiled = per_call(lambda: comp_fn(*xs))
            ours = []
            for (tt, algo, _), r in zip(jobs, built):
                if tt is not t:
                    continue
                try:
                    k = Kernel(r.so_path)
                    ours.append(per_call(lambda: fast_launch(k.handle, xs, meta)))
                    algo0.setdefault(t.signature, k)
                except Exception as e:  # noqa: BLE001
                    ours.append((float("nan"), float("nan")))
        dev[t.signature] = (n, compiled[1], ours[0][1])
        ok = [o for o in ours if o[1] == o[1]]
        best = min(ok, key=lambda o: o[1]) if ok else (float("nan"), float("nan"))
        for key, v in (("eager", eager), ("compiled", compiled), ("best_dev", best), ("algo0", ours[0])):
            tot[key][0] += n * v[0]
            tot[key][1] += n * v[1]
        print(f"| {t.name[5:]} | {n} | {tuple(t.inputs[1].shape)} {tuple(t.inputs[0].shape[2:])} | "
              f"{eager[0]:.0f}/{eager[1]:.1f} | {compiled[0]:.0f}/{compiled[1]:.1f} | "
              + " ".join(f"{h:.0f}/{d:.1f}" for h, d in ours) + " |", flush=True)
    print("\nsummed over the model's sites (host us / device us):",
          {k: f"{v[0]:.0f}/{v[1]:.0f}" for k, v in tot.items()}, flush=True)
    return model, inputs, dev, algo0


def subsets(dtype: str, batch: int, out_dir: str) -> None:
    """End to end with kernel subsets, both modes, one process: all algo-0 kernels, those whose
    region beat Inductor's on the device, and the ten with the largest device saving."""
    from torch_htam import inductor, timing
    model, inputs, dev, kernels = per_task(dtype, batch, out_dir, algos=1)
    torch._dynamo.reset()
    saving = {s: n * (c - o) for s, (n, c, o) in dev.items() if s in kernels}
    winners = [s for s, v in saving.items() if v > 0]
    top10 = sorted(winners, key=lambda s: -saving[s])[:10]
    sets = {"all": list(kernels), "winners": winners, "top10": top10}
    print("subsets:", {k: len(v) for k, v in sets.items()}, flush=True)
    with torch.inference_mode():
        ref = model(*inputs)
    for mode in ("default", "reduce-overhead"):
        arms = {"compile": inductor.compile_with(model, None, mode)}
        for name, sigs in sets.items():
            arms[name] = inductor.compile_with(model, inductor.HtamBackend({s: kernels[s] for s in sigs}, mode))
        errs = {}
        with torch.inference_mode():
            for k, f in arms.items():
                for _ in range(3):
                    out = f(*inputs)
                errs[k] = rel(out, ref)
        t = timing.time_many(arms, inputs, iters=300, rounds=15)
        base = t["compile"]
        print(f"\n{mode}\n| arm | kernels | ms | p20 | p80 | vs compile | paired | rel err |\n|---|---|---|---|---|---|---|---|")
        for k, a in t.items():
            pr = timing.paired_ratio(base.round_ms, a.round_ms)
            print(f"| {k} | {len(sets.get(k, []))} | {a.median_ms:.3f} | {a.p20_ms:.3f} | {a.p80_ms:.3f} | "
                  f"{base.median_ms / a.median_ms:.2f}x | {pr:.2f}x | {errs[k]:.1e} |", flush=True)


def ro_child(dtype: str, batch: int, out_dir: str, subset: list[int] | None) -> None:
    """Reduce-overhead with kernels[subset] (all: None); prints one JSON line."""
    from torch_htam import inductor, timing
    model, inputs, found, cl, kernels = setup(dtype, batch, out_dir)
    sigs = list(kernels)
    if subset is not None:
        kernels = {sigs[i]: kernels[sigs[i]] for i in subset}
    inductor.held_from_cuda_graphs = lambda tasks, ks: set()
    with torch.inference_mode():
        ref = model(*inputs)
    b = inductor.HtamBackend(kernels, "reduce-overhead")
    ours = inductor.compile_with(model, b)
    result = {"subset": subset, "kernels": len(kernels)}
    try:
        with torch.inference_mode():
            for _ in range(4):
                out = ours(*inputs)
            result["rel_err"] = rel(out, ref)
        comp = inductor.compile_with(model, None, "reduce-overhead")
        t = timing.time_many({"compile_ro": comp, "ours_ro": ours}, inputs, iters=200, rounds=10)
        result.update({k: round(a.median_ms, 4) for k, a in t.items()})
        result["paired"] = timing.paired_ratio(t["compile_ro"].round_ms, t["ours_ro"].round_ms)
        result["swapped"] = sum(len(r.swapped) for r in b.records)
        result["notes"] = [r.note for r in b.records if r.note]
    except Exception as e:  # noqa: BLE001 -- the probe's point: the whole chain
        result["error"] = "".join(traceback.format_exception(e))[-6000:]
    print("RESULT " + json.dumps(result), flush=True)


def ro_run(dtype: str, batch: int, out_dir: str, subset: list[int] | None, timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--dtype", dtype, "--batch", str(batch), "--out", out_dir, "--ro-child",
           "all" if subset is None else ",".join(map(str, subset))]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"subset": subset, "error": f"timeout {timeout} s"}
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    r = json.loads(line[7:]) if line else {"subset": subset, "error": (p.stdout + p.stderr)[-4000:]}
    r["seconds"] = round(time.time() - t0)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-default", action="store_true")
    ap.add_argument("--no-ro", action="store_true")
    ap.add_argument("--ro-child", default=None)
    ap.add_argument("--per-task", action="store_true")
    ap.add_argument("--subsets", action="store_true")
    ap.add_argument("--ro-timeout", type=int, default=240)
    a = ap.parse_args()
    out_dir = a.out or tempfile.mkdtemp(prefix="probe_cl_")
    if a.per_task:
        per_task(a.dtype, a.batch, out_dir)
        return 0
    if a.subsets:
        subsets(a.dtype, a.batch, out_dir)
        return 0
    if a.ro_child is not None:
        ro_child(a.dtype, a.batch, out_dir, None if a.ro_child == "all" else [int(i) for i in a.ro_child.split(",")])
        return 0
    model, inputs, found, cl, kernels = setup(a.dtype, a.batch, out_dir)
    if not a.no_default:
        default_mode(model, inputs, kernels)
    if not a.no_ro:
        del model
        torch.cuda.empty_cache()
        r = ro_run(a.dtype, a.batch, out_dir, None, a.ro_timeout)
        print("RO all:", json.dumps(r, indent=1), flush=True)
        if "error" in r:
            n = len(kernels)
            for half in (list(range(n // 2)), list(range(n // 2, n))):
                print("RO half:", json.dumps(ro_run(a.dtype, a.batch, out_dir, half, a.ro_timeout), indent=1),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
