"""Why the served decoder's and encoder's ranged attention and GEMM tasks verified no candidate (#36,
#34): each task's first 4 expert candidates built and evaluated as a search worker does (run_job,
the whole declared range). A diagnostic, not a benchmark row.

    cd <repo> && python3 docs/experiments/ranged_tasks/probe_verify.py decoder:bf16 encoder:bf16
"""
import os
import sys
import tempfile
import time

sys.path[:0] = ["bench", "."]
os.environ.setdefault("HTAM_CACHE_DIR", tempfile.mkdtemp())
import torch
import serve_models
from torch_htam.extract import extract_tasks
from torch_htam.proposers.expert.proposer import ExpertProposer
from torch_htam.proposers.base import ProposalRequest
from torch_htam.policy import policy_for
from torch_htam.evaluation import run_job
from torch_htam import build
for spec in sys.argv[1:]:
    model, example, dynamic, _ = serve_models.make(spec)
    with torch.inference_mode():
        tasks = extract_tasks(model, example, dynamic=dynamic)
    seen = set()
    for t in tasks:
        if t.kind not in ("attention", "gemm", "rowwise") or t.name in seen and t.kind != "gemm":
            continue
        seen.add(t.name)
        p = ExpertProposer().propose(ProposalRequest(t, "", [], n=4, policy=policy_for(t)))
        if not p.candidates:
            print(spec, t.name, t.signature[:8], "NO CANDIDATES", p.note, flush=True); continue
        t0 = time.time()
        rs = build.build_many([c.source for c in p.candidates], arch="sm_90a")
        for c, r in zip(p.candidates, rs):
            if not r.ok:
                print(spec, t.name, t.signature[:8], c.tags, "BUILD FAIL", (r.error or "")[:300], flush=True); continue
            out = run_job({"kind": "evaluate", "task": t.to_json(), "so_path": r.so_path,
                           "policy": policy_for(t).to_json(), "time": True})
            print(spec, t.name, t.signature[:8], c.params, out.get("correct"), out.get("reason"),
                  str(out.get("detail"))[:400], "buckets", out.get("buckets"),
                  "speedup", out.get("speedup"), "err", out.get("max_abs_err"), flush=True)
            if out.get("exit"):
                print("CONTEXT DEAD"); sys.exit(1)
        print("   task took", round(time.time() - t0, 1), "s", flush=True)
