"""Probe: which GPU kernels eager, torch.compile and our default kernel run for a conv task.

    python3 scripts/probe_conv_kernels.py conv_bn_relu_bf16 [conv_bn_relu_fp32 ...]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".")
from torch_htam import build, launcher  # noqa: E402
from torch_htam.policy import policy_for  # noqa: E402
from torch_htam.proposers.expert.proposer import match_task  # noqa: E402
from torch_htam.task import load_reference, task_from_source  # noqa: E402
from torch_htam.verify import _fresh_outputs, make_input  # noqa: E402


def kernels(fn, n=8):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages()]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])[:n]
    return "\n".join(f"  {us:8.1f} us  x{c}  {k[:110]}" for k, us, c in rows)


for stem in sys.argv[1:]:
    task = task_from_source(Path(f"bench/tasks/{stem}.py").read_text(), stem)
    tg = match_task(task, policy_for(task, conv_tf32=True))
    g = torch.Generator().manual_seed(0)
    ins = [make_input(s, s.shape, "normal", g, "cuda") for s in task.inputs]
    outs = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
    res = build.build(tg.render(dict(tg.defaults)), arch=build.default_arch())
    assert res.ok, res.error
    k = launcher.Kernel(res.so_path)
    ref = load_reference(task).cuda()
    comp = torch.compile(ref)
    with torch.no_grad():
        print(stem, "eager:\n" + kernels(lambda: ref(*ins)))
        print(stem, "torch.compile:\n" + kernels(lambda: comp(*ins)))
        print(stem, "ours (defaults):\n" + kernels(lambda: k(ins, outs)))
