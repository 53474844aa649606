"""Cold optimize: what torch_htam.optimize costs on a model with an empty kernel cache, at the
default budget (OptimizeConfig(): 16 candidates per task), and what it keeps.

    python3 bench/optimize_time.py gpt2:bf16 resnet50:bf16
    python3 bench/optimize_time.py swin:bf16 --budget 90     # a zoo row (bench/model_zoo.py), a budget

    python3 bench/optimize_time.py unet:bf16 --budget 90 --prebuild both   # cold with and without prebuild.py
    python3 bench/optimize_time.py gpt2:bf16 --memory none warm.json     # no memory, then a memory file

Rows: bench/models.py's, else bench/model_zoo.py's. Per task search (searches()): when it started
and ended, in seconds from the first search's start, and its candidates' build seconds, so a
budget that reached few tasks shows where its time went; "searched": how many tasks it reached.

Each model gets a fresh kernel cache and HTG memory (HTAM_CACHE_DIR: a new temp dir per model),
then one optimize(model, inputs) call per --memory (in order, each in its own fresh cache and its own
process, with new Inductor and Triton caches: isolated()): "htg"
(the default: the HTG with no experience yet), "none" (OptimizeConfig(memory="none"): the defaults,
then strategies in a seeded random order), or an HTG memory file (bench/anytime.py --save-memory),
copied in as the GPU arch's memory before the call: a cold kernel cache with warm memory. The call is timed by wall clock: capture, the search of every task,
timing each kernel against Inductor's code for its region, the end-to-end guard and the compile.
The row holds the seconds, the searches' candidates (from their trajectory files), the report's
tasks (speedup over eager and over Inductor, status), its end-to-end figures and note, and the
optimized model's relative error against eager on fresh inputs (benchmark.rel_err). Writes
bench/results/optimize_time-<date>.json (bench/record.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_zoo  # noqa: E402
import models  # noqa: E402
import record  # noqa: E402


def searches(cache_root: Path) -> list[dict]:
    """One row per task search under a cache root's trajectory files: its "summary" line, when its
    first and last events were written (seconds since the first search's first event: where the
    search's time went, task after task), and its candidates' build seconds (summed; a build the
    cache already held reads 0)."""
    rows, t0 = [], None
    for f in sorted(cache_root.rglob("trajectories/*.jsonl")):
        events = [json.loads(line) for line in f.read_text().splitlines()]
        if not events:
            continue
        stamps = [datetime.datetime.fromisoformat(e["time"]).timestamp() for e in events if e.get("time")]
        cands = [e for e in events if e.get("event") == "candidate"]
        row = {"task": events[0].get("task"), "started": min(stamps, default=None), "ended": max(stamps, default=None),
               "build_s": sum(e.get("build_s") or 0.0 for e in cands),
               # the worker's seconds by part (evaluation.Evaluation.job_s), summed over candidates
               "job_s": {k: round(sum((e.get("job_s") or {}).get(k) or 0.0 for e in cands), 2)
                         for k in sorted({k for e in cands for k in (e.get("job_s") or {})})}}
        for e in events:
            if e.get("event") == "summary":
                row.update({k: e.get(k) for k in ("stop", "candidates", "correct", "best_speedup", "wall_s")})
        rows.append(row)
        t0 = min(t0 or row["started"], row["started"] or t0)
    for row in rows:
        for k in ("started", "ended"):
            row[k] = None if row[k] is None or t0 is None else round(row[k] - t0, 2)
    return sorted(rows, key=lambda r: (r["started"] is None, r["started"]))


def one(spec: str, budget_s: float | None = None, prebuild: bool = True, memory: str = "htg") -> dict:
    import shutil
    import torch_htam
    from torch_htam import gpu, paths
    from torch_htam.pipeline import OptimizeConfig
    from torch_htam.benchmark import rel_err
    name, dtype = spec.split(":")
    cfg = OptimizeConfig(prebuild=prebuild, memory="none" if memory == "none" else "htg",
                         **({} if budget_s is None else {"time_budget_s": budget_s}))
    # bench/models.py's rows, else the zoo's (bench/model_zoo.py)
    model, inputs = models.MODELS[name](dtype) if name in models.MODELS else model_zoo.make(spec)
    fresh = tuple(torch.randn_like(x) if x.is_floating_point() else x.clone() for x in inputs)
    with tempfile.TemporaryDirectory(prefix="htam-cold-") as d:
        os.environ["HTAM_CACHE_DIR"] = d
        if memory not in MEMORY_MODES:     # a memory file: this arch's memory before the call
            target = paths.memory_path(gpu.detect().arch, "expert")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(memory, target)
        with torch.inference_mode():
            want = model(*fresh)
        t0 = time.perf_counter()
        model = torch_htam.optimize(model, inputs, cfg)
        optimize_s = time.perf_counter() - t0
        with torch.inference_mode():
            got = model(*fresh)
        report = model.htam_report
        row = {"model": spec, "prebuild": prebuild, "memory": memory, "optimize_s": optimize_s, "config": asdict(cfg),
               "tasks": len(report.tasks), "swapped": report.swapped, "method": report.method,
               "note": report.note, "e2e_ms": dict(report.e2e), "phases": dict(report.phases),
               "rel_err": rel_err(got, want),
               "searches": searches(Path(d)),
               "task_rows": [{"name": t.name, "count": t.count, "vs_eager": t.speedup,
                              "vs_inductor": t.vs_inductor, "status": t.status} for t in report.tasks]}
    row["candidates"] = sum(s["candidates"] or 0 for s in row["searches"])
    row["searched"] = len(row["searches"])      # tasks whose search ran before the budget ended
    print(report.format(), flush=True)
    return row


def isolated(spec: str, budget_s: float | None = None, prebuild: bool = True, memory: str = "htg") -> dict:
    """one() in a fresh Python process whose Inductor and Triton caches are new temp dirs: each run
    is as cold as a new user's first call, whatever ran before it. NOTE: run in one process, the
    second of two arms found the first's compiled graph (gpt2:bf16 on an H100, optimize_time-
    20261202-185729: the final compile took 20.7 s in the first arm and 9.4 s in the second); the
    deadline reserves time for that compile, so the second arm's searches ran 51 s longer."""
    with tempfile.TemporaryDirectory(prefix="htam-arm-") as d:
        out = Path(d) / "row.json"
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(Path(d) / "inductor"),
                   TRITON_CACHE_DIR=str(Path(d) / "triton"))
        arm = json.dumps([spec, budget_s, prebuild, memory])
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--arm-out", str(out)],
                       env=env, check=True)
        return json.loads(out.read_text())


# --prebuild -> the OptimizeConfig.prebuild values each model runs with, in order
PREBUILD = {"on": (True,), "off": (False,), "both": (False, True)}
MEMORY_MODES = ("htg", "none")    # --memory values that are not a memory file


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["gpt2:bf16", "resnet50:bf16"])
    ap.add_argument("--budget", type=float, default=None,
                    help="OptimizeConfig.time_budget_s (s); default: OptimizeConfig's own")
    ap.add_argument("--prebuild", choices=PREBUILD, default="on",
                    help="OptimizeConfig.prebuild: on, off, or both (each model cold twice, off first)")
    ap.add_argument("--memory", nargs="+", default=["htg"],
                    help="per model, one cold optimize per value: htg (no experience yet), none, or an "
                         "HTG memory file (bench/anytime.py --save-memory)")
    ap.add_argument("--no-record", action="store_true", help="do not write a file to bench/results/")
    ap.add_argument("--arm", help=argparse.SUPPRESS)       # isolated()'s child: one run, JSON [spec, budget, prebuild, memory]
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)   # where the child writes its row
    a = ap.parse_args()
    if a.arm:
        Path(a.arm_out).write_text(json.dumps(one(*json.loads(a.arm)), default=str))
        return 0
    for m in a.memory:
        if m not in MEMORY_MODES and not Path(m).is_file():
            ap.error(f"--memory {m}: neither {' nor '.join(MEMORY_MODES)} nor a file")
    if not torch.cuda.is_available():
        print("optimize_time needs a CUDA GPU", file=sys.stderr)
        return 2
    rows, path = [], None
    for spec, prebuild, memory in [(s, p, m) for s in a.models for p in PREBUILD[a.prebuild] for m in a.memory]:
        rows.append(isolated(spec, a.budget, prebuild, memory))
        r = rows[-1]
        print(f"ROW {spec} prebuild={prebuild} memory={memory} optimize_s={r['optimize_s']:.1f} tasks={r['tasks']} searched={r['searched']} "
              f"candidates={r['candidates']} swapped={r['swapped']} rel_err={r['rel_err']:.2e}",
              flush=True)
        for s in r["searches"]:
            print(f"  {s['started']:>7}-{s['ended']:<7} s  {str(s['task'])[:48]:48} {s.get('stop')} "
                  f"cands {s.get('candidates')} ok {s.get('correct')} best {s.get('best_speedup')} "
                  f"build {s['build_s']:.1f} s job {s['job_s']}", flush=True)
        if not a.no_record:   # NOTE: written after every model, so a cut run keeps what it measured
            path = record.write("optimize_time", {"rows": rows}, path=path)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
