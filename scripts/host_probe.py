"""Host time per call of conv kernels (graph and legacy cuDNN paths) against eager PyTorch.

    python3 scripts/host_probe.py      # on the GPU machine; prints host and wall us per call
"""
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, ".")
from torch_htam import build, launcher
from torch_htam.policy import policy_for
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import task_from_source, load_reference
from torch_htam.verify import make_input, _fresh_outputs

def probe(stem, variants):
    task = task_from_source(Path(f"bench/tasks/{stem}.py").read_text(), stem)
    pol = policy_for(task); tg = match_task(task, pol)
    g = torch.Generator().manual_seed(0)
    ins = [make_input(s, s.shape, "normal", g, "cuda") for s in task.inputs]
    outs = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
    ref = load_reference(task).cuda()
    def wall(f, n=300):
        for _ in range(20): f()
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): f()
        host = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize(); tot = (time.perf_counter() - t) / n * 1e6
        return host, tot
    with torch.no_grad():
        h, t = wall(lambda: ref(*ins))
    print(f"{stem:24s} eager          host {h:7.1f} us/call  wall {t:7.1f} us/call", flush=True)
    for name, extra in variants:
        p = dict(tg.defaults, **extra)
        res = build.build(tg.render(p), arch=build.default_arch())
        if not res.ok:
            print(name, "BUILD FAILED", res.log[-800:]); continue
        k = launcher.Kernel(res.so_path)
        rc = k(ins, outs); torch.cuda.synchronize()
        if rc:
            print(f"{stem:24s} {name:14s} rc={rc}"); continue
        h, t = wall(lambda: k(ins, outs))
        print(f"{stem:24s} {name:14s} host {h:7.1f} us/call  wall {t:7.1f} us/call", flush=True)

if __name__ == "__main__":
    for stem in ("conv_bn_relu_bf16", "conv_bn_relu_fp32", "conv_bn_add_relu_fp32"):
        probe(stem, [("graph", {"graph": True, "fused": False, "algo": 0}),
                     ("legacy", {"graph": False, "fused": False, "algo": 0}),
                     ("legacy-fused", {"graph": False, "fused": True, "algo": 0})])
