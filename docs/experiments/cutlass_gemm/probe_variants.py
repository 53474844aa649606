"""Times variants.cu's kernels (the cutlass_gemm library's, CUTLASS's built-in bias + GELU fusion,
the plain GEMM) against Inductor's linear + GELU and cuBLAS's linear, each replayed from a CUDA graph.

    python3 docs/experiments/cutlass_gemm/probe_variants.py
"""
import ctypes
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from torch_htam import build, paths

HERE = Path(__file__).resolve().parent
# variants-h200.txt's "lib" rows were the library at 8c88e18 (a visitor tree of ours); at HEAD
# variant 0 is the library as it is (CUTLASS's fusion, tile 0)
NAMES = {0: "lib act=gelu", 1: "builtin gelu 128x128", 2: "plain 128x128",
         3: "builtin gelu 128x256 c2", 4: "builtin gelu 128x128 pingpong", 5: "plain 128x256 c2"}


class Call(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("y", ctypes.c_void_p),
                ("m", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("act", ctypes.c_int32),
                ("tile", ctypes.c_int32), ("reserved", ctypes.c_int32)]


def graphed_us(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        g.replay()
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps)
    return best


def main():
    so = Path("/tmp/variants.so")
    root = build.find_cutlass()
    cmd = [str(paths.nvcc_path()), "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
           "-gencode=arch=compute_90a,code=sm_90a", f"-I{root / 'include'}", f"-I{root / 'tools/util/include'}",
           f"-I{HERE.parents[2] / 'torch_htam/csrc'}", str(HERE / "variants.cu"), "-o", str(so)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(so))
    for m, k, n in ((6304, 768, 3072), (4096, 1024, 4096), (100352, 96, 384)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = F.gelu(F.linear(x, w, b))
        ind = torch.compile(lambda: F.gelu(F.linear(x, w, b)))
        print(f"M={m} K={k} N={n}: inductor linear+gelu {graphed_us(ind):.1f} us, "
              f"cuBLAS linear {graphed_us(lambda: F.linear(x, w, b)):.1f} us", flush=True)
        for v, name in NAMES.items():
            call = Call(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), m, n, k, 0, 0, 0)   # GELU, tile 0
            fn = lambda: lib.htam_variant(v, ctypes.byref(call), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            rc = fn()
            torch.cuda.synchronize()
            err = (y.float() - ref.float()).abs().max().item()
            print(f"  {name:30s} rc {rc} err {err:.3g} {graphed_us(fn) if rc == 0 else float('nan'):7.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
