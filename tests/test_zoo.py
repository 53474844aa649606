"""Breadth: a zoo of real architectures (tests/zoo_models.py: torchvision ResNet-18, MobileNetV2,
EfficientNet-B0, ViT; HF GPT-2, BERT, Llama, T5, a Whisper encoder; a hand-written MinGPT), built
from configs at tiny sizes with random weights, captured on the CPU. A model whose library does not
import is skipped.

Asserts, per model:
  - every compute op (ops.COMPUTE: anchor, row-wise, elementwise) of every captured graph lands in
    a region that became a task (Extraction.sites);
  - the goal: the built-in proposer has a path (coverage.path_of) for tasks holding >= 95% of the
    model's FLOPs and >= 90% of its bytes. Models below it today are xfail(strict) with the
    measured shares and the missing families: the day coverage improves they XPASS, which fails,
    and the mark must be updated;
  - (slow) the expert's first candidate of every task with a path, across the zoo, compiles for
    sm_90a with nvcc.
"""
from __future__ import annotations

import functools

import pytest

from torch_htam import build, ops, paths
from torch_htam.coverage import coverage, path_of
from torch_htam.extract import Extraction, extract
from torch_htam.partition import op_name
from zoo_models import ZOO

FLOPS_GOAL, BYTES_GOAL = 0.95, 0.90

# Measured on the zoo's sizes (the shares depend on them): python -c over coverage(extract(...)).
# Every model is at the goal today: 100% FLOPs and bytes but for ViT (99.6% / 99.4%: its final
# layer_norm + select of the class token, an output that is one row of the row program's space).
# Elementwise ops after a permute of an anchor's result, or spreading it over a larger shape
# (squeeze-excitation's gate), start an elementwise region (partition._outside_anchor_epilogue)
# that reads it in place; cat is index math in the elementwise kernel (ir.Access.window); GQA's
# repeat of k/v heads is a stride-0 dim of a GEMM's output map or of an elementwise program's
# iteration space.
# NOTE: a path is a generated kernel, not a verified one. On an H100 (commit 94288c3) two of these
# failed their GPU test: Llama's rotary + GQA repeat (its kernel read the iteration sizes from an
# input instead of the merged output) and Whisper's permute + add of the positional embedding (torch
# makes that output permuted-dense, the kernel wanted it contiguous). Both are fixed since, but not
# yet re-run on a GPU.
BELOW_GOAL: dict[str, str] = {}

# Compute ops that may stay outside every region, by model: none today (embedding, factory ops
# and index ops are not COMPUTE in ops.py). Add one here only with the reason it must.
OUTSIDE_REGIONS: dict[str, set[str]] = {}


@functools.lru_cache(maxsize=None)
def _extract(name: str) -> Extraction:
    return extract(*ZOO[name]())


def found(name: str) -> Extraction:
    """The model's extraction (once per session); skip when its library does not import."""
    try:
        return _extract(name)
    except ImportError as e:
        pytest.skip(f"{name}: {e}")


def _goal_params():
    for name in ZOO:
        marks = [pytest.mark.xfail(strict=True, reason=BELOW_GOAL[name])] if name in BELOW_GOAL else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(ZOO))
def test_every_compute_op_lands_in_a_task(name):
    ex = found(name)
    assert ex.capture.graphs and ex.tasks, ex.problems
    inside = {id(n) for s in ex.sites for n in s.region.nodes}
    outside = []
    for gm in ex.capture.graphs:
        live = _live(gm)   # dead code the capture kept is no task (extract says so in .problems)
        for n in gm.graph.nodes:
            row = ops.info(op_name(n))
            # NOTE: a group of casts alone is no task (partition: e.g. HF Llama's rotary
            # inv_freq.to(x.device, float32), a no-op on its own): a cast outside is by design
            if row is not None and row.category in ops.COMPUTE and not row.cast and id(n) not in inside \
                    and n in live and op_name(n) not in OUTSIDE_REGIONS.get(name, set()):
                outside.append(f"{n.name}: {n.target}")
    assert not outside, outside


def _live(gm) -> set:
    """Nodes whose value reaches the graph's output."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    live, work = set(), [out]
    while work:
        n = work.pop()
        for a in n.all_input_nodes:
            if a not in live:
                live.add(a)
                work.append(a)
    return live


@pytest.mark.parametrize("name", _goal_params())
def test_builtin_proposer_covers_the_model(name):
    cov = coverage(found(name).tasks)
    missing = sorted({f"{r['kind']}: {r['why']}" for r in cov["tasks"] if not r["path"]})
    assert cov["flops"] >= FLOPS_GOAL and cov["bytes"] >= BYTES_GOAL, (
        f"{100 * cov['flops']:.1f}% FLOPs, {100 * cov['bytes']:.1f}% bytes; no path: {missing}")


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_first_candidates_compile_for_sm90a():
    """The expert's first candidate (seed proposal, step 0) of every task with a path, over the
    whole zoo, compiles for sm_90a: tasks deduplicated by signature, sources by content (build_many
    builds one source once). Measured: 134 tasks with a path give 54 distinct sources (many convs
    share one), 3-4 min on 2 cores with nvcc, so every one is built (no sampling). Sources needing cuBLASLt or cuDNN headers are left
    out only when build cannot find the nvidia wheels' headers."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import ProposalRequest
    from torch_htam.proposers.expert import ExpertProposer
    have_cublas, have_cudnn = build.find_cublas() is not None, build.find_cudnn() is not None
    tasks = {}
    for name in ZOO:
        try:
            ex = _extract(name)
        except ImportError:
            continue
        for t in ex.tasks:
            if t.signature not in tasks and path_of(t) is None:
                tasks[t.signature] = (name, t)
    assert len(tasks) >= 20
    todo, empty = {}, []
    for name, t in tasks.values():
        prop = ExpertProposer().propose(ProposalRequest(t, "seed", [], n=1, policy=policy_for(t)))
        if not prop.candidates:
            empty.append(f"{name}/{t.name}: {prop.note}")
            continue
        src = prop.candidates[0].source
        if (have_cublas or "cublasLt.h" not in src) and (have_cudnn or "cudnn.h" not in src):
            todo.setdefault(src, f"{name}/{t.name}/{t.signature}")
    assert not empty, empty        # a path means at least one candidate
    results = build.build_many(list(todo), arch="sm_90a")
    bad = [(n, r.error[:800]) for n, r in zip(todo.values(), results) if not r.ok]
    assert not bad, bad
