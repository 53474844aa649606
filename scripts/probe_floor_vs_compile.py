"""Is optimize's floor (inductor.compile_with, installed as _compiled_call_impl) as fast as
torch.compile(model) and model.compile()? Same model, deep copies, 30 interleaved rounds."""
import copy, statistics, sys, torch
sys.path.insert(0, "bench")
import floor_models
from bench_floor import time_interleaved
from torch_htam import inductor
for name in sys.argv[1:]:
    model, inputs = floor_models.make(name)
    a, b, c = copy.deepcopy(model), copy.deepcopy(model), copy.deepcopy(model)
    arms = {}
    with torch.inference_mode():
        opt = torch.compile(a)
        b.compile()
        c._compiled_call_impl = inductor.compile_with(c, None)
        for k, m in (("torch.compile(model)", opt), ("model.compile()", b), ("floor", c)):
            for _ in range(5):
                m(*inputs)
            arms[k] = (lambda m=m: m(*inputs))
        t = time_interleaved(arms, torch.cuda.synchronize, rounds=30, calls=20)
    base = t["torch.compile(model)"]
    for k, v in t.items():
        pl = statistics.median([x / y for x, y in zip(base["latency_round_ms"], v["latency_round_ms"])])
        pt = statistics.median([x / y for x, y in zip(base["throughput_round_ms"], v["throughput_round_ms"])])
        print(f"{name:18} {k:22} latency {v['latency_ms']:.3f} ms  throughput {v['throughput_ms']:.3f} ms  "
              f"paired vs torch.compile(model): {pl:.3f} / {pt:.3f}")
