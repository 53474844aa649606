"""What Inductor's C++ wrapper saves on the zoo's host-bound rows (issue #34, host time).

In default mode Inductor launches a compiled graph's kernels from generated Python; with
`cpp_wrapper=True` the same kernels are launched from generated C++. Where a model runs its calls in
more host time than GPU time (ConvNeXt and ViT bf16: 2.1-2.7 ms a call for about 1 ms of GPU time,
bench/findings.md), that launch code is the call. Arms per row, timed interleaved in one process
(torch_htam.timing.time_arms: synced latency, back-to-back throughput, device time):

  eager, compile (torch.compile default), compile_cpp (default mode, cpp_wrapper=True),
  compile_ro (mode="reduce-overhead": CUDA graphs, the host-time floor); on request (--arms), the
  C++ wrapper's variants: compile_cpp_o1 (its C++ at Inductor's default -O1, where compile_cpp has
  the decision's -O0) and compile_cpp_sep (its entry and kernels compiled apart,
  cpp_wrapper_build_separate)

    python3 bench/host_wrapper.py convnext:bf16 vit:bf16 [--out DIR]
    python3 bench/host_wrapper.py gpt2:bf16 --arms compile,compile_cpp,compile_cpp_o1,compile_cpp_sep

Row fields: "<arm>_ms" (synced median), "<arm>_ms_b2b", "<arm>_device_ms", "<arm>_compile_s" (its
first call), "cpp_vs_compile" (compile ms / compile_cpp ms, synced; "_b2b" back to back), "error".
GPU machine. Each row under torch.inference_mode(); fp32 rows with TF32 on, as the zoo's.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import record  # noqa: E402
import model_zoo  # noqa: E402

ARMS = ("eager", "compile", "compile_cpp", "compile_ro")
# Inductor options of the C++ wrapper's arms beyond the decision's own (inductor.WRAPPER_OPTIONS), by
# arm (compiled in the order given: the first pays the wrapper's precompiled header where it is not
# built yet)
CPP_ARMS = {"compile_cpp": {},
            "compile_cpp_o1": {"aot_inductor.compile_wrapper_opt_level": "O1"},
            "compile_cpp_sep": {"cpp_wrapper_build_separate": True}}


def _arm(name: str, model):
    import torch
    if name == "eager":
        return model
    if name in CPP_ARMS:   # the decision's C++-wrapper arm, as optimize compiles it
        from torch_htam.inductor import WRAPPER_OPTIONS
        return torch.compile(model, options={**WRAPPER_OPTIONS, **CPP_ARMS[name]})
    return torch.compile(model, mode="reduce-overhead" if name == "compile_ro" else None)


def row(name: str, rounds: int, small: bool = False, device: str = "cuda", arms: tuple = ARMS) -> dict:
    import torch
    import torch._dynamo
    from torch_htam.policy import tf32_switches
    from torch_htam.timing import GradMode, time_arms, wait_for_quiet_host
    out: dict = {"model": name}
    torch._dynamo.reset()
    model, inputs = model_zoo.make(name, small, device)
    with tf32_switches(name.endswith(":fp32")), torch.inference_mode():
        fns = {}
        for arm in arms:
            try:
                fn = _arm(arm, copy.deepcopy(model))
                t0 = time.perf_counter()
                for _ in range(3):
                    fn(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
                out[f"{arm}_compile_s"] = round(time.perf_counter() - t0, 2)
                fns[arm] = (lambda f: (lambda *a: f(*a)))(fn)
            except Exception as e:  # noqa: BLE001 -- an arm that fails is reported, the row goes on
                out[f"{arm}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
        wait_for_quiet_host()   # Inductor's compile workers, busy after the compiles
        times = time_arms(fns, inputs, iters=3 * rounds, rounds=rounds, grad=GradMode.INFERENCE)
    for arm, t in times.items():
        out[f"{arm}_ms"] = round(t.latency.median_ms, 4)
        out[f"{arm}_ms_b2b"] = round(t.throughput.median_ms, 4)
        out[f"{arm}_device_ms"] = round(t.device.median_ms, 4) if t.device else None
    if "compile_ms" in out and "compile_cpp_ms" in out:
        out["cpp_vs_compile"] = round(out["compile_ms"] / out["compile_cpp_ms"], 4)
        out["cpp_vs_compile_b2b"] = round(out["compile_ms_b2b"] / out["compile_cpp_ms_b2b"], 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="+", help=f"zoo rows, of: {', '.join(model_zoo.ROWS)}")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--small", action="store_true", help="the rows' small models (a CPU smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default bench/results)")
    ap.add_argument("--arms", type=lambda v: tuple(x for x in v.split(",") if x), default=ARMS,
                    help=f"arms in compile order (default {','.join(ARMS)}; also {','.join(list(CPP_ARMS)[1:])})")
    args = ap.parse_args()
    if unknown := set(args.arms) - set(ARMS) - set(CPP_ARMS):
        ap.error(f"--arms takes {', '.join(dict.fromkeys(ARMS + tuple(CPP_ARMS)))}, not {', '.join(sorted(unknown))}")
    rows, path = [], None
    for name in args.rows:
        try:
            r = row(name, args.rounds, args.small, args.device, args.arms)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            r = {"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(r)
        print({k: v for k, v in r.items() if not k.endswith("_error")}, flush=True)
        path = record.write("host_wrapper", {"rows": rows}, args.out, path=path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
