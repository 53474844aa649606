"""ExpertProposer: the built-in, offline, deterministic proposer.

graph -> the first target (target.Target: elementwise, rowwise, conv, gemm, attention) that
matches it -> its search space (search_space: the defaults, every strategy move from them, the
kind's knob grid) -> the settings that apply the requested strategies to the starting point (the
parent's params, else the defaults), nearest first -> up to n CUDA sources not tried yet in this
search. The search evaluates them on the GPU and keeps the best, so the HTG's choice of strategies
decides which part of a finite space is tried first. Nothing here depends on the kind: each target
says how.

A candidate's tags are the strategies applied to it: the moves that hold in its params and not in
its starting point, and that the params still embody. The defaults are the baseline, not a
strategy, so the default kernel has no tags. supports(task) is the set of strategies that some
setting of the space applies to the defaults.

    >>> prop = ExpertProposer().propose(ProposalRequest(task, "memory_access", strategies, n=4))
    >>> [(c.tags, c.params) for c in prop.candidates]
"""
from __future__ import annotations

import contextlib

from dataclasses import dataclass, replace
from typing import Any

from torch_htam.proposers.base import Candidate, Proposal, ProposalRequest, source_key
from torch_htam.proposers.expert import attention, conv, elementwise, gemm, gn_cl, pool, rowwise
from torch_htam.proposers.expert.conv_match import ConvMatch
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.proposers.expert.strategies import TABLE, TaskFacts, moves_for, strategy_id
from torch_htam.proposers.expert.target import Target
from torch_htam.recall import applied as applied_change
from torch_htam.verify import leading_dim

# tried in this order; the first whose match succeeds takes the task
TARGETS: tuple[Target, ...] = (elementwise.TARGET, gn_cl.TARGET, rowwise.TARGET, pool.TARGET, conv.TARGET, gemm.TARGET,
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
        if isinstance(region, ConvMatch) and leading_dim(task) == (region.x, 0):
            # the graph is the example's; its batch's range is the task's (batch_slice.cuh)
            region = replace(region, batch_ranged=True)
        refused = range_refusal(task, region)
        if refused:
            why.setdefault(refused, []).append(t.kind)
            continue
        return TaskMatch(t, region, t.defaults(region))
    raise Unsupported("; ".join(f"{'/'.join(kinds)}: {msg}" for msg, kinds in why.items()))


def range_refusal(task, region) -> str | None:
    """Why `region`'s kernels would refuse every size of the task's declared ranges but the
    example's, or None. Such a kernel bakes the example's sizes in at match time and returns
    HTAM_ERR_SHAPE elsewhere, so each candidate cost a build and the example's trials, then failed
    range verification in every bucket: the served decoder's q/k/v projections to heads (layout
    GEMMs) searched to "none verified" (bench_serve-20261129-203958)."""
    ranged = [(i, d, lo, hi) for i, s in enumerate(task.inputs) for d, (lo, hi) in zip(s.dynamic, s.ranges)]
    if not ranged:
        return None
    i, d, lo, hi = ranged[0]
    if isinstance(region, gemm.GemmMatch) and region.lay is not None:
        return (f"a GEMM whose operands or outputs are views or strided (heads, a split, a transpose) has "
                f"its sizes fixed at the example's, and in{i} dim {d} is declared {lo}-{hi}")
    if isinstance(region, attention.AttnMatch):
        reads = [(task.inputs[b.index], b, f"in{b.index}")
                 for b in (region.q, region.k, region.v, *(m.bind for m in region.masks))]
        for spec, b, name in reads + [(task.outputs[0], region.o, "the output")]:
            fixed = [dd for dd in spec.dynamic if b.mode != 0 and dd not in b.grow] if spec.ranges else []
            if fixed:
                return (f"attention binds {name} through views that fix its dim {fixed[0]}, which the task "
                        f"declares ranged")
    return None


class ExpertProposer:
    """Deterministic, offline proposer (no LLM): see the module docstring. targets: the kinds it
    knows, tried in order; space_limit: only the first N settings of each task's search space
    (bench/anytime.py measures exactly those; None: all of it)."""
    name = "expert"
    speculative = True    # rendering templates: milliseconds, no network (prebuild.py)

    def __init__(self, targets: tuple[Target, ...] = TARGETS, space_limit: int | None = None,
                 within: set[tuple] | None = None):
        self.targets, self.space_limit, self.within = targets, space_limit, within

    def prepare(self, tasks, policy_of) -> None:
        """Match each task once before the search: a target whose candidates link a library of
        ours that is not built yet starts its build in the background on a GPU machine
        (conv_cutlass.library_ready), so it runs beside torch.compile of the floor. A task no
        target takes is the search's to report."""
        for task in tasks:
            with contextlib.suppress(Exception):     # policy_of of a task no target takes
                self.libraries_for(task, policy_of(task))

    def libraries_for(self, task, policy) -> tuple[str, ...]:
        """Our libraries this task's candidates may link once they are built (() where no target
        takes the task)."""
        try:
            tm = match_task(task, policy, self.targets)
        except Exception:  # noqa: BLE001 - a task no target takes links nothing
            return ()
        return tuple(tm.target.libraries(tm.region))

    def supports(self, task, policy=None) -> set[str]:
        """Strategy ids this proposer can apply to `task` (empty when no target matches it): those
        that some setting of the search space applies to the defaults. A move with no override
        ({}: a fusion or launch shape every kernel of the kind has) changes nothing, so its
        strategy is not one the expert can apply."""
        if task.graph is None:
            return set()
        if policy is None:
            from torch_htam.policy import policy_for
            policy = policy_for(task)
        try:
            tm = match_task(task, policy, self.targets)
        except Exception:   # NOTE: as in propose: an odd graph is just unsupported
            return set()
        start = tm.target.canonical(tm.region, dict(tm.defaults))
        return {s for p in search_space(tm, self.space_limit, self.within)
                for s in tags_of(tm, p, start, list(TABLE))}

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
        start = t.canonical(region, base)
        sids = [strategy_id(s) for s in request.strategies]
        if parent is None and not sids:
            sids = list(t.start_order)
        out, skipped, repeats = [], [], 0
        ordered = _ordered(tm, start, sids, parent is None, self.space_limit, self.within, request.recall)
        extra = 0
        if parent is None:     # a first step: the other paths' defaults too, beyond request.n
            ordered, extra = _alternates_first(tm, start, ordered, self.within)
        else:                  # a library built since the first step: its defaults, once
            ordered, extra = _library_defaults_first(tm, start, ordered, request.tried, self.within)
        n = request.n + extra
        for params, tags in ordered:
            try:
                src = t.render(region, params)
            except Unsupported as e:
                skipped.append(str(e))
                continue
            if source_key(src) in request.tried:
                repeats += 1
                continue
            out.append(Candidate(src, tags, dict(params), "expert"))
            if len(out) >= n:
                break
        unknown = [s for s in sids if not moves_for(s, tm.facts)]
        note = f"expert: {t.kind} kernel, {len(out)} setting(s)"
        if unknown:
            note += f"; not applicable here: {', '.join(unknown)}"
        if repeats:
            note += f"; {repeats} already tried"
        if skipped:
            note += f"; skipped: {'; '.join(skipped[:2])}"
        return Proposal(out, note)


def _alternates_first(tm: TaskMatch, start: dict, ordered: list, within: set[tuple] | None) -> tuple[list, int]:
    """A first step's (params, tags) with the kind's other paths' defaults (Target.alternates) right
    after the defaults, and how many they are: the step proposes them beyond its n. Only those
    `within` the measured settings where a replay gives them."""
    keys = {setting_key(start)}
    alts = []
    for a in tm.target.alternates(tm.region, start):
        k = setting_key(a)
        if k not in keys and (within is None or k in within):
            keys.add(k)
            alts.append((a, tags_of(tm, a, start, list(TABLE))))
    rest = [(p, g) for p, g in ordered[1:] if setting_key(p) not in keys]
    return ordered[:1] + alts + rest, len(alts)


def _library_defaults_first(tm: TaskMatch, start: dict, ordered: list, tried: set[str],
                            within: set[tuple] | None) -> tuple[list, int]:
    """A later step's (params, tags) with the task's defaults first where they link a library of
    ours and were never tried, and how many they are (0 or 1, beyond the step's n). NOTE: a library
    built while the search ran (build.library_here) changes the defaults; the task's first step,
    proposed before, had none of its kernels, and its later steps move from that step's winner."""
    from torch_htam import build
    d = tm.target.canonical(tm.region, dict(tm.defaults))
    try:
        src = tm.target.render(tm.region, d)
    except Unsupported:
        return ordered, 0
    if not build.libraries_used(src) or source_key(src) in tried or (within is not None and setting_key(d) not in within):
        return ordered, 0
    rest = [(p, g) for p, g in ordered if setting_key(p) != setting_key(d)]
    return [(d, tags_of(tm, d, start, list(TABLE)))] + rest, 1


def setting_key(params: dict) -> tuple:
    """A setting's identity (its canonical params, as search_space writes them)."""
    return tuple(sorted(params.items()))


def search_space(tm: TaskMatch, limit: int | None = None, within: set[tuple] | None = None) -> list[dict]:
    """The expert's search space on a task, defaults first: the defaults, every strategy move
    applied to them (refit), then the kind's knob grid (Target.grid); canonical, valid, distinct.

    A step walks this finite space: which part of it comes first is what the HTG's choice of
    strategies decides (`_ordered`), so memory has something to steer. within: only the settings
    whose setting_key is in it (bench/anytime.py's replay: the ones its table measured).
    """
    t, region, facts = tm.target, tm.region, tm.facts
    base = dict(tm.defaults)
    raw = [base]
    for s in TABLE:
        for v in moves_for(s, facts):
            if v:
                raw.append(t.refit(region, dict(base, **v), v))
    raw += t.grid(region, dict(base))
    out, seen = [], set()
    for p in raw:
        p = t.canonical(region, dict(p))
        if setting_key(p) not in seen and t.valid(p) and (within is None or setting_key(p) in within):
            seen.add(setting_key(p))
            out.append(p)
    return out[:limit]


def applied(tm: TaskMatch, params: dict, start: dict, sids: list[str]) -> list[str]:
    """The strategies among `sids` that `params` applies to `start`: one of the strategy's moves
    holds in params and not in start, and the params still embody it on the path they take
    (Target.retag: e.g. a vector width of 1 is not vectorized access)."""
    t, facts = tm.target, tm.facts
    ids = [s for s in sids
           if any(v and all(params.get(k) == x for k, x in v.items()) and any(start.get(k) != x for k, x in v.items())
                  for v in moves_for(s, facts))]
    kept = set(t.retag(tm.region, dict(params), list(ids)))
    return [s for s in ids if s in kept]


def touched(tm: TaskMatch, params: dict, start: dict, sids: list[str]) -> list[str]:
    """The strategies among `sids` one of whose moves sets a knob that `params` changes from
    `start`: the family of a grid setting that applies no strategy's move exactly (a pool's
    tpr 8 where warp_shuffle_reduction's moves try 32 and 16)."""
    changed = {k for k in set(params) | set(start) if params.get(k) != start.get(k)}
    return [s for s in sids if any(v and changed & set(v) for v in moves_for(s, tm.facts))]


def tags_of(tm: TaskMatch, params: dict, start: dict, sids: list[str]) -> list[str]:
    """What a setting is credited to: the strategies it applies to `start` (applied), else those
    whose knobs it changes (touched). NOTE: tagged by exact moves alone, a grid setting off every
    move was never proposed: on 13 of 48 held-out tasks (bench/heldout, H100 tables in
    bench/results/anytime_table-20261126-23*.json) every search stopped short of its space's best,
    up to 1.6x short (a conv at 2.63x of eager where its grid held 4.29x)."""
    return applied(tm, params, start, sids) or touched(tm, params, start, sids)


def _ordered(tm: TaskMatch, start: dict, sids: list[str], first: bool, limit: int | None = None,
             within: set[tuple] | None = None, recall: list[dict] = ()) -> list[tuple[dict, list[str]]]:
    """(params, tags) in the order a step proposes them: the start itself when it is the first
    step (the defaults, the baseline, untagged), then the settings memory recalls (`recall`: the
    changes to the defaults that won on tasks of similar size, best first) where this task's space
    has them, then round-robin over the requested strategies, each one's settings nearest the
    start first (fewest params changed); tags are every strategy the setting applies to the start.
    Other settings are not proposed: the step is the HTG's choice, not a sweep."""
    space = [p for p in search_space(tm, limit, within) if setting_key(p) != setting_key(start)]
    everything = list(TABLE)
    exact = [applied(tm, p, start, everything) for p in space]
    tags = [e or touched(tm, p, start, everything) for e, p in zip(exact, space)]
    dist = [sum(p.get(k) != start.get(k) for k in set(p) | set(start)) for p in space]
    # a strategy's exact moves first, then the settings that only change its knobs, nearest first
    queues = [[i for i in sorted(range(len(space)), key=lambda i: (s not in exact[i], dist[i])) if s in tags[i]]
              for s in sids]
    out: list[tuple[dict, list[str]]] = [(dict(start), [])] if first else []
    taken: set[int] = set()
    for i in _recalled(tm, space, recall):
        if i not in taken:
            taken.add(i)
            out.append((space[i], tags[i]))
    while any(queues):
        for q in queues:
            while q and q[0] in taken:
                q.pop(0)
            if q:
                i = q.pop(0)
                taken.add(i)
                out.append((space[i], tags[i]))
    return out


def _recalled(tm: TaskMatch, space: list[dict], recall: list[dict]) -> list[int]:
    """Indices into `space` of the recalled changes (recall.py) applied to the task's defaults, in
    the recall's order; a change this task's space does not hold is passed over."""
    index = {setting_key(p): i for i, p in enumerate(space)}
    defaults = tm.target.canonical(tm.region, dict(tm.defaults))
    out = []
    for delta in recall:
        try:
            key = setting_key(tm.target.canonical(tm.region, applied_change(delta, defaults)))
        except (Unsupported, KeyError, TypeError, ValueError):   # knobs another target reads
            continue
        if key in index:
            out.append(index[key])
    return out


def tuning_grid(task, policy=None, limit: int = 48, targets: tuple[Target, ...] = TARGETS) -> list[dict]:
    """The first `limit` settings of the task's search space (defaults first), for bench/sweep.py
    and bench/anytime.py.

        >>> [p["tpr"] for p in tuning_grid(rmsnorm_task)][:3]
        [256, 32, 32]
    """
    return search_space(match_task(task, policy, targets), limit)
