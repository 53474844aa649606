"""ncu probe: the tiled pointwise-conv kernel at its defaults, then a few other settings, 3 calls each.

    ncu --clock-control none -k regex:"pw_kernel" --metrics gpu__time_duration.sum,... python3 scripts/ncu_pwconv.py
    ncu --set full -k regex:pw_kernel -c 1 -o prof python3 scripts/ncu_pwconv.py conv_bn_add_relu_bf16   # defaults only
"""
import sys
from pathlib import Path
import torch
sys.path.insert(0, ".")
from torch_htam import build, launcher  # noqa: E402
from torch_htam.policy import policy_for  # noqa: E402
from torch_htam.proposers.expert.proposer import match_task  # noqa: E402
from torch_htam.extract import task_from_source  # noqa: E402
from torch_htam.verify import make_input, _fresh_outputs  # noqa: E402

VARIANTS = {
    "conv_bn_add_relu_bf16": [{}, {"pre": False}, {"minb": 3}, {"bn": 256}],
    "conv_bn_add_relu_fp32": [{}, {"bn": 128, "persist": True}],
}
for stem in sys.argv[1:] or VARIANTS:
    task = task_from_source(Path(f"bench/tasks/{stem}.py").read_text(), stem)
    tg = match_task(task, policy_for(task, conv=True))
    g = torch.Generator().manual_seed(0)
    ins = [make_input(s, s.shape, "normal", g, "cuda") for s in task.inputs]
    outs = _fresh_outputs(task.outputs, [s.shape for s in task.outputs], 0, "cuda")
    for v in VARIANTS[stem]:
        res = build.build(tg.render(dict(tg.defaults, **v)), arch=build.default_arch())
        assert res.ok, res.error
        k = launcher.Kernel(res.so_path)
        print(stem, v, flush=True)
        for _ in range(3):
            assert k(ins, outs) == 0
        torch.cuda.synchronize()
