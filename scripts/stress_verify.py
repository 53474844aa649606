"""Stress the verifier on the expert's candidates for some bench tasks: every distinct candidate
over all directions, verified with many seeds. A verdict that changes between runs on fixed seeds
is a race (METHOD.md: a moving error is a race).

    python3 scripts/stress_verify.py rw_layernorm_bf16 rw_softmax_bf16 [--seeds 12] [--repeat 2]
"""
import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_htam import build, verify  # noqa: E402
from torch_htam.launcher import Kernel  # noqa: E402
from torch_htam.policy import policy_for  # noqa: E402
from torch_htam.proposers.base import ProposalRequest  # noqa: E402
from torch_htam.proposers.expert import ExpertProposer  # noqa: E402
from torch_htam.extract import task_from_source  # noqa: E402
from torch_htam.task import load_reference  # noqa: E402

DIRS = {"seed": [], "parallel_mapping": ["warp_per_row", "block_per_row"],
        "reduction_strategy": ["warp_shuffle_reduction", "online_softmax", "welford_statistics"],
        "memory_access": ["vectorized_16b_access"], "data_reuse": ["row_in_registers"]}


def candidates(task):
    seen = {}
    for d, strats in DIRS.items():
        req = ProposalRequest(task, d, strats, n=4, policy=policy_for(task))
        for c in ExpertProposer().propose(req).candidates:
            seen.setdefault(c.source, c)
    return list(seen.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tasks", nargs="+")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    bad = 0
    for name in a.tasks:
        task = task_from_source(Path(f"bench/tasks/{name}.py").read_text(), name)
        ref = load_reference(task).cuda().eval()
        cands = candidates(task)
        builds = build.build_many([c.source for c in cands])
        for c, b in zip(cands, builds):
            if not b.ok:
                print(f"{name} {c.params}: BUILD {b.error[:200]}")
                bad += 1
                continue
            k = Kernel(b.so_path)
            verdicts = [verify.verify(task, k, ref, policy_for(task), seeds=range(a.seeds))
                        for _ in range(a.repeat)]
            same = len({v[1] for v in verdicts}) == 1
            ok, reason, detail, errs = verdicts[0]
            bad += (not ok) or (not same)
            print(f"{name:22} {str(c.params)[:70]:70} {reason:10} rel {errs.get('max_rel_err', 0):.1e}"
                  f"{'' if same else '  MOVING VERDICT'} {detail[:160]}")
    print(f"stress: {bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
