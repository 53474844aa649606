"""The cutlass_gemm library's SwiGLU gate, silu(x @ w^T) * up in one launch (every tile), against
eager, Inductor's code for the same region (the gate's GEMM, then a kernel for silu * up) and cuBLAS's
GEMM alone, bf16, at the SwiGLU MLP shapes of decoders (the zoo's Llama and common sizes), each
timed as zoo_shapes.py times: as the search times a candidate (timing.time_fn: L2 flushed, inputs
rotated) and replayed from CUDA graphs back to back. Checks each output against eager first.

    python3 docs/experiments/cutlass_gemm/swiglu.py     # a row a shape, JSON last
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

from torch_htam import build, timing
from torch_htam.launcher import Kernel
from torch_htam.proposers.expert import gemm_cutlass

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe import graphed_ms, operands  # noqa: E402

# (name, M rows, K hidden, N intermediate): the gate GEMM of each MLP
SHAPES = [("zoo llama 4x512", 4 * 512, 1024, 2816), ("llama-7b 1x2048", 2048, 4096, 11008),
          ("llama-7b 4x128", 512, 4096, 11008), ("qwen2-0.5b 4x512", 2048, 896, 4864),
          ("llama-3.2-1b 4x512", 2048, 2048, 8192)]


def region(x, w, u):
    return F.silu(F.linear(x, w)) * u


def main():
    t0 = time.perf_counter()
    so, err = build.library(gemm_cutlass.LIBRARY, build.default_arch())
    assert so is not None, err
    print(f"library ready in {time.perf_counter() - t0:.0f} s", flush=True)
    srcs = [gemm_cutlass.render(0, 1, gemm_cutlass.Epilogue("silu_mul", mul=2), 3, t)
            for t in range(len(gemm_cutlass.TILES))]
    kernels = [Kernel(r.so_path) for r in build.build_many(srcs)]
    ind = torch.compile(region)
    rows = []
    for name, m, k, n in SHAPES:
        torch.manual_seed(0)

        def make():
            x, w, _ = operands(m, k, n)
            u = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            return x, w, u, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        x, w, u, y = make()
        ref = region(x, w, u)
        fns = {"eager": lambda x, w, u, y: region(x, w, u), "inductor": lambda x, w, u, y: ind(x, w, u),
               "cublas_gemm": lambda x, w, u, y: F.linear(x, w)}
        for t, kern in enumerate(kernels):
            fns[f"t{t}"] = lambda x, w, u, y, kern=kern: kern([x, w, u], [y])
        row = dict(shape=name, m=m, k=k, n=n, default_tile=gemm_cutlass.default_tile(m, n))
        for key, fn in fns.items():
            y.fill_(float("nan"))
            out = fn(x, w, u, y)
            if key.startswith("t") and out != 0:      # the library refused or failed: its rc, no time
                row[f"{key}_rc"] = out
                continue
            out = y if key.startswith("t") else out
            torch.cuda.synchronize()
            if key != "cublas_gemm":
                row[f"{key}_err"] = (out.float() - ref.float()).abs().max().item()
            row[f"{key}_searched_ms"] = timing.time_fn(lambda s, fn=fn: fn(*s), make).median_ms
            row[f"{key}_graphed_ms"] = graphed_ms(lambda fn=fn: fn(x, w, u, y))
        rows.append(row)
        cols = " ".join(f"{key} {row[f'{key}_searched_ms'] * 1e3:6.1f}/{row[f'{key}_graphed_ms'] * 1e3:6.1f}"
                        if f"{key}_rc" not in row else f"{key} rc {row[f'{key}_rc']}" for key in fns)
        errs = max(v for key, v in row.items() if key.endswith("_err"))
        print(f"{name:20s} M={m:5d} K={k:4d} N={n:5d} us searched/graphed: {cols}  default t{row['default_tile']} "
              f"err {errs:.3g}", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
