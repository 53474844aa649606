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

from torch_htam import build
from torch_htam.proposers.expert import gemm_cutlass

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from zoo_shapes import measure  # noqa: E402

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
    rows = measure(SHAPES, region, gemm_cutlass.Epilogue("silu_mul", mul=2),
                   third=lambda m, n, b: torch.randn(m, n, device="cuda", dtype=torch.bfloat16),
                   arms={"cublas_gemm": lambda x, w, u: F.linear(x, w)})
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
