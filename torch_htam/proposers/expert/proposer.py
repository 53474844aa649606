"""ExpertProposer: the built-in, offline, deterministic proposer.

graph -> the first target (target.Target: elementwise, rowwise, conv, gemm) that matches it -> default
parameters -> strategy moves (strategies.TABLE) -> up to n distinct parameter settings -> CUDA sources.
The search evaluates them on the GPU and keeps the best, so a proposal is one autotuning round
around the parent's parameters. Nothing here depends on the kind: each target says how.

    >>> prop = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=4))
    >>> [(c.tags, c.params) for c in prop.candidates]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch_htam.proposers.base import Candidate, Proposal, ProposalRequest
from torch_htam.proposers.expert import conv, elementwise, gemm, rowwise
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.proposers.expert.strategies import TaskFacts, moves_for, strategy_id
from torch_htam.proposers.expert.target import Target

# tried in this order; the first whose match succeeds takes the task
TARGETS: tuple[Target, ...] = (elementwise.TARGET, rowwise.TARGET, conv.TARGET, gemm.TARGET)


@dataclass
class TaskMatch:
    """A task's target and the region it matched, with the defaults computed once.

        >>> tm = match_task(task, policy); src = tm.render(dict(tm.defaults, vec=1))
    """
    target: Target
    region: Any
    defaults: dict

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def facts(self) -> TaskFacts:
        return self.region.facts

    def render(self, params: dict) -> str:
        return self.target.render(self.region, params)

    def tags(self, params: dict) -> list[str]:
        return self.target.tags(self.region, params)


def match_task(task, policy, targets: tuple[Target, ...] = TARGETS) -> TaskMatch:
    """The first target that matches the task's graph; Unsupported says why none does."""
    why: dict[str, list[str]] = {}       # message -> kinds that gave it
    for t in targets:
        try:
            region = t.match(task.graph, policy)
        except Unsupported as e:
            why.setdefault(str(e), []).append(t.kind)
            continue
        return TaskMatch(t, region, t.defaults(region))
    raise Unsupported("; ".join(f"{'/'.join(kinds)}: {msg}" for msg, kinds in why.items()))


class ExpertProposer:
    """Deterministic, offline proposer (no LLM): see the module docstring. targets: the kinds it
    knows, tried in order."""
    name = "expert"

    def __init__(self, targets: tuple[Target, ...] = TARGETS):
        self.targets = targets

    def propose(self, request: ProposalRequest) -> Proposal:
        task = request.task
        if task.graph is None:
            return Proposal([], "expert: task has no graph (rebuild it from the task source first)")
        try:
            tm = match_task(task, request.policy, self.targets)
        except Unsupported as e:
            return Proposal([], f"expert: unsupported graph: {e}")
        except Exception as e:   # NOTE: never raise into the search; an odd graph is just unsupported
            return Proposal([], f"expert: failed to match {task.name}: {type(e).__name__}: {e}")
        t, region = tm.target, tm.region
        base = dict(tm.defaults)
        base_tags = t.tags(region, base)
        parent = request.parent
        if parent is not None and parent.params and set(parent.params) <= set(base):
            base.update(parent.params)
            base_tags = list(dict.fromkeys(parent.tags or base_tags))
        sids = [strategy_id(s) for s in request.strategies]
        settings = _settings(tm, base, base_tags, sids, request.direction == "seed" or not sids,
                             parent is not None)
        out, seen, skipped = [], set(), []
        for params, tags in settings:
            params = t.canonical(region, params)      # two settings of one kernel are one candidate
            key = tuple(sorted(params.items()))
            if key in seen or not t.valid(params):
                continue
            seen.add(key)
            try:
                src = t.render(region, params)
            except Unsupported as e:
                skipped.append(str(e))
                continue
            out.append(Candidate(src, tags, dict(params), "expert"))
            if len(out) >= request.n:
                break
        unknown = [s for s in sids if not moves_for(s, tm.facts)]
        note = f"expert: {t.kind} kernel, {len(out)} setting(s)"
        if unknown:
            note += f"; not applicable here: {', '.join(unknown)}"
        if skipped:
            note += f"; skipped: {'; '.join(skipped[:2])}"
        return Proposal(out, note)


def _settings(tm: TaskMatch, base: dict, base_tags: list[str], sids: list[str], first: bool,
              has_parent: bool) -> list[tuple[dict, list[str]]]:
    """Ordered (params, tags): round-robin over the strategies' variants, then all first variants
    combined, then (library GEMM/conv) the heuristic's next algorithms. A first proposal (direction
    "seed", or no strategies) without a parent starts with the defaults and, given no strategies,
    tries the target's start order."""
    t, region, facts = tm.target, tm.region, tm.facts

    def retag(p: dict, applied: list[str]) -> list[str]:
        return t.retag(region, p, list(dict.fromkeys(base_tags + applied)))

    if first and not has_parent:
        sids = sids or list(t.start_order)
    per = [(s, moves_for(s, facts)) for s in sids]
    per = [(s, v) for s, v in per if v]
    out: list[tuple[dict, list[str]]] = []
    if first and not has_parent:
        out.append((dict(base), list(base_tags)))
    depth = max((len(v) for _, v in per), default=0)
    for level in range(depth):
        for s, variants in per:
            if level < len(variants):
                p = t.refit(region, dict(base, **variants[level]), variants[level])
                out.append((p, retag(p, [s])))
    if len(per) > 1:
        moved = {}
        for _, v in per:
            moved.update(v[0])
        p = t.refit(region, dict(base, **moved), moved)
        out.append((p, retag(p, [s for s, _ in per])))
    if t.library_algos:   # on the last setting that runs the library: the algorithm means nothing elsewhere
        lib = [(p, tags) for p, tags in out if t.on_library(p) == p]
        last_p, last_t = lib[-1] if lib else (t.on_library(base), None)
        for a in t.library_algos:
            p = dict(last_p, **a)
            out.append((p, last_t or retag(p, [])))
    if not first:
        key = tuple(sorted(base.items()))
        out = [(p, tags) for p, tags in out if tuple(sorted(p.items())) != key]
    return out


def tuning_grid(task, policy=None, limit: int = 48, targets: tuple[Target, ...] = TARGETS) -> list[dict]:
    """Every parameter setting worth timing for a task (the exhaustive autotuning space around the
    defaults, defaults first), for bench/sweep.py and for picking defaults from measurements.

        >>> [p["tpr"] for p in tuning_grid(rmsnorm_task)][:3]
        [256, 32, 32]
    """
    tm = match_task(task, policy, targets)
    t, out = tm.target, []
    for p in [dict(tm.defaults)] + t.grid(tm.region, dict(tm.defaults)):
        if t.valid(p) and p not in out:
            out.append(p)
    return out[:limit]
