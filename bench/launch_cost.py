"""Host time of one of our launches inside a compiled graph (issues #34, #36), against one of
Inductor's own extern calls.

A served model at a small batch is bound by its host: each call's time is the launches' issue
time, not the GPU's. Our kernels enter Inductor's graph as htam::launch_o<N> (csrc/launcher.cpp)
where it compiles with its C++ wrapper, called through the dispatcher from C++; with its Python
wrapper as htam::launch, which the generated Python calls through the launcher's own binding
(inductor.direct_call: fallback.checked_launch). This times graphs of 1 and 21 chained calls of
the canary kernel (csrc/canary.cu: a + b on 8 floats, no real GPU work) and of a tiny matmul
(8x8: an extern cuBLAS call in both wrappers), and the op called eagerly; per call =
(t21 - t1) / 20, each t the median of 300 synced calls (us).

Conv sites (C++ wrapper only, as the served rows run): a chain of conv 3x3 + batch norm + ReLU
(bf16, channels-last, [1, 64, 8, 8]: aten's cuDNN conv and one Triton kernel a site, "aten_site")
against our launch of a site's inputs (x, w and the four batch-norm vectors, an output like x)
running one or two kernels (bench/kernels/site_canary.cu: "ours_site1", "ours_site2"). Their
difference bounds what host time a conv kernel of ours can save or lose at a host-bound site:
our cuDNN conv kernels launch two (the batch-norm fold, then cudnnBackendExecute, whose own host
time comes on top), a conv of our own with the fold in its epilogue would launch one.

    python3 bench/launch_cost.py [--out DIR]

Rows: "wrapper" (cpp, python, eager), "call" (ours: the product's launch in that wrapper, in the
C++ wrapper a direct call of launch_o1's C shim (launcher.export_shims); ours_dispatcher: the C++
wrapper calling launch_o1 through the dispatcher instead; ours_o1: launch_o1 from generated Python;
extern_mm; aten_site, ours_site1, ours_site2, ours_site1_dispatcher), "t1_us", "t21_us",
"per_call_us", "compile_s" (the 21-call graph's first call). GPU machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

ITERS, LONG = 300, 21
SITE_CU = Path(__file__).resolve().parent / "kernels" / "site_canary.cu"
SITE_SHAPE = (1, 64, 8, 8)   # [N, C, H, W]: a conv site with next to no GPU work
# The C++ wrapper calling launch_o<N> through the dispatcher, as before launcher.export_shims
NO_SHIMS = {"aot_inductor.custom_ops_to_c_shims": {}}


def _chains(handle: int, one: list[int], b: torch.Tensor, m: torch.Tensor) -> dict:
    """{call: make(k) -> a function of x (8 floats) making k chained calls}."""
    from torch_htam import launcher
    op = launcher.stable_op(1)

    def ours_o1(k):
        def f(a):
            for _ in range(k):
                a = op(handle, *one, a, b)
            return a
        return f

    def ours_launch(k):     # NOTE: never under the C++ wrapper (pytorch#190551: a one-tensor list)
        def f(a):
            for _ in range(k):
                a = torch.ops.htam.launch.default(handle, [a, b], [0, 1, 8])[0]
            return a
        return f

    def extern_mm(k):
        def f(a):
            s = a.view(1, 8)
            for _ in range(k):
                s = s @ m
            return s.view(8)
        return f
    return {"ours_o1": ours_o1, "ours_launch": ours_launch, "extern_mm": extern_mm}


def _site_chains(handles: dict[int, int]) -> tuple[dict, torch.Tensor]:
    """({call: make(k) -> a function of x making k chained conv sites}, x): aten_site, and
    ours_site<L> for each {launches: kernel handle} (site_canary.cu built with SITE_LAUNCHES=L)."""
    import torch.nn.functional as F
    from torch_htam import launcher
    from torch_htam.task import TensorSpec
    c = SITE_SHAPE[1]
    g = torch.Generator().manual_seed(0)
    cl = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(SITE_SHAPE, generator=g).to(**cl).contiguous(memory_format=torch.channels_last)
    w = (0.05 * torch.randn(c, c, 3, 3, generator=g)).to(**cl).contiguous(memory_format=torch.channels_last)
    gamma, beta = torch.ones(c, **cl), torch.zeros(c, **cl)
    mean, var = torch.zeros(c, **cl), torch.ones(c, **cl)
    meta = launcher.encode_out_meta([TensorSpec.of(x)])   # y like x: channels-last

    def aten_site(k):
        def f(a):
            for _ in range(k):
                a = torch.relu(F.batch_norm(F.conv2d(a, w, padding=1), mean, var, gamma, beta, False, 0.0, 1e-5))
            return a
        return f

    ours = {f"ours_site{n}": launch_chain(handle, meta, (w, gamma, beta, mean, var)) for n, handle in handles.items()}
    return {"aten_site": aten_site, **ours}, x


def launch_chain(handle: int, meta: list[int], params: tuple):
    """make(k) -> a function of x making k chained launch_o<N> calls of kernel `handle` on
    (x, *params), each output (out_meta `meta`, one output like x) the next call's x."""
    from torch_htam import launcher
    outputs, args = launcher.stable_args(handle, [], meta)
    op, slots = launcher.stable_op(outputs), list(args[1:1 + outputs * launcher.STABLE_META_SLOTS])

    def make(k):
        def f(a):
            for _ in range(k):
                a = op(handle, *slots, a, *params)
            return a
        return f
    return make


def _site_rows(options: dict) -> list[dict]:
    """The conv-site rows under Inductor's C++ wrapper (`options`)."""
    from torch_htam import build, launcher
    handles = {}
    for launches in (1, 2):
        res = build.build(f"#define SITE_LAUNCHES {launches}\n" + SITE_CU.read_text())
        if not res.ok:
            raise RuntimeError(f"site_canary.cu (SITE_LAUNCHES={launches}) did not build: {res.error}")
        handles[launches] = launcher.Kernel(res.so_path).handle
    chains, x = _site_chains(handles)
    rows = [_chain_row("cpp", call, make, x, options, tol=5e-2) for call, make in chains.items()]
    return rows + [_chain_row("cpp", "ours_site1_dispatcher", chains["ours_site1"], x, {**options, **NO_SHIMS},
                              tol=5e-2)]


def _chain_row(wrapper: str, call: str, make, x, options: dict, tol: float = 0.0) -> dict:
    """The row of the chains make(1) and make(LONG) compiled with `options`, each output checked
    against the chain run eagerly (within tol, relative and absolute; 0: allclose's defaults)."""
    t, compile_s = {}, None
    for k in (1, LONG):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        f = torch.compile(make(k), options=options, fullgraph=True)
        got, want = f(x), make(k)(x)
        ok = torch.allclose(got.float(), want.float(), rtol=tol, atol=tol) if tol else torch.allclose(got, want)
        if not ok:
            raise RuntimeError(f"{wrapper} {call} x{k}: wrong output")
        compile_s = time.perf_counter() - t0
        t[k] = median_us(f, x)
    row = _row(wrapper, call, t, compile_s)
    print(row, flush=True)
    return row


def median_us(fn, x, synced: bool = True) -> float:
    """The median us of ITERS calls of fn(x) after 20 warm ones: to the GPU's idle (synced), else
    to fn's return (the host's issue time; the GPU drained after each call, untimed)."""
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    out = []
    for _ in range(ITERS):
        t0 = time.perf_counter()
        fn(x)
        if synced:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(out)


def measure() -> list[dict]:
    from torch_htam import build, inductor, launcher
    inductor.direct_call()     # the Python wrapper's launches as the product's graphs make them
    res = build.build(open(inductor.CANARY_CU).read())
    if not res.ok:
        raise RuntimeError(f"the canary kernel did not build: {res.error}")
    handle = launcher.Kernel(res.so_path).handle
    n, args = launcher.stable_args(handle, [], [0, 1, 8])    # one fp32 output of 8
    one = list(args[1:1 + n * launcher.STABLE_META_SLOTS])
    x = torch.arange(8.0, device="cuda")
    chains = _chains(handle, one, torch.full((8,), 1.0, device="cuda"), torch.eye(8, device="cuda"))
    rows = []
    cpp, python = dict(inductor.WRAPPER_OPTIONS), {}
    arms = (("cpp", {"ours": ("ours_o1", cpp), "ours_dispatcher": ("ours_o1", {**cpp, **NO_SHIMS}),
                     "extern_mm": ("extern_mm", cpp)}),
            ("python", {"ours": ("ours_launch", python), "ours_o1": ("ours_o1", python),
                        "extern_mm": ("extern_mm", python)}))
    for wrapper, calls in arms:
        rows += [_chain_row(wrapper, call, chains[chain], x, options) for call, (chain, options) in calls.items()]
    ours = chains["ours_o1"]
    rows.append(_row("eager", "ours_o1", {k: median_us(ours(k), x) for k in (1, LONG)}, None))
    return rows + _site_rows(cpp)


def _row(wrapper: str, call: str, t: dict, compile_s: float | None) -> dict:
    return {"wrapper": wrapper, "call": call, "t1_us": round(t[1], 2), "t21_us": round(t[LONG], 2),
            "per_call_us": round((t[LONG] - t[1]) / (LONG - 1), 2),
            "compile_s": round(compile_s, 1) if compile_s is not None else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_cost needs a CUDA GPU", file=sys.stderr)
        return 2
    path = record.write("launch_cost", {"rows": measure()}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
