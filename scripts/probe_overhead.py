"""Where does a swapped call's host time go? Per-call host time (us) of the launcher binding (the
METH_FASTCALL one the runtime uses, and the older pybind11 one beside it) for: a kernel that
returns without launching, a relu with nvcc's default static cudart, the same relu built against
the shared cudart (one runtime for torch and all kernels), and torch.relu.

    python3 scripts/probe_overhead.py
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_htam import build, launcher, paths  # noqa: E402

RELU = r'''
#include "htam_abi.h"
__global__ void relu(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  int64_t n = htam_numel(&out[0]);
  %s
  relu<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, n);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}'''


def so(src: str, extra: list[str]) -> str:
    d = Path(tempfile.mkdtemp())
    (d / "k.cu").write_text(src)
    cmd = [paths.nvcc_path(), *build._flags(src, "sm_90a"), *extra, f"-I{build.CSRC}", str(d / "k.cu"),
           "-o", str(d / "k.so")]
    subprocess.run(cmd, check=True)
    return str(d / "k.so")


def per_call(fn, calls=20000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


x = torch.randn(1024, device="cuda")
meta = launcher.encode_out_meta([__import__("torch_htam.task", fromlist=["TensorSpec"]).TensorSpec.of(x)])
ext = launcher.extension()
bind, pyb = ext.launch, ext.launch_pybind
rows = {"torch.relu": per_call(lambda: torch.relu(x))}
for name, src, extra in (("noop (no launch), static cudart", RELU % "return HTAM_OK;", []),
                         ("relu, static cudart (default)", RELU % "", []),
                         ("relu, shared cudart", RELU % "", ["-cudart=shared"])):
    h = launcher.Kernel(so(src, extra)).handle
    rows[name] = per_call(lambda: bind(h, [x], meta))
    rows[name + " (pybind11 binding)"] = per_call(lambda: pyb(h, [x], meta))
    rows[name + " via fast_launch"] = per_call(lambda: launcher.fast_launch(h, [x], meta))
    y = torch.empty_like(x)
    rows[name + " via htam::run, no alloc"] = per_call(lambda: torch.ops.htam.run(h, [x], [y]))
rows["torch.empty_like alone"] = per_call(lambda: torch.empty_like(x))
rows["launcher.plain_eager alone"] = per_call(lambda: launcher.plain_eager([x]))
rows["python call of an empty lambda"] = per_call(lambda: None)
for k, v in rows.items():
    print(f"{k:48} {v:7.2f} us")
