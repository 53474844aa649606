"""Candidate build+load time, parallel build throughput, load_inline for contrast, launcher overhead.

    python3 bench/bench_build.py                 # on the GPU machine; writes bench/results/bench_build-*.json
    python3 bench/bench_build.py --no-record --no-load-inline   # quick look, nothing written

Every build uses a fresh directory (nothing cached). Targets (DESIGN.md): build+load median <= 5 s,
host overhead of one kernel call <= 10 us. Host time per call is on a 1024-float relu: the op through
torch.ops, launcher.fast_launch (what the runtime's swapped nodes call), and the runtime's own path.
The raw figures go to bench/results/ (bench/record.py): suite "bench_build", nvcc, arch, cpus, gpu,
serial, parallel, calls, rows = {"measure", "value", "unit"} per figure.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record as provenance  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_htam import build, launcher, paths  # noqa: E402
from torch_htam.task import TensorSpec  # noqa: E402

# A relu candidate; BLOCK, CAP and TAG make distinct sources (distinct content hashes).
CANDIDATE = r"""#include "htam_abi.h"
// candidate TAG
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = fmaxf(x[i], 0.0f);
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  int64_t n = htam_numel(&in[0]);
  if (n == 0) return HTAM_OK;
  int64_t blocks = (n + BLOCK - 1) / BLOCK;
  relu_kernel<<<(unsigned)(blocks < CAP ? blocks : CAP), BLOCK, 0, stream>>>(
      (const float*)in[0].data, (float*)out[0].data, n);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
"""

# The same kernel as a torch extension, for load_inline.
INLINE_CUDA = r"""#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = fmaxf(x[i], 0.0f);
}
torch::Tensor relu(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int64_t n = x.numel(), blocks = (n + 255) / 256;
  relu_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


def candidates(n: int, salt: str) -> list[str]:
    shapes = [(b, c) for c in (1024, 4096, 65535) for b in (128, 256, 512, 1024)]
    return [CANDIDATE.replace("TAG", f"{salt}-{i}").replace("BLOCK", str(shapes[i % len(shapes)][0]))
            .replace("CAP", str(shapes[i % len(shapes)][1])) for i in range(n)]


def bench_serial(n: int, arch: str, load: bool) -> dict:
    """Build and load n distinct candidates one at a time, each in a fresh directory."""
    times, builds = [], []
    for src in candidates(n, uuid.uuid4().hex[:8]):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            res = build.build(src, arch=arch, out_dir=d, jobs=1)
            assert res.ok, res.error
            if load:
                launcher.Kernel(res.so_path)
            times.append(time.perf_counter() - t0)
            builds.append(res.seconds)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "median_nvcc_s": statistics.median(builds)}


def bench_parallel(n: int, arch: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        results = build.build_many(candidates(n, uuid.uuid4().hex[:8]), arch=arch, out_dir=d, jobs=n)
        total = time.perf_counter() - t0
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return {"n": n, "total_s": total, "per_s": n / total}


def bench_load_inline(arch: str) -> float:
    """One cold load_inline (fresh build directory) of the same relu as a torch extension."""
    from torch.utils.cpp_extension import load_inline
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{arch[3]}.{arch[4:]}"       # sm_90a -> 9.0a: one arch
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        mod = load_inline(name=f"bench_relu_{uuid.uuid4().hex[:8]}", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                          cuda_sources=INLINE_CUDA, functions=["relu"], build_directory=d,
                          extra_cuda_cflags=["-O3"], verbose=False)
        seconds = time.perf_counter() - t0
        x = torch.randn(1000, device="cuda")
        torch.testing.assert_close(mod.relu(x), torch.relu(x))
    return seconds


def per_call_us(fn, calls: int) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def bench_overhead(arch: str, calls: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        res = build.build(candidates(1, "overhead")[0], arch=arch, out_dir=d)
        assert res.ok, res.error
        k = launcher.Kernel(res.so_path)
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    meta = launcher.encode_out_meta([TensorSpec.of(x)])
    torch.testing.assert_close(k.launch([x], meta)[0], torch.relu(x))
    launch, launch_default, h = torch.ops.htam.launch, torch.ops.htam.launch.default, k.handle
    fast, binding = launcher.fast_launch, launcher.extension().launch
    gm, model = swapped_relu(k, x)
    torch.testing.assert_close(gm(x)[0], torch.relu(x))
    torch.testing.assert_close(model(x), torch.relu(x))
    assert model.htam_report.fast_calls == 1, model.htam_report.format()
    return {"torch.relu": per_call_us(lambda: torch.relu(x), calls),
            "torch.ops.htam.launch": per_call_us(lambda: launch(h, [x], meta), calls),
            "torch.ops.htam.launch.default": per_call_us(lambda: launch_default(h, [x], meta), calls),
            "Kernel.__call__ (htam::run)": per_call_us(lambda: k([x], [y]), calls),
            "launcher.fast_launch": per_call_us(lambda: fast(h, [x], meta), calls),
            "launcher.extension().launch (the binding alone)": per_call_us(lambda: binding(h, [x], meta), calls),
            "runtime: swapped GraphModule, 1 region": per_call_us(lambda: gm(x), calls),
            "runtime: installed model forward (guard + graph)": per_call_us(lambda: model(x), calls)}


def swapped_relu(kernel: launcher.Kernel, x: torch.Tensor) -> tuple[torch.fx.GraphModule, torch.nn.Module]:
    """relu(x) captured and swapped for `kernel`: the runtime's graph alone, and installed in a model."""
    from torch_htam import runtime
    from torch_htam.extract import extract
    model = Relu()
    found = extract(model, (x,))
    assert len(found.tasks) == 1, found.tasks
    sig = found.tasks[0].signature
    gm, swapped = runtime.swap(found.capture.graphs[0], found.sites_of(0), {sig: kernel})
    assert len(swapped) == 1, gm.htam_load_errors
    return gm, runtime.install(model, found, {sig: kernel})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serial", type=int, default=8, help="candidates built one at a time")
    p.add_argument("--parallel", type=int, default=16, help="candidates in the parallel batch")
    p.add_argument("--calls", type=int, default=10_000, help="calls timed for host overhead")
    p.add_argument("--no-load-inline", action="store_true", help="skip the ~1 min load_inline build")
    p.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    args = p.parse_args()
    gpu = torch.cuda.is_available()
    arch = build.default_arch()
    rows: list[dict] = []       # {"measure", "value" (as measured), "unit"}

    def add(measure: str, value: float, unit: str) -> None:
        rows.append({"measure": measure, "value": value, "unit": unit})

    if gpu:
        t0 = time.perf_counter()
        launcher.get()
        add("launcher build/load (first get())", time.perf_counter() - t0, "s")
    s = bench_serial(args.serial, arch, load=gpu)
    what = "build+load" if gpu else "build (no GPU: no load)"
    add(f"{what}, median of {args.serial} (one at a time)", s["median_s"], "s")
    add(f"{what}, min", s["min_s"], "s")
    add(f"{what}, max", s["max_s"], "s")
    add("nvcc time per candidate (ninja log), median", s["median_nvcc_s"], "s")
    par = bench_parallel(args.parallel, arch)
    add(f"parallel batch of {par['n']} (-j{par['n']}), total", par["total_s"], "s")
    add("parallel throughput", par["per_s"], "candidates/s")
    if gpu and not args.no_load_inline:
        add("load_inline of the same kernel, cold", bench_load_inline(arch), "s")
    if gpu:
        for name, us in bench_overhead(arch, args.calls).items():
            add(f"host time per call: {name}", us, "us")

    env = {"nvcc": paths.nvcc_version(), "arch": arch, "cpus": os.cpu_count(), "gpu": gpu}
    print(f"torch {torch.__version__}, nvcc {env['nvcc']}, arch {arch}, {env['cpus']} CPUs, "
          f"device: {torch.cuda.get_device_name() if gpu else 'no GPU'}")
    width = max(len(r["measure"]) for r in rows)
    for r in rows:
        print(f"{r['measure']:<{width}}  {r['value']:.2f} {r['unit']}")
    if not args.no_record:
        provenance.write("bench_build", {**env, "serial": args.serial, "parallel": args.parallel,
                                         "calls": args.calls, "rows": rows})


if __name__ == "__main__":
    main()
