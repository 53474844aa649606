"""What the GPU is: arch for nvcc, size, and measured ceilings for the roofline.

Detected at run time (never assumed): `detect()` reads torch.cuda; without CUDA it returns None and
callers fall back to the original PyTorch path. HTAM_ARCH overrides the nvcc target (e.g. for
precompiling on a machine without the GPU).

    >>> gpu.detect()
    GpuInfo(name='NVIDIA H100 80GB HBM3', arch='sm_90a', sms=132, ...)
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GpuInfo:
    name: str
    arch: str                  # nvcc target, e.g. "sm_90a" (Hopper gets the a-variant for wgmma)
    sms: int
    l2_bytes: int
    smem_per_block: int        # opt-in maximum, bytes
    mem_bandwidth: float       # bytes/s, datasheet-ish from clocks; timing.measure_ceilings refines it
    fp32_flops: float          # FLOP/s, CUDA cores
    tensor_flops: float        # FLOP/s, dense bf16/fp16 tensor cores (0 if unknown)

    def to_json(self) -> dict:
        return asdict(self)


def arch_for(major: int, minor: int) -> str:
    # sm_90a / sm_100a unlock wgmma / tcgen05; the plain targets cannot use them.
    suffix = "a" if (major, minor) in ((9, 0), (10, 0)) else ""
    return f"sm_{major}{minor}{suffix}"


# Dense tensor-core and CUDA-core rates by compute capability (datasheet leads, SXM parts);
# used only to bound the roofline, and replaced by measured ceilings where those exist.
_PEAKS = {(9, 0): (989e12, 67e12), (8, 0): (312e12, 19.5e12), (8, 9): (330e12, 82e12),
          (8, 6): (142e12, 35e12), (10, 0): (2250e12, 80e12)}


def detect(device: int = 0) -> GpuInfo | None:
    import torch
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(device)
    arch = os.environ.get("HTAM_ARCH") or arch_for(p.major, p.minor)
    # bandwidth: 2 (DDR) * memory clock (kHz) * bus width (bits) / 8, where torch exposes them.
    clk = getattr(p, "memory_clock_rate", 0) or 0
    bus = getattr(p, "memory_bus_width", 0) or 0
    bw = 2.0 * clk * 1e3 * bus / 8 if clk and bus else 3.35e12
    tensor, fp32 = _PEAKS.get((p.major, p.minor), (0.0, 0.0))
    smem = getattr(p, "shared_memory_per_block_optin", 0) or 49152
    return GpuInfo(p.name, arch, p.multi_processor_count, getattr(p, "L2_cache_size", 0) or 0,
                   smem, bw, fp32, tensor)
