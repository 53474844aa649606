"""Which attention kernel is fastest on this GPU at the zoo's attention shapes: PyTorch's SDPA
backends (FlashAttention-2, memory-efficient, cuDNN) against the one torch.compile runs.

    python3 bench/attention_backends.py            # bf16, every shape; JSON to bench/results/
    python3 bench/attention_backends.py --dtype fp16

Why: #34 asks for attention kernels faster than Inductor's. Inductor lowers SDPA to one of these
fused kernels (it writes no attention kernel of its own), so the first question is whether a
faster one already exists on Hopper. Each shape is the attention of a bench/model_zoo.py model at
its example inputs: (batch, q heads, kv heads, q len, kv len, head dim, causal, additive bias).
A backend that refuses a shape (GQA, a bias, a head dim) is recorded with its error.

Timing: device time. Each arm's `calls` calls are captured in one CUDA graph and its replay timed
by CUDA events, median of `reps`, the arms interleaved per rep: most of these attentions run in
tens of microseconds, under the host's issue time per call, so plain back-to-back calls would time
the host. "compile" is torch.compile(sdpa) in default mode, as a user's model runs it (Inductor
lowers SDPA to the fused op the dispatcher picks); "default" is eager's own pick, named in
"default_backend" (torch._fused_sdp_choice).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402


@dataclass(frozen=True)
class Shape:
    model: str
    b: int
    hq: int
    hkv: int
    lq: int
    lk: int
    d: int
    causal: bool = False
    bias: bool = False            # an additive float (1, hq, lq, lk) mask, as T5 and Swin add


SHAPES = [
    Shape("llama prefill", 4, 16, 4, 512, 512, 64, causal=True),
    Shape("gpt2", 8, 12, 12, 256, 256, 64, causal=True),
    Shape("bert", 8, 12, 12, 128, 128, 64),
    Shape("vit-b/16", 32, 12, 12, 197, 197, 64),
    Shape("whisper encoder", 1, 8, 8, 1500, 1500, 64),
    Shape("t5 encoder", 4, 8, 8, 512, 512, 64, bias=True),
    Shape("swin window 7", 32 * 64, 3, 3, 49, 49, 32, bias=True),
    Shape("llama-7b prefill", 1, 32, 32, 2048, 2048, 128, causal=True),
]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}


def inputs(s: Shape, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(s.b, s.hq, s.lq, s.d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(s.b, s.hkv, s.lk, s.d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    bias = torch.randn(1, s.hq, s.lq, s.lk, device="cuda", dtype=dtype, generator=g) if s.bias else None
    return q, k, v, bias


def sdpa(q, k, v, bias, causal: bool):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal,
                                          enable_gqa=q.shape[1] != k.shape[1])


def graphed(fn, calls: int) -> torch.cuda.CUDAGraph:
    """`calls` calls of fn (warmed up already) captured as one CUDA graph."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def events_ms(g: torch.cuda.CUDAGraph, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def measure(s: Shape, dtype: torch.dtype, compiled, reps: int, calls: int) -> dict:
    q, k, v, bias = inputs(s, dtype)
    ref = sdpa(q.float(), k.float(), v.float(), None if bias is None else bias.float(), s.causal)
    arms, errors, err = {}, {}, {}
    for name, backend in BACKENDS.items():
        def run(backend=backend):
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, bias, s.causal)
        try:
            err[name] = (run().float() - ref).abs().max().item()
            arms[name] = run
        except RuntimeError as e:                     # the backend refuses this shape
            errors[name] = str(e).splitlines()[0][:200]
    arms["default"] = lambda: sdpa(q, k, v, bias, s.causal)
    arms["compile"] = lambda: compiled(q, k, v, bias, s.causal)
    for n in ("default", "compile"):
        err[n] = (arms[n]().float() - ref).abs().max().item()
    for fn in arms.values():                          # warm-up: plans, autotuning, compiles
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graphs = {n: graphed(fn, calls) for n, fn in arms.items()}
    times = {n: [] for n in arms}
    for _ in range(reps):
        for n, g in graphs.items():
            times[n].append(events_ms(g, calls))
    ms = {n: statistics.median(t) for n, t in times.items()}
    fastest = min(BACKENDS.keys() & ms.keys(), key=ms.get)
    choice = torch._fused_sdp_choice(q, k, v, bias, 0.0, s.causal, enable_gqa=s.hq != s.hkv)
    return {**asdict(s), "ms": ms, "max_abs_err": err, "refused": errors, "default_backend": SDPBackend(choice).name,
            "fastest": fastest, "fastest_vs_compile": ms["compile"] / ms[fastest]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    a = p.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    torch.manual_seed(0)
    compiled = torch.compile(sdpa)
    rows = []
    with torch.inference_mode():
        for s in SHAPES:
            r = measure(s, dtype, compiled, a.reps, a.calls)
            rows.append(r)
            cells = " ".join(f"{n} {t:.4f}" for n, t in r["ms"].items())
            print(f"{s.model:18s} {cells}  default {r['default_backend']}, fastest {r['fastest']}"
                  f" {r['fastest_vs_compile']:.2f}x compile"
                  f"{'  refused: ' + ','.join(r['refused']) if r['refused'] else ''}", flush=True)
    record.write("attention_backends", {"dtype": a.dtype, "reps": a.reps, "calls": a.calls, "rows": rows},
                 results_dir=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
