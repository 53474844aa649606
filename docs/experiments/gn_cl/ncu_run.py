"""Run the default gn_cl kernels on two UNet shapes four times each (the program ncu profiles)."""
import sys
from pathlib import Path

import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_gn_cl import ConvNormSilu, _norm_task
from torch_htam import build
from torch_htam.golden import make_inputs
from torch_htam.launcher import Kernel
from torch_htam.policy import policy_for
from torch_htam.proposers.expert.proposer import match_task
for c, shape in [(512, (8, 512, 16, 16)), (128, (8, 128, 64, 64))]:
    task = _norm_task(ConvNormSilu(c, 32).to(torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16))
    tm = match_task(task, policy_for(task))
    r, = build.build_many([tm.render(tm.defaults)])
    k = Kernel(r.so_path)
    ins = make_inputs(task, "cuda")
    outs = [torch.empty_strided(o.shape, o.stride, dtype=o.torch_dtype, device="cuda") for o in task.outputs]
    for _ in range(4): k(ins, outs)
    torch.cuda.synchronize()
