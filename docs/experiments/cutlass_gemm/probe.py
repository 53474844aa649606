"""The cutlass_gemm library's kernel (every tile) against Inductor's code for linear + bias + GELU
(erf), both replayed from CUDA graphs back to back (as in a reduce-overhead model: L2 not flushed),
at the zoo's transformer MLP shapes, bf16. Checks each output against eager first.

    python3 docs/experiments/cutlass_gemm/probe.py     # a row a shape, JSON last
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_htam import build
from torch_htam.launcher import Kernel
from torch_htam.proposers.expert import gemm_cutlass

SHAPES = [("vit-b b32 fc1", 32 * 197, 768, 3072), ("bert-ish fc1", 8192, 768, 3072),
          ("d1024 fc1", 4096, 1024, 4096), ("mixer fc1", 32 * 196, 512, 2048),
          ("convnext s0 pw1", 32 * 56 * 56, 96, 384), ("convnext s2 pw1", 32 * 14 * 14, 384, 1536),
          ("small", 512, 768, 3072)]
REPS = 20


def operands(m: int, k: int, n: int, device: str = "cuda"):
    """x [m, k], w [n, k] (scaled by k^-0.5: activations of order 1) and bias [n], bf16, from torch's
    current random state."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k ** -0.5
    return x, w, torch.randn(n, device=device, dtype=torch.bfloat16)


def gelu_region(m: int, k: int, n: int):
    """(x, w, b, eager's gelu(linear), Inductor's code for it as a no-argument function) at seed 0:
    a probe's shape, as each probe sets it up."""
    torch.manual_seed(0)
    x, w, b = operands(m, k, n)
    return x, w, b, F.gelu(F.linear(x, w, b)), torch.compile(lambda: F.gelu(F.linear(x, w, b)))


def graphed_ms(fn, n=5):
    """fn captured REPS times into one CUDA graph; the best of n replays, per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(n):
        g.replay()
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / REPS)
    return best


def main():
    so, err = build.library(gemm_cutlass.LIBRARY, build.default_arch())
    assert so is not None, err
    srcs = [gemm_cutlass.render(0, 1, gemm_cutlass.Epilogue("gelu_erf", bias=2), 3, t) for t in range(len(gemm_cutlass.TILES))]
    kernels = [Kernel(r.so_path) for r in build.build_many(srcs)]
    rows = []
    for name, m, k, n in SHAPES:
        x, w, b, ref, ind = gelu_region(m, k, n)
        gemm_only = torch.compile(lambda: F.linear(x, w, b))
        row = dict(shape=name, m=m, k=k, n=n, inductor_ms=graphed_ms(ind), gemm_only_ms=graphed_ms(gemm_only),
                   default_tile=gemm_cutlass.default_tile(m, n))
        y = torch.empty_like(ref)
        for t, kern in enumerate(kernels):
            y.fill_(float("nan"))
            rc = kern([x, w, b], [y])
            torch.cuda.synchronize()
            err = (y.float() - ref.float()).abs().max().item() if rc == 0 else None
            row[f"tile{t}_rc"], row[f"tile{t}_err"] = rc, err
            row[f"tile{t}_ms"] = graphed_ms(lambda: kern([x, w, b], [y])) if rc == 0 else None
        rows.append(row)
        ts = " ".join(f"t{t} {row[f'tile{t}_ms'] * 1e3:6.1f}" if row[f"tile{t}_ms"] else f"t{t} rc{row[f'tile{t}_rc']}"
                      for t in range(len(kernels)))
        print(f"{name:16s} M={m:6d} K={k:4d} N={n:5d} inductor {row['inductor_ms'] * 1e3:6.1f} us "
              f"(gemm {row['gemm_only_ms'] * 1e3:6.1f})  cutlass us: {ts}  default t{row['default_tile']}  "
              f"err {max(row[f'tile{t}_err'] or 0 for t in range(len(kernels))):.3g}", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
