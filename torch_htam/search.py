"""The HTAM evolution loop: step 0, then up to `steps` rounds of state -> direction -> strategies ->
proposer -> evaluator -> memory update, keeping the fastest verified kernel.

    >>> result = search(task, ExpertProposer(), evaluator, HTG.load(path), SearchConfig(steps=6))
    >>> result.best.evaluation.speedup, result.stop
    (1.84, 'stagnation')

Every step reads the coarse state of the best kernel (state.state_of; before any, the start state),
lets the HTG pick a direction and retrieve its strategies among those the proposer supports
(Proposer.supports), asks for `candidates_per_step` kernels that start from the best so far (step 0:
from none), evaluates them in one batch, and records every candidate in memory: the transition
previous -> direction under the state (step 0 leaves htg.START), and the strategies it applied
(Candidate.tags).

Every candidate is rewarded against the kernel it was made from. Once a kernel is correct: the best
so far (the parent). Before (step 0): the best known starting point, the fastest correct untagged
candidate of the batch (the expert's defaults, which step 0 brings whatever the direction: no
strategy applied), else the reference (speedup 1.0: PyTorch's own kernels, cuBLAS/cuDNN where the
region calls them). The starting point is not a move of the direction: memory records nothing for
it. Failures are recorded by kind (Evaluation.reason) on the transition and the strategies. A
failed candidate's source stays in the feedback (SearchAttempt) for the proposer's next request.
NOTE: step 0 used to be rewarded against eager alone, which credited the start edge with the
defaults' whole speedup whatever direction was chosen, and every later edge averaged below zero:
memory learned "the first direction tried" and "nothing after the defaults pays".

A step whose proposal is empty is "unrealized": memory records nothing for it (an endpoint down, a
reply without code, moves that are no-ops on this parent say nothing about the direction); only
this task's trail damps the direction so the next step goes elsewhere. A candidate becomes the best
only if it is correct and strictly faster. The loop stops at the step budget, after `stagnation`
steps after step 0 without a gain over min_gain, when the best reaches `roofline_stop` of the
roofline, when the proposer has nothing to offer EMPTY_STEPS steps in a row or supports no strategy
eligible for the task ("no_candidates"), when every candidate of REFUSED_STEPS steps in a row
refused the task's own inputs ("refused": the proposer's path does not fit them, and its next
settings share that path), or when wall time, tokens or cost run out.

Every candidate, step and run summary is one JSON line in the trajectory file (for people: grep it,
or `jq -c 'select(.event=="step")'`).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from torch_htam import recall
from torch_htam.evaluation import UNJUDGED
from torch_htam.htg import HTG, MODES, Trail, outcome_of
from torch_htam.proposers.base import Attempt, Parent, ProposalRequest, source_key
from torch_htam.state import ridge_point, state_of

log = logging.getLogger("torch_htam")

EMPTY_STEPS = 3         # consecutive steps whose proposal was empty before giving up on the task
# consecutive steps whose every candidate refused the task's own inputs (HTAM_ERR_SHAPE) before
# giving up: MLP-Mixer's strided GEMMs spent 13 and 17 candidates so (zoo-20261130-143804)
REFUSED_STEPS = 2
DETAIL_CHARS = 400      # evaluation detail kept per trajectory line (compiler output is long)
DEFAULT_RIDGE = 20.0    # FLOP/B; H100 fp32 CUDA cores: 67 TFLOP/s / 3.35 TB/s, when no GPU is known


@dataclass
class SearchConfig:
    """Budget and behaviour of one task's search.

    steps: evolution steps after step 0 (HTAM uses at most 6). stagnation: stop after this many
    steps without a gain over min_gain (0 = never). roofline_stop: stop once the best reaches this
    fraction of the roofline (None = never). max_tokens / max_cost_usd: LLM budget, read from
    Proposal.usage (prompt + completion tokens, cost_usd). memory: "htg" | "flat" | "none".
    prebuild: search_many's cover pass builds the coming tasks' step-0 candidates ahead, in the
    background (prebuild.py). cover_candidates: how many candidates step 0 asks for in that cover
    pass (the proposer's defaults first), so a budget reaches every task before it explores; the
    deepening pass explores from step 1 with candidates_per_step. recall: how many of the settings
    memory recalls from tasks of similar size (recall.py) the search tries first, after the
    defaults (memory "htg" only; 0: none); a search records its own verified settings there, as
    changes to its defaults (step 0's starting point).
    """
    steps: int = 6
    candidates_per_step: int = 4
    strategies_per_step: int = 4
    max_wall_s: float | None = None
    max_tokens: float | None = None
    max_cost_usd: float | None = None
    stagnation: int = 3
    roofline_stop: float | None = 0.85
    min_gain: float = 0.01
    memory: str = "htg"
    seed: int = 0
    feedback: int = 6
    prebuild: bool = True    # search_many's cover pass builds coming tasks' step 0 ahead (prebuild.py)
    cover_candidates: int = 1
    recall: int = 16

    def __post_init__(self):
        if self.memory not in MODES:
            raise ValueError(f"SearchConfig.memory={self.memory!r}: expected one of {MODES}")
        if self.steps < 0 or self.candidates_per_step < 1 or self.cover_candidates < 1 or self.recall < 0:
            raise ValueError("SearchConfig needs steps >= 0, candidates_per_step >= 1, cover_candidates >= 1 "
                             "and recall >= 0")

    def covering(self) -> "SearchConfig":
        """This config for search_many's cover pass: step 0 asks for cover_candidates."""
        return SearchConfig(**{**self.to_json(), "candidates_per_step": self.cover_candidates})

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Best:
    """The winning kernel. so_path: the built library when the evaluator reports one
    (Evaluation.so_path), else None."""
    source: str
    tags: list[str]
    params: dict[str, Any]
    evaluation: Any          # evaluation.Evaluation
    origin: str = "expert"
    step: int = 0
    direction: str = ""

    @property
    def so_path(self) -> str | None:
        return getattr(self.evaluation, "so_path", None)

    @property
    def speedup(self) -> float:
        return self.evaluation.speedup or 0.0

    def parent(self, bar_ms: float | None = None, bar_code: str = "") -> Parent:
        """The kernel the next step starts from; bar_ms / bar_code: Inductor's time and code for
        the region where some evaluation of the task measured them (the parent's own first)."""
        ev = self.evaluation
        bar = getattr(ev, "compile_ms", None) or bar_ms
        return MeasuredParent(self.source, list(self.tags), ev.speedup, ev.kernel_ms,
                              ev.roofline_fraction, dict(self.params), ev.ptxas(), compile_ms=bar,
                              compile_speedup=bar / ev.kernel_ms if bar and ev.kernel_ms else None,
                              inductor_code=getattr(ev, "inductor_code", "") or bar_code)


@dataclass
class MeasuredParent(Parent):
    """A Parent with Inductor's time for the region, the bar a kernel must beat to be used inside a
    compiled model (policy.why_not): the prompt shows it when known. compile_speedup: compile_ms /
    the parent's kernel_ms. inductor_code: Inductor's kernels and call for the region
    (evaluation.inductor_kernels), "" where not captured."""
    compile_ms: float | None = None
    compile_speedup: float | None = None
    inductor_code: str = ""


@dataclass
class SearchAttempt(Attempt):
    """An Attempt that keeps the source of a failed candidate (Attempt keeps only its hash), so a
    prompt can show the code that broke next to the compiler error or the mismatch; a correct
    candidate keeps none (the parent's source is shown apart)."""
    source: str = ""


@dataclass
class SearchResult:
    """Outcome of one task's search. stop: "steps" | "stagnation" | "roofline" | "wall" |
    "tokens" | "cost" | "no_candidates" | "refused" | "time_budget" | "error: ...". population: correct
    kernels, fastest first (at most POPULATION); directions: the direction of each step, step 0
    first."""
    task: str
    signature: str
    best: Best | None = None
    steps: int = 0
    candidates: int = 0
    correct: int = 0
    wall_s: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)
    stop: str = "steps"
    directions: list[str] = field(default_factory=list)
    population: list[Best] = field(default_factory=list)
    partial: bool = False    # search_many's cover pass: only step 0 so far, more steps may follow
    # candidates that did not verify, by Evaluation.reason ("mismatch", "build", "shape", ...)
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return self.best.speedup if self.best else None


POPULATION = 4


class Trajectory:
    """Append-only JSONL log of one search; a None path writes nothing."""

    def __init__(self, path: str | Path | None, task, run: str):
        self.path = Path(path) if path else None
        self.base = {"task": task.name, "signature": task.signature, "run": run}
        self.t0 = time.monotonic()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields) -> None:
        if self.path is None:
            return
        line = {"event": event, **self.base, **fields, "t": round(time.monotonic() - self.t0, 3),
                "time": _now()}
        with self.path.open("a") as f:
            f.write(json.dumps(line, default=_jsonable) + "\n")


# --- one task -----------------------------------------------------------------------------------

def search(task, proposer, evaluator, memory: HTG, config: SearchConfig | None = None,
           trajectory: str | Path | None = None, progress: Callable | None = None,
           gpu=None) -> SearchResult:
    """Search a faster verified kernel for one task (module docstring).

    proposer: proposers.base.Proposer; evaluator: has evaluate_many(task, sources) -> [Evaluation];
    memory: the HTG, updated in place (save it yourself); progress(task, step, steps, best_speedup)
    is called after every step; gpu: GpuInfo (default: evaluator.gpu, else gpu.detect()).

    >>> r = search(task, ExpertProposer(), evaluator, HTG.from_prior(), SearchConfig(steps=3))
    >>> r.best.speedup, r.steps, r.stop
    """
    loop = _open(task, proposer, memory, config or SearchConfig(), trajectory, gpu or _gpu_of(evaluator))
    loop.advance(proposer, evaluator, loop.cfg.steps, progress)
    return loop.close()


def _open(task, proposer, memory: HTG, cfg: SearchConfig, trajectory, gpu) -> "_Loop":
    """A task's search before its first step (trajectory "start" written)."""
    from torch_htam.policy import policy_for
    run = hashlib.sha256(f"{task.signature}:{time.time_ns()}".encode()).hexdigest()[:8]
    loop = _Loop(task, memory, cfg, Trajectory(trajectory, task, run), gpu, policy_for(task),
                 _supported(proposer, task))
    loop.traj.write("start", kind=task.kind, memory=cfg.memory, config=cfg.to_json(),
                    proposer=getattr(proposer, "name", type(proposer).__name__),
                    supported=None if loop.supported is None else sorted(loop.supported))
    if not memory.eligible(state_of(task, None, gpu), loop.supported):
        loop.halt("no_candidates")   # NOTE: nothing the proposer can do here; asking costs a step
    return loop


@dataclass
class _Loop:
    """One task's search state between steps: result so far, short-term memory, feedback."""
    task: Any
    memory: HTG
    cfg: SearchConfig
    traj: Trajectory
    gpu: Any
    policy: Any
    supported: set[str] | None = None   # the proposer's supported strategy ids (None: all)
    res: SearchResult = None
    trail: Trail = None
    feedback: list[Attempt] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)   # source_key of every evaluated candidate
    bar_ms: float | None = None   # Inductor's time for the region, once an evaluation measured it
    bar_code: str = ""            # and its code (Evaluation.inductor_code), where captured
    last_failure: str | None = None
    stale: int = 0     # steps since the best last improved by more than min_gain
    empty: int = 0     # consecutive steps with an empty proposal
    refused: int = 0   # consecutive steps whose every candidate refused the task's inputs
    next_step: int = 0
    stopped: bool = False   # a stop reason fired or every step ran
    recalled: list[dict] = field(default_factory=list)   # memory's changes for this task, best first
    defaults: dict | None = None     # the params of step 0's starting point (the proposer's defaults)
    speeds: dict[str, float] = field(default_factory=dict)   # change_id -> speedup, verified ones

    def __post_init__(self):
        self.res = SearchResult(self.task.name, self.task.signature)
        self.trail = Trail(self.task.name, self.cfg.seed)
        self.recalled = _recalled(self.task, self.memory, self.cfg)

    def advance(self, proposer, evaluator, last: int, progress: Callable | None = None) -> None:
        """Run steps next_step..last (at most cfg.steps) unless a stop reason fires first; the wall
        budget cfg.max_wall_s counts from this call, so a search resumed later gets a fresh one."""
        t0 = time.monotonic()
        while not self.stopped and self.next_step <= min(last, self.cfg.steps):
            stop = _budget_stop(self.cfg, t0, self.res.usage)
            if stop:
                self.halt(stop)
                break
            step = self.next_step
            self.step(step, proposer, evaluator)
            self.next_step += 1
            if progress is not None:
                progress(self.task, step, self.cfg.steps, self.res.speedup)
            stop = self.stop_reason()
            if stop:
                self.halt(stop)
        self.stopped |= self.next_step > self.cfg.steps    # stop stays "steps"
        self.res.wall_s += time.monotonic() - t0

    def halt(self, stop: str) -> None:
        self.res.stop, self.stopped = stop, True

    def close(self) -> SearchResult:
        """End the search: its verified settings into memory's recall (memory "htg"), the
        trajectory's summary line; returns the result."""
        res = self.res
        res.partial = False
        if self.cfg.memory == "htg" and self.speeds:
            self.memory.recall.record(self.task.kind, self.task.signature, recall.features(self.task), self.speeds)
        self.traj.write("summary", stop=res.stop, steps=res.steps, candidates=res.candidates,
                        correct=res.correct, best_speedup=_r(res.speedup),
                        best_tags=res.best.tags if res.best else None,
                        best_hash=(res.best.evaluation.source_hash or source_key(res.best.source))
                        if res.best else None,
                        directions=res.directions, usage=res.usage, wall_s=round(res.wall_s, 3))
        return res

    def step(self, step: int, proposer, evaluator) -> None:
        """Choose (HTG, every step), propose, evaluate, learn from every candidate, log."""
        res, cfg = self.res, self.cfg
        state = state_of(self.task, res.best.evaluation if res.best else None, self.gpu,
                         self.last_failure)
        c = self.memory.select(state, self.trail, cfg.memory, step, cfg.strategies_per_step,
                               self.supported)
        direction, previous, strategies, scores = c.direction, c.previous, c.strategies, c.scores
        request = _request(self.task, c, cfg, self.gpu, self.policy,
                           parent=res.best.parent(self.bar_ms, self.bar_code) if res.best else None,
                           feedback=self.feedback[-cfg.feedback:], tried=self.tried,
                           recalled=self.recalled)
        proposal = proposer.propose(request)
        add_usage(res.usage, proposal.usage)
        cands = proposal.candidates
        evals = evaluator.evaluate_many(self.task, [c.source for c in cands]) if cands else []
        if len(evals) != len(cands):
            raise RuntimeError(f"evaluator returned {len(evals)} evaluations for {len(cands)} sources")
        self.learn_bar(evals)
        # what every candidate is rewarded against (module docstring)
        parent_speedup = res.best.speedup if res.best else starting_point(cands, evals)
        moved = res.best is not None or any(cand.tags for cand in cands)   # else the defaults alone
        improved = False
        for cand, ev in zip(cands, evals):
            start = res.best is None and not cand.tags   # step 0's starting point: not a move
            improved |= self.absorb(step, state, previous, direction, cand, ev, parent_speedup,
                                    learn=not start)
        reasons = [ev.reason for ev in evals if ev.reason not in UNJUDGED]
        # NOTE: a step with no correct candidate says why in the next state (boundary handling etc.);
        # one whose candidates the deadline cut says nothing new
        if reasons:
            self.last_failure = None if "ok" in reasons else _most_common(reasons)
            self.refused = self.refused + 1 if set(reasons) == {"refused"} else 0
        # NOTE: an unrealized step (no candidate) is pushed as not improved so the trail's tabu
        # steers the next step elsewhere; memory records nothing for it (module docstring).
        if moved or not cands:   # NOTE: the defaults alone (a cover pass's step 0) try no direction
            self.trail.push(direction, improved)
        res.directions.append(direction)
        if step > 0:   # step 0 starts the search: stagnation counts the steps after it
            self.stale = 0 if improved else self.stale + 1
        self.empty = 0 if cands else self.empty + 1
        res.steps = step
        top = sorted(scores.items(), key=lambda x: -x[1])[:5]
        self.traj.write("step", step=step, direction=direction, previous=previous, state=state.key(),
                        strategies=[s.id for s in strategies], candidates=len(cands),
                        rewarded_against=_r(parent_speedup),
                        unrealized=not cands, improved=improved, best_speedup=_r(res.speedup),
                        note=proposal.note[:DETAIL_CHARS], scores={d: round(v, 4) for d, v in top})

    def learn_bar(self, evals) -> None:
        """Inductor's time and code for the region, from the evaluations that measured them."""
        self.bar_ms = next((ev.compile_ms for ev in evals if getattr(ev, "compile_ms", None)), self.bar_ms)
        self.bar_code = next((ev.inductor_code for ev in evals if getattr(ev, "inductor_code", "")), self.bar_code)

    def absorb(self, step, state, previous, direction, cand, ev, parent_speedup, learn=True) -> bool:
        """Record one evaluated candidate everywhere (memory only when `learn`); True if it became
        a best with a real gain over parent_speedup."""
        outcome = outcome_of(ev, parent_speedup, self.cfg.min_gain)
        if ev.reason not in UNJUDGED:   # a candidate the budget cut is no failure of its strategies
            if learn:
                self.memory.record(state, previous, direction, cand.tags, outcome, self.cfg.memory)
            self.trail.note_strategies(cand.tags, outcome)
        self.feedback.append(_attempt(cand, ev))
        self.tried.add(source_key(cand.source))
        self.res.candidates += 1
        self.res.correct += int(ev.correct)
        if self.res.best is None and not cand.tags and cand.params and self.defaults is None:
            self.defaults = dict(cand.params)    # step 0's starting point: the proposer's defaults
        if ev.correct and ev.speedup and cand.params and self.defaults is not None:
            cid = recall.change_id(recall.change(cand.params, self.defaults))
            if cid is not None:
                self.speeds[cid] = max(self.speeds.get(cid, 0.0), ev.speedup)
        if not ev.correct and ev.reason not in UNJUDGED:
            self.res.failures[ev.reason] = self.res.failures.get(ev.reason, 0) + 1
        became = _offer(self.res, Best(cand.source, list(cand.tags), dict(cand.params), ev,
                                       cand.origin, step, direction))
        self.traj.write("candidate", step=step, direction=direction, strategies=list(cand.tags),
                        hash=ev.source_hash or source_key(cand.source), reason=ev.reason,
                        detail=(ev.detail or "")[:DETAIL_CHARS], speedup=_r(ev.speedup),
                        kernel_ms=_r(ev.kernel_ms), roofline=_r(ev.roofline_fraction),
                        gain=_r(outcome.gain), best=became, origin=cand.origin,
                        build_s=_r(getattr(ev, "build_s", None)),
                        job_s={k: _r(v) for k, v in (getattr(ev, "job_s", None) or {}).items()})
        return became and outcome.success

    def stop_reason(self) -> str | None:
        best, cfg = self.res.best, self.cfg
        roof = best.evaluation.roofline_fraction if best else None
        if cfg.roofline_stop is not None and roof is not None and roof >= cfg.roofline_stop:
            return "roofline"
        if cfg.stagnation and self.stale >= cfg.stagnation:
            return "stagnation"
        if self.empty >= EMPTY_STEPS:   # NOTE: e.g. the expert cannot express this graph at all
            return "no_candidates"
        if self.refused >= REFUSED_STEPS:
            return "refused"
        return None


def _request(task, choice, cfg: SearchConfig, gpu, policy, parent=None, feedback=(), tried=(),
             recalled=()) -> ProposalRequest:
    """What a step asks the proposer for: cfg.candidates_per_step kernels of the HTG's choice."""
    return ProposalRequest(task=task, direction=choice.direction, strategies=choice.strategies,
                           n=cfg.candidates_per_step, parent=parent, feedback=list(feedback),
                           transition=(choice.previous, choice.direction), gpu=gpu, policy=policy,
                           tried=set(tried), recall=[dict(p) for p in recalled])


def _recalled(task, memory: HTG, cfg: SearchConfig) -> list[dict]:
    """The changes to the defaults memory recalls for `task` (cfg.recall of them, best first;
    memory "htg" only)."""
    if cfg.memory != "htg" or not cfg.recall:
        return []
    ranked = memory.recall.ranked(task.kind, recall.features(task))
    return [json.loads(k) for k, _ in ranked[:cfg.recall]]


def _step0_request(task, proposer, memory: HTG, cfg: SearchConfig, gpu) -> ProposalRequest | None:
    """The request a fresh search of `task` makes at step 0 with this memory (None: it asks
    nothing, _open's no_candidates), for a Prebuild's guess: the same choice, taken on its own
    trail, leaves memory as it was."""
    from torch_htam.policy import policy_for
    supported = _supported(proposer, task)
    state = state_of(task, None, gpu)
    if not memory.eligible(state, supported):
        return None
    choice = memory.select(state, Trail(task.name, cfg.seed), cfg.memory, 0, cfg.strategies_per_step, supported)
    return _request(task, choice, cfg, gpu, policy_for(task), recalled=_recalled(task, memory, cfg))


def _prebuild(tasks, proposer_factory, evaluator, memory: HTG, cfg: SearchConfig, gpu):
    """A started Prebuild of the cover pass's step-0 candidates, or None where there is nothing to
    gain: one task, an evaluator that builds elsewhere or offers no background builder, or a
    proposer whose proposals are not cheap to guess (Proposer.speculative)."""
    from torch_htam.prebuild import Prebuild, step0_guesser
    try:
        builder = getattr(evaluator, "background_builder", lambda: None)()
        if len(tasks) < 2 or builder is None or not getattr(proposer_factory(), "speculative", False):
            return None
        guess = step0_guesser(proposer_factory, memory, lambda t, p, m: _step0_request(t, p, m, cfg, gpu))
    except Exception as e:  # noqa: BLE001 - builds ahead are a speed-up: the search builds for itself
        log.info("no builds ahead of the search (%s: %s)", type(e).__name__, e)
        return None
    # the first task's step 0 builds at once in the search itself
    return Prebuild(tasks[1:], guess, builder).start()


def _supported(proposer, task) -> set[str] | None:
    """The proposer's supported strategy ids for the task; None (all) if it does not say."""
    supports = getattr(proposer, "supports", None)
    return None if supports is None else set(supports(task))


def _gpu_of(evaluator):
    """The evaluator's GpuInfo if it has one, else this machine's first GPU (None without CUDA)."""
    gpu = getattr(evaluator, "gpu", None)
    if gpu is None:
        from torch_htam.gpu import detect
        gpu = detect()
    return gpu


def _budget_stop(cfg: SearchConfig, t0: float, usage: dict[str, float]) -> str | None:
    if cfg.max_wall_s is not None and time.monotonic() - t0 >= cfg.max_wall_s:
        return "wall"
    tokens = usage.get("prompt_tokens", 0.0) + usage.get("completion_tokens", 0.0)
    if cfg.max_tokens is not None and tokens >= cfg.max_tokens:
        return "tokens"
    if cfg.max_cost_usd is not None and usage.get("cost_usd", 0.0) >= cfg.max_cost_usd:
        return "cost"
    return None


def _offer(res: SearchResult, cand: Best) -> bool:
    """Add a correct candidate to the population; True if it is the new best (strictly faster).
    One verified at the example's sizes only (range_checked False) may parent later steps but is
    never the best: the best is what the task keeps, so it was verified over the whole range."""
    ev = cand.evaluation
    if not ev.correct or not ev.speedup:
        return False
    res.population = sorted(res.population + [cand], key=lambda b: -b.speedup)[:POPULATION]
    if not getattr(ev, "range_checked", True):
        return False
    if res.best is None or cand.speedup > res.best.speedup:
        res.best = cand
        return True
    return False


def starting_point(cands, evals) -> float:
    """Step 0's reward baseline: the fastest correct candidate that applies no strategy (the
    proposer's defaults), else 1.0, the reference."""
    start = [ev.speedup for c, ev in zip(cands, evals) if not c.tags and ev.correct and ev.speedup]
    return max(start, default=1.0)


def _attempt(cand, ev) -> Attempt:
    return SearchAttempt(ev.source_hash or source_key(cand.source), list(cand.tags), ev.reason,
                         ev.detail or "", ev.speedup, ev.kernel_ms, ev.ptxas(),
                         source="" if ev.correct else cand.source)


def add_usage(total: dict[str, float], usage: dict[str, float]) -> None:
    """Accumulate Proposal/SearchResult usage: amounts add up; "estimated" is any, "cost_known" all."""
    for k, v in (usage or {}).items():
        if k in ("estimated", "cost_known"):   # flags, not amounts
            total[k] = max(total.get(k, 0.0), v) if k == "estimated" else min(total.get(k, 1.0), v)
        else:
            total[k] = total.get(k, 0.0) + v


def _most_common(reasons: list[str]) -> str | None:
    return max(set(reasons), key=lambda r: (reasons.count(r), r)) if reasons else None


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if hasattr(x, "to_json"):
        return x.to_json()
    return str(x)


# --- many tasks ---------------------------------------------------------------------------------

def eager_weight(task, gpu=None) -> float:
    """Relative eager time of a task across the model, estimated by its roofline: count x
    roofline_ms (only ratios between tasks matter; headroom_weights measures instead)."""
    return max(task.count, 1) * max(roofline_weight_ms(task, gpu), 1e-9)


def roofline_weight_ms(task, gpu) -> float:
    """The task's least possible time in ms at the GPU's nominal rates (max of bytes over
    bandwidth and FLOPs over the policy's peak), per call (H100 rates where no GPU is known)."""
    from torch_htam.policy import policy_for
    bandwidth = gpu.mem_bandwidth if gpu is not None and gpu.mem_bandwidth else 3.35e12
    ridge = ridge_point(gpu, policy_for(task).name) or DEFAULT_RIDGE
    return 1e3 * max(task.bytes, task.flops / ridge) / bandwidth


# A task whose eager time is at its roofline keeps this share of it as weight: a kernel can still
# pay there (a fused epilogue, the host's time), and no task's search is starved to nothing.
HEADROOM_FLOOR = 0.1


def headroom_weights(tasks, gpu, time_ms: Callable[[Any], float], max_s: float) -> dict[str, float]:
    """{signature: count x (measured eager ms - roofline ms)}: the time a kernel could save on the
    task across the model, which search_many's order and budget shares follow (the estimate by
    roofline alone, eager_weight, ranks by size: on a Swin-T it spent a 90 s budget on 2-3 of 43 tasks,
    GEMMs where its kernels reached 0.99-1.06x of eager, and never reached the windowed attention,
    where PyTorch's SDPA pick ran 4-7x slower than our kernel; H100,
    bench/results/optimize_time-20261127-015725.json, anytime_table-20261126-232123.json).

    time_ms(task): one call of the task's reference, ms (plan.time_reference). Tasks are timed
    largest roofline first until max_s seconds have gone; a task not timed (out of time, or its
    timing failed) gets its roofline times the median eager/roofline ratio of those that were.
    """
    roof = {t.signature: roofline_weight_ms(t, gpu) for t in tasks}
    eager: dict[str, float] = {}
    t0 = time.monotonic()
    for t in sorted(tasks, key=lambda t: -max(t.count, 1) * roof[t.signature]):
        if time.monotonic() - t0 > max_s:
            break
        try:
            eager[t.signature] = time_ms(t)
        except Exception as e:  # noqa: BLE001 - a weight, not a verdict: the estimate stands in
            log.info("timing the reference of %s failed (%s: %s); its roofline estimate stands in",
                     t.name, type(e).__name__, e)
    ratios = sorted(eager[s] / roof[s] for s in eager if roof[s] > 0)
    typical = ratios[len(ratios) // 2] if ratios else 1.0 / HEADROOM_FLOOR
    out = {}
    for t in tasks:
        s, r = t.signature, roof[t.signature]
        ms = eager.get(s, typical * r)
        out[s] = max(t.count, 1) * max(ms - r, HEADROOM_FLOOR * ms)
    return out


class Progress:
    """One line per update on stderr: task i/n, step, best speedup so far, ETA."""

    def __init__(self, n_tasks: int, steps: int, time_budget_s: float | None, stream=None):
        self.n, self.steps, self.budget = n_tasks, steps, time_budget_s
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.done_steps = 0
        self.index = 0

    def task_started(self, index: int) -> None:
        self.index = index

    def __call__(self, task, step: int, steps: int, best: float | None) -> None:
        self.done_steps += 1
        elapsed = time.monotonic() - self.t0
        left = max(self.n * (self.steps + 1) - self.done_steps, 0)   # steps of every task
        eta = elapsed / self.done_steps * left
        if self.budget is not None:
            eta = min(eta, max(0.0, self.budget - elapsed))
        shown = f"{best:.2f}x" if best else "none yet"
        print(f"[htam {self.index + 1}/{self.n}] {task.name}: step {step}/{steps}, best {shown}, "
              f"eta {_duration(eta)}", file=self.stream, flush=True)


def search_many(tasks, proposer_factory: Callable[[], Any], evaluator, memory: HTG,
                config: SearchConfig | None = None, progress: bool | Progress = True,
                trajectory_dir: str | Path | None = None, time_budget_s: float | None = None,
                on_result: Callable | None = None, weights: dict[str, float] | None = None,
                gpu=None, later: Callable[[Any], bool] | None = None) -> dict[str, SearchResult]:
    """Search every task, the heaviest weight first, those later(task) says after all others
    (optimize: a library their candidates link is still building); {signature: SearchResult}.

    weights: {signature: relative weight}: what a kernel could save on the task (optimize passes
    headroom_weights), by default its roofline estimate (eager_weight). time_budget_s is shared out
    by weight: each task may use remaining * max(its share of the remaining weight, 1/(2 * tasks
    left)), capped by config.max_wall_s, so a dominant GEMM gets most of the time and a tiny
    elementwise task still gets a fair slice.

    With a time budget the search runs in two passes: a cover pass runs every task's step 0 with
    cfg.cover_candidates candidates (1: the proposer's defaults), then a deepening pass resumes each
    task's search for its remaining steps in the same order with what is left of the budget.
    NOTE: one pass, task after task, spent a ResNet-50's 330 s on its 20 costliest of 27 tasks and
    left 7 with no kernel at all (H100, bench/results/bench_models-20261124-140953.json), while the
    expert's step-0 defaults held 95% of the oracle on 20 of 22 tasks
    (bench/results/anytime-20261123-202559.json). With four candidates a step 0, served vision
    reached 9 of its 18 tasks in 300 s (H200, docs/experiments/search_time).

    The cover pass's coming step-0 candidates are built ahead, niced, on a thread of their own
    (prebuild.py), where the proposer is speculative and the evaluator builds here
    (Evaluator.background_builder); that thread ends with the cover pass.

    on_result(task, result) runs after each task's pass (save memory and cache there, so an
    interruption loses at most one task); result.partial is True after the cover pass when the
    deepening pass may still improve it. It may return the winner's confirmation (an Evaluation):
    its Inductor time and code for the region are the bar the task's later steps show the proposer.
    A task whose proposer or evaluator raises is logged and gets stop "error: ...", and the rest go
    on. GPU parallelism lives in the evaluator (one worker process per GPU).

    >>> results = search_many(tasks, ExpertProposer, evaluator, htg, SearchConfig(), time_budget_s=600)
    """
    cfg = config or SearchConfig()
    gpu = gpu or _gpu_of(evaluator)
    weight = {t.signature: (weights or {}).get(t.signature, eager_weight(t, gpu)) for t in tasks}
    order = sorted(tasks, key=lambda t: (bool(later and later(t)), -weight[t.signature]))
    show = progress if isinstance(progress, Progress) else (
        Progress(len(order), cfg.steps, time_budget_s) if progress else None)
    passes = _Passes(cfg, evaluator, weight, show, on_result, time_budget_s,
                     {t.signature: i for i, t in enumerate(order)})
    cover = time_budget_s is not None and cfg.steps > 0
    prebuild = (_prebuild(order, proposer_factory, evaluator, memory, cfg.covering(), gpu)
                if cover and cfg.prebuild else None)
    results = {}
    try:
        for i, task in enumerate(order):
            if passes.out_of_time():
                results[task.signature] = SearchResult(task.name, task.signature, stop="time_budget")
                continue
            traj = (Path(trajectory_dir) / f"{_safe(task.name)}-{task.signature[:12]}.jsonl"
                    if trajectory_dir else None)
            try:
                proposer = proposer_factory()
                loop = _open(task, proposer, memory, cfg, traj, gpu)
            except Exception as e:
                log.exception("search of task %s failed", task.name)
                results[task.signature] = SearchResult(task.name, task.signature,
                                                       stop=f"error: {type(e).__name__}: {e}")
                continue
            results[task.signature] = loop.res
            if prebuild is not None:
                prebuild.reached(i - 1)          # its tasks are order[1:]
            passes.run(task, loop, proposer, 0 if cover else cfg.steps, order[i:], cover)
    finally:
        if prebuild is not None:   # NOTE: its nvcc must not run on into the decision's timing
            prebuild.stop()
            log.info("prebuild: %d step-0 candidates built ahead of the cover pass", prebuild.built)

    deepen, passes.open = passes.open, []
    for i, (task, loop, proposer) in enumerate(deepen):
        if passes.out_of_time():
            loop.halt("time_budget")    # its step-0 result was already handed on
            loop.close()
            continue
        passes.run(task, loop, proposer, cfg.steps, [t for t, _, _ in deepen[i:]])
    return results


@dataclass
class _Passes:
    """search_many's state across its passes: the clock, and the tasks still open after a pass."""
    cfg: SearchConfig
    evaluator: Any
    weight: dict[str, float]
    show: Progress | None
    on_result: Callable | None
    budget_s: float | None
    index: dict[str, int]                    # signature -> place in the costliest-first order
    t0: float = field(default_factory=lambda: time.monotonic())   # read late: tests stand in a clock
    open: list = field(default_factory=list)    # (task, loop, proposer) a later pass may resume

    def remaining(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - (time.monotonic() - self.t0)

    def out_of_time(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def run(self, task, loop, proposer, last: int, left: list, cover: bool = False) -> None:
        """One pass of one task: advance its loop to step `last`, hand the result on (cover: the
        cover pass, SearchConfig.covering)."""
        if self.show is not None:
            self.show.task_started(self.index[task.signature])
        try:
            loop.cfg = _task_config(self.cfg.covering() if cover else self.cfg, self.remaining(), self.weight,
                                    left, task)
            loop.advance(proposer, self.evaluator, last, self.show)
        except Exception as e:   # NOTE: one bad task must not end a model-wide search
            log.exception("search of task %s failed", task.name)
            loop.halt(f"error: {type(e).__name__}: {e}")
        if loop.stopped:
            loop.close()
        else:
            loop.res.partial = True
            self.open.append((task, loop, proposer))
        if self.on_result is not None and (confirmed := self.on_result(task, loop.res)) is not None:
            loop.learn_bar([confirmed])   # the winner's confirmation timed Inductor's code for the region


def _task_config(cfg: SearchConfig, remaining: float | None, weight: dict[str, float], left, task):
    if remaining is None:
        return cfg
    share = weight[task.signature] / max(sum(weight[t.signature] for t in left), 1e-30)
    allowed = remaining * max(share, 1.0 / (2 * len(left)))
    if cfg.max_wall_s is not None:
        allowed = min(allowed, cfg.max_wall_s)
    return SearchConfig(**{**cfg.to_json(), "max_wall_s": allowed})


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60] or "task"


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
