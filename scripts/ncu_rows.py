"""ncu probe: our row kernels (defaults and a few settings) and torch.compile's, 3 calls each.

    ncu --clock-control none -k regex:"row_kernel|triton" --metrics gpu__time_duration.sum,... python3 scripts/ncu_rows.py
"""
import sys, importlib.util
from pathlib import Path
import torch
sys.path.insert(0, ".")
from torch_htam import build, launcher
from torch_htam.policy import policy_for
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.extract import task_from_source
from torch_htam.verify import make_input, _fresh_outputs

for stem, variants in (("rw_layernorm_bf16", [{}, {"memo": False}, {"occ": 1024}, {"rows_per_block": 8}]),
                       ("rw_softmax_bf16", [{}, {"occ": 2048}])):
    task = task_from_source(Path(f"bench/tasks/{stem}.py").read_text(), stem)
    tg = match_task(task, policy_for(task))
    g = torch.Generator().manual_seed(0)
    ins = [make_input(s, s.shape, "normal", g, "cuda") for s in task.inputs]
    outs = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
    for v in variants:
        res = build.build(tg.render(dict(tg.defaults, **v)), arch=build.default_arch())
        k = launcher.Kernel(res.so_path)
        print(stem, v, flush=True)
        for _ in range(3): k(ins, outs)
        torch.cuda.synchronize()
    spec = importlib.util.spec_from_file_location(stem, f"bench/tasks/{stem}.py"); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    c = torch.compile(m.Model().cuda())
    for _ in range(3): c(*ins)
    torch.cuda.synchronize()
