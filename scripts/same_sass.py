"""Does a change to the kernel generators leave the kernels the same? Generates the expert's
candidates for bench tasks at a base commit and in the working tree, builds both for sm_90a, and
compares the GPU machine code (SASS) of each candidate pair, names and addresses left out.

    python3 scripts/same_sass.py --base HEAD                 # every bench task's default set
    python3 scripts/same_sass.py --base HEAD gemm conv_bn    # tasks whose name contains a word
    python3 scripts/same_sass.py --base HEAD --set all       # every direction's candidates too

"default" is what the GPU test feeds (test_expert.test_default_candidates_match_torch): the first
two seed candidates and one reduction_strategy move. A candidate is matched across the two trees by
its task and params. Exits 1 when any pair differs, fails to build, or exists on one side only.
Same SASS means the same device code; the host side (grid, block, workspace) is checked on the GPU.
CPU machine with nvcc (cuBLASLt / cuDNN headers for the library-backed candidates)."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs inside the tree being read (its torch_htam on sys.path): prints {key: source} as JSON.
_GENERATE = r"""
import json, sys
from pathlib import Path
from torch_htam.extract import task_from_source
from torch_htam.policy import policy_for
from torch_htam.proposers.base import ProposalRequest
from torch_htam.proposers.expert import ExpertProposer
words, which = json.loads(sys.argv[1]), sys.argv[2]
moves = [("seed", [], 2), ("reduction_strategy",
         ["warp_shuffle_reduction", "online_softmax", "welford_statistics"], 1)]
if which == "all":
    moves = [("seed", [], 4),
             ("memory_access", ["vectorized_16b_access", "read_only_cache_loads"], 4),
             ("parallel_mapping", ["warp_per_row", "block_per_row", "grid_stride_loop", "persistent_grid"], 4),
             ("reduction_strategy", ["warp_shuffle_reduction", "online_softmax", "welford_statistics"], 4),
             ("fusion", ["fuse_elementwise_chain", "fuse_row_prologue_epilogue", "cublaslt_epilogue",
                         "gemm_plus_epilogue_kernel"], 4),
             ("instruction_throughput", ["ilp_unroll", "fast_math_intrinsics"], 4),
             ("compute_precision", ["tf32_tensor_cores", "bf16_tensor_cores"], 4)]
out = {}
for path in sorted(Path(sys.argv[3]).glob("*.py")):
    if words and not any(w in path.stem for w in words):
        continue
    task = task_from_source(path.read_text(), path.stem)
    for direction, sids, n in moves:
        req = ProposalRequest(task, direction, sids, n=n, policy=policy_for(task))
        for c in ExpertProposer().propose(req).candidates:
            out[path.stem + " " + json.dumps(c.params, sort_keys=True, default=str)] = c.source
print(json.dumps(out))
"""


def generate(tree: Path, words: list[str], which: str) -> dict[str, str]:
    # the tree first: its torch_htam, then whatever the caller's path holds (its dependencies)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", _GENERATE, json.dumps(words), which,
                          str(ROOT / "bench" / "tasks")], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"generating candidates in {tree} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
_CODE = re.compile(r"/\* 0x[0-9a-f]+ \*/")


def cuobjdump() -> str:
    """The CUDA toolkit's cuobjdump, else the copy Triton ships (pip's torch brings Triton)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        sys.exit("cuobjdump not found: install the CUDA toolkit's binutils or Triton")
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def sass(so_path: str) -> list[str]:
    """One normalized text per kernel in the .so, sorted: instructions only (no function names,
    addresses or encodings, which differ with a kernel's name but not with what it does)."""
    text = subprocess.run([cuobjdump(), "-sass", so_path], capture_output=True, text=True,
                          check=True).stdout
    kernels, body = [], None
    for line in text.splitlines():
        if "Function :" in line:
            if body is not None:
                kernels.append("\n".join(body))
            body = []
        elif body is not None:
            ins = _CODE.sub("", _ADDR.sub("", line)).strip()
            if ins and not ins.startswith(("....", ".L_x")):
                body.append(ins)
    if body is not None:
        kernels.append("\n".join(body))
    return sorted(kernels)


def base_tree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
                   check=True, capture_output=True)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("words", nargs="*", help="only bench tasks whose name contains one of these")
    ap.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--set", dest="which", choices=("default", "all"), default="default")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from torch_htam import build

    with tempfile.TemporaryDirectory(prefix="same_sass_") as tmp:
        tree = base_tree(args.base, Path(tmp) / "base")
        try:
            old = generate(tree, args.words, args.which)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)
        new = generate(ROOT, args.words, args.which)
        keys = sorted(old.keys() & new.keys())
        problems = [f"only at {args.base}: {k}" for k in sorted(old.keys() - new.keys())]
        problems += [f"only in the working tree: {k}" for k in sorted(new.keys() - old.keys())]
        same_text = sum(old[k] == new[k] for k in keys)
        changed = [k for k in keys if old[k] != new[k]]
        todo = [old[k] for k in changed] + [new[k] for k in changed]
        print(f"{len(keys)} candidates in both trees ({same_text} with the same source); "
              f"building {len(set(todo))} sources for sm_90a", flush=True)
        built = build.build_many(todo, arch="sm_90a", out_dir=Path(tmp) / "build", jobs=args.jobs,
                                 timeout_s=3600)
        by_source = dict(zip(todo, built))
        for k in changed:
            a, b = by_source[old[k]], by_source[new[k]]
            if not (a.ok and b.ok):
                problems.append(f"build failed ({'base' if not a.ok else 'new'}): {k}\n"
                                f"{(a.error if not a.ok else b.error)[:600]}")
            elif sass(a.so_path) != sass(b.so_path):
                problems.append(f"SASS differs: {k}")
    for p in problems:
        print(p)
    print(f"{len(keys) - len(problems)} of {len(keys)} candidates: the same SASS" if not problems
          else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
