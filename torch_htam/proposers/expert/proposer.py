"""ExpertProposer: the built-in, offline, deterministic proposer.

graph -> the first target (target.Target: elementwise, rowwise, conv, gemm) that matches it -> default
parameters -> strategy moves (strategies.TABLE) -> up to n distinct parameter settings -> CUDA sources.
The search evaluates them on the GPU and keeps the best, so a proposal is one autotuning round
around the parent's parameters. Nothing here depends on the kind: each target says how.

A candidate's tags are the strategies applied to it: the moves that changed its starting point
(the parent's params, else the defaults) and that the resulting params still embody. The defaults
are the baseline, not a strategy, so the default kernel has no tags. supports(task) is the set of
strategies with at least one move that changes a parameter on this task.

    >>> prop = ExpertProposer().propose(ProposalRequest(task, "memory_access", strategies, n=4))
    >>> [(c.tags, c.params) for c in prop.candidates]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch_htam.proposers.base import Candidate, Proposal, ProposalRequest
from torch_htam.proposers.expert import attention, conv, elementwise, gemm, rowwise
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.proposers.expert.strategies import TABLE, TaskFacts, moves_for, strategy_id
from torch_htam.proposers.expert.target import Target

# tried in this order; the first whose match succeeds takes the task
TARGETS: tuple[Target, ...] = (elementwise.TARGET, rowwise.TARGET, conv.TARGET, gemm.TARGET,
                               attention.TARGET)


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

    def supports(self, task, policy=None) -> set[str]:
        """Strategy ids this proposer can apply to `task` (empty when no target matches it). A move
        with no override ({}: a fusion or launch shape every kernel of the kind has) changes nothing,
        so its strategy is not one the expert can apply."""
        if task.graph is None:
            return set()
        if policy is None:
            from torch_htam.policy import policy_for
            policy = policy_for(task)
        try:
            tm = match_task(task, policy, self.targets)
        except Exception:   # NOTE: as in propose: an odd graph is just unsupported
            return set()
        return {s for s in TABLE if any(moves_for(s, tm.facts))}

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
        parent = request.parent
        if parent is not None and parent.params and set(parent.params) <= set(base):
            base.update(parent.params)
        sids = [strategy_id(s) for s in request.strategies]
        settings = _settings(tm, base, sids, parent is not None)
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


def _settings(tm: TaskMatch, base: dict, sids: list[str], has_parent: bool
              ) -> list[tuple[dict, list[str]]]:
    """Ordered (params, applied strategy ids): round-robin over the strategies' variants, then all
    first variants combined, then (library GEMM/conv) the heuristic's next algorithms. Without a
    parent the defaults come first (no tags) and, given no strategies, the target's start order is
    tried; with one, a setting equal to the parent's is left out."""
    t, region, facts = tm.target, tm.region, tm.facts
    start = t.canonical(region, dict(base))

    def applied(p: dict, moves: list[tuple[str, dict]]) -> list[str]:
        # a move counts where it changed the starting point and the params still embody it
        # (retag corrects to the path taken, e.g. a vector width of 1 is not vectorized access)
        q = t.canonical(region, dict(p))
        ids = [s for s, over in moves if any(q.get(k) != start.get(k) for k in over)]
        kept = set(t.retag(region, p, list(ids)))
        return [s for s in ids if s in kept]

    if not has_parent:
        sids = sids or list(t.start_order)
    per = [(s, moves_for(s, facts)) for s in sids]
    per = [(s, v) for s, v in per if v]
    out: list[tuple[dict, list[str]]] = []
    if not has_parent:
        out.append((dict(base), []))
    depth = max((len(v) for _, v in per), default=0)
    for level in range(depth):
        for s, variants in per:
            if level < len(variants):
                p = t.refit(region, dict(base, **variants[level]), variants[level])
                out.append((p, applied(p, [(s, variants[level])])))
    if len(per) > 1:
        moved = {}
        for _, v in per:
            moved.update(v[0])
        p = t.refit(region, dict(base, **moved), moved)
        out.append((p, applied(p, [(s, v[0]) for s, v in per])))
    if t.library_algos:   # on the last setting that runs the library: the algorithm means nothing elsewhere
        lib = [(p, tags) for p, tags in out if t.on_library(p) == p]
        last_p, last_t = lib[-1] if lib else (t.on_library(base), [])
        for a in t.library_algos:   # the heuristic's next algorithm is no strategy of its own
            out.append((dict(last_p, **a), list(last_t)))
    if has_parent:
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
