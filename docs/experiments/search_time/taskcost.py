"""Where a served model's search time goes, per task and per candidate (a diagnostic, not a
benchmark row; issues #34, #36). One cold optimize of a bench/serve_models.py row with its declared
dynamic dims, at a budget, in a fresh kernel cache; then every task's search (bench/optimize_time.py's
searches(): its start and end, candidates, build seconds and the worker's seconds by part,
Evaluation.job_s) and every candidate event of its trajectory (reason, speedup, build_s, job_s).

    cd <repo> && PYTHONPATH=.:bench python3 docs/experiments/search_time/taskcost.py vision:bf16 300 > cost.log
"""
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = ["bench"]   # run from the repository root
import torch  # noqa: E402
import serve_models  # noqa: E402
import torch_htam  # noqa: E402
from optimize_time import searches  # noqa: E402

FIELDS = ("event", "step", "direction", "strategies", "reason", "detail", "speedup", "build_s", "job_s", "stop",
          "wall_s")

spec, budget = sys.argv[1], float(sys.argv[2])
model, example, dynamic, make_inputs = serve_models.make(spec)
with tempfile.TemporaryDirectory() as d:
    os.environ["HTAM_CACHE_DIR"] = d
    t0 = time.time()
    with torch.inference_mode():
        m = torch_htam.optimize(model, example, torch_htam.OptimizeConfig(dynamic=dynamic, time_budget_s=budget))
    print("optimize_s", round(time.time() - t0, 1), flush=True)
    print("phases", {k: round(v, 1) for k, v in m.htam_report.phases.items()})
    for s in searches(Path(d)):
        print("TASK", json.dumps(s))
    for f in sorted(Path(d).rglob("trajectories/*.jsonl")):
        events, first = [json.loads(line) for line in f.read_text().splitlines()], None
        for e in events:   # seconds since the task's first event, then the event's fields
            at = datetime.datetime.fromisoformat(e["time"]).timestamp() if e.get("time") else None
            first = first or at
            keep = {k: e.get(k) for k in FIELDS if e.get(k) is not None}
            print("  EV", f.stem[:40], round((at or 0) - (first or 0), 2), json.dumps(keep)[:420])
