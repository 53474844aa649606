"""prebuild.py: the cover pass's coming step-0 candidates built ahead, on a thread of their own.
A stand-in builder for the thread's order, batches and stop; with nvcc (`build` marker), the real
expert and builds: every candidate compiled once, the later tasks' step 0 found built."""
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from torch_htam import build
from torch_htam.prebuild import Prebuild

ROOT = Path(__file__).resolve().parents[1]


def test_tasks_are_built_in_order_one_build_each_and_a_failed_guess_skips_only_its_task():
    batches = []

    def sources_of(task):
        if task == "bad":
            raise ValueError("no graph")
        return [f"{task}.a", f"{task}.b"]

    def build_many(sources, cancel=None):
        batches.append(list(sources))
        return [SimpleNamespace(ok=True, cached=s.startswith("t1")) for s in sources]

    p = Prebuild(["t0", "bad", "t1", "t2", "t3"], sources_of, build_many).start()
    p.stop()   # waits for the thread: the stand-in builds at once, so all of it ran
    assert batches == [["t0.a", "t0.b"], ["t1.a", "t1.b"], ["t2.a", "t2.b"], ["t3.a", "t3.b"]]
    assert p.failed == 1 and p.built == 6         # t1's two were already built (cached)


def test_stop_cancels_the_running_build_and_builds_nothing_more():
    started, batches = threading.Event(), []

    def build_many(sources, cancel=None):
        batches.append(sources)
        started.set()
        assert cancel.wait(10)                     # a build runs until stop() cancels it
        return [SimpleNamespace(ok=False, cached=False) for _ in sources]

    p = Prebuild([f"t{i}" for i in range(8)], lambda t: [t], build_many).start()
    assert started.wait(10)
    p.stop()
    assert len(batches) == 1 and p.built == 0


def _bench_task(stem):
    from torch_htam.extract import task_from_source
    return task_from_source((ROOT / "bench" / "tasks" / f"{stem}.py").read_text(), stem)


@pytest.mark.build
@pytest.mark.skipif(build.paths.nvcc_path() is None or build._ninja() is None, reason="needs nvcc and ninja")
def test_the_search_finds_the_later_tasks_step_zero_built_and_builds_nothing_twice(monkeypatch):
    from torch_htam.evaluation import Evaluator
    from torch_htam.htg import HTG
    from torch_htam.proposers.expert import ExpertProposer
    from torch_htam.search import SearchConfig, search_many
    compiled, real = [], build._compile     # (hash, built, thread) of every source nvcc ran on

    def counting(jobs, *a, **kw):
        out = real(jobs, *a, **kw)
        compiled.extend((h, r.ok, threading.current_thread().name) for h, r in out.items())
        return out

    monkeypatch.setattr(build, "_compile", counting)
    tasks = [_bench_task(s) for s in ("ew_bias_gelu_fp32", "ew_gelu_tanh_formula_fp32", "ew_cast_chain_bf16")]
    seen = {}
    with Evaluator(arch="sm_90a") as ev:       # no GPU here: each built candidate is "no_gpu"
        real_eval = ev.evaluate_many

        def evaluate_many(task, sources, **kw):
            out = real_eval(task, sources, **kw)
            seen.setdefault(task.name, out)     # the task's step 0
            return out

        ev.evaluate_many = evaluate_many
        search_many(tasks, ExpertProposer, ev, HTG.from_prior(), SearchConfig(steps=1, candidates_per_step=2),
                    progress=False, time_budget_s=600)
    # no source built twice (a build the Prebuild's stop() cancelled, a guess the search did not
    # take, may be built once more where a later step proposes it)
    built = [h for h, ok, _ in compiled if ok]
    assert len(built) == len(set(built)), compiled
    assert all(e.reason == "no_gpu" for out in seen.values() for e in out)
    # the later tasks' defaults (their step 0's first candidate, whatever memory learned from the
    # first task) were built ahead: the search found them, and built nothing for them
    later = list(seen.values())[1:]
    assert len(later) == 2 and all(out[0].build_s == 0 for out in later)


def test_tasks_the_search_has_reached_are_not_built_ahead():
    go, inside, batches = threading.Event(), threading.Event(), []

    def sources_of(task):
        inside.set()
        go.wait(10)                                # the search moves on while the thread guesses t0
        return [task]

    p = Prebuild(["t0", "t1", "t2", "t3"], sources_of, lambda s, cancel=None: batches.append(s) or [])
    p.start()
    assert inside.wait(10)
    p.reached(1)
    go.set()
    p._thread.join(10)                             # the thread's own end, not stop()'s cancel
    assert batches == [["t0"], ["t2"], ["t3"]]     # t0 was in hand already; t1 is skipped
