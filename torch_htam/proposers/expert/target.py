"""The per-kind target interface of the expert proposer, and what the targets share.

A target is one kind of region the expert writes CUDA for: elementwise.py, rowwise.py, gemm.py,
conv.py and attention.py each export one as TARGET. proposer.py drives every target the same way:
match the graph, take the defaults (or the parent's params), apply strategy moves (strategies.TABLE), refit, keep the
valid and distinct settings, render each. The matched region is the target's own object; all the
generic loop reads of it is `.facts` (strategies.TaskFacts).

    >>> m = elementwise.TARGET.match(task.graph, policy)          # raises Unsupported
    >>> src = elementwise.TARGET.render(m, elementwise.TARGET.defaults(m))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from torch_htam.proposers.expert.cuda import DT
from torch_htam.proposers.expert.ir import FLOAT_DTYPES, ExprProgram
from torch_htam.proposers.expert.strategies import TaskFacts


def pow2_vec(params: dict) -> bool:
    """Vector widths are powers of two (loads and stores of 2/4/8/16 bytes)."""
    v = params.get("vec", 1)
    return not v & (v - 1)


def _same(region: Any, params: dict, *rest) -> dict:
    return params


@dataclass(frozen=True)
class Target:
    """One kind of region. Every function takes the region `match` returned (`m` below)."""
    kind: str                                    # "elementwise" | "rowwise" | "gemm" | "conv" | "attention" | "pool"
    match: Callable[[Any, Any], Any]             # (graph module, policy) -> m; raises ir.Unsupported
    defaults: Callable[[Any], dict]              # m -> the default params
    tags: Callable[[Any, dict], list[str]]       # (m, params) -> strategy ids the setting embodies
    # (m, params, tags) -> the tags corrected to the path the params actually take; the proposer
    # keeps only the applied ids that survive it (candidate tags are applied strategies)
    retag: Callable[[Any, dict, list[str]], list[str]]
    # strategy ids a first proposal tries, in order, when it is asked for none
    start_order: tuple[str, ...]
    grid: Callable[[Any, dict], list[dict]]      # (m, defaults) -> further settings worth timing
    render: Callable[[Any, dict], str]           # (m, params) -> CUDA source; raises ir.Unsupported
    valid: Callable[[dict], bool] = pow2_vec     # params -> whether the kernel can take them
    # (m, params, the move's overrides) -> params made consistent again after the move
    refit: Callable[[Any, dict, dict], dict] = _same
    # (m, params) -> the same kernel's params with the knobs it does not read at their defaults
    canonical: Callable[[Any, dict], dict] = _same
    # the partition kinds (Task.kind) of the regions it takes, when not its own kind (pool: "rowwise")
    region_kinds: tuple[str, ...] = ()
    # graph -> whether the region is this target's own (pool: it holds a pooling op): coverage then
    # gives this target's reason alone, not that of the kind's generic target (None: no such test)
    claims: Callable[[Any], bool] | None = None
    # (m, defaults) -> the defaults of the kind's other paths, proposed beside the defaults in a
    # task's first step: where no path wins everywhere, timing picks at every region (conv: cuDNN's
    # default beside CUTLASS's)
    alternates: Callable[[Any, dict], list[dict]] = lambda m, base: []
    # m -> the names of our libraries (build.OUR_LIBRARIES) its candidates may link once built
    libraries: Callable[[Any], tuple[str, ...]] = lambda m: ()

    def takes(self, task_kind: str) -> bool:
        """Whether regions of this partition kind are this target's (coverage's reason comes from it)."""
        return task_kind in (self.region_kinds or (self.kind,))


@dataclass(frozen=True)
class ProgramMatch:
    """An elementwise or row region: its lowered program and facts."""
    program: ExprProgram
    facts: TaskFacts


def program_facts(prog: ExprProgram, policy) -> TaskFacts:
    """The strategy table's facts about an elementwise or row program under a precision policy."""
    dts = [dt for _, dt in prog.inputs] + [o.dtype for o in prog.outputs]
    if prog.kind == "rowwise":
        # NOTE: a row kernel's bool masks ride its float lanes and its int64 indices are stored per
        # row, so neither sets the vector width
        dts = [dt for dt in dts if dt in FLOAT_DTYPES] or ["float32"]
    pairs = {r.pair[0] for r in prog.reductions if r.pair}
    # NOTE: integer and bool values are exact, not low precision (no SFU math for them), and a
    # bool's one byte would ask for 16-wide vectors: at most 8 values a thread
    low = any(dt in ("bfloat16", "float16") for dt in dts)
    single = len(prog.reductions) == 1 and all(o.row for o in prog.outputs)
    ncol = math.prod(prog.shape[prog.ndim - prog.nred:]) if prog.kind == "rowwise" else prog.shape[-1]
    return TaskFacts(prog.kind, ncol, min(8, 16 // min(DT[dt][2] for dt in dts)),
                     "softmax" in pairs, "welford" in pairs, prog.has_transcendental,
                     bool(prog.dropped), low, bool(policy and policy.allow_tf32), not low,
                     single_pass=single)


def access_tags(params: dict, facts: TaskFacts) -> list[str]:
    """The elementwise and row kernels' trailing tags: vector access, dropped no-op ops."""
    return ["vectorized_16b_access"] * (params.get("vec", 1) > 1) + ["drop_noop_ops"] * facts.has_dropped


def drop_scalar_tag(params: dict, tags: list[str]) -> list[str]:
    """A move to scalar access (vec 1) is no longer vectorized."""
    return [t for t in tags if t != "vectorized_16b_access"] if params.get("vec", 1) == 1 else tags
