"""The deployment path (issue 7): cold optimize, warm optimize, precompile, and loading a bundle.

    python3 bench/bench_deploy.py [MODEL_SPEC] [--steps 1] [--budget 60]

Each phase runs in a fresh Python process, as a user would meet it, and times the model's first
call afterwards too (under torch.compile, where a cold process compiles):
  cold      an empty cache dir: launcher build, capture, search, verification, install
  warm      a new process on the same cache: capture + cache hits + install, no search
  precompile   (in the warm process) the bundle written from the cache
  load      a new process with empty caches of its own (the production box): torch_htam.load of
            the bundle, which brings the prebuilt launcher and Inductor's code for the model
  compile   a new process with an empty Inductor cache: torch.compile(model) alone, the first-call
            latency the bundle is compared with
Times are of the torch_htam call alone (imports and model construction excluded), in seconds. Each
phase checks the result against the original model on a fresh input. Writes the run's raw figures
to bench/results/bench_deploy-<date>.json (bench/record.py): suite "bench_deploy", spec, steps,
budget_s, rows = one dict per phase as the phase printed it (phase, seconds, swapped, tasks,
kernels, rel_err, note, first_call_s; precompile_s in the warm phase's).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# One phase, run as `python3 bench_deploy.py --phase NAME ...` in its own process; prints JSON last.
PHASE = r'''
import json, sys, time, torch
import torch_htam
from torch_htam.modelspec import load_model_spec
phase, spec, bundle, steps, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
torch.manual_seed(0)
model, inputs = load_model_spec(spec, device="cuda")
model.eval()
fresh = tuple(torch.randn_like(x) if x.is_floating_point() else x for x in inputs)
with torch.inference_mode():
    want = model(*fresh)
    cfg = torch_htam.OptimizeConfig(steps=steps, time_budget_s=budget, progress=False,
                                    search=phase == "cold")
    t0 = time.perf_counter()
    if phase == "load":
        model = torch_htam.load(model, bundle, inputs)
    elif phase == "compile":
        model = torch.compile(model)
    else:
        model = torch_htam.optimize(model, inputs, cfg)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    extra = {}
    if phase == "warm":
        t0 = time.perf_counter()
        torch_htam.precompile(model, inputs, bundle, torch_htam.OptimizeConfig(search=False, progress=False))
        extra["precompile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = model(*fresh)   # under torch.compile, a cold process compiles here
    torch.cuda.synchronize()
    extra["first_call_s"] = time.perf_counter() - t0
from torch_htam import inductor, runtime
rep = getattr(model, "htam_report", None) or runtime.Report()   # torch.compile alone has none
inductor.sync_report(model)
err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()
print(json.dumps({"phase": phase, "seconds": took, "swapped": rep.swapped, "tasks": len(rep.tasks),
                  "kernels": sum(t.status == "swapped" for t in rep.tasks) or sum(t.speedup is not None for t in rep.tasks),
                  "rel_err": err, "note": rep.note, **extra}))
'''


def run_phase(phase: str, spec: str, cache: Path, bundle: Path, steps: int, budget: float,
              inductor_cache: Path) -> dict:
    """One phase in its own process; cache: torch_htam's cache dir, inductor_cache: Inductor's
    (the development box's phases share one, the server and the plain torch.compile start empty)."""
    env = {**os.environ, "HTAM_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
           "PYTHONPATH": f"{ROOT}{os.pathsep}" + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", PHASE, phase, spec, str(bundle), str(steps), str(budget)],
                       env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"phase {phase} failed:\n{r.stderr[-4000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{phase:8} {out['seconds']:8.2f} s  first call {out['first_call_s']:.2f} s  swapped {out['swapped']}  "
          f"rel err {out['rel_err']:.1e}"
          + (f"  precompile {out['precompile_s']:.2f} s" if "precompile_s" in out else "")
          + (f"  ({out['note']})" if out["note"] else ""), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="?", default=str(ROOT / "examples" / "gpt_block.py"))
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--budget", type=float, default=60.0, help="search seconds (cold phase)")
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        bundle = d / "bundle"
        cold = run_phase("cold", a.spec, d / "cache", bundle, a.steps, a.budget, d / "inductor_dev")
        warm = run_phase("warm", a.spec, d / "cache", bundle, a.steps, a.budget, d / "inductor_dev")
        load = run_phase("load", a.spec, d / "server_cache", bundle, a.steps, a.budget, d / "inductor_server")
        plain = run_phase("compile", a.spec, d / "plain_cache", bundle, a.steps, a.budget, d / "inductor_plain")
    rows = [("cold optimize (empty cache, search)", cold), ("warm optimize (cached, new process)", warm),
            ("bundle load (empty caches, new process)", load),
            ("torch.compile alone (empty Inductor cache, new process)", plain)]
    body = ("| phase | seconds | first call s | regions swapped | max rel err vs original | note |\n"
            "|---|---|---|---|---|---|\n"
            + "\n".join(f"| {name} | {r['seconds']:.2f} | {r['first_call_s']:.2f} | {r['swapped']} | "
                        f"{r['rel_err']:.1e} | {r['note'] or '-'} |" for name, r in rows)
            + f"\n| precompile (bundle written, warm cache) | {warm['precompile_s']:.2f} | - | - | - |\n")
    print(body)
    if not a.no_record:
        import record
        spec = a.spec
        try:
            spec = str(Path(a.spec).resolve().relative_to(ROOT))
        except ValueError:
            pass
        record.write("bench_deploy", {"spec": spec, "steps": a.steps, "budget_s": a.budget,
                                      "rows": [dict(r, label=name) for name, r in rows]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
