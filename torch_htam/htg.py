"""The Hierarchical Transition Graph (HTG): HTAM's memory of how kernels get faster.

A networkx DiGraph with three kinds of nodes and two kinds of edges:

    "start" --transition--> direction --transition--> direction ...       (level 1, global)
                            direction --has--> strategy                   (level 2, local)

Directions (memory_access, fusion, ...) and strategies (vectorized_16b_access, online_softmax, ...)
come from the shipped prior (prior/*.json: text, preconditions, KernelSkill-style intent/example/
expected/forbidden fields). Experience is written at run time onto transition edges and strategy
nodes as Stats per coarse state key (state.KernelState.key()) plus an all-states aggregate "*". It
is saved apart from the prior text, so a prior upgrade keeps every recorded attempt. Beside the
graph, `recall` (recall.py) keeps which settings won on each searched task, by the task's sizes.

    >>> htg = HTG.load(paths.memory_path("sm_90a", "expert"))   # prior + recorded experience
    >>> trail = Trail("gelu_bias")
    >>> choice = htg.select(state, trail, supported=proposer.supports(task))   # best first
    >>> htg.record(state, "start", choice.direction, tags, outcome_of(ev, parent_speedup=defaults))
    >>> htg.save(paths.memory_path("sm_90a", "expert"))

Every step, the first included, is a transition: the first leaves the "start" node (no kernel yet,
headroom "unknown" in the state). Selection only considers strategies the proposer supports
(Proposer.supports) and directions with at least one of them, so memory is never asked to rank,
and never credits, a move the proposer cannot make.

Reward of one evaluated candidate (the unit of all values below):
    r = clip(log(speedup / parent_speedup), -1, 1)   if the candidate is correct
    r = -FAIL_PENALTY (0.2)                          otherwise (Stats.failures counts each reason)
parent_speedup is what the candidate was made from: the best kernel so far, and at step 0 the best
known starting point (the proposer's defaults, else the reference: search.starting_point), so the
start edge learns what its direction's first moves add to the defaults, not the defaults' speedup.
A log ratio makes 2x then 2x worth the same as 4x once (gains compose multiplicatively); the clip
keeps one freak timing from owning an edge; a failure costs about what a 0.82x slowdown costs, so a
risky direction that sometimes wins big still beats a safe one that never wins.

Value of a transition a -> d in state s (two-level shrinkage, K0 = prior_weight, K = shrink):
    v_all(a->d)  = (R_all + K0 * p(a->d)) / (n_all + K0)        p: prior edge value (0 if none)
    Q(a->d | s)  = (R_s + K * v_all) / (n_s + K)
R, n: summed reward and attempts. A new state key borrows what the edge did in every state and the
prior, and its own evidence takes over after a few attempts: experience generalizes across tasks
but is not blindly carried over where it hurts (HTAM's cross-entropy transfer case).

Score of direction d, given state s and this task's history h_1..h_k (newest last, "start" when
empty; k = SelectConfig.history):
    score(d) = sum_j w_j * Q(h_j -> d | s) / sum_j w_j          position-weighted history
             + c * sqrt(ln(2 + N_s) / (1 + n_s(d)))             exploration (UCB1-style)
             + when_bonus * [d's prior "when" matches s]
             - tabu * sum_{t: h_t = d, no gain} rho^(age_t)      short-term memory
    w_j = decay^(k - j)  (newest 1, then 0.5, 0.25 ...)
Why each term: pairwise edges from each of the last k directions approximate path-conditioned
experience at O(|V|^2) memory instead of O(|V|^k) (HTAM's argument); the geometric weights make the
move just made count most, as HTAM's position weights do. n_s(d) counts attempts that entered d in
state s, N_s all attempts in s: a direction never tried in this state gets the largest bonus, so it
is tried once the tried ones stop paying, and the bonus fades as evidence grows. The tabu term is
KernelSkill's short-term memory: a direction that just failed to improve this task is damped for a
few steps, which stops A -> B -> A -> B oscillation; a direction that improved is not damped.
Ties go to prior order, so selection is deterministic. Constants (SelectConfig): k = 3, decay =
0.5, c = 0.1, K = 2, K0 = 2, tabu = 0.25, rho = 0.7. c is in reward units: after ~100 attempts in a
state an untried direction's bonus is 0.1 * sqrt(ln 102) = 0.21, so it outranks a tried direction
whose edge averages less than about a 1.2x gain per attempt. With c = 0.3 (classic UCB1 scaling for
this reward range) a fake world where one direction pays 1.4x needed ~12 tasks before the search
settled on it; with 0.1 it settled after ~5, and both tried every eligible direction within 16 tasks.

Strategy ranking under the chosen direction (retrieval):
    rank(x) = V(x | s) + match_weight * m(x, s) - tabu * fails_x
V is the same shrunk estimate on the strategy's own stats (prior 0); m counts the strategy's dynamic
preconditions (bound, headroom, last_failure) that hold (+1) or are violated (-1) in s; fails_x
counts this task's failed attempts with x. Structural preconditions (has_gemm, has_conv,
has_reduction, dtype_class, tf32_allowed, tensor_cores) and applies_to (task kind) are hard
filters in every mode, so the ablations below measure memory, not whether a GEMM strategy is
offered to a softmax.

Ablation modes (MODES):
    "htg"  everything above.
    "flat" one pool of all eligible strategies ranked by their own all-state stats alone,
           V_all(x) + c * sqrt(ln(2 + N) / (1 + n_x)): no directions, transitions or state.
           The request's direction is the top strategy's direction.
    "none" no memory read or written: eligible strategies in a seeded random order
           (random.Random(f"{seed}:{task}:{step}"), so reruns are identical).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import math
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import networkx as nx

from torch_htam.recall import Recall
from torch_htam.state import KernelState

log = logging.getLogger("torch_htam")

PRIOR_DIR = Path(__file__).resolve().parent / "prior"
MODES = ("htg", "flat", "none")
START = "start"       # pseudo-direction a task's first transition leaves from
ALL = "*"             # stats key aggregating every state
FAIL_PENALTY = 0.2
MAX_LOG_GAIN = 1.0
STRUCTURAL = ("has_reduction", "has_gemm", "has_conv", "dtype_class", "tf32_allowed", "tensor_cores")
DYNAMIC = ("bound", "headroom", "last_failure")
KINDS = ("elementwise", "rowwise", "gemm", "conv", "attention")   # "other" sees every strategy
MEMORY_FORMAT = "htg-memory"
MEMORY_VERSION = 1
# What step-0 rewards were measured against. Files without this mark were written when step 0 was
# rewarded against eager: their start edges hold the defaults' speedup, whatever the direction, and
# are dropped on load (every other record is kept; the format is otherwise unchanged, so older code
# still reads files written here).
REWARD_BASIS = "step0-vs-defaults"


# --- records ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Direction:
    """Level-1 node. when: state fields under which the prior favours this direction."""
    id: str
    title: str
    text: str
    when: dict[str, Any] = field(default_factory=dict)


@dataclass
class Strategy:
    """Level-2 node (KernelSkill fields). preconditions: state field -> required value or list of
    allowed values (last_failure takes failure classes: "ok"|"build"|"crash"|"wrong").
    stats: filled on retrieval with the recorded outcome summary (what prompts show)."""
    id: str
    direction: str
    title: str
    text: str
    intent: str = ""
    example: str = ""
    preconditions: dict[str, Any] = field(default_factory=dict)
    expected: str = ""
    forbidden: list[str] = field(default_factory=list)
    applies_to: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def eligible(self, state: KernelState) -> bool:
        """Task kind and structural preconditions hold (hard filter, every mode)."""
        if state.kind in KINDS and self.applies_to and state.kind not in self.applies_to:
            return False
        return all(_holds(self.preconditions[k], state.value(k))
                   for k in STRUCTURAL if k in self.preconditions)

    def match(self, state: KernelState) -> int:
        """+1 per dynamic precondition that holds, -1 per one violated, 0 where the state is unknown."""
        m = 0
        for k in DYNAMIC:
            if k in self.preconditions and state.value(k) != "unknown":
                m += 1 if _holds(self.preconditions[k], state.value(k)) else -1
        return m


@dataclass
class Stats:
    """Experience of one edge or strategy in one state. successes: correct and faster than the
    parent by more than min_gain; log_gain: sum of log(speedup / parent) over correct attempts."""
    attempts: int = 0
    correct: int = 0
    successes: int = 0
    reward: float = 0.0
    log_gain: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, o: "Outcome") -> None:
        self.attempts += 1
        self.reward += o.reward
        if o.gain is not None:
            self.correct += 1
            self.log_gain += math.log(o.gain)
            self.successes += int(o.success)
        else:
            self.failures[o.reason] = self.failures.get(o.reason, 0) + 1

    @property
    def mean_log_gain(self) -> float | None:
        return self.log_gain / self.correct if self.correct else None

    def summary(self) -> dict[str, Any]:
        """Readable form for prompts: tried, correct, faster, mean speedup over the parent, failures."""
        mean = self.mean_log_gain
        return {"tried": self.attempts, "correct": self.correct, "faster": self.successes,
                "mean_speedup_over_parent": None if mean is None else round(math.exp(mean), 3),
                "failures": dict(self.failures)}

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Stats":
        s = Stats(int(d["attempts"]), int(d["correct"]), int(d["successes"]), float(d["reward"]),
                  float(d["log_gain"]), {str(k): int(v) for k, v in d.get("failures", {}).items()})
        if min(s.attempts, s.correct, s.successes) < 0 or s.correct > s.attempts:
            raise ValueError(f"inconsistent stats {d}")
        return s


@dataclass(frozen=True)
class Outcome:
    """One evaluated candidate as memory sees it. gain: speedup / parent speedup (None if not correct)."""
    reason: str
    gain: float | None
    success: bool
    reward: float


def outcome_of(evaluation, parent_speedup: float | None, min_gain: float = 0.01) -> Outcome:
    """Outcome of an Evaluation relative to what it was made from (parent_speedup; None = 1.0,
    the reference).

    >>> outcome_of(Evaluation(True, "ok", speedup=1.5), parent_speedup=1.2).gain
    1.25
    """
    if not evaluation.correct or not evaluation.speedup or evaluation.speedup <= 0:
        reason = evaluation.reason if not evaluation.correct else "not_timed"
        return Outcome(reason, None, False, -FAIL_PENALTY)
    gain = evaluation.speedup / (parent_speedup or 1.0)
    reward = max(-MAX_LOG_GAIN, min(MAX_LOG_GAIN, math.log(gain)))
    return Outcome("ok", gain, gain > 1.0 + min_gain, reward)


@dataclass
class SelectConfig:
    """Selection constants (see the module docstring for the formulas).

    position_weights=False gives every history entry the same weight (HTAM's ablation);
    history=1 keeps only the last direction (no history prefix)."""
    history: int = 3
    decay: float = 0.5
    explore: float = 0.1
    shrink: float = 2.0
    tabu: float = 0.25
    tabu_decay: float = 0.7
    when_bonus: float = 0.05
    match_weight: float = 0.1
    position_weights: bool = True


@dataclass
class Trail:
    """Short-term memory of one task's search: directions taken (newest last), whether each step
    improved the best, and how often each strategy failed on this task."""
    task: str
    seed: int = 0
    directions: list[str] = field(default_factory=list)
    improved: list[bool] = field(default_factory=list)
    strategy_fails: dict[str, int] = field(default_factory=dict)

    @property
    def last(self) -> str:
        return self.directions[-1] if self.directions else START

    def push(self, direction: str, improved: bool) -> None:
        self.directions.append(direction)
        self.improved.append(improved)

    def note_strategies(self, tags: Iterable[str], outcome: Outcome) -> None:
        if not outcome.success:
            for t in tags:
                self.strategy_fails[t] = self.strategy_fails.get(t, 0) + 1


@dataclass
class Choice:
    """What one step follows: direction, strategies (best first, stats filled), every direction's
    score (htg mode; empty otherwise), and the previous direction the transition leaves from."""
    direction: str
    strategies: list[Strategy]
    scores: dict[str, float]
    previous: str


# --- the graph ----------------------------------------------------------------------------------

class HTG:
    """Directions, strategies and transition experience; see the module docstring.

    >>> htg = HTG.from_prior()
    >>> len(htg.directions), len(htg.strategies)
    (10, 43)
    """

    def __init__(self, directions: list[Direction], strategies: list[Strategy],
                 edges: list[dict[str, Any]], prior_weight: float = 2.0,
                 config: SelectConfig | None = None, prior_hash: str = ""):
        self.config = config or SelectConfig()
        self.prior_weight = prior_weight
        self.prior_hash = prior_hash
        self.directions = {d.id: d for d in directions}
        self.strategies = {s.id: s for s in strategies}
        self._orphans: dict[str, dict[str, Any]] = {"edges": {}, "strategies": {}}
        g = nx.DiGraph()
        g.add_node(START, kind="start")
        for d in directions:
            g.add_node(d.id, kind="direction")
        for s in strategies:
            if s.direction not in self.directions:
                raise ValueError(f"strategy {s.id!r} is under unknown direction {s.direction!r}")
            g.add_node(s.id, kind="strategy", exp={})
            g.add_edge(s.direction, s.id, kind="has")
        for e in edges:
            for end in (e["from"], e["to"]):
                if end not in self.directions and end != START:
                    raise ValueError(f"prior edge {e['from']}->{e['to']}: unknown direction {end!r}")
            g.add_edge(e["from"], e["to"], kind="transition", prior=float(e["value"]),
                       why=e.get("why", ""), risk=e.get("risk", ""), exp={})
        self.graph = g
        self.recall = Recall()   # which settings won on tasks of similar size (recall.py)

    # --- construction and persistence ---

    @staticmethod
    def from_prior(prior_dir: str | Path | None = None, config: SelectConfig | None = None) -> "HTG":
        """The shipped prior (every prior/*.json), no experience. Raises ValueError on bad prior data."""
        pdir = Path(prior_dir) if prior_dir else PRIOR_DIR
        directions, strategies, edges, weight = [], [], [], 2.0
        digest = hashlib.sha256()
        for path in sorted(pdir.glob("*.json")):
            raw = path.read_bytes()
            digest.update(raw)
            try:
                data = json.loads(raw)
                directions += [Direction(d["id"], d["title"], d["text"], d.get("when", {}))
                               for d in data.get("directions", [])]
                strategies += [_strategy(s) for s in data.get("strategies", [])]
                edges += data.get("edges", [])
                weight = float(data.get("prior_weight", weight))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"bad HTG prior file {path}: {e!r}") from e
        for what, items in (("direction", directions), ("strategy", strategies)):
            ids = [x.id for x in items]
            dup = sorted({i for i in ids if ids.count(i) > 1})
            if dup:
                raise ValueError(f"duplicate {what} ids in {pdir}: {dup}")
        if not directions or not strategies:
            raise ValueError(f"no HTG prior in {pdir} (expected directions and strategies JSON)")
        return HTG(directions, strategies, edges, weight, config, digest.hexdigest()[:16])

    @staticmethod
    def load(path: str | Path, prior_dir: str | Path | None = None,
             config: SelectConfig | None = None) -> "HTG":
        """Prior plus the experience saved at `path`. A missing file gives the bare prior; a corrupt
        one is reported (warning with the path), moved aside to <path>.corrupt, and the bare prior
        is used: the search never dies on its memory.

        >>> htg = HTG.load(paths.memory_path("sm_90a", "expert"))
        """
        htg = HTG.from_prior(prior_dir, config)
        path = Path(path)
        if not path.exists():
            return htg
        try:
            data = json.loads(path.read_text())
            htg._load_experience(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            aside = path.with_name(path.name + ".corrupt")
            try:
                os.replace(path, aside)
                kept = f"the bad file was moved to {aside}"
            except OSError:
                kept = "the bad file was left in place"
            msg = (f"HTG memory {path} is unreadable ({type(e).__name__}: {e}); starting from the "
                   f"shipped prior, {kept}")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            return HTG.from_prior(prior_dir, config)
        return htg

    def save(self, path: str | Path) -> Path:
        """Write the experience (not the prior text) atomically: tmp file in the same folder, fsync,
        os.replace, so a crash leaves the old file or the new one.

        >>> htg.save(paths.memory_path("sm_90a", "expert"))
        """
        from torch_htam.paths import write_json_atomic
        path = Path(path)
        write_json_atomic(path, self.experience_json())
        return path

    def experience_json(self) -> dict[str, Any]:
        """Experience only, keyed by ids; ids the current prior lacks are kept as they were."""
        edges = dict(self._orphans["edges"])
        for a, b, attrs in self.graph.edges(data=True):
            if attrs["kind"] == "transition" and attrs["exp"]:
                edges[f"{a}->{b}"] = {k: s.to_json() for k, s in attrs["exp"].items()}
        strategies = dict(self._orphans["strategies"])
        for sid in self.strategies:
            exp = self.graph.nodes[sid]["exp"]
            if exp:
                strategies[sid] = {k: s.to_json() for k, s in exp.items()}
        return {"format": MEMORY_FORMAT, "version": MEMORY_VERSION, "reward": REWARD_BASIS,
                "prior": self.prior_hash,
                "saved": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "edges": edges, "strategies": strategies, "recall": self.recall.to_json()}

    def _load_experience(self, data: dict[str, Any]) -> None:
        if data.get("format") != MEMORY_FORMAT:
            raise ValueError(f"not an HTG memory file (format={data.get('format')!r})")
        if data.get("version") != MEMORY_VERSION:
            raise ValueError(f"memory version {data.get('version')!r}, this code reads {MEMORY_VERSION}")
        eager_based = data.get("reward") != REWARD_BASIS
        dropped = 0
        for name, per_key in data["edges"].items():
            a, _, b = name.partition("->")
            exp = {k: Stats.from_json(s) for k, s in per_key.items()}   # validated even if dropped
            if eager_based and a == START:   # NOTE: REWARD_BASIS says why
                dropped += 1
                continue
            if a in self.graph and b in self.directions:
                self._edge(a, b)["exp"] = exp
            else:
                self._orphans["edges"][name] = per_key
        for sid, per_key in data["strategies"].items():
            exp = {k: Stats.from_json(s) for k, s in per_key.items()}
            if sid in self.strategies:
                self.graph.nodes[sid]["exp"] = exp
            else:
                self._orphans["strategies"][sid] = per_key
        self.recall = Recall.from_json(data.get("recall", {}))   # files written before it have none
        if dropped:
            log.info("HTG memory: %d start edge(s) recorded against eager (before %s) dropped",
                     dropped, REWARD_BASIS)

    # --- reading ---

    def strategies_under(self, direction: str) -> list[Strategy]:
        """Strategies of a direction in prior order."""
        return [self.strategies[s] for s in self.graph.successors(direction)
                if self.graph.nodes[s]["kind"] == "strategy"]

    def eligible(self, state: KernelState, supported: Iterable[str] | None = None) -> list[Strategy]:
        """Strategies eligible in `state`, restricted to `supported` ids (None: no restriction)."""
        ok = None if supported is None else set(supported)
        return [s for s in self.strategies.values()
                if s.eligible(state) and (ok is None or s.id in ok)]

    def edge_stats(self, a: str, b: str, key: str = ALL) -> Stats:
        """Recorded stats of transition a -> b in state `key` (empty Stats if none)."""
        if not self.graph.has_edge(a, b):
            return Stats()
        return self.graph.edges[a, b]["exp"].get(key, Stats())

    def strategy_stats(self, sid: str, key: str = ALL) -> Stats:
        return self.graph.nodes[sid]["exp"].get(key, Stats()) if sid in self.strategies else Stats()

    def q(self, a: str, b: str, key: str) -> float:
        """Q(a -> b | key): two-level shrunk mean reward (module docstring)."""
        prior = self.graph.edges[a, b].get("prior", 0.0) if self.graph.has_edge(a, b) else 0.0
        return self._shrunk(self.edge_stats(a, b, ALL), self.edge_stats(a, b, key), prior)

    def strategy_value(self, sid: str, key: str) -> float:
        return self._shrunk(self.strategy_stats(sid, ALL), self.strategy_stats(sid, key), 0.0)

    def _shrunk(self, all_: Stats, here: Stats, prior: float) -> float:
        k0, k = self.prior_weight, self.config.shrink
        v_all = (all_.reward + k0 * prior) / (all_.attempts + k0)
        return (here.reward + k * v_all) / (here.attempts + k)

    def position_weights(self, n: int) -> list[float]:
        """Weights of the last n history entries, oldest first; newest is 1.0.

        >>> HTG.from_prior().position_weights(3)
        [0.25, 0.5, 1.0]
        """
        if not self.config.position_weights:
            return [1.0] * n
        return [self.config.decay ** (n - 1 - j) for j in range(n)]

    def scores(self, state: KernelState, trail: Trail, candidates: Iterable[str]) -> dict[str, float]:
        """score(d) for each candidate direction (module docstring), htg mode."""
        cfg, key = self.config, state.key()
        history = trail.directions[-cfg.history:] or [START]
        weights = self.position_weights(len(history))
        entered = {d: sum(self.edge_stats(a, d, key).attempts for a in self.graph.predecessors(d)
                          if self.graph.edges[a, d]["kind"] == "transition")
                   for d in self.directions}
        total = sum(entered.values())
        out = {}
        for d in candidates:
            history_term = sum(w * self.q(h, d, key) for w, h in zip(weights, history)) / sum(weights)
            explore = cfg.explore * math.sqrt(math.log(2 + total) / (1 + entered[d]))
            when = cfg.when_bonus if _when(self.directions[d].when, state) else 0.0
            tabu = cfg.tabu * sum(cfg.tabu_decay ** (len(trail.directions) - 1 - t)
                                  for t, (h, up) in enumerate(zip(trail.directions, trail.improved))
                                  if h == d and not up)
            out[d] = history_term + explore + when - tabu
        return out

    # --- selection ---

    def select(self, state: KernelState, trail: Trail, mode: str = "htg", step: int = 0,
               n_strategies: int = 4, supported: Iterable[str] | None = None) -> Choice:
        """Direction and up to n_strategies strategies for the next step, among the `supported`
        strategy ids (None: all) and the directions that have one. Raises ValueError when none is
        eligible.

        >>> c = htg.select(state_of(task), Trail(task.name))
        >>> c.direction, [s.id for s in c.strategies]
        ('fusion', ['fuse_elementwise_chain', 'fuse_row_prologue_epilogue'])
        """
        if mode not in MODES:
            raise ValueError(f"memory mode {mode!r}: expected one of {MODES}")
        supported = None if supported is None else set(supported)
        pool = self.eligible(state, supported)
        if not pool:
            raise ValueError(f"no strategy of the prior is eligible for state {state}"
                             + ("" if supported is None else " among the proposer's supported ones"))
        if mode == "none":
            rng = random.Random(f"{trail.seed}:{trail.task}:{step}")
            rng.shuffle(pool)
            return self._choice(pool[0].direction, pool[:n_strategies], {}, trail, state, filled=False)
        if mode == "flat":
            n = sum(self.strategy_stats(s.id).attempts for s in pool)
            rank = {s.id: self.strategy_value(s.id, ALL) + self.config.explore * math.sqrt(
                math.log(2 + n) / (1 + self.strategy_stats(s.id).attempts)) for s in pool}
            pool.sort(key=lambda s: -rank[s.id])   # NOTE: stable sort: ties keep prior order
            return self._choice(pool[0].direction, pool[:n_strategies], {}, trail, state, flat=True)
        candidates = [d for d in self.directions if any(s.direction == d for s in pool)]
        scores = self.scores(state, trail, candidates)
        best = max(candidates, key=lambda d: scores[d])   # NOTE: max keeps the first of ties
        return self._choice(best, self.retrieve(best, state, trail, supported)[:n_strategies], scores,
                            trail, state)

    def retrieve(self, direction: str, state: KernelState, trail: Trail | None = None,
                 supported: Iterable[str] | None = None) -> list[Strategy]:
        """Eligible (and supported, unless None) strategies of `direction`, ranked by rank(x)
        (module docstring), stats filled."""
        key, cfg = state.key(), self.config
        fails = trail.strategy_fails if trail else {}
        ok = None if supported is None else set(supported)
        pool = [s for s in self.strategies_under(direction)
                if s.eligible(state) and (ok is None or s.id in ok)]
        rank = {s.id: self.strategy_value(s.id, key) + cfg.match_weight * s.match(state)
                - cfg.tabu * fails.get(s.id, 0) for s in pool}
        pool.sort(key=lambda s: -rank[s.id])
        return [self._filled(s, key) for s in pool]

    def _choice(self, direction, strategies, scores, trail, state, flat=False, filled=True) -> Choice:
        key = ALL if flat else state.key()
        if not filled:   # mode "none" shows no recorded outcomes
            strategies = [dataclasses.replace(s, stats={}) for s in strategies]
        elif flat:
            strategies = [self._filled(s, key) for s in strategies]
        return Choice(direction, strategies, scores, trail.last)

    def _filled(self, s: Strategy, key: str) -> Strategy:
        here = self.strategy_stats(s.id, key)
        scope, stats = (key, here) if here.attempts else (ALL, self.strategy_stats(s.id, ALL))
        summary = stats.summary() if stats.attempts else {}
        if summary:
            summary["scope"] = "this kind of kernel" if scope != ALL else "all kernels"
        return dataclasses.replace(s, stats=summary)

    # --- learning ---

    def record(self, state: KernelState, previous: str, direction: str, tags: Iterable[str],
               outcome: Outcome, mode: str = "htg") -> None:
        """Learn from one evaluated candidate: transition previous -> direction under state (htg),
        and each strategy it applied (htg: per state and overall; flat: overall). "none" learns
        nothing. Tags that are not strategy ids of the prior are ignored.

        >>> htg.record(state, "fusion", "memory_access", ["vectorized_16b_access"], outcome)
        """
        if mode not in MODES:
            raise ValueError(f"memory mode {mode!r}: expected one of {MODES}")
        if mode == "none":
            return
        keys = (ALL,) if mode == "flat" else (ALL, state.key())
        known = previous in self.directions or previous == START
        if mode == "htg" and known and direction in self.directions:
            exp = self._edge(previous, direction)["exp"]
            for k in keys:
                exp.setdefault(k, Stats()).add(outcome)
        for t in dict.fromkeys(tags):   # NOTE: a tag listed twice is still one application
            if t in self.strategies:
                exp = self.graph.nodes[t]["exp"]
                for k in keys:
                    exp.setdefault(k, Stats()).add(outcome)

    def _edge(self, a: str, b: str) -> dict[str, Any]:
        if not self.graph.has_edge(a, b):
            self.graph.add_edge(a, b, kind="transition", prior=0.0, why="", risk="", exp={})
        return self.graph.edges[a, b]

    def summary(self, key: str = ALL, top: int = 10) -> list[tuple[str, Stats]]:
        """The most tried transitions in state `key`, for reports: [("a->b", Stats), ...]."""
        rows = [(f"{a}->{b}", d["exp"][key]) for a, b, d in self.graph.edges(data=True)
                if d["kind"] == "transition" and key in d["exp"]]
        return sorted(rows, key=lambda r: -r[1].attempts)[:top]


# --- helpers ------------------------------------------------------------------------------------

def _strategy(d: dict[str, Any]) -> Strategy:
    return Strategy(d["id"], d["direction"], d["title"], d["text"], d.get("intent", ""),
                    d.get("example", ""), dict(d.get("preconditions", {})), d.get("expected", ""),
                    list(d.get("forbidden", [])), list(d.get("applies_to", [])))


def _holds(required: Any, value: Any) -> bool:
    return value in required if isinstance(required, list) else value == required


def _when(when: dict[str, Any], state: KernelState) -> bool:
    return bool(when) and all(_holds(v, state.value(k)) for k, v in when.items())
