"""The implicit-GEMM conv alone on the GPU: each IG_TILES tile, KCRS and KRSC weights, against
cuDNN's conv (F.conv2d, channels-last), at ResNet-18's 3x3 layers. Each time is a CUDA graph of 10
calls replayed 20 times (us a call; no host time in it). `--one` runs one config twice for ncu.

    PYTHONPATH=.:tests python3 docs/experiments/igemm_tiles/probe.py [--one]
"""
import sys
import torch
import torch.nn.functional as F
from test_conv_igemm import source
from torch_htam import build
from torch_htam.launcher import Kernel
from torch_htam.proposers.expert.conv_igemm import IG_TILES

SHAPES = [(16, 64, 56), (16, 128, 28), (16, 256, 14), (16, 512, 7), (1, 512, 7), (64, 512, 7), (1, 64, 56)]


def graph_us(fn, calls=10, reps=20) -> float:
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / (calls * reps)


def inputs(n, c, size):
    g = torch.Generator(device="cuda").manual_seed(c)
    cl = torch.channels_last
    x = torch.randn(n, c, size, size, device="cuda", generator=g).bfloat16().contiguous(memory_format=cl)
    w = (torch.randn(c, c, 3, 3, device="cuda", generator=g) / (9 * c) ** 0.5).bfloat16()
    one, zero = (torch.full((c,), v, device="cuda", dtype=torch.bfloat16) for v in (1.0, 0.0))
    stats = [one, zero, zero, one]   # gamma, beta, mean, var: y = relu(round(conv) / sqrt(1 + eps))
    y = torch.empty(n, c, size, size, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    return x, w, stats, y


def main():
    tiles = IG_TILES[:1] if "--one" in sys.argv else IG_TILES
    srcs = [source(torch.bfloat16, torch.bfloat16, 1, 1, 1, True, False, t) for t in tiles]
    kernels = [Kernel(r.so_path) for r in build.build_many(srcs, jobs=8)]
    shapes = SHAPES[:1] if "--one" in sys.argv else SHAPES
    print("shape (n, c, size) | cudnn KCRS | cudnn KRSC | " + " | ".join(f"ig {t} KCRS / KRSC" for t in tiles))
    for n, c, size in shapes:
        x, w, stats, y = inputs(n, c, size)
        wk = w.contiguous(memory_format=torch.channels_last)
        row = [graph_us(lambda: F.conv2d(x, w, padding=1)), graph_us(lambda: F.conv2d(x, wk, padding=1))]
        want = F.relu(F.conv2d(x.float(), w.float(), padding=1).bfloat16().float() / (1 + 1e-5) ** 0.5)
        for k in kernels:
            for ww in (w, wk):
                assert k([x, ww, *stats], [y]) == 0
                torch.cuda.synchronize()
                torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2 * (1 + want.abs().max().item()))
                row.append(graph_us(lambda: k([x, ww, *stats], [y])))
        flops = 2 * n * size * size * c * c * 9
        print(f"{(n, c, size)} | " + " | ".join(f"{t:.1f}" for t in row) + f" | ig best {flops / min(row[2:]) / 1e6:.0f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()
