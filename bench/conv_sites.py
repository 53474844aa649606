"""A conv site's time inside Inductor's C++ wrapper, three ways (issues #36, #34).

  aten    torch.compile of the site: aten's cuDNN conv, then Inductor's Triton kernel for batch
          norm and ReLU
  cudnn   our kernel as the expert renders it by default (conv.render_cl): the batch-norm fold's
          launch, then one cudnnBackendExecute of a fused cuDNN graph
  igemm   our implicit-GEMM kernel (conv_igemm.py): one launch, batch norm from the raw statistics

The site is conv 3x3 (padding 1, C -> C channels) + batch norm + ReLU, bf16, x channels-last and
the weight [K, C, R, S] contiguous as a model holds it, at ResNet-18's widths and sizes (C 64 at
56 x 56 ... C 512 at 7 x 7) and served batches. Each arm compiles graphs of 1 and of 21 chained
sites with the C++ wrapper; per site = (t21 - t1) / 20 of medians of 300 calls: synced (the GPU's
time where the GPU is the bound) and issue time (the host's). Each graph's output is checked
against the same chain run eagerly.

    python3 bench/conv_sites.py [--out DIR] [--quick]

Rows: "width", "size", "batch", "arm", "synced_us", "issue_us", "t1_us", "t21_us", "compile_s".
GPU machine.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch_cost  # noqa: E402
import record  # noqa: E402

LONG = launch_cost.LONG    # sites in the long chain; timed over launch_cost.ITERS calls each
# (width C, size H = W, batches): ResNet-18's stages at 224 x 224 input
SITES = ((64, 56, (1, 16)), (128, 28, (16,)), (256, 14, (16,)), (512, 7, (1, 16, 64)))
QUICK = ((64, 56, (16,)), (512, 7, (16,)))


class Site(nn.Module):
    """conv 3x3 (padding 1) -> batch norm (inference) -> ReLU: a ResNet basic block's first half."""

    def forward(self, x, w, gamma, beta, mean, var):
        return F.relu(F.batch_norm(F.conv2d(x, w, padding=1), mean, var, gamma, beta, False, 0.0, 1e-5))


def site_inputs(c: int, size: int, n: int, device: str = "cuda") -> tuple:
    """(x [n, c, size, size] channels-last, w [c, c, 3, 3] contiguous, gamma, beta, mean, var [c]),
    bf16, scaled so a chain of sites keeps values of order 1."""
    g = torch.Generator().manual_seed(c * 1000 + size)
    x = torch.randn(n, c, size, size, generator=g).to(device, torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(c, c, 3, 3, generator=g) * (2.0 / (9 * c)) ** 0.5).to(device, torch.bfloat16)
    stats = (1 + 0.1 * torch.randn(c, generator=g), 0.1 * torch.randn(c, generator=g),
             0.1 * torch.randn(c, generator=g), 0.5 + torch.rand(c, generator=g))
    return (x, w, *(t.to(device, torch.bfloat16) for t in stats))


def sources(c: int, size: int) -> dict[str, str]:
    """{arm: the kernel source the expert renders for the site's region} (cudnn, igemm)."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import conv
    from torch_htam.task import Task, TensorSpec
    args = site_inputs(c, size, 2, device="cpu")
    gm = torch.export.export(Site(), args, strict=False).graph_module
    with torch.no_grad():
        out = Site()(*args)
    task = Task("conv_site", "conv", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(out)], "site", [], graph=gm)
    cp = conv.match(task.graph, policy_for(task))
    base = conv.defaults(cp)
    return {"cudnn": conv.render(cp, base), "igemm": conv.render(cp, dict(base, igemm=True))}


def _chains(c: int, size: int, n: int, handles: dict[str, int]) -> tuple[dict, torch.Tensor]:
    """({arm: make(k) -> a function of x making k chained sites}, x)."""
    from torch_htam import launcher
    x, *params = site_inputs(c, size, n)
    site = Site()

    def aten(k):
        def f(a):
            for _ in range(k):
                a = site(a, *params)
            return a
        return f

    meta = launcher.encode_out_meta([TensorSpec.of(x)])   # y like x: channels-last
    return {"aten": aten, **{arm: launch_cost.launch_chain(h, meta, params) for arm, h in handles.items()}}, x


def _row(c: int, size: int, n: int, arm: str, make, x) -> dict:
    from torch_htam import inductor
    t, compile_s = {}, None
    for k in (1, LONG):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        f = torch.compile(make(k), options=dict(inductor.WRAPPER_OPTIONS), fullgraph=True)
        got, want = f(x).float(), make(k)(x).float()
        compile_s = time.perf_counter() - t0
        if not torch.allclose(got, want, rtol=5e-2, atol=5e-2 * (1 + want.abs().max().item())):
            raise RuntimeError(f"{arm} C{c} {size}x{size} batch {n} x{k}: wrong output")
        t[k] = (launch_cost.median_us(f, x), launch_cost.median_us(f, x, synced=False))
    per = [(t[LONG][i] - t[1][i]) / (LONG - 1) for i in (0, 1)]
    row = {"width": c, "size": size, "batch": n, "arm": arm, "synced_us": round(per[0], 2),
           "issue_us": round(per[1], 2), "t1_us": round(t[1][0], 2), "t21_us": round(t[LONG][0], 2),
           "compile_s": round(compile_s, 1)}
    print(row, flush=True)
    return row


def measure(sites=SITES) -> list[dict]:
    from torch_htam import build, launcher
    rows = []
    for c, size, batches in sites:
        handles = {}
        for arm, src in sources(c, size).items():
            res = build.build(src)
            if not res.ok:
                raise RuntimeError(f"the {arm} kernel for C{c} {size}x{size} did not build: {res.error}")
            handles[arm] = launcher.Kernel(res.so_path).handle
        for n in batches:
            chains, x = _chains(c, size, n, handles)
            rows += [_row(c, size, n, arm, make, x) for arm, make in chains.items()]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    ap.add_argument("--quick", action="store_true", help="C 64 at 56 x 56 and C 512 at 7 x 7, batch 16 only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("conv_sites needs a CUDA GPU", file=sys.stderr)
        return 2
    path = record.write("conv_sites", {"rows": measure(QUICK if args.quick else SITES)}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
