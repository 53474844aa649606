"""The optimize pipeline: capture -> tasks -> cache -> search the misses -> swap in.

    >>> fast = torch_htam.optimize(model, (x,))          # the same object, faster
    >>> print(fast.htam_report.format())

Nothing here is allowed to break the user's model: without a GPU, a compiler, a capturable graph,
or a kernel that is both verified and faster, the region (or the whole model) stays on its original
PyTorch path and the report says why.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from torch_htam.config import OptimizeConfig
from torch_htam.deadline import Deadline
from torch_htam.report import SearchPlan

log = logging.getLogger("torch_htam")


class SearchedLog:
    """Tasks already searched on this arch without a kernel worth keeping, with the budget spent.

    NOTE: without it every optimize() call would search the losers again and a warm run would
    never be instant. A task is searched again only when the new budget is larger
    (more steps or candidates per step), since a larger budget can find what a small one missed.
    Stored as JSON beside the cache: {signature: {"steps", "candidates", "stop", "best", "date"}}.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}     # missing or corrupt: forget, the cost is one more search

    def covers(self, signature: str, cfg: OptimizeConfig, policy: str) -> bool:
        rec = self.data.get(signature)
        return (bool(rec) and rec["steps"] >= cfg.steps and rec["candidates"] >= cfg.candidates_per_step
                and rec.get("policy") == policy)   # another precision policy is another search

    def add(self, signature: str, cfg: OptimizeConfig, stop: str, best: float | None, policy: str,
            vs_inductor: float | None = None, libraries: list[str] | None = None,
            failures: dict[str, int] | None = None) -> None:
        """best / vs_inductor: the confirmed winner's speedup over eager / over Inductor's code
        for the region (None: no verified kernel, or not timed against Inductor); libraries: ours
        built when it was searched (_Run.grown); failures: its candidates that did not verify, by
        reason (SearchResult.failures)."""
        self.data[signature] = {"steps": cfg.steps, "candidates": cfg.candidates_per_step, "policy": policy,
                                "stop": stop, "best": best, "vs_inductor": vs_inductor, "libraries": libraries,
                                "failures": dict(failures or {}), "date": time.strftime("%Y-%m-%d")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def libraries(self, signature: str) -> list[str] | None:
        """Our libraries built when the task was last searched (None: not searched, or not recorded)."""
        return (self.data.get(signature) or {}).get("libraries")

    def why_not(self, signature: str, min_speedup: float) -> str | None:
        """Why a searched task has no kernel, in one line (None if it was not searched)."""
        rec = self.data.get(signature)
        if not rec:
            return None
        best, ind = rec.get("best"), rec.get("vs_inductor")
        failed = failures_words(rec.get("failures"))
        if best is None and rec.get("stop") == "refused":
            return (f"no kernel: the candidates refused the region's own inputs (HTAM_ERR_SHAPE: their "
                    f"sizes, strides or dtypes), so the search stopped{failed}")
        if best is None:
            return f"no kernel: searched, none verified ({rec.get('stop')}){failed}"
        if ind is not None and ind < min_speedup <= best:
            return f"no kernel: the best verified one lost to Inductor's code for the region ({ind:.2f}x){failed}"
        return f"no kernel: the best verified one was {best:.2f}x of eager{failed}"


def failures_words(failures: dict[str, int] | None) -> str:
    """"; 3 candidates failed (mismatch 2, build 1)" for a search's failed candidates, "" for none."""
    if not failures:
        return ""
    n = sum(failures.values())
    kinds = ", ".join(f"{r} {c}" for r, c in sorted(failures.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"; {n} candidate{'s' * (n != 1)} failed ({kinds})"


# The report's phase for confirming the search's winners (inside "search"'s time, not beside it).
CONFIRM_PHASE = "search: confirming winners"


def _confirm(evaluator, task, best, inductor: bool = False):
    """A fresh verification + timing of the search's winner, or None if it fails now. inductor:
    time the region under torch.compile too (the bar inside a compiled model).

    NOTE: the winner is the max of many noisy timings (each against its own reference timing), so
    its recorded speedup is biased upward: the winner's curse. Measured on an H100 over our task
    suite: search-best 2.80x / 1.35x re-timed at 1.13x / 0.73x. Only this independent measurement
    decides whether a kernel is cached and swapped in.
    """
    ev = evaluator.evaluate_many(task, [best.source], inductor=inductor)[0]
    return ev if ev.correct and ev.speedup else None


@dataclass
class _Keeper:
    """search_many's on_result: re-confirms a task's winner, caches it when it clears min_speedup
    and beats what this run already cached for the task, and logs a finished task without a kernel
    in the searched log. Called once per pass (search_many's cover pass hands on partial results):
    a winner already confirmed is not confirmed again, and a partial result logs nothing.

    NOTE: a kernel that beats eager but not Inductor's code for its region is cached too: the
    end-to-end guard tries it inside the compiled model, where host time per call can decide
    (_install_compiled); alone, the backend leaves it out (inductor.beats_inductor).

    NOTE: a winner whose search speedup is under min_speedup is not confirmed: a confirmation only
    lowers the search's figure (the winner's curse), so it could not be cached, and it costs a
    compile of the region (torch.compile in the worker): 3.5 s a task of ResNet-18 bf16's search,
    more than verifying and timing its four candidates (H100, optimize_time-20261127-092724).
    """
    evaluator: Any
    cache: Any
    searched: SearchedLog
    cfg: OptimizeConfig
    gpu_name: str
    save_memory: Any                                        # () -> None
    # the optimize run's Deadline.phase: a confirmation's wall time is reported as its own phase
    phase: Any = contextlib.nullcontext
    checked: dict = field(default_factory=dict)             # {signature: sources confirmed}
    confirmed: dict = field(default_factory=dict)           # {signature: best confirmed Evaluation}
    cached: set = field(default_factory=set)                # signatures cached by this run

    def __call__(self, task, result):
        """Confirm and cache as above; the task's confirmed Evaluation (None: none), whose Inductor
        time and code for the region are the bar of its later steps (search_many's on_result)."""
        from torch_htam import build
        from torch_htam.policy import policy_for
        sig, best = task.signature, result.best
        libraries = build.libraries_ready(self.cache.arch)
        if (best is not None and best.speedup >= self.cfg.min_speedup
                and best.source not in self.checked.setdefault(sig, set())):
            self.checked[sig].add(best.source)
            with self.phase(CONFIRM_PHASE):
                ev = _confirm(self.evaluator, task, best, self.cfg.compile)
            old = self.confirmed.get(sig)
            if ev is not None and (old is None or ev.speedup > old.speedup):
                self.confirmed[sig] = ev
                if ev.speedup >= self.cfg.min_speedup:
                    self.cache.put(task, best.source, ev.so_path or best.so_path, ev,
                                   {"proposer": best.origin, "tags": best.tags, "params": best.params,
                                    "steps": result.steps, "gpu": self.gpu_name,
                                    "search_speedup": best.speedup, "libraries": libraries})
                    self.cached.add(sig)
        # NOTE: a search the time budget cut is not a search done: the next run searches it again
        if (sig not in self.cached and not result.partial and not result.stop.startswith("error")
                and result.stop != "time_budget"):
            ev = self.confirmed.get(sig)
            self.searched.add(sig, self.cfg, result.stop, self.speedup(sig, result), policy_for(task).name,
                              ev.compile_speedup if ev is not None else None, libraries, result.failures)
        self.save_memory()   # experience persists task by task
        return self.confirmed.get(sig)

    def speedup(self, sig: str, result) -> float | None:
        """The task's figure: its winner's confirmed speedup, else (a winner under min_speedup is
        not confirmed) the search's own, else None."""
        ev = self.confirmed.get(sig)
        best = result.best
        return ev.speedup if ev is not None else best.speedup if best is not None else None


def _search(tasks, cfg: OptimizeConfig, gpu, cache, searched: SearchedLog, evaluator,
            budget_s: float | None, weights: dict[str, float] | None = None,
            phase=contextlib.nullcontext, incumbents: dict | None = None) -> dict:
    """Search kernels for the cache misses within budget_s; returns {signature: SearchResult}.
    Found kernels that verify and win are written to the cache as each task finishes (nothing
    lost on interruption); builds and worker jobs in flight end at the evaluator's deadline.
    incumbents: {signature: Evaluation} of kernels already cached for tasks searched again
    (_Run.grown): a new one replaces such a kernel only where it is faster."""
    from torch_htam import paths
    from torch_htam.htg import HTG
    from torch_htam.proposers.expert import ExpertProposer
    from torch_htam.search import SearchConfig, search_many

    proposer, message = ExpertProposer(), ""
    if cfg.use_llm:
        from torch_htam.proposers.fallback import make_proposer
        proposer, message = make_proposer(True, cfg.llm, proposer)
    if message:
        log.warning(message)
    memory_path = paths.memory_path(gpu.arch, proposer.name)   # kept across toolchain upgrades
    memory = HTG.load(memory_path)
    scfg = SearchConfig(steps=cfg.steps, candidates_per_step=cfg.candidates_per_step,
                        memory=cfg.memory, max_wall_s=cfg.task_time_s, prebuild=cfg.prebuild)
    traj = Path(cfg.trajectory_dir) if cfg.trajectory_dir else paths.arch_dir(gpu.arch) / "trajectories"

    keep = _Keeper(evaluator, cache, searched, cfg, gpu.name, lambda: memory.save(memory_path), phase,
                   confirmed=dict(incumbents or {}))
    return search_many(tasks, lambda: proposer, evaluator, memory, scfg, trajectory_dir=traj,
                       progress=cfg.progress, time_budget_s=budget_s, on_result=keep, weights=weights,
                       later=_awaits_library)


def _awaits_library(task) -> bool:
    """Whether a library of ours that the task's expert candidates link is still building (the
    search then reaches the task after the others)."""
    from torch_htam import build
    building = set(build.libraries_building())
    if not building:
        return False
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import ExpertProposer
    return bool(building & set(ExpertProposer().libraries_for(task, policy_for(task))))


def _provenance(entry) -> dict:
    """A cache entry's provenance ({} for none)."""
    return (entry.record.get("provenance") or {}) if entry is not None else {}


def _start_libraries(tasks) -> None:
    """The builds of our libraries that these tasks' expert candidates link, started in the
    background now (ExpertProposer.prepare), not when the search first proposes for one of them."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import ExpertProposer
    ExpertProposer().prepare(tasks, policy_for)


def optimize(model: nn.Module, example_inputs: tuple, config: OptimizeConfig | None = None) -> nn.Module:
    """Swap verified, faster CUDA kernels into `model` and return it (the same object).

    With config.compile (the default) the model ends on the fastest of what worked: torch.compile
    of it (the floor, compiled first), Inductor on our re-exported graph, torch.compile with our
    kernels, the replay, the original forward (decide.py). Nothing inside torch_htam can leave it
    slower than torch.compile: a failure anywhere (capture, search, a trial, a kernel at run
    time) drops that piece and the report says what happened; only where torch.compile itself
    fails does the original forward stay. `time_budget_s` bounds the whole call. Kernels found
    before a failure stay cached.

    >>> model = torch_htam.optimize(model, (torch.randn(8, 512, 768, device="cuda"),))
    >>> model.htam_report.outcome, model.htam_report.speedups()
    """
    from torch_htam.timing import GradMode
    cfg = config or OptimizeConfig()
    run = _Run(model, tuple(example_inputs), cfg, Deadline(cfg.time_budget_s), GradMode.current())
    return run.go()


# The most of the time left after capture and the floor that is kept from the search for the
# decision's trials (compiles and timings).
RESERVE_SHARE = 0.4
# The least search time worth keeping one kernel trial's time back for (reserve_s).
MIN_SEARCH_S = 20.0
# Timing the tasks' references for the search's weights: at most this share of the time left, and
# at most WEIGHING_MAX_S seconds (a few ms a task: tens of tasks in a second or two).
WEIGHING_SHARE = 0.05
WEIGHING_MAX_S = 10.0
# Waiting for a library of ours still building in the background when the search starts (its build
# begins after capture, beside torch.compile of the floor): at most this share of the search's time
# and LIBRARY_WAIT_MAX_S. NOTE: CUTLASS's conv library builds in 60-84 s (H200 host, the 2-core
# CI machine); a ResNet's tasks are nearly all its convs, and searched without it (budget 150 s)
# ResNet-18 bf16 kept cuDNN's fused graphs plus a batch-norm fold launch a site (arm_profile-
# 20261130-053237): the one-launch kernels it was built for never ran.
LIBRARY_WAIT_SHARE = 0.3
LIBRARY_WAIT_MAX_S = 90.0


@dataclass
class _Run:
    """One optimize() call: what it found, searched and decided, phase by phase (see optimize)."""
    model: nn.Module
    inputs: tuple
    cfg: OptimizeConfig
    deadline: Deadline
    grad: Any
    found: Any = None
    kernels: dict = field(default_factory=dict)      # {signature: usable cache entry}
    results: dict = field(default_factory=dict)      # {signature: SearchResult}
    searched: SearchedLog | None = None
    notes: list[str] = field(default_factory=list)
    trials: Any = None
    gpu: Any = None                                  # GpuInfo, None: no search
    cache: Any = None                                # KernelCache of the GPU's arch
    misses: list = field(default_factory=list)       # tasks to search: no usable kernel, or grown
    unswappable: dict = field(default_factory=dict)  # {signature: why no kernel could be swapped in}
    incumbents: dict = field(default_factory=dict)   # {signature: Evaluation} of misses' cached kernels
    evaluator: Any = None                            # started by prepare() where GPU work is ahead
    weights: dict | None = None                      # {signature: headroom ms}, the search's order
    plan: SearchPlan | None = None                   # where a timed search ran

    def go(self) -> nn.Module:
        from torch_htam import attach, decide
        attach.detach(self.model)   # NOTE: optimizing an optimized model starts from its original forward
        self.trials = decide.Trials(self.model, self.inputs, self.cfg, self.grad, self.deadline)
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.trials.limits())
            self.capture()
            try:
                self.look()
            except Exception as e:  # noqa: BLE001 -- no search; the report says what failed
                self.gpu = None
                self.failed("the search", e)
            self.floor()
            with contextlib.ExitStack() as workers:   # the evaluator's GPU workers, for the search only
                try:
                    self.prepare(workers)
                    self.search()
                except Exception as e:  # noqa: BLE001 -- the floor stays; the report says what failed
                    self.failed("the search", e)
            try:
                d = self.trials.finish(self.found, self.kernels, *self.ranked())
            except Exception as e:  # noqa: BLE001
                self.failed("the decision", e)
                d = self.fallback()
        try:
            with self.deadline.phase("settle"):
                d = self.trials.settle(d)
        except Exception as e:  # noqa: BLE001 -- its dropped frames compile again on the next call
            self.failed("re-warming the chosen arm", e)
        return self.install(d)

    def fallback(self):
        """The floor where it works, else the original forward, untimed: what stays when the
        decision itself fails."""
        from torch_htam import decide
        floor = self.trials.arms[0]
        if not floor.error:
            floor.call = self.trials.floor_call()
            return self.trials.done(floor, decide.Outcome.NOT_TIMED, f"{floor.name}: the decision failed")
        return self.trials.done(self.trials.arm(decide.ArmKind.ORIGINAL), decide.Outcome.COMPILE_FAILED,
                                f"torch.compile failed on this model ({floor.error})")

    def capture(self) -> None:
        from torch_htam.capture import marked
        from torch_htam.config import ConfigError
        from torch_htam.extract import extract
        with self.deadline.phase("capture"):
            try:
                self.found = extract(self.model, self.inputs, dynamic=self.cfg.dynamic)
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001
                self.failed("capture", e)
                return
        if not self.found.capture.graphs:
            self.notes.append("could not capture the model: " + "; ".join(self.found.problems))
            self.found = None
        elif self.found.capture.dynamic:
            # every arm's first call compiles with the declared dims dynamic, as the capture did,
            # so the compiled model serves their ranges without a recompile per size; the example's
            # own sizes get torch.compile's graph for them too (serving.ExampleSplit)
            self.trials.inputs = marked(self.inputs, self.found.capture.dynamic)
            self.trials.plain = tuple(self.inputs)
        if self.found is not None and (note := _inference_note(self.inputs, self.grad, self.cfg.dynamic)):
            log.warning("torch_htam: %s", note)
            self.notes.append(note)

    def floor(self) -> None:
        """torch.compile (or, with compile=False, the original forward), compiled and installed
        before anything else runs: what the model keeps if nothing after it works."""
        from torch_htam import attach, runtime
        from torch_htam.decide import ArmKind
        floor = self.trials.start()
        if floor.kind is ArmKind.COMPILE and not floor.error:   # the original forward needs no install
            attach.compiled(self.model, self.trials.floor_call(), runtime.Report(note="the floor, while optimize runs"),
                            floor.backend)
            if self.found is not None:
                self.trials.time_first_call(self.found)

    def look(self) -> None:
        """What the search will face, known right after capture: the GPU, the cache (with the
        kernels torch_htam ships) and the tasks it misses."""
        from torch_htam import gpu as gpu_mod
        from torch_htam import paths
        from torch_htam.cache import KernelCache
        from torch_htam.policy import admitted, policy_for
        from torch_htam.shipped_kernels import install_shipped
        self.gpu = gpu_mod.detect()
        if self.gpu is None:
            self.notes.append("no CUDA GPU: no kernel search")
            return
        if self.found is None:
            return
        off_gpu = _off_gpu_tensors(self.model, self.inputs)
        if off_gpu:
            self.notes.append(f"{off_gpu} is on the CPU: torch_htam's kernels run on a CUDA device; move "
                              "the model and the example inputs there first (model.cuda(), x.cuda())")
            self.gpu = None
            return
        tasks = self.found.tasks
        self.cache = KernelCache(self.gpu.arch)
        with self.deadline.phase("shipped kernels"):
            install_shipped(self.cache, self.gpu.arch, only={t.signature for t in tasks})
        self.searched = SearchedLog(paths.arch_dir(self.gpu.arch) / "searched.json")
        from torch_htam import build
        ready = set(build.libraries_ready(self.gpu.arch))
        from torch_htam.launcher import unallocatable
        self.misses, self.incumbents = [], {}
        for t in tasks:
            why = unallocatable(t.outputs)
            if why:   # NOTE: a search there only spends the budget (MLP-Mixer's linear + transpose)
                self.unswappable[t.signature] = why
                continue
            entry = admitted(self.cache.get(t.signature), t)
            done = entry is not None or self.searched.covers(t.signature, self.cfg, policy_for(t).name)
            if done and not self.grown(t, entry, ready):
                continue
            self.misses.append(t)
            if entry is not None:
                self.incumbents[t.signature] = entry.evaluation
        if self.cfg.max_tasks is not None:
            self.misses = self.misses[: self.cfg.max_tasks]
        if self.cfg.search and self.misses:
            _start_libraries(self.misses)

    def prepare(self, stack: contextlib.ExitStack) -> None:
        """After the floor: where there is GPU work ahead (a miss to search, a cached kernel not yet
        timed against Inductor), one evaluator for all of it, its GPU workers started now, in the
        background, while the misses are weighed here. NOTE: started before the floor instead,
        their start-up (the launcher's first build on a new machine) saved the first task 9-14 s
        but slowed a Swin-T's torch.compile from 28.5 to 34.7-37.5 s (H100,
        optimize_time-20261127-015725 / -020344 / -021534), which the decision takes as what each
        trial's compile costs: it then had no time left to try the kernel the search found."""
        from torch_htam import inductor
        from torch_htam.evaluation import Evaluator
        if self.gpu is None or self.found is None:
            return
        if self.trials.wrapper_offered():   # its header and vector ISA, found while the search runs
            inductor.warm_cpp_wrapper()
            inductor.warm_vec_isa()
        untimed = self.cfg.compile and any(_untimed(self.cache.get(t.signature)) for t in self.found.tasks)
        if (self.cfg.search and self.misses) or untimed:
            self.evaluator = stack.enter_context(Evaluator(deadline=self.deadline)).start()
        if self.cfg.search and self.misses:
            self.weights = self.headroom()

    def headroom(self) -> dict[str, float]:
        """The misses' weights for the search's order and shares (search.headroom_weights): their
        references timed here, on the GPU, for at most WEIGHING_SHARE of the budget (10 s
        without one), while the workers start."""
        import torch
        from torch_htam.plan import time_reference
        from torch_htam.search import headroom_weights
        left = self.deadline.remaining()
        max_s = WEIGHING_MAX_S if left is None else min(WEIGHING_MAX_S, WEIGHING_SHARE * left)
        with self.deadline.phase("weighing tasks"), torch.no_grad():
            return headroom_weights(self.misses, self.gpu, lambda t: time_reference(t, "cuda", iters=10), max_s)

    def search(self) -> None:
        from torch_htam.policy import why_not
        if self.gpu is None or self.found is None:
            return
        tasks, misses = self.found.tasks, self.misses
        if self.cfg.search and misses:
            self.wait_for_libraries(self.deadline.left(self.reserve_s(len(tasks))))
        reserve = self.reserve_s(len(tasks))
        budget = self.deadline.left(reserve)
        if budget is not None and self.cfg.search and misses:
            self.plan = SearchPlan(max(self.deadline.remaining(), 0.0), reserve, budget, len(misses))
        if self.cfg.search and misses:
            if budget is not None and budget <= 0:
                self.deadline.skip(f"the search of {len(misses)} task(s): the time budget went to "
                                   "capture and torch.compile")
            else:
                # NOTE: the search's own deadline ends its builds and worker jobs in flight where
                # the decision's reserve begins: a step started near the end once ran on past it
                # and left the decision no time to try what the search found
                until = Deadline(budget) if budget is not None else self.deadline
                with self.deadline.phase("search"), _examples(self.found, misses), self.evaluator.until(until):
                    self.results = _search(misses, self.cfg, self.gpu, self.cache, self.searched,
                                           self.evaluator, budget, self.weights, self.deadline.phase,
                                           self.incumbents)
        self.kernels = {t.signature: e for t in tasks
                        if why_not(e := self.cache.get(t.signature), t, self.cfg.min_speedup) is None}
        if self.cfg.compile and self.kernels:
            with self.deadline.phase("inductor times"):
                self.kernels = _with_inductor_times(tasks, self.kernels, self.cache, self.evaluator,
                                                    self.deadline, self.reserve_s(len(self.kernels)))

    def grown(self, task, entry, ready: set[str]) -> bool:
        """Whether a library of ours that the task's expert candidates link is built now and was
        not when the task was last searched (its cached kernel's record and the searched log say
        which were; neither saying: not grown). NOTE: a task searched while CUTLASS's conv library
        was still building keeps the cuDNN kernel it found, and a cached kernel is otherwise never
        searched again: a first optimize at a small budget would fix a model's convs without it."""
        recorded = [set(libs) for libs in (_provenance(entry).get("libraries"), self.searched.libraries(task.signature))
                    if libs is not None]
        new = ready - set().union(*recorded) if recorded else set()
        if not new:
            return False
        from torch_htam.policy import policy_for
        from torch_htam.proposers.expert import ExpertProposer
        return bool(new & set(ExpertProposer().libraries_for(task, policy_for(task))))

    def wait_for_libraries(self, search_s: float | None) -> None:
        """Let the libraries of ours still building (_start_libraries) finish before the search,
        for at most LIBRARY_WAIT_SHARE of its time and LIBRARY_WAIT_MAX_S: a task searched before
        its library is there gets the expert's other defaults, and keeps them once cached."""
        from torch_htam import build
        building = build.libraries_building()
        if not building:
            return
        max_s = LIBRARY_WAIT_MAX_S if search_s is None else min(LIBRARY_WAIT_MAX_S, LIBRARY_WAIT_SHARE * search_s)
        if self.cfg.progress:
            print(f"[htam] waiting up to {max_s:.0f} s for the {', '.join(building)} library's build (once per "
                  "machine; `torch-htam libraries build` does it ahead)", file=sys.stderr, flush=True)
        with self.deadline.phase("libraries"):
            left = build.wait_for_libraries(max_s)
        if left:
            self.notes.append(f"the search began before the {', '.join(left)} library was built: the tasks "
                              "searched first have none of its kernels (`torch-htam libraries build` builds "
                              "it once for this machine)")

    def reserve_s(self, n_tasks: int) -> float:
        """Seconds kept from the search for the decision: what its trials are expected to take
        (decide.Trials.reserve_s), but at most RESERVE_SHARE of the time left, so that a small
        budget still searches (the decision skips the trials that no longer fit, and says so) --
        and at least one kernel trial (decide.Trials.first_trial_s) where that still leaves the
        search MIN_SEARCH_S. NOTE: a model whose torch.compile takes a third of the budget (a
        Swin-T: 28-37 s of 90) otherwise finds a kernel and has no time to try it. The C++
        wrapper's arm, where offered (decide.Trials.wrapper_s) and where it fits in the time left
        at all, is kept whatever the search is left: on a host-bound model it is worth more than
        the search (where it cannot fit, the search keeps the time: the decision would not build it).
        The wrapper's wait for this process's vector-ISA look is kept only where the search would
        end before the look does (decide.Trials.isa_wait_s): the look runs while the search does."""
        left = self.deadline.remaining()
        if left is None:
            return self.trials.reserve_s(n_tasks)
        left = max(left, 0.0)
        overlapped = self._reserve(left, n_tasks, ahead_s=left)
        if left - overlapped >= self.trials.isa_wait_s():
            return overlapped
        return self._reserve(left, n_tasks, ahead_s=0.0)

    def _reserve(self, left: float, n_tasks: int, ahead_s: float) -> float:
        """reserve_s for `left` seconds, the wrapper's compile expected ahead_s seconds from now."""
        want = self.trials.reserve_s(n_tasks, ahead_s)
        wrapper = self.trials.wrapper_s(ahead_s)
        wrapper = wrapper if wrapper <= left else 0.0
        first = self.trials.first_trial_s(ahead_s) if n_tasks else wrapper
        floor = first if left - first >= MIN_SEARCH_S else wrapper
        return max(wrapper, min(want, max(RESERVE_SHARE * left, floor)))

    def ranked(self) -> tuple[list[str], list[str]]:
        """(the kernels that beat Inductor's code for their region, every kernel), each by
        estimated saving (count x reference ms x (1 - 1/speedup)), the largest first."""
        from torch_htam.policy import why_not
        saving = {s: _saving_ms(e, _count(self.found, s)) for s, e in self.kernels.items()}
        every = sorted(self.kernels, key=lambda s: -saving[s])
        beat = [s for s in every if why_not(self.kernels[s], None, self.cfg.min_speedup, against_inductor=True) is None]
        return (beat, every) if self.cfg.compile else (every, every)

    def failed(self, what: str, e: Exception) -> None:
        log.warning("torch_htam: %s failed; the model keeps the fastest path that worked", what, exc_info=True)
        self.notes.append(f"{what} failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                          "please report this")

    def install(self, d) -> nn.Module:
        from torch_htam import decide
        model = decide.install(self.model, d, self.found, self.kernels, self.ranked()[0], self.notes)
        report = model.htam_report
        report.phases, report.skipped = dict(self.deadline.phases), list(self.deadline.skipped)
        report.search_plan = self.plan
        report.overran = list(self.deadline.overran)
        return _finish(model, self.deadline, self.results, self.searched, self.cfg, self.unswappable)


def _inference_note(example_inputs: tuple, grad, dynamic: dict | None) -> str | None:
    """What to do where optimize runs under inference_mode on example inputs that are not
    inference tensors (None elsewhere). NOTE: Dynamo guards on whether an input is an inference
    tensor: requests made inside inference_mode then compile the model again on their first call,
    and with declared dynamic sizes that graph is dynamic without their ranges, so it gets no
    kernel of ours (seen on an H200)."""
    import torch
    from torch.utils import _pytree as pytree
    from torch_htam.timing import GradMode
    if grad is not GradMode.INFERENCE:
        return None
    plain = next((i for i, x in enumerate(pytree.tree_leaves(tuple(example_inputs)))
                  if isinstance(x, torch.Tensor) and not x.is_inference()), None)
    if plain is None:
        return None
    lost = ", and that graph gets none of our kernels (its sizes lose their declared ranges)" if dynamic else ""
    return (f"example input {plain} is no inference tensor (made outside torch.inference_mode()), while "
            f"optimize runs under inference_mode: requests made inside inference_mode compile the model "
            f"again on their first call{lost}; make the example inputs as the requests will be made")


def _off_gpu_tensors(model: nn.Module, example_inputs: tuple) -> str | None:
    """What is not on a CUDA device ("example input 0", "parameter 'fc.weight'"), or None."""
    import torch
    from torch.utils import _pytree as pytree
    for i, x in enumerate(pytree.tree_leaves(tuple(example_inputs))):
        if isinstance(x, torch.Tensor) and not x.is_cuda:
            return f"example input {i}"
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if not t.is_cuda:
            return f"{'parameter' if isinstance(t, nn.Parameter) else 'buffer'} {name!r}"
    return None


def _finish(model: nn.Module, deadline: Deadline, results: dict, searched: SearchedLog | None,
            cfg: OptimizeConfig, unswappable: dict | None = None) -> nn.Module:
    """The report's totals, and for each task without a kernel why, from its search (e.g. the
    best verified kernel lost to Inductor's code for the region, and by how much, or the time
    budget ran out first), or why it was not searched (unswappable: {signature: why})."""
    from torch_htam.runtime import TaskStatus
    report = model.htam_report
    report.optimize_s = deadline.elapsed()
    report.usage = _total_usage(results.values())
    for t in report.tasks:
        rec = searched.data.get(t.signature) if searched is not None else None
        res = results.get(t.signature)
        if t.status is not TaskStatus.NO_KERNEL:
            continue
        if t.signature in (unswappable or {}):
            t.detail = f"not searched: {unswappable[t.signature]}"
        elif rec:
            t.detail = searched.why_not(t.signature, cfg.min_speedup)
            t.speedup, t.vs_inductor = rec.get("best"), rec.get("vs_inductor")
        elif res is not None and res.stop == "time_budget":
            more = "a larger OptimizeConfig.time_budget_s (--time-budget) searches it further"
            if res.best is None:
                t.detail = (f"the time budget ({cfg.time_budget_s:g} s) ran out before its search found one; "
                            f"{more}{failures_words(res.failures)}")
            else:    # its first steps found only kernels below min_speedup
                t.speedup = res.best.speedup
                t.detail = (f"the best verified one was {res.best.speedup:.2f}x of eager when the time "
                            f"budget ({cfg.time_budget_s:g} s) stopped its search; {more}"
                            + failures_words(res.failures))
    return model


@contextlib.contextmanager
def _examples(found, tasks: list):
    """Each task's real inputs from the example call, in a temp safetensors file that
    verification reads (Task.example), removed when the search ends."""
    from safetensors.torch import save_file
    with tempfile.TemporaryDirectory(prefix="htam-examples-") as d:
        for t in tasks:
            values = found.values.get(t.signature)
            if values:
                path = Path(d) / f"{t.signature}.safetensors"
                save_file({f"in{i}": v.detach().contiguous().cpu() for i, v in enumerate(values)}, str(path))
                t.example = str(path)
        try:
            yield
        finally:
            for t in tasks:
                t.example = None


def _total_usage(results) -> dict[str, float]:
    """Sum of the searches' LLM usage (SearchResult.usage: tokens, cost_usd, requests, ...)."""
    from torch_htam.search import add_usage
    total: dict[str, float] = {}
    for r in results:
        add_usage(total, r.usage)
    return total


def _untimed(entry) -> bool:
    """A cached kernel not yet timed against Inductor's code for its region (_with_inductor_times)."""
    return entry is not None and entry.evaluation.compile_speedup is None


def _with_inductor_times(tasks: list, kernels: dict, cache, evaluator, deadline: Deadline,
                         reserve_s: float) -> dict:
    """The kernels, each with its region's time under torch.compile in its record: those cached
    without it (found by a replay-mode search, shipped with torch_htam) are verified and timed
    against it now, once, and cached again with both figures, as far as the time budget (less
    reserve_s for the decision) allows; the rest keep no Inductor time (they are tried only
    with every kernel together).

    NOTE: on an H100, GPT-2 bf16's lm_head kernel (1.07x over eager, timed without Inductor) ran
    3.1 ms a call inside the compiled model, where Inductor's own GEMM (it pads the 50257-wide
    weight) took 0.45 ms: the compiled model went from 3.42 to 5.78 ms with that kernel alone
    (bench/bench_swaps.py; bench/results/bench_swaps-*.json). The bar inside a compiled model is
    Inductor's code for the region, not eager's.
    """
    from torch_htam.evaluation import INDUCTOR_COMPILE_S
    todo = [t for t in tasks if _untimed(kernels.get(t.signature))]
    if not todo:
        return kernels
    out = dict(kernels)
    with evaluator.until(deadline):
        for i, t in enumerate(todo):
            if not deadline.allows(min(INDUCTOR_COMPILE_S, 30.0), reserve_s):
                deadline.skip(f"timing {len(todo) - i} kernel(s) against Inductor's code: no time left")
                break
            entry = out[t.signature]
            ev = evaluator.evaluate_many(t, [entry.source], inductor=True)[0]
            if not (ev.correct and ev.speedup):
                log.warning("torch_htam: kernel %s (%s) failed again when timed against Inductor: "
                            "%s; not used", t.signature[:12], t.name, ev.reason)
                out.pop(t.signature)
                continue
            kept = {k: v for k, v in entry.record.get("provenance", {}).items()
                    if k not in ("torch_htam", "date", "arch", "toolchain")}   # make_record's own
            meta = {**kept, "tags": entry.record.get("tags"), "params": entry.record.get("params")}
            out[t.signature] = cache.put(t, entry.source, ev.so_path or entry.so_path, ev, meta)
    return out


def _count(found, signature: str) -> int:
    return next((t.count for t in found.tasks if t.signature == signature), 1)


def _saving_ms(entry, count: int) -> float:
    ev = entry.evaluation
    ref, sp = ev.ref_ms or 0.0, ev.speedup or 1.0
    return count * ref * (1.0 - 1.0 / sp)


def _swapped(model) -> set[str]:
    from torch_htam.runtime import TaskStatus
    return {t.signature for t in model.htam_report.tasks if t.status is TaskStatus.SWAPPED}


def precompile(model: nn.Module, example_inputs: tuple, out_dir: str | Path,
               config: OptimizeConfig | None = None, arch: str | None = None) -> Path:
    """Optimize (filling the cache), then write a self-contained bundle for this GPU arch.

    arch: bundle the kernels already cached for that arch (e.g. "sm_90a"), with no search: how a
    machine without a GPU (a CI box) writes a bundle. Without a GPU and without arch, $HTAM_ARCH
    stands for it; with neither, a RuntimeError says so. Where the optimized model is torch.compile
    with no kernel of ours (none beat Inductor), the bundle carries Inductor's code alone. Raises
    errors.EmptyBundleError when there is nothing to bundle (no bundle is written then).

    >>> torch_htam.precompile(model, (x,), "bundle/")   # later: torch_htam.load(model, "bundle/", (x,))
    >>> torch_htam.precompile(model, (x,), "bundle/", arch="sm_90a")   # no GPU here
    """
    from torch_htam import attach, inductor, runtime
    from torch_htam.bundle import _gpu_arch, bundle_arch, run_of, with_dynamic, with_dynamic_of
    from torch_htam.bundle import precompile as write_bundle
    cfg = config or OptimizeConfig()
    if arch is not None or _gpu_arch() is None:
        # NOTE: searching needs a GPU of the target arch, so this bundles what the cache already
        # holds for it, every usable kernel: optimize's end-to-end check (which kernels make the
        # whole model faster) needs that GPU too, and load's golden check still runs on the server.
        runtime.restore(model)
        # the example's own sizes on plain torch.compile's graph for them, as torch.compile serves them
        return write_bundle(model, example_inputs, out_dir, arch=bundle_arch(arch),
                            run=with_dynamic({"compile": True, "mode": cfg.mode}, cfg.dynamic, {}))
    optimize(model, example_inputs, cfg)
    # Only what the optimized model really uses: a kernel that won alone but that the end-to-end
    # guard turned down stays out, so load() never swaps in what optimize() rejected.
    used, run = _swapped(model), run_of(model)
    if run["compile"]:   # the replay serves the example's sizes only
        run = with_dynamic_of(run, cfg.dynamic, model)
    # Inductor's code for the compiled model (optimize compiled it and called it once), so that a
    # server on the same stack loads it instead of compiling on its first call.
    code = inductor.save_artifacts() if run["compile"] else None
    # NOTE: the bundle lists the tasks of the ORIGINAL graph; captured through the swapped
    # forward, the swapped regions would be launcher calls and their kernels left out. The
    # optimized model is put back as it was after (attach.suspended), not optimized a second time.
    with attach.suspended(model):
        return write_bundle(model, example_inputs, out_dir, only=used, run=run, inductor_code=code)
