"""The optimize pipeline: capture -> tasks -> cache -> search the misses -> swap in.

    >>> fast = torch_htam.optimize(model, (x,))          # the same object, faster
    >>> print(fast.htam_report.format())

Nothing here is allowed to break the user's model: without a GPU, a compiler, a capturable graph,
or a kernel that is both verified and faster, the region (or the whole model) stays on its original
PyTorch path and the report says why.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

log = logging.getLogger("torch_htam")


@dataclass
class OptimizeConfig:
    """What optimize may spend and use.

    steps / candidates_per_step: HTAM evolution budget per task: step 0 plus `steps` steps of up to
    `candidates_per_step` kernels. The default, 16 candidates, is where the HTG's anytime curve
    reached the oracle of the expert's search space on bench/tasks (bench/anytime.py, H100: geomean
    100% of the oracle with warm memory, 99.7% cold; bench/results/anytime-20261123-202559.json).
    min_speedup: a verified kernel is swapped in only if it beats the original region by this
    factor; below it the gain is inside timing noise and not worth a custom op.
    check_end_to_end: time ours against the alternative on the example inputs and keep only the
    kernels that make the whole model faster (per-region wins need not add up).
    compile: the model runs under torch.compile with our kernels inside Inductor's graph (the
    alternative then is torch.compile of the model in the same mode); with check_end_to_end, the
    replay below replaces it where that is faster beyond noise. False replays the captured graph
    op by op with the kernels swapped in (the alternative: the original forward).
    mode: torch.compile's mode for compile=True ("default", "reduce-overhead", ...).
    time_budget_s: wall time for the whole search (None = steps bound it).
    """
    steps: int = 3
    candidates_per_step: int = 4
    memory: str = "htg"                # "htg" | "flat" | "none" (ablation switch)
    use_llm: bool = False
    llm: Any = None                    # proposers.llm.LLMConfig; None = from the environment
    search: bool = True                # False: cached kernels only
    max_tasks: int | None = None       # search only the N costliest tasks
    time_budget_s: float | None = None
    task_time_s: float | None = 300.0  # per-task wall limit
    min_speedup: float = 1.03
    progress: bool = True
    check_end_to_end: bool = True      # keep the swap only if the whole model got faster
    compile: bool = True               # kernels inside torch.compile (else: graph replay)
    mode: str = "default"              # torch.compile mode when compile=True
    trajectory_dir: str | None = None  # default: <arch cache dir>/trajectories
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        # A config mistake is the caller's: say so at once, before any capture or search.
        if self.memory not in ("htg", "flat", "none"):
            raise ValueError(f"OptimizeConfig.memory={self.memory!r}: use 'htg', 'flat' or 'none'")
        if self.steps < 0 or self.candidates_per_step < 1:
            raise ValueError("OptimizeConfig needs steps >= 0 and candidates_per_step >= 1")
        from torch_htam.inductor import MODES
        if self.mode not in MODES:
            raise ValueError(f"OptimizeConfig.mode={self.mode!r}: use one of {', '.join(MODES)}")
        if self.min_speedup < 1.0:
            raise ValueError(f"OptimizeConfig.min_speedup={self.min_speedup}: below 1.0 would swap "
                             "in kernels slower than the original")


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
            vs_inductor: float | None = None) -> None:
        """best / vs_inductor: the confirmed winner's speedup over eager / over Inductor's code
        for the region (None: no verified kernel, or not timed against Inductor)."""
        self.data[signature] = {"steps": cfg.steps, "candidates": cfg.candidates_per_step, "policy": policy,
                                "stop": stop, "best": best, "vs_inductor": vs_inductor,
                                "date": time.strftime("%Y-%m-%d")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def why_not(self, signature: str, min_speedup: float) -> str | None:
        """Why a searched task has no kernel, in one line (None if it was not searched)."""
        rec = self.data.get(signature)
        if not rec:
            return None
        best, ind = rec.get("best"), rec.get("vs_inductor")
        if best is None:
            return f"no kernel: searched, none verified ({rec.get('stop')})"
        if ind is not None and ind < min_speedup <= best:
            return f"no kernel: the best verified one lost to Inductor's code for the region ({ind:.2f}x)"
        return f"no kernel: the best verified one was {best:.2f}x of eager"


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
    """
    evaluator: Any
    cache: Any
    searched: SearchedLog
    cfg: OptimizeConfig
    gpu_name: str
    save_memory: Any                                        # () -> None
    checked: dict = field(default_factory=dict)             # {signature: sources confirmed}
    confirmed: dict = field(default_factory=dict)           # {signature: best confirmed Evaluation}
    cached: set = field(default_factory=set)                # signatures cached by this run

    def __call__(self, task, result) -> None:
        from torch_htam.policy import policy_for
        sig, best = task.signature, result.best
        if best is not None and best.source not in self.checked.setdefault(sig, set()):
            self.checked[sig].add(best.source)
            ev = _confirm(self.evaluator, task, best, self.cfg.compile)
            old = self.confirmed.get(sig)
            if ev is not None and (old is None or ev.speedup > old.speedup):
                self.confirmed[sig] = ev
                if ev.speedup >= self.cfg.min_speedup:
                    self.cache.put(task, best.source, ev.so_path or best.so_path, ev,
                                   {"proposer": best.origin, "tags": best.tags, "params": best.params,
                                    "steps": result.steps, "gpu": self.gpu_name,
                                    "search_speedup": best.speedup})
                    self.cached.add(sig)
        if sig not in self.cached and not result.partial and not result.stop.startswith("error"):
            ev = self.confirmed.get(sig)
            self.searched.add(sig, self.cfg, result.stop, ev.speedup if ev is not None else None,
                              policy_for(task).name, ev.compile_speedup if ev is not None else None)
        self.save_memory()   # experience persists task by task


def _search(tasks, cfg: OptimizeConfig, gpu, cache, searched: SearchedLog) -> dict:
    """Search kernels for the cache misses; returns {signature: SearchResult}. Found kernels that
    verify and win are written to the cache as each task finishes (nothing lost on interruption)."""
    from torch_htam import paths
    from torch_htam.evaluation import Evaluator
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
                        memory=cfg.memory, max_wall_s=cfg.task_time_s)
    traj = Path(cfg.trajectory_dir) if cfg.trajectory_dir else paths.arch_dir(gpu.arch) / "trajectories"

    with Evaluator() as evaluator:
        keep = _Keeper(evaluator, cache, searched, cfg, gpu.name, lambda: memory.save(memory_path))
        return search_many(tasks, lambda: proposer, evaluator, memory, scfg, trajectory_dir=traj,
                           progress=cfg.progress, time_budget_s=cfg.time_budget_s, on_result=keep)


def optimize(model: nn.Module, example_inputs: tuple, config: OptimizeConfig | None = None) -> nn.Module:
    """Swap verified, faster CUDA kernels into `model` and return it (the same object).

    Never leaves the model broken: on any failure inside torch_htam the model keeps its original
    forward and `model.htam_report.note` says what went wrong (the traceback goes to the
    "torch_htam" logger). Kernels found before a failure stay cached.

    >>> model = torch_htam.optimize(model, (torch.randn(8, 512, 768, device="cuda"),))
    >>> model.htam_report.speedups()
    """
    from torch_htam import runtime
    cfg = config or OptimizeConfig()
    try:
        return _optimize(model, example_inputs, cfg)
    except Exception as e:
        log.warning("torch_htam.optimize failed; the model keeps its original path", exc_info=True)
        return runtime.leave(model, f"torch_htam failed ({type(e).__name__}: {e}); the original "
                             "path is kept and found kernels stay cached - please report this")


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


def _optimize(model: nn.Module, example_inputs: tuple, cfg: OptimizeConfig) -> nn.Module:
    from torch_htam import gpu as gpu_mod
    from torch_htam import paths, runtime
    from torch_htam.cache import KernelCache
    from torch_htam.extract import extract
    from torch_htam.policy import admitted, policy_for
    from torch_htam.shipped_kernels import install_shipped

    t0 = time.perf_counter()
    gpu = gpu_mod.detect()
    if gpu is None:
        return runtime.leave(model, "no CUDA GPU: the model stays on its original PyTorch path")
    off_gpu = _off_gpu_tensors(model, example_inputs)
    if off_gpu:
        return runtime.leave(model, f"{off_gpu} is on the CPU: torch_htam's kernels run on a CUDA "
                                    "device; move the model and the example inputs there first "
                                    "(model.cuda(), x.cuda())")
    # NOTE: optimizing an optimized model starts from its original forward: captured through the
    # swapped one, its regions would be launcher calls that match no task.
    runtime.restore(model)
    found = extract(model, tuple(example_inputs))
    if not found.capture.graphs:
        return runtime.leave(model, "could not capture the model: " + "; ".join(found.problems))
    tasks = found.tasks
    cache = KernelCache(gpu.arch)
    install_shipped(cache, gpu.arch)
    searched = SearchedLog(paths.arch_dir(gpu.arch) / "searched.json")
    misses = [t for t in tasks if admitted(cache.get(t.signature), t) is None
              and not searched.covers(t.signature, cfg, policy_for(t).name)]
    if cfg.max_tasks is not None:
        misses = misses[: cfg.max_tasks]
    results = {}
    if cfg.search and misses:
        with _examples(found, misses):
            results = _search(misses, cfg, gpu, cache, searched)
    kernels = {t.signature: e for t in tasks
               if (e := admitted(cache.get(t.signature), t)) is not None and e.usable(cfg.min_speedup)}
    # NOTE: Dynamo captures (graph breaks, outputs export cannot flatten) take this path too:
    # torch.compile handles the breaks and the backend swaps kernels into each piece.
    if cfg.compile:
        try:
            kernels = _with_inductor_times(tasks, kernels, cache, cfg)
            model = _install_compiled(model, found, kernels, tuple(example_inputs), cfg)
            if cfg.check_end_to_end:
                model = _fastest_path(model, found, kernels, tuple(example_inputs), cfg)
            return _finish(model, t0, results, searched, cfg)
        except Exception as e:  # noqa: BLE001 -- Inductor could not take it: the replay path
            log.warning("torch_htam: torch.compile with the kernels failed (%s: %s); replaying the "
                        "captured graph instead", type(e).__name__, e, exc_info=True)
            runtime.restore(model)
    try:
        model = runtime.install(model, found, kernels, min_speedup=cfg.min_speedup)
    except Exception as e:   # NOTE: never leave the user's model broken; kernels stay cached
        log.debug("install failed", exc_info=True)
        return runtime.leave(model, f"could not install the kernels ({type(e).__name__}: {e}); "
                             "the original path is kept - please report this", tasks)
    if model.htam_report.swapped and cfg.check_end_to_end:
        model = _keep_what_pays(model, found, kernels, tuple(example_inputs), cfg.min_speedup)
    return _finish(model, t0, results, searched, cfg)


def _finish(model: nn.Module, t0: float, results: dict, searched: SearchedLog, cfg: OptimizeConfig) -> nn.Module:
    """The report's totals, and for each task without a kernel why, from its search (e.g. the
    best verified kernel lost to Inductor's code for the region, and by how much, or the time
    budget ran out first)."""
    report = model.htam_report
    report.optimize_s = time.perf_counter() - t0
    report.usage = _total_usage(results.values())
    for t in report.tasks:
        rec, res = searched.data.get(t.signature), results.get(t.signature)
        if t.status == "no kernel" and rec:
            t.status = searched.why_not(t.signature, cfg.min_speedup)
            t.speedup, t.vs_inductor = rec.get("best"), rec.get("vs_inductor")
        elif t.status == "no kernel" and res is not None and res.stop == "time_budget":
            more = "a larger OptimizeConfig.time_budget_s (--time-budget) searches it further"
            if res.best is None:
                t.status = (f"no kernel: the time budget ({cfg.time_budget_s:g} s) ran out before its "
                            f"search found one; {more}")
            else:    # its first steps found only kernels below min_speedup
                t.speedup = res.best.speedup
                t.status = (f"no kernel: the best verified one was {res.best.speedup:.2f}x of eager when the "
                            f"time budget ({cfg.time_budget_s:g} s) stopped its search; {more}")
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


def _keep_what_pays(model: nn.Module, found, kernels: dict, inputs: tuple,
                    min_speedup: float = 1.0, tries: int = 3, provider=None) -> nn.Module:
    """End-to-end guard: the swapped forward must beat the original one on the example inputs,
    timed interleaved in this process (so clocks and other load hit both alike). Per-region
    speedups do not add up by themselves: a region can win alone and still lose in the model
    (host time per call in a launch-bound model, layout copies). If all kernels together lose, the
    ones with the largest estimated saving (count x reference ms x (1 - 1/speedup)) are tried alone:
    the top half, then the top quarter, ... (`tries` subsets at most); else the original path.

        >>> model = _keep_what_pays(model, found, kernels, (x,))   # model.htam_report says what stayed
    """
    from torch_htam import runtime
    counts, swapped = {t.signature: t.count for t in found.tasks}, _swapped(model)
    ranked = sorted((s for s in kernels if s in swapped),
                    key=lambda s: -_saving_ms(kernels[s], counts.get(s, 1)))
    first = None
    for attempt, subset in enumerate(_halvings(ranked, tries)):
        if attempt:
            model = runtime.install(model, found, {s: kernels[s] for s in subset},
                                    provider=provider, min_speedup=min_speedup)
            if not model.htam_report.swapped:
                break
        orig, ours = _e2e(model, inputs)
        o, h = orig.median_ms, ours.median_ms
        first = first or (o, h)
        if pays(orig, ours):
            report = model.htam_report
            report.e2e.update({"original_ms": o, "htam_ms": h})
            if attempt:
                _mark_unused(report, kernels, set(subset))
                report.note = (f"{len(subset)} of {len(ranked)} kernels kept: all {len(ranked)} together "
                               f"took {first[1]:.3f} ms against {first[0]:.3f} ms for the original")
            return model
    report = model.htam_report
    report.e2e.update({"original_ms": first[0], "htam_ms": first[1]})
    _mark_unused(report, kernels, set())
    report.swapped = 0
    return runtime.leave(model, f"end to end not faster ({first[1]:.3f} ms vs original {first[0]:.3f} ms "
                         "on the example inputs): the original path is kept", report=report)


def _install_compiled(model: nn.Module, found, kernels: dict, inputs: tuple, cfg: OptimizeConfig,
                      tries: int = 2) -> nn.Module:
    """torch.compile with our kernels on the user's model, behind the end-to-end guard: timed
    against the base, the faster of torch.compile of the same model in the same mode and Inductor
    on our re-exported graph with no kernel (_base), interleaved in this process.

    The subsets tried, each against the base: every verified kernel, where some lost to Inductor's
    code for their region alone; the kernels that beat it (if both pay, the one with the better
    ratio to the base stays); then their top half and top quarter by estimated saving. If none
    pays, the model runs the base, the best known answer for it.

    NOTE: a region's time alone is its device time, but a model whose host issues calls slower
    than the GPU runs them is bound by host time per call, where one of our kernels replaces
    Inductor's extern conv call and its Triton epilogue. ResNet-50 bf16 at batch 32 in default
    mode (H100, scripts/probe_resnet_cl.py at 40c2c05, docs/RESULTS_LOG.md): 1.73x torch.compile
    with all 24 conv tasks' kernels, 1.13x with the 17 that beat Inductor on the device, 1.02x
    with the top 10; in reduce-overhead mode, where the device decides, 0.93x, 1.03x and 1.01x.

        >>> model = _install_compiled(model, found, kernels, (x,), cfg)   # model.htam_report says what stayed
    """
    from torch_htam import inductor
    from torch_htam.timing import time_pair
    saving = {s: _saving_ms(e, _count(found, s)) for s, e in kernels.items()}
    beat = {s: e for s, e in kernels.items() if inductor.beats_inductor(e, cfg.min_speedup)}
    ranked = sorted(beat, key=lambda s: -saving[s])
    every = sorted(kernels, key=lambda s: -saving[s])
    if not cfg.check_end_to_end:
        b = inductor.HtamBackend(beat, cfg.mode)
        return _warm(inductor.install(model, found, beat, cfg.mode, backend_obj=b), inputs)
    base, base_b, base_ms, base_note = _base(model, inputs, cfg)
    trials = ([every] if len(every) > len(ranked) else []) + [t for t in _halvings(ranked, tries) if t]
    tried: list[tuple] = []     # (subset, compiled call, backend, base ms, ours ms) of each trial
    for i, subset in enumerate(trials):
        b = inductor.HtamBackend({s: kernels[s] for s in subset}, cfg.mode, keep_reexport=base_b.keep_reexport)
        ours = inductor.compile_with(model, b)
        t_base, t_ours = time_pair(base, ours, inputs, iters=GUARD_ITERS, rounds=GUARD_ROUNDS)
        tried.append((subset, ours, b, t_base.median_ms, t_ours.median_ms, pays(t_base, t_ours)))
        paid = [t for t in tried if t[5]]
        if paid and not (subset is every and i + 1 < len(trials)):   # every paid: the winners' turn
            break
    paid = [t for t in tried if t[5]]
    # NOTE: with no kernel left, install the very compile the guard timed as the base, so the
    # model cannot be slower than it by anything but noise.
    subset, ours, b, t_base, t_ours, _ = (min(paid, key=lambda t: t[4] / t[3]) if paid
                                          else ([], base, base_b, None, None, True))
    model = inductor.install(model, found, {s: kernels[s] for s in subset}, cfg.mode,
                             compiled=ours, backend_obj=b)
    _warm(model, inputs)
    report = model.htam_report
    report.e2e.update(base_ms)
    if subset:
        report.e2e.update({"base_ms": t_base, "htam_ms": t_ours})
    left = set(kernels) - set(subset)
    for t in report.tasks:
        if t.signature in left:
            t.speedup = kernels[t.signature].speedup
            t.vs_inductor = kernels[t.signature].record.get("evaluation", {}).get("compile_speedup")
            t.status = ("not used: slower than Inductor's code for the region"
                        if t.signature not in beat else "not used: the compiled model was not faster with it")
    base_name = "our re-exported graph" if base_b.keep_reexport else "torch.compile"
    first = tried[0] if tried else None
    if first and not subset and not ranked:
        report.note = (f"no kernel beat Inductor's code for its region, and all {len(first[0])} together "
                       f"took {first[4]:.3f} ms against {first[3]:.3f} ms: {base_name} alone")
    elif first and subset != first[0]:
        report.note = (f"{len(subset)} of {len(first[0])} kernels kept: all {len(first[0])} took "
                       f"{first[4]:.3f} ms against {first[3]:.3f} ms for {base_name}")
    elif subset and len(subset) > len(ranked):
        report.note = (f"all {len(subset)} kernels kept, {len(subset) - len(ranked)} of them slower than "
                       f"Inductor's code for their region alone: {t_ours:.3f} ms against {t_base:.3f} ms "
                       f"for {base_name}")
    elif not ranked and kernels:
        report.note = f"no kernel beat Inductor's code for its region: {base_name} alone"
    report.note = "; ".join(x for x in (report.note, base_note) if x)
    return model


def _base(model: nn.Module, inputs: tuple, cfg: OptimizeConfig):
    """The compiled model with no kernel of ours: Inductor on our re-exported graph where that beats
    torch.compile of the model beyond noise, else torch.compile itself. Returns (compiled call,
    its HtamBackend, both times for the report's e2e, a note for the report: "" where
    torch.compile stays the base).

    NOTE: the re-export (capture.export_graph) is a different graph for Inductor: functionalized,
    with the constant causal / all-true masks HF models hand SDPA folded into is_causal or dropped.
    On an H100 that alone made a Llama-style model 1.10x faster than torch.compile in
    reduce-overhead mode (scripts/probe_graph.py, docs/RESULTS_LOG.md), where a kernel kept in it
    had been credited with the gain.
    """
    from torch_htam import inductor
    from torch_htam.timing import time_pair
    plain_b = inductor.HtamBackend({}, cfg.mode)
    plain = inductor.compile_with(model, None, cfg.mode)
    graph_b = inductor.HtamBackend({}, cfg.mode, keep_reexport=True)
    graph = inductor.compile_with(model, graph_b)
    t_plain, t_graph = time_pair(plain, graph, inputs, iters=GUARD_ITERS, rounds=GUARD_ROUNDS)
    ms = {"torch.compile_ms": t_plain.median_ms, "reexported_ms": t_graph.median_ms}
    if not pays(t_plain, t_graph):
        return plain, plain_b, ms, ""
    return graph, graph_b, ms, (f"base: Inductor on our re-exported graph, {t_graph.median_ms:.3f} ms "
                                f"against {t_plain.median_ms:.3f} ms for torch.compile")


def _fastest_path(model: nn.Module, found, kernels: dict, inputs: tuple,
                  cfg: OptimizeConfig, provider=None) -> nn.Module:
    """The compiled model (installed by _install_compiled), the replay of the captured graph with
    every usable kernel, or the model's original forward: the fastest, where it beats the compiled
    model beyond noise (all three timed interleaved, this process); else the compiled model.

    NOTE: torch.compile is not always the faster path. On an H100, HF BERT-base bf16 ran 11.4 ms a
    call under torch.compile against 7.6 ms eager and 5.5 ms for the replay with our kernels
    (bench/results/bench_models-20261124-011550.json); ViT-B/16 fp32 ran 58.2 ms under
    torch.compile against 56.4 ms eager (bench_models-20261124-041504.json), where installing the
    compiled model left the user's model slower than it was.
    """
    from torch_htam import runtime
    from torch_htam.timing import time_many
    forward, report = runtime.replay(model, found, kernels, provider, cfg.min_speedup)
    compiled_report = model.htam_report
    arms = {"compiled": model, "original": model._call_impl} | ({"replay": forward} if forward else {})
    timed = time_many(arms, inputs, iters=GUARD_ITERS, rounds=GUARD_ROUNDS)
    compiled_report.e2e.update({f"{k}_ms": t.median_ms for k, t in timed.items() if k != "compiled"})
    best = min((k for k in arms if k != "compiled"), key=lambda k: timed[k].median_ms)
    if not pays(timed["compiled"], timed[best]):
        return model
    ms, base = timed[best].median_ms, timed["compiled"].median_ms
    inside = f"({compiled_report.swapped} of our kernels inside it)"
    if best == "original":
        for t in compiled_report.tasks:
            if t.status == "swapped" or t.status.startswith("kernel ready"):
                t.status = "not used: the original forward was faster than torch.compile"
        compiled_report.e2e.update({"compiled_ms": base, "htam_ms": ms})
        compiled_report.swapped = 0
        return runtime.leave(model, f"the original forward: {ms:.3f} ms against {base:.3f} ms for "
                                    f"torch.compile {inside}", report=compiled_report)
    report.fast_calls = report.fallback_calls = 0       # the guard's timed calls are not the user's
    report.fallback_reasons.clear()
    model = runtime.use(runtime.restore(model), forward, report)
    model.htam_report.e2e.update({k: v for k, v in compiled_report.e2e.items() if k != "replay_ms"})
    model.htam_report.e2e.update({"compiled_ms": base, "htam_ms": ms})
    model.htam_report.note = (f"replay of the captured graph with our kernels: {ms:.3f} ms "
                              f"against {base:.3f} ms for torch.compile {inside}")
    return model


def _with_inductor_times(tasks: list, kernels: dict, cache, cfg: OptimizeConfig) -> dict:
    """The kernels, each with its region's time under torch.compile in its record: those cached
    without it (found by a replay-mode search, shipped with torch_htam) are verified and timed against it
    now, once, and cached again with both figures.

    NOTE: on an H100, GPT-2 bf16's lm_head kernel (1.07x over eager, timed without Inductor) ran
    3.1 ms a call inside the compiled model, where Inductor's own GEMM (it pads the 50257-wide
    weight) took 0.45 ms: the compiled model went from 3.42 to 5.78 ms with that kernel alone
    (bench/bench_swaps.py; bench/results/bench_swaps-*.json). The bar inside a compiled model is
    Inductor's code for the region, not eager's.
    """
    from torch_htam.evaluation import Evaluator
    todo = [t for t in tasks if t.signature in kernels
            and kernels[t.signature].record.get("evaluation", {}).get("compile_speedup") is None]
    if not todo:
        return kernels
    out = dict(kernels)
    with Evaluator() as evaluator:
        for t in todo:
            entry = out.pop(t.signature)
            ev = evaluator.evaluate_many(t, [entry.source], inductor=True)[0]
            if not (ev.correct and ev.speedup):
                log.warning("torch_htam: kernel %s (%s) failed again when timed against Inductor: "
                            "%s; not used", t.signature[:12], t.name, ev.reason)
                continue
            kept = {k: v for k, v in entry.record.get("provenance", {}).items()
                    if k not in ("torch_htam", "date", "arch", "toolchain")}   # make_record's own
            meta = {**kept, "tags": entry.record.get("tags"), "params": entry.record.get("params")}
            out[t.signature] = cache.put(t, entry.source, ev.so_path or entry.so_path, ev, meta)
    return out


def _count(found, signature: str) -> int:
    return next((t.count for t in found.tasks if t.signature == signature), 1)


def _warm(model: nn.Module, inputs: tuple) -> nn.Module:
    """One call on the example inputs: torch.compile compiles here, not in the user's first call,
    and the report learns what was swapped."""
    import torch
    from torch_htam import inductor
    with torch.inference_mode():
        model(*inputs)
    inductor.sync_report(model)
    return model


def _halvings(ranked: list, tries: int):
    """The subsets both end-to-end guards try, best estimated saving first: all of `ranked`, then
    its top half, top quarter, ... (`tries` halvings at most, none empty)."""
    subset = ranked
    yield subset
    for _ in range(tries):
        subset = subset[: len(subset) // 2]
        if not subset:
            return
        yield subset


def _swapped(model) -> set[str]:
    return {t.signature for t in model.htam_report.tasks if t.status == "swapped"}


def _saving_ms(entry, count: int) -> float:
    ev = entry.record.get("evaluation", {})
    ref, sp = ev.get("ref_ms") or 0.0, ev.get("speedup") or 1.0
    return count * ref * (1.0 - 1.0 / sp)


def _mark_unused(report, kernels: dict, kept: set[str]) -> None:
    for t in report.tasks:
        if t.signature in kernels and t.signature not in kept:
            t.status = "not used: the model was not faster end to end"
            t.speedup = kernels[t.signature].speedup


def _e2e(model, inputs: tuple):
    """(original, swapped) ArmTime of the model's forward; the guard's own calls are not counted."""
    from torch_htam.timing import time_pair
    orig, ours = time_pair(model.forward.htam.original, model.forward, inputs, iters=GUARD_ITERS,
                           rounds=GUARD_ROUNDS)
    model.htam_report.fast_calls, model.htam_report.fallback_calls = 0, 0
    return orig, ours


# The end-to-end guards' timing: GUARD_ROUNDS alternating rounds, GUARD_ITERS calls per arm in all.
GUARD_ITERS, GUARD_ROUNDS = 45, 15
# NOTE: a swap is kept only if it wins by more than the timing's noise. GPT-2 bf16 under
# torch.compile is host-bound on an H100 (2.7 ms of device time in 4.2-6.9 ms a call, moving by
# 1-2 ms between runs): a guard that took any lower median kept 24 swaps that the same run's
# interleaved benchmark then measured at 0.92x of torch.compile (bench_models-20261123-230318.json).
GUARD_MARGIN = 0.02


def pays(base, ours, margin: float = GUARD_MARGIN) -> bool:
    """ours (timing.ArmTime) beats base beyond noise: its median at least `margin` lower, and
    even its 80th percentile below base's median.

        >>> pays(ArmTime(1.0, 0.9, 1.1), ArmTime(0.9, 0.85, 0.95)), pays(ArmTime(1.0, 0.9, 1.1), ArmTime(0.99, 0.9, 1.1))
        (True, False)
    """
    return ours.median_ms <= base.median_ms * (1.0 - margin) and ours.p80_ms < base.median_ms


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
    from torch_htam import inductor, runtime
    from torch_htam.bundle import _gpu_arch, bundle_arch, run_of
    from torch_htam.bundle import precompile as write_bundle
    cfg = config or OptimizeConfig()
    if arch is not None or _gpu_arch() is None:
        # NOTE: searching needs a GPU of the target arch, so this bundles what the cache already
        # holds for it, every usable kernel: optimize's end-to-end check (which kernels make the
        # whole model faster) needs that GPU too, and load's golden check still runs on the server.
        runtime.restore(model)
        return write_bundle(model, example_inputs, out_dir, arch=bundle_arch(arch),
                            run={"compile": True, "mode": cfg.mode})
    optimize(model, example_inputs, cfg)
    # Only what the optimized model really uses: a kernel that won alone but that the end-to-end
    # guard turned down stays out, so load() never swaps in what optimize() rejected.
    used, run = _swapped(model), run_of(model)
    # Inductor's code for the compiled model (optimize compiled it and called it once), so that a
    # server on the same stack loads it instead of compiling on its first call.
    code = inductor.save_artifacts() if run["compile"] else None
    # NOTE: the bundle lists the tasks of the ORIGINAL graph; captured through the swapped
    # forward, the swapped regions would be launcher calls and their kernels left out.
    runtime.restore(model)
    try:
        return write_bundle(model, example_inputs, out_dir, only=used, run=run, inductor_code=code)
    finally:
        optimize(model, example_inputs, dataclasses.replace(cfg, search=False))   # from the cache
