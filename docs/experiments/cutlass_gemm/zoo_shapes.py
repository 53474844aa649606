"""The cutlass_gemm library's kernel (every tile) against eager and Inductor's code for linear + bias
+ GELU (erf), bf16, at the shapes the zoo's models really run (bench/model_zoo.py, batch as there),
timed two ways: as the search times a candidate (timing.time_fn: L2 flushed, inputs rotated) and
replayed from CUDA graphs back to back (as in a reduce-overhead model). Checks each output first.

    python3 docs/experiments/cutlass_gemm/zoo_shapes.py     # a row a shape, JSON last
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_htam import build, timing
from torch_htam.launcher import Kernel
from torch_htam.proposers.expert import gemm_cutlass

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe import graphed_ms, operands  # noqa: E402

# (name, M rows, K, N): fc1 of each GELU MLP in bench/model_zoo.py at the zoo's batch
SHAPES = [("vit b16", 16 * 197, 768, 3072), ("bert b8x128", 8 * 128, 768, 3072),
          ("whisper 1x1500", 1500, 512, 2048), ("convnext/swin s0 b16", 16 * 56 * 56, 96, 384),
          ("convnext/swin s1 b16", 16 * 28 * 28, 192, 768), ("convnext/swin s2 b16", 16 * 14 * 14, 384, 1536),
          ("convnext/swin s3 b16", 16 * 7 * 7, 768, 3072)]


def region(x, w, b):
    return F.gelu(F.linear(x, w, b))


def measure(shapes, region, epi: gemm_cutlass.Epilogue, third=lambda m, n, b: b, arms=None) -> list[dict]:
    """A row per shape (name, M, K, N): the library at every tile with epilogue epi (its inputs x, w and
    third(m, n, bias): the bias, or another [M, N] operand) against eager's and Inductor's code for
    region(x, w, third) and the extra arms (name -> fn(x, w, third)), each output checked against
    eager's, each timed as the search times a candidate and replayed from CUDA graphs. A tile the
    library refuses or fails records its rc ("t<i>_rc") and no time."""
    srcs = [gemm_cutlass.render(0, 1, epi, 3, t) for t in range(len(gemm_cutlass.TILES))]
    kernels = [Kernel(r.so_path) for r in build.build_many(srcs)]
    ind = torch.compile(region)
    rows = []
    for name, m, k, n in shapes:
        torch.manual_seed(0)

        def make():
            x, w, b = operands(m, k, n)
            return x, w, third(m, n, b), torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        x, w, c, y = make()
        ref = region(x, w, c)
        fns = {"eager": lambda x, w, c, y: region(x, w, c), "inductor": lambda x, w, c, y: ind(x, w, c),
               **{key: lambda x, w, c, y, f=f: f(x, w, c) for key, f in (arms or {}).items()}}
        for t, kern in enumerate(kernels):
            fns[f"t{t}"] = lambda x, w, c, y, kern=kern: kern([x, w, c], [y])
        row = dict(shape=name, m=m, k=k, n=n, default_tile=gemm_cutlass.default_tile(m, n))
        for key, fn in fns.items():
            y.fill_(float("nan"))
            out = fn(x, w, c, y)
            if key.startswith("t") and out != 0:
                row[f"{key}_rc"] = out
                continue
            out = y if key.startswith("t") else out
            torch.cuda.synchronize()
            if key not in (arms or {}):
                row[f"{key}_err"] = (out.float() - ref.float()).abs().max().item()
            row[f"{key}_searched_ms"] = timing.time_fn(lambda s, fn=fn: fn(*s), make).median_ms
            row[f"{key}_graphed_ms"] = graphed_ms(lambda fn=fn: fn(x, w, c, y))
        rows.append(row)
        cols = " ".join(f"{key} {row[f'{key}_searched_ms'] * 1e3:6.1f}/{row[f'{key}_graphed_ms'] * 1e3:6.1f}"
                        if f"{key}_rc" not in row else f"{key} rc {row[f'{key}_rc']}" for key in fns)
        err = max(v for key, v in row.items() if key.endswith("_err"))
        print(f"{name:22s} M={m:6d} K={k:4d} N={n:5d} us searched/graphed: {cols}  default t{row['default_tile']} "
              f"err {err:.3g}", flush=True)
    return rows


def main():
    so, err = build.library(gemm_cutlass.LIBRARY, build.default_arch())
    assert so is not None, err
    rows = measure(SHAPES, region, gemm_cutlass.Epilogue("gelu_erf", bias=2))
    json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), sys.stdout)
    print()


if __name__ == "__main__":
    main()
