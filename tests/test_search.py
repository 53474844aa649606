"""The evolution loop with a fake proposer and a fake evaluator (deterministic, CPU only).

The fake world: a candidate's source records the direction, the transition and the parent's
speedup; the evaluator multiplies the parent's speedup by a gain that depends on the transition.
"""
import io
import json

import pytest

from torch_htam.evaluation import Evaluation
from torch_htam.htg import HTG, START
from torch_htam.proposers.base import Candidate, Proposal
from torch_htam.search import REFUSED_STEPS, Progress, SearchConfig, search, search_many
from torch_htam.task import Task, TensorSpec


def make_task(name="rms", kind="rowwise", ops=("aten.rms_norm.default",), count=1, nbytes=8e6):
    x = TensorSpec((1024, 1024), "float32", (1024, 1), dynamic=(0,))
    return Task(name, kind, "class Model: ...", [x], [x], f"sig-{name}", list(ops), count=count,
                flops=5e6, bytes=nbytes)


class FakeProposer:
    """n candidates per request; candidate i applies the i-th retrieved strategy. Records requests."""
    name = "fake"

    def __init__(self, usage=None, fail_last=True):
        self.requests, self.usage, self.fail_last = [], usage or {}, fail_last

    def propose(self, req):
        self.requests.append(req)
        prev = req.transition[0] if req.transition else None
        parent = req.parent.speedup if req.parent else 1.0
        cands = []
        for i in range(req.n):
            tags = [req.strategies[i % len(req.strategies)].id] if req.strategies else []
            meta = {"d": req.direction, "prev": prev, "parent": parent, "i": i,
                    "broken": self.fail_last and i == req.n - 1}
            cands.append(Candidate(f"// {json.dumps(meta)}\n", tags, {"i": i}, "fake"))
        return Proposal(cands, note=f"{len(cands)} fake", usage=dict(self.usage))


class FakeEvaluator:
    """gain(prev, direction) * parent speedup; the last candidate of a batch fails to compile;
    a candidate with i == 1 claims a huge speedup but is wrong (must never become best)."""

    def __init__(self, gains=None, default=1.0, roofline_per_x=0.1):
        self.gains, self.default, self.roof = gains or {}, default, roofline_per_x
        self.calls = 0

    def evaluate_many(self, task, sources):
        self.calls += 1
        out = []
        for src in sources:
            m = json.loads(src[3:])
            if m["broken"]:
                out.append(Evaluation(False, "compile_error", "error: expected ';'"))
            elif m["i"] == 1:
                out.append(Evaluation(False, "mismatch", "out[0] max abs err 0.3", speedup=50.0))
            else:
                gain = self.gains.get((m["prev"], m["d"]), self.gains.get(m["d"], self.default))
                s = m["parent"] * gain * (1 - 0.01 * m["i"])
                out.append(Evaluation(True, "ok", source_hash=f"h{abs(hash(src)) % 10**8}",
                                      ref_ms=1.0, kernel_ms=1.0 / s, speedup=s,
                                      roofline_fraction=min(1.0, s * self.roof)))
        return out


def test_search_improves_and_only_correct_faster_kernels_become_best():
    ev = FakeEvaluator(default=1.2)
    res = search(make_task(), FakeProposer(), ev, HTG.from_prior(), SearchConfig(steps=3))
    assert res.best is not None and res.best.evaluation.correct
    assert res.best.speedup == pytest.approx(1.2 ** 4)   # step 0 + 3 steps, each x1.2 over the parent
    # the candidates that did not verify, by reason (the report says them where no kernel is kept)
    assert sum(res.failures.values()) == res.candidates - res.correct > 0
    assert set(res.failures) <= {"compile_error", "mismatch"}
    assert res.steps == 3 and res.stop == "steps" and res.candidates == 16 and res.correct == 8
    assert [b.speedup for b in res.population] == sorted((b.speedup for b in res.population),
                                                         reverse=True)
    assert len(res.directions) == 4   # step 0 chooses a direction too


def test_requests_carry_parent_feedback_transition_and_strategies():
    prop = FakeProposer()
    search(make_task(), prop, FakeEvaluator(default=1.1), HTG.from_prior(), SearchConfig(steps=2))
    zero, first, second = prop.requests
    assert zero.parent is None and zero.transition == (START, zero.direction) and zero.strategies
    assert first.transition == (zero.direction, first.direction)
    assert first.parent.speedup == pytest.approx(1.1)
    assert first.strategies and all(s.direction == first.direction for s in first.strategies)
    assert {a.outcome for a in first.feedback} == {"ok", "mismatch", "compile_error"}
    assert second.transition == (first.direction, second.direction)
    assert second.policy.name == "fp32" and first.n == 4


def test_stops_on_stagnation():
    res = search(make_task(), FakeProposer(), FakeEvaluator(default=1.0), HTG.from_prior(),
                 SearchConfig(steps=6, stagnation=2))
    assert res.stop == "stagnation" and res.steps == 2


def test_stops_on_roofline():
    res = search(make_task(), FakeProposer(), FakeEvaluator(default=1.5, roofline_per_x=0.6),
                 HTG.from_prior(), SearchConfig(steps=6, roofline_stop=0.85))
    assert res.stop == "roofline" and res.steps == 0   # step 0's kernel is already at 90% of the roof


@pytest.mark.parametrize("cfg, usage, stop", [
    (dict(max_wall_s=0.0), {}, "wall"),
    (dict(max_tokens=2500), {"prompt_tokens": 1000.0, "completion_tokens": 500.0}, "tokens"),
    (dict(max_cost_usd=0.05), {"cost_usd": 0.02}, "cost"),
])
def test_stops_on_budget(cfg, usage, stop):
    prop = FakeProposer(usage=usage)
    res = search(make_task(), prop, FakeEvaluator(default=1.3), HTG.from_prior(),
                 SearchConfig(steps=6, **cfg))
    assert res.stop == stop
    if stop != "wall":   # tokens: 1500 a step -> stops before step 2; cost: 0.02 -> before step 3
        assert len(prop.requests) == {"tokens": 2, "cost": 3}[stop]
        assert res.usage["prompt_tokens" if stop == "tokens" else "cost_usd"] > 0
    else:
        assert res.candidates == 0 and res.best is None


def test_trajectory_is_readable_jsonl(tmp_path):
    path = tmp_path / "t.jsonl"
    res = search(make_task(), FakeProposer(), FakeEvaluator(default=1.2), HTG.from_prior(),
                 SearchConfig(steps=2), trajectory=path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    events = [x["event"] for x in lines]
    assert events[0] == "start" and events[-1] == "summary"
    assert events.count("step") == 3 and events.count("candidate") == res.candidates
    for c in (x for x in lines if x["event"] == "candidate"):
        assert {"step", "direction", "strategies", "hash", "reason", "detail", "speedup",
                "kernel_ms", "t", "time", "task"} <= set(c)
    bad = next(x for x in lines if x["event"] == "candidate" and x["reason"] == "compile_error")
    assert "expected ';'" in bad["detail"] and bad["speedup"] is None
    assert lines[-1]["best_speedup"] == pytest.approx(res.best.speedup, abs=1e-4)


def test_memory_learns_across_tasks_and_steers_later_searches():
    # Only reduction_strategy pays on row tasks; everything else is neutral.
    world = FakeEvaluator(gains={"reduction_strategy": 1.4}, default=1.0)
    htg = HTG.from_prior()
    cfg = SearchConfig(steps=4, stagnation=0, roofline_stop=None)
    firsts = []
    for i in range(14):   # step 0 tries each of the 10 directions from the start state once first
        res = search(make_task(f"row{i}"), FakeProposer(), world, htg, cfg)
        firsts.append(res.directions)
    assert htg.edge_stats(START, "reduction_strategy").attempts > 0
    late = firsts[-3:]
    assert all(d.count("reduction_strategy") >= 2 for d in late), late
    # the flat and none arms run the same loop and do not learn transitions
    flat = HTG.from_prior()
    search(make_task(), FakeProposer(), world, flat, SearchConfig(steps=2, memory="flat"))
    assert flat.experience_json()["edges"] == {} and flat.experience_json()["strategies"]
    none = HTG.from_prior()
    r = search(make_task(), FakeProposer(), world, none, SearchConfig(steps=2, memory="none", seed=3))
    assert none.experience_json()["strategies"] == {} and r.steps == 2


def test_search_many_orders_by_weight_reports_progress_and_survives_errors():
    tasks = [make_task("small", nbytes=1e5), make_task("big", nbytes=1e9),
             make_task("boom", nbytes=1e7)]

    class Flaky(FakeEvaluator):
        def evaluate_many(self, task, sources):
            if task.name == "boom":
                raise RuntimeError("worker died")
            return super().evaluate_many(task, sources)

    seen, err = [], io.StringIO()
    results = search_many(tasks, FakeProposer, Flaky(default=1.1), HTG.from_prior(),
                          SearchConfig(steps=1), progress=Progress(3, 1, None, stream=err),
                          on_result=lambda t, r: seen.append(t.name))
    assert seen == ["big", "boom", "small"]
    assert results["sig-boom"].stop.startswith("error: RuntimeError: worker died")
    assert results["sig-big"].best is not None
    out = err.getvalue().splitlines()
    assert out[0].startswith("[htam 1/3] big: step 0/1, best 1.10x, eta")
    assert any(line.startswith("[htam 3/3] small") for line in out)


def test_tasks_awaiting_a_library_come_after_the_others():
    """later(task): a task whose library still builds is searched after every other task, the
    heaviest first within each group."""
    tasks = [make_task("small", nbytes=1e5), make_task("big", nbytes=1e9), make_task("mid", nbytes=1e7),
             make_task("waits", nbytes=1e10)]
    seen = []
    search_many(tasks, FakeProposer, FakeEvaluator(default=1.1), HTG.from_prior(), SearchConfig(steps=1),
                progress=False, on_result=lambda t, r: seen.append(t.name), later=lambda t: t.name == "waits")
    assert seen == ["big", "mid", "small", "waits"]


def test_search_many_shares_the_time_budget():
    tasks = [make_task(f"t{i}") for i in range(3)]
    results = search_many(tasks, FakeProposer, FakeEvaluator(default=1.1), HTG.from_prior(),
                          SearchConfig(steps=1), progress=False, time_budget_s=0.0)
    assert {r.stop for r in results.values()} == {"time_budget"}


class Clocked(FakeEvaluator):
    """Every evaluate_many call takes 10 s of a fake clock; records which task it served."""

    def __init__(self, clock, **kw):
        super().__init__(**kw)
        self.clock, self.served = clock, []

    def evaluate_many(self, task, sources):
        self.clock[0] += 10.0
        self.served.append(task.name)
        return super().evaluate_many(task, sources)


@pytest.fixture
def clock(monkeypatch):
    """search.py's clock, frozen at 0 and moved only by Clocked."""
    import time
    from types import SimpleNamespace
    now = [0.0]
    monkeypatch.setattr("torch_htam.search.time", SimpleNamespace(monotonic=lambda: now[0],
                                                                   time_ns=time.time_ns))
    return now


def test_a_time_budget_covers_every_task_before_deepening(clock):
    tasks = [make_task("small", nbytes=1e5), make_task("big", nbytes=1e9), make_task("mid", nbytes=1e7)]
    ev, seen = Clocked(clock, default=1.1), []
    results = search_many(tasks, FakeProposer, ev, HTG.from_prior(),
                          SearchConfig(steps=2, stagnation=0, roofline_stop=None, cover_candidates=4),
                          progress=False, time_budget_s=1e6, on_result=lambda t, r: seen.append((t.name, r.partial)))
    assert ev.served[:3] == ["big", "mid", "small"]          # every task's step 0 first
    assert ev.served[3:] == ["big"] * 2 + ["mid"] * 2 + ["small"] * 2
    assert seen == [("big", True), ("mid", True), ("small", True),
                    ("big", False), ("mid", False), ("small", False)]
    assert all(r.steps == 2 and r.stop == "steps" and not r.partial for r in results.values())


def test_a_budget_spent_while_deepening_keeps_every_task_s_first_kernel(clock):
    tasks = [make_task(f"t{i}", nbytes=10 ** (9 - i)) for i in range(3)]
    ev, seen = Clocked(clock, default=1.1), []
    results = search_many(tasks, FakeProposer, ev, HTG.from_prior(),
                          SearchConfig(steps=3, stagnation=0, roofline_stop=None, cover_candidates=4),
                          progress=False, time_budget_s=35.0, on_result=lambda t, r: seen.append((t.name, r.partial)))
    # cover pass: 30 s for three step-0s; t0 then gets one step before its share runs out
    assert ev.served == ["t0", "t1", "t2", "t0"]
    assert all(r.best is not None and not r.partial for r in results.values())
    assert results["sig-t0"].stop == "wall" and results["sig-t0"].steps == 1
    assert {results[f"sig-t{i}"].stop for i in (1, 2)} == {"time_budget"}
    assert seen == [("t0", True), ("t1", True), ("t2", True), ("t0", False)]


class DefaultsFirst(FakeProposer):
    """As the expert: with no parent, candidate 0 is the defaults (no strategy, never broken)."""

    def __init__(self):
        super().__init__(fail_last=False)

    def propose(self, req):
        out = super().propose(req)
        if req.parent is None and out.candidates:
            c = out.candidates[0]
            out.candidates[0] = Candidate(c.source.replace('"i": 0', '"i": 0, "defaults": 1'), [], c.params, c.origin)
        return out


def test_the_cover_pass_asks_each_task_for_its_defaults_and_deepening_for_more(clock):
    """With a time budget, step 0 of the cover pass asks for cover_candidates (1: the defaults),
    so the budget reaches every task first; a step of the defaults alone tries no direction (the
    trail stays empty, so step 1 may take the direction step 0 chose); deepening asks for
    candidates_per_step."""
    tasks = [make_task("a", nbytes=1e9), make_task("b", nbytes=1e5)]
    proposers = []

    def factory():
        proposers.append(DefaultsFirst())
        return proposers[-1]
    results = search_many(tasks, factory, Clocked(clock, default=1.1), HTG.from_prior(),
                          SearchConfig(steps=1, stagnation=0, roofline_stop=None), progress=False, time_budget_s=1e6)
    assert [[r.n for r in p.requests] for p in proposers] == [[1, 4], [1, 4]]
    assert all(r.best is not None and r.steps == 1 for r in results.values())
    assert [p.requests[1].transition[0] for p in proposers] == [START, START]   # no move before step 1


def test_without_a_time_budget_each_task_is_searched_in_one_go(clock):
    tasks = [make_task("a", nbytes=1e9), make_task("b", nbytes=1e5)]
    ev, seen = Clocked(clock, default=1.1), []
    search_many(tasks, FakeProposer, ev, HTG.from_prior(),
                SearchConfig(steps=2, stagnation=0, roofline_stop=None), progress=False,
                on_result=lambda t, r: seen.append((t.name, r.partial)))
    assert ev.served == ["a"] * 3 + ["b"] * 3 and seen == [("a", False), ("b", False)]


def test_stops_when_every_candidate_refuses_the_task_s_inputs():
    """HTAM_ERR_SHAPE on the task's own inputs ("refused"): the proposer's path does not fit the
    task, so after REFUSED_STEPS such steps the search stops and the report says so; a step with
    one refusal among other failures does not count."""
    class Refusing(FakeEvaluator):
        def evaluate_many(self, task, sources):
            self.calls += 1
            return [Evaluation(False, "refused", "htam_run returned HTAM_ERR_SHAPE") for _ in sources]
    res = search(make_task(), FakeProposer(), Refusing(), HTG.from_prior(), SearchConfig(steps=6, stagnation=0))
    assert res.stop == "refused" and res.steps == REFUSED_STEPS - 1 and res.best is None

    class Mixed(FakeEvaluator):
        def evaluate_many(self, task, sources):
            self.calls += 1
            return [Evaluation(False, "refused" if i == 0 else "mismatch", "") for i, _ in enumerate(sources)]
    res = search(make_task(), FakeProposer(), Mixed(), HTG.from_prior(), SearchConfig(steps=3, stagnation=0))
    assert res.stop != "refused"


def test_stops_when_the_proposer_has_nothing():
    class Empty(FakeProposer):
        def propose(self, req):
            self.requests.append(req)
            return Proposal([], note="unsupported graph")
    prop = Empty()
    res = search(make_task(), prop, FakeEvaluator(), HTG.from_prior(), SearchConfig(steps=6, stagnation=0))
    assert res.stop == "no_candidates" and len(prop.requests) == 3 and res.best is None


def test_bad_memory_mode_is_rejected():
    with pytest.raises(ValueError, match="memory"):
        SearchConfig(memory="random")


class Supporting(FakeProposer):
    """A fake proposer that realizes only `ids`; a request for anything else is a bug."""

    def __init__(self, ids, **kw):
        super().__init__(**kw)
        self.ids = set(ids)

    def supports(self, task):
        return set(self.ids)

    def propose(self, req):
        assert {s.id for s in req.strategies} <= self.ids, [s.id for s in req.strategies]
        return super().propose(req)


def test_search_asks_only_for_supported_strategies():
    htg, ids = HTG.from_prior(), {"online_softmax", "warp_per_row", "read_only_cache_loads"}
    allowed = {htg.strategies[s].direction for s in ids}
    world = FakeEvaluator(gains={"fusion": 2.0, "memory_access": 1.1}, default=1.0)
    for i in range(8):
        prop = Supporting(ids)
        res = search(make_task(f"r{i}"), prop, world, htg, SearchConfig(steps=4, stagnation=0))
        assert set(res.directions) <= allowed and prop.requests
    recorded = {b for a, b, d in htg.graph.edges(data=True) if d["kind"] == "transition" and d["exp"]}
    assert recorded <= allowed
    assert {s for s in htg.strategies if htg.strategy_stats(s).attempts} <= ids


def test_step_zero_is_a_transition_from_the_start_state(tmp_path):
    from torch_htam.htg import Trail
    from torch_htam.state import state_of
    htg, task, prop = HTG.from_prior(), make_task(), FakeProposer(fail_last=False)
    start = state_of(task)
    want = htg.select(start, Trail(task.name), "htg", 0, 4)   # what the HTG picks before any kernel
    path = tmp_path / "t.jsonl"
    res = search(task, prop, FakeEvaluator(default=1.1), htg, SearchConfig(steps=1), trajectory=path)
    zero = prop.requests[0]
    assert zero.transition == (START, want.direction) and res.directions[0] == want.direction
    assert [s.id for s in zero.strategies] == [s.id for s in want.strategies]
    assert htg.edge_stats(START, want.direction, start.key()).attempts == 4   # every step-0 candidate
    step0 = next(json.loads(x) for x in path.read_text().splitlines() if '"event": "step"' in x)
    assert step0["step"] == 0 and step0["previous"] == START and step0["direction"] == want.direction


def test_an_unrealized_step_is_not_a_failure_of_its_direction():
    class Picky(FakeProposer):          # writes nothing for one direction
        def propose(self, req):
            if req.direction == self.refuse:
                self.requests.append(req)
                return Proposal([], note="no move changes this parent")
            return super().propose(req)

    cfg = SearchConfig(steps=2, stagnation=0)
    plain = search(make_task(), FakeProposer(), FakeEvaluator(default=1.1), HTG.from_prior(), cfg)
    htg, prop = HTG.from_prior(), Picky()
    prop.refuse = plain.directions[1]     # deterministic: the same world picks it again at step 1
    res = search(make_task(), prop, FakeEvaluator(default=1.1), htg, cfg)
    assert res.directions[1] == prop.refuse and res.directions[2] != prop.refuse   # the trail moves on
    recorded = [(a, b) for a, b, d in htg.graph.edges(data=True) if d["kind"] == "transition" and d["exp"]]
    assert all(b != prop.refuse for _, b in recorded) and len(recorded) == 2


def test_a_task_the_proposer_supports_nothing_for_costs_no_step():
    prop = Supporting(set())
    res = search(make_task(), prop, FakeEvaluator(), HTG.from_prior(), SearchConfig(steps=6))
    assert res.stop == "no_candidates" and prop.requests == [] and res.steps == 0


def test_expert_search_credits_only_applied_supported_strategies(tmp_path):
    """The real expert in the loop (evaluation faked): step 0 comes from the HTG with the expert's
    defaults among its candidates (no tags), and memory credits only strategies the expert supports."""
    from pathlib import Path
    from torch_htam.extract import task_from_source
    from torch_htam.proposers.expert import ExpertProposer

    class Judge(FakeEvaluator):
        def evaluate_many(self, task, sources):
            return [Evaluation(True, "ok", ref_ms=1.0, kernel_ms=1.0 / (1.1 + 0.01 * i), speedup=1.1 + 0.01 * i,
                               roofline_fraction=0.3) for i, _ in enumerate(sources)]

    src = (Path(__file__).parents[1] / "bench" / "tasks" / "rw_softmax_fp32.py").read_text()
    task = task_from_source(src, "rw_softmax_fp32")
    expert, htg, path = ExpertProposer(), HTG.from_prior(), tmp_path / "t.jsonl"
    res = search(task, expert, Judge(), htg, SearchConfig(steps=2, stagnation=0), trajectory=path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    zero = [x for x in lines if x["event"] == "candidate" and x["step"] == 0]
    assert zero[0]["strategies"] == [] and all(len(x["strategies"]) >= 1 for x in zero[1:])
    # the defaults are the starting point step 0's moves are measured against, not a move
    assert htg.edge_stats(START, res.directions[0]).attempts == len(zero) - 1
    credited = {s for s in htg.strategies if htg.strategy_stats(s).attempts}
    assert credited and credited <= expert.supports(task)


class WithDefaults(FakeProposer):
    """Step 0 (no parent) brings the proposer's defaults first, untagged, as the expert does."""

    def propose(self, req):
        prop = super().propose(req)
        if req.parent is None:
            meta = {"d": "defaults", "prev": None, "parent": 1.0, "i": 0, "broken": False}
            prop.candidates[0] = Candidate(f"// {json.dumps(meta)}\n", [], {}, "fake")
        return prop


def test_step_zero_is_rewarded_against_the_defaults_not_eager():
    """The defaults run 2x eager and the chosen direction's moves add nothing to them: the start
    edge learns ~0 (its moves did not pay), not log 2 (the defaults' speedup, whatever the
    direction), and the defaults themselves are not recorded as a move."""
    world = FakeEvaluator(gains={"defaults": 2.0}, default=1.0)

    class Moves(WithDefaults):   # every tagged step-0 move: the defaults' 2x, as a move that changes nothing
        def propose(self, req):
            prop = super().propose(req)
            for i, c in enumerate(prop.candidates[1:], 1):
                m = json.loads(c.source[3:])
                m.update(parent=2.0 if req.parent is None else m["parent"])
                prop.candidates[i] = Candidate(f"// {json.dumps(m)}\n", c.tags, c.params, c.origin)
            return prop

    htg = HTG.from_prior()
    res = search(make_task(), Moves(), world, htg, SearchConfig(steps=0))
    edge = htg.edge_stats(START, res.directions[0])
    assert edge.attempts == 3                        # 4 candidates, less the defaults
    assert edge.failures == {"mismatch": 1, "compile_error": 1}   # failures by kind, on the edge
    assert edge.correct == 1 and edge.successes == 0       # i == 2: the defaults' 2x, nothing more
    assert abs(edge.log_gain) < 0.05 and edge.reward < 0   # eager-relative: log 2 = 0.69


def test_step_zero_without_defaults_is_rewarded_against_the_reference():
    """A proposer with no defaults (every candidate applies a strategy, as an LLM's do): the
    starting point is the reference, speedup 1.0."""
    htg = HTG.from_prior()
    res = search(make_task(), FakeProposer(fail_last=False), FakeEvaluator(default=1.5), htg,
                 SearchConfig(steps=0))
    edge = htg.edge_stats(START, res.directions[0])
    assert edge.attempts == 4 and edge.successes == 3        # i = 0, 2, 3 correct, about 1.5x
    assert edge.log_gain > 3 * 0.35                         # log 1.5 = 0.41, less 1% per i


def test_failed_sources_and_inductor_s_bar_reach_the_next_request():
    class Timed(FakeEvaluator):      # Inductor timed for the region: 0.5 ms
        def evaluate_many(self, task, sources):
            out = super().evaluate_many(task, sources)
            for e in out:
                if e.correct:
                    e.compile_ms = 0.5
            return out

    prop = FakeProposer()
    search(make_task(), prop, Timed(default=1.25), HTG.from_prior(), SearchConfig(steps=1))
    first = prop.requests[1]
    failed = [a for a in first.feedback if a.outcome != "ok"]
    assert failed and all(a.source.startswith("// {") for a in failed)   # the code that broke
    assert all(not a.source for a in first.feedback if a.outcome == "ok")
    assert first.parent.compile_ms == 0.5
    assert first.parent.compile_speedup == pytest.approx(0.5 / first.parent.kernel_ms)
    assert prop.requests[0].parent is None                             # nothing measured yet


def test_headroom_weights_follow_measured_eager_time_over_the_roofline():
    """A task far above its roofline outweighs a larger one already at it; a task whose timing
    fails, or that the time limit leaves out, gets its roofline times the typical ratio."""
    from types import SimpleNamespace
    from torch_htam.search import HEADROOM_FLOOR, headroom_weights, roofline_weight_ms
    gpu = SimpleNamespace(mem_bandwidth=1e12, fp32_flops=1e13, tensor_flops=1e15)
    t = lambda sig, nbytes, count=1: SimpleNamespace(  # noqa: E731
        signature=sig, name=sig, count=count, bytes=nbytes, flops=0.0, dtypes=("float32",),
        inputs=[], outputs=[], kind="x")
    big, small, broken = t("big", 4e9, 1), t("small", 1e8, 2), t("broken", 1e9, 1)
    roof = {x.signature: roofline_weight_ms(x, gpu) for x in (big, small, broken)}
    assert roof["big"] == 4.0 and roof["small"] == 0.1           # bytes / 1e12 B/s, in ms
    eager = {"big": 4.2, "small": 0.9}

    def time_ms(task):
        if task.signature == "broken":
            raise RuntimeError("no inputs")
        return eager[task.signature]

    w = headroom_weights([big, small, broken], gpu, time_ms, max_s=60)
    assert w["small"] == 2 * (0.9 - 0.1)                          # count x (eager - roofline)
    assert w["big"] == max(4.2 - 4.0, HEADROOM_FLOOR * 4.2)       # at its roofline: the floor
    assert w["small"] > w["big"]
    ratios = sorted([4.2 / 4.0, 0.9 / 0.1])
    typical = ratios[len(ratios) // 2]
    assert w["broken"] == max(typical * 1.0 - 1.0, HEADROOM_FLOOR * typical * 1.0)
    # no time to time anything: every task by its roofline, in the same units
    w0 = headroom_weights([big, small], gpu, time_ms, max_s=-1)
    assert w0["big"] > w0["small"]


class Speculative(FakeProposer):
    speculative = True


class Building(FakeEvaluator):
    """A FakeEvaluator with a background builder that records what it was handed; each
    evaluate_many takes 50 ms of real time, as a GPU's verification would, so the builder's thread
    runs while the cover pass waits."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.events, self.ahead = [], []

    def background_builder(self):
        from types import SimpleNamespace

        def build_many(sources, cancel=None):
            self.ahead += sources
            self.events.append("prebuild")
            return [SimpleNamespace(ok=True, cached=False) for _ in sources]
        return build_many

    def evaluate_many(self, task, sources):
        import time
        time.sleep(0.05)
        self.events.append(("evaluate", task.name, tuple(sources)))
        return super().evaluate_many(task, sources)


def test_the_cover_pass_s_coming_step_zero_candidates_are_built_ahead_and_only_then():
    tasks = [make_task(f"t{i}", nbytes=10 ** (9 - i)) for i in range(4)]
    cfg = SearchConfig(steps=1, stagnation=0, roofline_stop=None, memory="none")
    ev = Building(default=1.1)
    results = search_many(tasks, Speculative, ev, HTG.from_prior(), cfg, progress=False, time_budget_s=1e6)
    evaluated = [e for e in ev.events if e != "prebuild"]
    assert [e[1] for e in evaluated] == ["t0", "t1", "t2", "t3"] * 2      # cover pass, then deepening
    # the guess is each later task's step 0 exactly: the first task's builds in the search itself
    assert ev.ahead == [s for e in evaluated[1:4] for s in e[2]]
    # nothing is built ahead once the cover pass is over
    assert max(i for i, e in enumerate(ev.events) if e == "prebuild") < ev.events.index(evaluated[4])
    # and the search is the same search
    plain = search_many(tasks, FakeProposer, FakeEvaluator(default=1.1), HTG.from_prior(), cfg,
                        progress=False, time_budget_s=1e6)
    assert {k: (r.speedup, r.steps) for k, r in results.items()} == {k: (r.speedup, r.steps) for k, r in plain.items()}


def test_nothing_is_built_ahead_for_a_proposer_that_is_not_speculative_or_without_a_budget():
    tasks = [make_task(f"t{i}", nbytes=10 ** (9 - i)) for i in range(3)]
    ev = Building(default=1.1)
    search_many(tasks, FakeProposer, ev, HTG.from_prior(), SearchConfig(steps=1), progress=False, time_budget_s=1e6)
    search_many(tasks, Speculative, ev, HTG.from_prior(), SearchConfig(steps=1), progress=False)
    assert ev.ahead == [] and "prebuild" not in ev.events


def test_a_background_builder_that_fails_to_start_costs_the_search_nothing():
    class Broken(Building):
        def background_builder(self):
            raise OSError("no nice here")

    tasks = [make_task(f"t{i}", nbytes=10 ** (9 - i)) for i in range(3)]
    results = search_many(tasks, Speculative, Broken(default=1.1), HTG.from_prior(), SearchConfig(steps=1),
                          progress=False, time_budget_s=1e6)
    assert all(r.best is not None for r in results.values())


def test_candidates_the_deadline_cut_teach_the_memory_nothing():
    """A step whose candidates optimize's deadline cut (Evaluation reason "deadline") judged none
    of its strategies: it records no transition or strategy experience, where a failed step would."""
    class Cut(FakeEvaluator):
        def evaluate_many(self, task, sources):
            out = super().evaluate_many(task, sources)
            return out if self.calls <= 2 else [Evaluation(False, "deadline", "cut") for _ in sources]

    plain = search(make_task(), FakeProposer(), FakeEvaluator(default=1.1), HTG.from_prior(),
                   SearchConfig(steps=1, stagnation=0))
    htg = HTG.from_prior()
    search(make_task(), FakeProposer(), FakeEvaluator(default=1.1), htg, SearchConfig(steps=1, stagnation=0))
    cut_htg = HTG.from_prior()
    res = search(make_task(), FakeProposer(), Cut(default=1.1), cut_htg, SearchConfig(steps=2, stagnation=0))
    assert res.directions[:2] == plain.directions[:2]

    def experience(h):
        edges = [(a, b, k, s.attempts) for a, b, d in h.graph.edges(data=True) if d["kind"] == "transition"
                 for k, s in d["exp"].items()]
        nodes = [(n, k, s.attempts) for n, d in h.graph.nodes(data=True) for k, s in (d.get("exp") or {}).items()]
        return sorted(edges), sorted(nodes)
    assert experience(cut_htg) == experience(htg)   # step 2's cut candidates added nothing


def test_a_candidate_verified_at_the_example_only_is_never_the_best():
    """Evaluator.evaluate_many verifies a ranged batch over the range for its fastest only; a
    candidate left at the example's sizes (range_checked False) may not become what the task keeps,
    even where a second timing put it ahead of the one that was checked over the range."""
    class Unchecked(FakeEvaluator):
        def evaluate_many(self, task, sources):
            out = super().evaluate_many(task, sources)
            out[0].range_checked, out[0].speedup = False, 99.0    # fastest, but not checked
            return out

    res = search(make_task(), FakeProposer(), Unchecked(default=1.1), HTG.from_prior(), SearchConfig(steps=1))
    assert res.best is not None and res.best.speedup < 99.0 and res.best.evaluation.range_checked


def test_inductor_s_time_and_code_from_a_confirmation_are_the_bar_of_the_task_s_later_steps(clock):
    """on_result (optimize's _Keeper) confirms the cover pass's winner, timing Inductor's code for
    the region, and returns that Evaluation; the deepening pass's requests carry its time and
    code as the parent's bar."""
    prop = DefaultsFirst()
    confirmed = Evaluation(True, "ok", compile_ms=0.25, inductor_code="def call(args): ...")
    search_many([make_task("a")], lambda: prop, Clocked(clock, default=1.1), HTG.from_prior(),
                SearchConfig(steps=1, stagnation=0, roofline_stop=None), progress=False, time_budget_s=1e6,
                on_result=lambda t, r: confirmed if r.partial else None)
    assert [r.parent.compile_ms if r.parent else None for r in prop.requests] == [None, 0.25]
    parent = prop.requests[1].parent
    assert parent.compile_speedup == pytest.approx(0.25 / parent.kernel_ms)
    assert parent.inductor_code == "def call(args): ..."
