"""Probe (GPU): the cutlass_conv library (torch_htam/csrc/cutlass_conv.cu), a ResNet conv site
(conv + batch norm from raw statistics [+ residual] + ReLU) in one CUTLASS launch, against aten's
site (cuDNN's conv, then batch norm, add, ReLU) and torch.compile's, at ResNet-50's conv shapes, bf16,
channels-last, batches 1, 16 and 64.

    python3 docs/experiments/cutlass_conv/probe.py [--so LIB.so] [--out DIR]

Builds the library with build.library (CUTLASS's headers: pip install --no-deps nvidia-cutlass)
where --so is not given. Per shape and batch: the largest error of ours and of aten's bf16 site
against an fp32 reference of the same bf16 inputs; device us a call (each arm's 20 calls captured in
one CUDA graph, replayed, median of 5); ours' host ns a call (htam_cutlass_conv_bn called 200 times,
the kernel's cached parameters, no sync) and uncached (TMA descriptors encoded every call). Writes
conv_bn_probe.json under --out and prints a table.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "bench"))
from attention_backends import events_ms, graphed  # noqa: E402
TILES = {0: "128x64", 1: "128x128", 2: "64x64"}
# name, C, K, R(=S), stride, pad, H (input), residual
SITES = [("l1.conv2", 64, 64, 3, 1, 1, 56, False), ("l1.conv3", 64, 256, 1, 1, 0, 56, True),
         ("l2.conv2.s2", 128, 128, 3, 2, 1, 56, False), ("l2.conv2", 128, 128, 3, 1, 1, 28, False),
         ("l3.conv2", 256, 256, 3, 1, 1, 14, False), ("l4.conv2", 512, 512, 3, 1, 1, 7, False),
         ("l4.conv3", 512, 2048, 1, 1, 0, 7, True)]
BATCHES = (1, 16, 64)
EPS = 1e-5


def build_library() -> Path:
    from torch_htam import build
    major, minor = torch.cuda.get_device_capability()
    t0 = time.time()
    so, err = build.library("cutlass_conv", f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}")
    if so is None:
        raise SystemExit(err)
    print(f"library {so} in {time.time() - t0:.0f} s", flush=True)
    return so


class ConvBn(ctypes.Structure):
    """cutlass_conv.h's HtamConvBn."""
    _fields_ = ([(k, ctypes.c_void_p) for k in ("x", "w", "mean", "gamma", "var", "beta", "res", "y")]
                + [(k, ctypes.c_int32) for k in ("n", "h", "wd", "c", "k", "r", "s", "pad_h", "pad_w", "stride_h",
                                                 "stride_w", "dil_h", "dil_w", "relu", "tile")]
                + [("eps", ctypes.c_float)])


def load(so: Path):
    lib = ctypes.CDLL(str(so))
    p = ctypes.c_void_p
    lib.htam_cutlass_conv_bn.argtypes = [ctypes.POINTER(ConvBn), p]
    lib.htam_cutlass_conv_bn.restype = ctypes.c_int
    lib.htam_cutlass_conv_bn_host_ns.argtypes = [ctypes.POINTER(ConvBn), p, ctypes.c_int, ctypes.c_int]
    lib.htam_cutlass_conv_bn_host_ns.restype = ctypes.c_double
    return lib


def tensors(n, c, k, r, stride, pad, h, residual, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cl = torch.channels_last
    p = (h + 2 * pad - r) // stride + 1
    t = {"x": torch.randn(n, c, h, h, device="cuda", generator=g).to(torch.bfloat16).contiguous(memory_format=cl),
         "w": (torch.randn(k, c, r, r, device="cuda", generator=g) / (c * r * r) ** 0.5)
         .to(torch.bfloat16).contiguous(memory_format=cl),
         "mean": (0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16),
         "gamma": (0.5 + torch.rand(k, device="cuda", generator=g)).to(torch.bfloat16),
         "var": (0.5 + torch.rand(k, device="cuda", generator=g)).to(torch.bfloat16),
         "beta": (0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16)}
    t["res"] = (torch.randn(n, k, p, p, device="cuda", generator=g).to(torch.bfloat16).contiguous(memory_format=cl)
                if residual else None)
    t["y"] = torch.empty(n, k, p, p, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    return t


def site(t, stride, pad):
    """aten's site in the tensors' dtype: what eager PyTorch and (as extern kernels) Inductor run."""
    y = F.conv2d(t["x"], t["w"], None, stride, pad)
    y = F.batch_norm(y, t["mean"], t["var"], t["gamma"], t["beta"], False, 0.0, EPS)
    return F.relu(y + t["res"] if t["res"] is not None else y)


def reference(t, stride, pad):
    f = {k: (v.float() if v is not None else None) for k, v in t.items()}
    return site(f, stride, pad)


def ours_call(lib, t, dims, cached, host_calls=0):
    """dims: n h w c k r s pad_h pad_w stride_h stride_w dil_h dil_w relu tile."""
    ptr = lambda v: v.data_ptr() if v is not None else None   # noqa: E731
    call = ConvBn(*[ptr(t[k]) for k in ("x", "w", "mean", "gamma", "var", "beta", "res", "y")], *dims, EPS)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    if host_calls:
        return lib.htam_cutlass_conv_bn_host_ns(ctypes.byref(call), stream, host_calls, cached)
    return lib.htam_cutlass_conv_bn(ctypes.byref(call), stream)


def graph_us(fn, calls=20, reps=5) -> float:
    """Device us a call: `calls` calls captured in one CUDA graph (bench/attention_backends.py's
    helpers), replayed; the median of reps."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = graphed(fn, calls)
    return statistics.median(events_ms(g, calls) * 1000 for _ in range(reps))


def probe_one(lib, name, c, k, r, stride, pad, h, residual, n, compiled) -> dict:
    t = tensors(n, c, k, r, stride, pad, h, residual)
    ref = reference(t, stride, pad)
    scale = ref.abs().max().item()
    row = {"site": name, "batch": n, "C": c, "K": k, "R": r, "stride": stride, "H": h, "residual": residual,
           "aten_err": (site(t, stride, pad).float() - ref).abs().max().item() / scale}
    best = None
    for tile in TILES:
        dims = [n, h, h, c, k, r, r, pad, pad, stride, stride, 1, 1, 1, tile]
        rc = ours_call(lib, t, dims, cached=1)
        torch.cuda.synchronize()
        if rc != 0:
            row[f"tile_{TILES[tile]}"] = {"rc": rc}
            continue
        err = (t["y"].float() - ref).abs().max().item() / scale
        us = graph_us(lambda: ours_call(lib, t, dims, cached=1))
        row[f"tile_{TILES[tile]}"] = {"rc": 0, "err": err, "us": us}
        if best is None or us < row[f"tile_{TILES[best]}"]["us"]:
            best = tile
    if best is not None:
        dims = [n, h, h, c, k, r, r, pad, pad, stride, stride, 1, 1, 1, best]
        row.update(best_tile=TILES[best], ours_us=row[f"tile_{TILES[best]}"]["us"],
                   ours_err=row[f"tile_{TILES[best]}"]["err"],
                   host_ns_cached=ours_call(lib, t, dims, 1, host_calls=200),
                   host_ns_uncached=ours_call(lib, t, dims, 0, host_calls=50))
        torch.cuda.synchronize()
    row["aten_us"] = graph_us(lambda: site(t, stride, pad))
    row["compile_us"] = graph_us(lambda: compiled(t["x"], t["w"], t["mean"], t["var"], t["gamma"], t["beta"],
                                                  t["res"], stride, pad))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--so", help="a built cutlass_conv library (default: build.library builds it)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    lib = load(Path(args.so) if args.so else build_library())
    torch.backends.cudnn.allow_tf32 = False      # the fp32 reference's convs in fp32, not TF32

    def fn(x, w, mean, var, gamma, beta, res, stride, pad):
        return site({"x": x, "w": w, "mean": mean, "var": var, "gamma": gamma, "beta": beta, "res": res},
                    stride, pad)
    for knob in ("recompile_limit", "cache_size_limit"):     # one graph per site and batch (21)
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    compiled = torch.compile(fn, dynamic=False)
    rows = []
    for n in BATCHES:
        for s in SITES:
            row = probe_one(lib, *s, n, compiled)
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "conv_bn_probe.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"\n{'site':12s} {'N':>3s} {'tile':>8s} {'ours us':>8s} {'aten us':>8s} {'compile us':>10s} "
          f"{'host ns':>8s} {'uncached':>9s} {'err':>8s} {'aten err':>8s}")
    for r in rows:
        print(f"{r['site']:12s} {r['batch']:3d} {r.get('best_tile', '-'):>8s} {r.get('ours_us', float('nan')):8.1f} "
              f"{r['aten_us']:8.1f} {r['compile_us']:10.1f} {r.get('host_ns_cached', float('nan')):8.0f} "
              f"{r.get('host_ns_uncached', float('nan')):9.0f} {r.get('ours_err', float('nan')):8.4f} "
              f"{r['aten_err']:8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
