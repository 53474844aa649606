"""Probe: when optimize's compiled model beats torch.compile, is it the kernels or the graph?

optimize hands Inductor each Dynamo graph re-exported to aten (capture.export_graph: functionalized,
constant attention masks folded) with our kernels swapped in. Arms, timed interleaved in this
process, one torch.compile mode per process:
  compile     torch.compile(model)
  reexport    the re-exported graph with no kernel swapped (HtamBackend(keep_reexport=True), the
              base optimize's guard also tries)
  optimized   torch_htam.optimize(model) in the same mode (its guard's verdict: kernels kept or not)
A reexport arm as fast as optimized says the gain is the graph path, not the kernels.

    python3 scripts/probe_graph.py llama:bf16 gpt2:bf16 [--mode reduce-overhead] [--budget 45]

Prints a table per model; writes $OUT/probe_graph_<mode>.json (or /tmp/). GPU machine.
"""
import argparse
import copy
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402
import torch_htam  # noqa: E402
from torch_htam import inductor  # noqa: E402
from torch_htam.benchmark import rel_err  # noqa: E402
from torch_htam.pipeline import OptimizeConfig  # noqa: E402
from torch_htam.timing import time_many  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--mode", default="default", choices=inductor.MODES)
    ap.add_argument("--budget", type=float, default=45.0)
    a = ap.parse_args()
    res = {}
    for spec in a.models:
        name, dtype = spec.split(":")
        model, inputs = models.MODELS[name](dtype)
        fns = {"compile": inductor.compile_with(model, None, a.mode)}
        fns["reexport"] = inductor.compile_with(model, inductor.HtamBackend({}, a.mode, keep_reexport=True))
        fns["optimized"] = torch_htam.optimize(copy.deepcopy(model), inputs, OptimizeConfig(
            steps=1, time_budget_s=a.budget, progress=False, mode=a.mode))
        with torch.inference_mode():
            ref = model(*inputs).clone()
            errs = {k: rel_err(f(*inputs).clone(), ref) for k, f in fns.items()}
        times = time_many(fns, inputs, iters=100, rounds=10)
        report = fns["optimized"].htam_report
        res[spec] = {"mode": a.mode, "swapped": report.swapped, "note": report.note, "rel_err": errs,
                     "ms": {k: [t.median_ms, t.p20_ms, t.p80_ms] for k, t in times.items()}}
        base = times["compile"].median_ms
        print(f"{spec} ({a.mode}; optimized kept {report.swapped} kernels)")
        for k, t in times.items():
            print(f"  {k:10} {t.median_ms:8.3f} ms  p20-p80 {t.p20_ms:.3f}-{t.p80_ms:.3f}  "
                  f"{base / t.median_ms:5.2f}x of torch.compile  rel err {errs[k]:.1e}", flush=True)
        torch_htam.runtime.restore(fns["optimized"])
        del fns, model
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT", "/tmp")) / f"probe_graph_{a.mode}.json"
    out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
