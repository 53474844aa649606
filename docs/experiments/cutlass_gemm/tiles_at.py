"""Every tile of the cutlass_gemm library at one shape, both epilogue kinds: bias + erf GELU and
SwiGLU's silu(x @ w^T) * up. Per tile: the first call's rc, three more calls' rcs (the library's
cache of initialized kernels), the max error against eager, and the time as the search times a
candidate (timing.time_fn: L2 flushed, inputs rotated). One tile a process, so a tile that breaks
the CUDA context does not take the others with it:

    for t in 0 1 2 3 4; do python3 docs/experiments/cutlass_gemm/tiles_at.py 2048 1024 2816 $t; done
"""
import sys

import torch
import torch.nn.functional as F

from torch_htam import build, timing
from torch_htam.launcher import Kernel
from torch_htam.proposers.expert import gemm_cutlass as gc


def main(m: int, k: int, n: int, t: int):
    so, err = build.library(gc.LIBRARY, build.default_arch())
    assert so is not None, err

    def make():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        u = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        return x, w, b, u, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    x, w, b, u, _ = make()
    for name, epi, sel, ref in [
            ("gelu", gc.Epilogue("gelu_erf", bias=2), lambda s: [s[0], s[1], s[2]], lambda: F.gelu(F.linear(x, w, b))),
            ("silu_mul", gc.Epilogue("silu_mul", mul=2), lambda s: [s[0], s[1], s[3]], lambda: F.silu(F.linear(x, w)) * u)]:
        kern = Kernel(build.build_many([gc.render(0, 1, epi, 3, t)])[0].so_path)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        try:
            rc = kern(sel((x, w, b, u)), [y])
            torch.cuda.synchronize()
            e = (y.float() - ref().float()).abs().max().item()
            again = [kern(sel((x, w, b, u)), [y]) for _ in range(3)]
            torch.cuda.synchronize()
            ms = timing.time_fn(lambda s: kern(sel(s), [s[4]]), make).median_ms
            print(name, t, "rc", rc, "again", again, "err", e, "ms", ms, flush=True)
        except Exception as ex:      # noqa: BLE001 - the experiment reports what broke and goes on
            print(name, t, "EXC", repr(ex)[:100], flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
