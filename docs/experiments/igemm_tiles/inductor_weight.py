"""Does torch.compile (default mode) pay a weight layout copy per call on a channels-last conv site
whose weight is KCRS, as a model holds it? The conv_sites site (conv 3x3 + BN + ReLU, bf16, x
channels-last) compiled with the weight KCRS and KRSC: the GPU kernels of one call (profiler) and
the synced time of a chain of 21 sites (CUDA graph of the compiled chain, us a site).

    PYTHONPATH=.:bench python3 docs/experiments/igemm_tiles/inductor_weight.py
"""
import torch
from torch.profiler import ProfilerActivity, profile
import conv_sites

for c, size, n in ((64, 56, 16), (512, 7, 16), (512, 7, 1)):
    x, w, *stats = conv_sites.site_inputs(c, size, n)
    for name, ww in (("KCRS", w), ("KRSC", w.contiguous(memory_format=torch.channels_last))):
        torch._dynamo.reset()
        site = conv_sites.Site()
        f = torch.compile(lambda a: site(a, ww, *stats))

        def sites21(a, ww=ww):
            for _ in range(21):
                a = site(a, ww, *stats)
            return a
        chain = torch.compile(sites21)
        f(x); chain(x); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(x); torch.cuda.synchronize()
        kernels = [e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"]
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            chain(x)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            chain(x)
        g.replay(); torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            g.replay()
        b.record(); torch.cuda.synchronize()
        print(f"C{c} {size}x{size} b{n} w {name}: {a.elapsed_time(b) * 1000 / (20 * 21):.1f} us a site (GPU, graph);"
              f" one call's kernels: {kernels}", flush=True)
