"""Headroom of a GEMM with its bias + GELU fused, under CUDA graphs (torch.compile reduce-overhead):
Inductor's linear + GELU region against its linear alone, back to back (L2 as in a model: no flush).
The gap bounds what a GEMM kernel with the activation in its epilogue can save a region.

    python3 docs/experiments/cutlass_gemm/headroom.py   # prints one row a shape, JSON last
"""
import json
import sys

import torch
import torch.nn.functional as F

# (name, M = tokens, K, N): the fc1 GEMMs of the zoo's transformer MLPs (bf16)
SHAPES = [("vit-b b32", 32 * 197, 768, 3072), ("bert b16x512?", 8192, 768, 3072),
          ("whisper-ish", 4 * 1500, 512, 2048), ("mixer", 32 * 196, 512, 2048),
          ("convnext s0", 32 * 56 * 56, 96, 384), ("convnext s2", 32 * 14 * 14, 384, 1536),
          ("d1024", 4096, 1024, 4096)]


def per_call_ms(fn, args, n=200):
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        s.record()
        for _ in range(n):
            fn(*args)
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / n)
    return best


def main():
    rows = []
    for name, m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        fused = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b)), mode="reduce-overhead")
        plain = torch.compile(lambda x, w, b: F.linear(x, w, b), mode="reduce-overhead")
        t_f, t_p = per_call_ms(fused, (x, w, b)), per_call_ms(plain, (x, w, b))
        tflops = 2 * m * k * n / t_p / 1e9
        rows.append(dict(shape=name, m=m, k=k, n=n, inductor_gelu_ms=t_f, gemm_only_ms=t_p, tflops=tflops,
                         bound=t_f / t_p))
        print(f"{name:14s} M={m:6d} K={k:5d} N={n:5d}  linear+gelu {t_f*1e3:7.1f} us  linear {t_p*1e3:7.1f} us "
              f"({tflops:5.0f} TFLOP/s)  bound {t_f / t_p:.2f}x", flush=True)
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
