"""Probe: is the captured graph itself (no kernel swapped) as fast as the model's own forward?

The end-to-end guard compares the swapped graph with the original forward; if replaying the
captured graph costs more than eager by itself, no per-region win can pay for it. Prints, per
model: eager, graph replay as FX writes it (a getattr chain per weight) and as install() runs it
(runtime._fetch_attrs: one fetch through the modules' dicts), timed interleaved, then the top GPU
kernels of eager and of the replay.

    python3 scripts/probe_captured.py resnet50:fp32 resnet50:bf16
"""
import sys

import torch

sys.path.insert(0, ".")
from bench.models import MODELS  # noqa: E402
from torch_htam import runtime  # noqa: E402
from torch_htam.benchmark import time_pair  # noqa: E402
from torch_htam.capture import capture  # noqa: E402


def top_kernels(fn, inputs, n=12):
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(*inputs)
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=n, max_name_column_width=70)


for spec in sys.argv[1:]:
    name, dtype = spec.split(":")
    model, inputs = MODELS[name](dtype)
    cap = capture(model, inputs)
    gm, _ = runtime.swap(cap.graphs[0], {})
    runtime._hoist_constants(gm, model)
    runtime._bind_to_model(gm, model)
    fast, _ = runtime.swap(cap.graphs[0], {})
    runtime._hoist_constants(fast, model)
    runtime._bind_to_model(fast, model)
    n = len(runtime._fetch_attrs(fast, model)())
    ops = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            ops[str(node.target)] = ops.get(str(node.target), 0) + 1
    print(spec, "graph ops:", sorted(ops.items(), key=lambda kv: -kv[1])[:12])
    replay = lambda *a: gm(*a)  # noqa: E731
    eager, graph = time_pair(model.forward, replay, inputs, iters=45, rounds=9)
    eager2, fetched = time_pair(model.forward, lambda *a: fast(*a), inputs, iters=45, rounds=9)
    print(f"{spec}: eager {eager.median_ms:.3f} ms, captured graph replay {graph.median_ms:.3f} ms; "
          f"eager {eager2.median_ms:.3f} ms, replay with one fetch of {n} tensors {fetched.median_ms:.3f} ms")
    print("eager:\n" + top_kernels(model.forward, inputs))
    print("graph:\n" + top_kernels(replay, inputs))
