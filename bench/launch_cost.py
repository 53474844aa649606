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

    python3 bench/launch_cost.py [--out DIR]

Rows: "wrapper" (cpp, python, eager), "call" (ours: the product's launch in that wrapper; ours_o1:
launch_o1 from generated Python; extern_mm), "t1_us", "t21_us",
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


def _median_us(fn, x) -> float:
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    out = []
    for _ in range(ITERS):
        t0 = time.perf_counter()
        fn(x)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
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
    arms = (("cpp", dict(inductor.WRAPPER_OPTIONS), {"ours": "ours_o1", "extern_mm": "extern_mm"}),
            ("python", {}, {"ours": "ours_launch", "ours_o1": "ours_o1", "extern_mm": "extern_mm"}))
    for wrapper, options, calls in arms:
        for call, chain in calls.items():
            make = chains[chain]
            t, compile_s = {}, None
            for k in (1, LONG):
                torch._dynamo.reset()
                t0 = time.perf_counter()
                f = torch.compile(make(k), options=options, fullgraph=True)
                if not torch.allclose(f(x), make(k)(x)):
                    raise RuntimeError(f"{wrapper} {call} x{k}: wrong output")
                compile_s = time.perf_counter() - t0
                t[k] = _median_us(f, x)
            rows.append(_row(wrapper, call, t, compile_s))
            print(rows[-1], flush=True)
    ours = chains["ours_o1"]
    rows.append(_row("eager", "ours_o1", {k: _median_us(ours(k), x) for k in (1, LONG)}, None))
    return rows


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
