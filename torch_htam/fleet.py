"""Fleet precompile: the kernels of several models searched once each, then one bundle per model.

Models share regions (every GPT-2 size has the same GELU, most CNNs the same conv shapes), so the
tasks of all models are deduplicated by signature and each is searched once; searches run side by
side (`parallel`), their candidates going to whatever pool the search's Evaluator has: a RayPool
spreads them over every GPU of the target arch in a Ray cluster.

A long run writes its progress to a JSON file after every change (tasks done / in flight / left,
kernels kept, seconds per phase) and can be interrupted: run it again with the same file and the
tasks already done are not searched again (ones in flight or failed are).

    >>> from torch_htam import fleet
    >>> prog = fleet.precompile_fleet({"gpt2": gpt2_tasks, "gpt2-medium": medium_tasks},
    ...                               search=fleet.searcher("sm_90a", cfg, pool), bundle=write_bundle,
    ...                               progress="fleet.json", parallel=4)
    >>> prog.line()
    'fleet: 31/31 tasks done, 0 in flight, 0 left, 12 kernels kept; plan 0.0 s, search 1840.2 s, bundle 20.1 s'

`precompile_specs` is the whole run from model specs (what `torch-htam precompile --ray` runs).
Writes to shared state are safe from many searches at once: the kernel cache takes its file lock
(cache.py), the HTG's experience is merged under a lock as deltas (merge_experience), and the
searched log is guarded by a lock; the progress file has one writer, this process.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torch_htam import paths

log = logging.getLogger("torch_htam")

FORMAT = "torch_htam.fleet/1"
LEFT, IN_FLIGHT, DONE, ERROR = "left", "in_flight", "done", "error"


@dataclass
class TaskOutcome:
    """What a search function returns for one task: kept (a verified, faster kernel is in the
    cache now), its speedup, and why the search stopped ("cached" when it was not needed)."""
    kept: bool
    speedup: float | None = None
    stop: str = ""


# ------------------------------------------------------------------------------------ progress

class FleetProgress:
    """The run's state, mirrored to a JSON file (atomically) on every change:

        {"format", "arch", "models": {model: [signature, ...]},
         "tasks": {signature: {"name", "models", "state", "kept", "speedup", "stop", "seconds", "error"}},
         "phases": {phase: seconds, summed over resumed runs}, "bundles": {model: {"path"} | {"error"}},
         "counts": {"total", "done", "in_flight", "left", "error", "kept"}, "updated"}
    """

    def __init__(self, path: str | Path | None, arch: str | None = None):
        self.path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        self.data: dict[str, Any] = {"format": FORMAT, "arch": arch, "models": {}, "tasks": {},
                                     "phases": {}, "bundles": {}}
        if self.path is not None and self.path.exists():
            self._resume(json.loads(self.path.read_text()), arch)

    def _resume(self, old: dict[str, Any], arch: str | None) -> None:
        if old.get("format") != FORMAT:
            raise ValueError(f"{self.path} is not a fleet progress file (format {old.get('format')!r})")
        if arch is not None and old.get("arch") not in (None, arch):
            raise ValueError(f"{self.path} is the progress of a run for {old['arch']}, not {arch}: "
                             "use another progress file per arch")
        self.data.update({k: old.get(k, self.data[k]) for k in ("models", "tasks", "phases", "bundles")})
        for rec in self.data["tasks"].values():
            if rec["state"] in (IN_FLIGHT, ERROR):   # cut off or failed last time: searched again
                rec["state"] = LEFT

    def plan(self, models: dict[str, list]) -> dict[str, Any]:
        """Record every model's tasks; returns {signature: task}, each signature once (the first
        model's task object). Tasks done in an earlier run keep their state."""
        unique: dict[str, Any] = {}
        with self._lock:
            for model, tasks in models.items():
                self.data["models"][model] = list(dict.fromkeys(t.signature for t in tasks))
                for t in tasks:
                    unique.setdefault(t.signature, t)
                    rec = self.data["tasks"].setdefault(t.signature, {"name": t.name, "models": [],
                                                                      "state": LEFT, "kept": False})
                    if model not in rec["models"]:
                        rec["models"].append(model)
            self.save()
        return unique

    def todo(self) -> list[str]:
        return [s for s, r in self.data["tasks"].items() if r["state"] == LEFT]

    def update(self, signature: str, **fields) -> None:
        with self._lock:
            self.data["tasks"][signature].update(fields)
            self.save()

    def add_phase(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.data["phases"][phase] = round(self.data["phases"].get(phase, 0.0) + seconds, 3)
            self.save()

    def bundle(self, model: str, **fields) -> None:
        with self._lock:
            self.data["bundles"][model] = fields
            self.save()

    def counts(self) -> dict[str, int]:
        states = [r["state"] for r in self.data["tasks"].values()]
        return {"total": len(states), **{s: states.count(s) for s in (DONE, IN_FLIGHT, LEFT, ERROR)},
                "kept": sum(1 for r in self.data["tasks"].values() if r.get("kept"))}

    def line(self) -> str:
        c = self.counts()
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.data["phases"].items())
        failed = f" ({c[ERROR]} failed)" if c[ERROR] else ""
        return (f"fleet: {c[DONE]}/{c['total']} tasks done, {c[IN_FLIGHT]} in flight, {c[LEFT]} left"
                f"{failed}, {c['kept']} kernels kept" + (f"; {phases}" if phases else ""))

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            self.data["counts"] = self.counts()
            self.data["updated"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            paths.write_json_atomic(self.path, self.data)


@contextlib.contextmanager
def _file_lock(path: Path, blocking: bool = True):
    """An exclusive flock on <path>.lock (per open, so threads and processes both exclude)."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise RuntimeError(f"another fleet precompile is using {path} (lock {lock}); wait for it "
                               "or give this run its own progress file") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _phase(progress: FleetProgress, name: str):
    t0 = time.monotonic()
    try:
        yield
    finally:
        progress.add_phase(name, time.monotonic() - t0)


# ------------------------------------------------------------------------------------ the run

def precompile_fleet(models: dict[str, list], search: Callable[[Any], TaskOutcome],
                     bundle: Callable[[str, list[str]], Any], progress: str | Path | None = None,
                     parallel: int = 1, arch: str | None = None,
                     on_progress: Callable[[FleetProgress], None] | None = None) -> FleetProgress:
    """Search every distinct task of `models` ({model: [Task]}) once, then bundle each model.

    search(task) -> TaskOutcome: one task's search (fills the cache); `parallel` run at once.
    bundle(model, signatures) -> path: that model's bundle, after every search ended (a model
    whose bundle fails is recorded with the error; the others still get theirs). progress: the
    JSON file to write and to resume from (None: in memory only). on_progress(progress): called
    after each task (e.g. print(progress.line())).
    """
    state = FleetProgress(progress, arch)
    with _file_lock(state.path, blocking=False) if state.path is not None else contextlib.nullcontext():
        with _phase(state, "plan"):
            tasks = state.plan(models)
        todo = state.todo()
        if todo:
            with _phase(state, "search"):
                _search_all([tasks[s] for s in todo], search, state, parallel, on_progress)
        with _phase(state, "bundle"):
            for model, sigs in state.data["models"].items():
                if model in models:
                    _bundle_one(model, sigs, bundle, state)
    return state


def _search_all(tasks: list, search: Callable, state: FleetProgress, parallel: int,
                on_progress: Callable | None) -> None:
    """Each task through search(), `parallel` at once; a task that raises is recorded as an error
    (searched again on the next run), never the end of the fleet. An interruption (Ctrl-C) ends
    the run: tasks not started are dropped, and searches cut by it are left to the next run."""
    stop = threading.Event()

    def one(task) -> None:
        if stop.is_set():
            return
        sig = task.signature
        state.update(sig, state=IN_FLIGHT)
        t0 = time.monotonic()
        try:
            out = search(task)
        except Exception as e:  # noqa: BLE001 -- one bad task must not end a fleet-wide run
            log.warning("torch_htam fleet: the search of %s failed", task.name, exc_info=True)
            outcome = {"state": ERROR, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        else:
            outcome = {"state": DONE, "kept": bool(out.kept), "speedup": out.speedup, "stop": out.stop,
                       "error": None}
        if stop.is_set():   # NOTE: its jobs may have died with the pool: no verdict, search it again
            outcome = {"state": LEFT}
        state.update(sig, seconds=round(time.monotonic() - t0, 3), **outcome)
        if on_progress is not None:
            on_progress(state)

    if parallel <= 1:
        for t in tasks:
            one(t)
        return
    ex = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="htam-fleet")
    try:
        for f in [ex.submit(one, t) for t in tasks]:
            f.result()
    except BaseException:
        stop.set()
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown()


def _bundle_one(model: str, sigs: list[str], bundle: Callable, state: FleetProgress) -> None:
    try:
        path = bundle(model, [s for s in sigs if state.data["tasks"][s].get("kept")])
    except Exception as e:  # noqa: BLE001 -- e.g. EmptyBundleError: no kernel for this model
        state.bundle(model, error=f"{type(e).__name__}: {str(e)[:300]}")
    else:
        state.bundle(model, path=str(path))


# ------------------------------------------------------------------------ HTG experience merge

STATS_NUMBERS = ("attempts", "correct", "successes", "reward", "log_gain")
HEADER = ("format", "version", "reward")   # what must match for counts to add up


def merge_experience(path: str | Path, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Add what one search learned (after - before, two HTG.experience_json() snapshots) to the
    memory file at `path`, under its lock: concurrent searches each add their own delta, so none
    overwrites another's (HTG.save alone would: last writer wins)."""
    path = Path(path)
    with _file_lock(path):
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):   # missing (or unreadable: HTG.load has set a bad one aside)
            current = None
        if current is None or any(current.get(k) != after.get(k) for k in HEADER):
            # NOTE: none yet, or written by another HTG version or reward basis: this search read it
            # through HTG.load (which migrates), so its snapshot minus the delta is the base
            current = {k: v for k, v in after.items() if k not in ("edges", "strategies", "recall")}
            current.update(edges={}, strategies={}, recall={})
            current = _added(current, before)   # the base it started from
        current = _added(current, after, minus=before)
        current["saved"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        paths.write_json_atomic(path, current)


def _added(current: dict, new: dict, minus: dict | None = None) -> dict:
    """current + (new - minus), stats by stats, for the experience parts; recall's task records
    (recall.py: one per task signature) that new holds and minus does not, as new has them, in
    place of current's record of the same task."""
    for kind, records in new.get("recall", {}).items():
        old = {json.dumps(r, sort_keys=True) for r in (minus or {}).get("recall", {}).get(kind, [])}
        for r in records:
            if json.dumps(r, sort_keys=True) not in old:
                rows = current.setdefault("recall", {}).setdefault(kind, [])
                rows[:] = [x for x in rows if x.get("signature") != r["signature"]] + [r]
    for part in ("edges", "strategies"):
        for name, per_key in new.get(part, {}).items():
            for key, stats in per_key.items():
                old = (minus or {}).get(part, {}).get(name, {}).get(key)
                delta = _stats_delta(stats, old)
                if delta is not None:
                    slot = current[part].setdefault(name, {})
                    slot[key] = _stats_add(slot.get(key), delta)
    return current


def _stats_delta(new: dict, old: dict | None) -> dict | None:
    """new - old for one htg.Stats JSON; None when nothing changed."""
    old = old or {}
    d = {k: new.get(k, 0) - old.get(k, 0) for k in STATS_NUMBERS}
    fails = {r: n - old.get("failures", {}).get(r, 0) for r, n in new.get("failures", {}).items()}
    d["failures"] = {r: n for r, n in fails.items() if n}
    return d if d["attempts"] or d["failures"] else None


def _stats_add(a: dict | None, d: dict) -> dict:
    a = a or {k: 0 for k in STATS_NUMBERS}
    out = {k: a.get(k, 0) + d[k] for k in STATS_NUMBERS}
    out["failures"] = dict(a.get("failures", {}))
    for r, n in d["failures"].items():
        out["failures"][r] = out["failures"].get(r, 0) + n
    return out


# ------------------------------------------------------------------ the real search, on any pool

def searcher(arch: str, cfg=None, pool=None, gpu=None, trajectory_dir: str | Path | None = None):
    """search(task) -> TaskOutcome for precompile_fleet: the optimize pipeline's search of one task
    (expert proposer, HTG memory, the winner re-confirmed before it is cached), its candidates
    evaluated on `pool` (a RayPool, or None: this machine's WorkerPool). Several may run at once:
    one Evaluator and cache are shared, each search has its own HTG copy, merged by delta.

    gpu: the target GPU's GpuInfo (the search's state); default this machine's, else the pool's.
    """
    from torch_htam import paths
    from torch_htam.cache import KernelCache
    from torch_htam.config import OptimizeConfig
    from torch_htam.evaluation import Evaluator
    from torch_htam.search import SearchConfig
    cfg = cfg or OptimizeConfig()
    cache = KernelCache(arch)
    searched = _locked_log(paths.arch_dir(arch) / "searched.json")
    evaluator = Evaluator(arch=arch, pool=pool)
    gpu = gpu or evaluator.gpu or getattr(pool, "gpu", None)
    scfg = SearchConfig(steps=cfg.steps, candidates_per_step=cfg.candidates_per_step,
                        memory=cfg.memory, max_wall_s=cfg.task_time_s, prebuild=cfg.prebuild)
    traj = Path(trajectory_dir) if trajectory_dir else paths.arch_dir(arch) / "trajectories"
    cached = cached_only(arch, "", cfg.min_speedup)

    def search(task) -> TaskOutcome:
        from torch_htam.policy import policy_for
        if (hit := cached(task)).kept:
            return hit
        if searched.covers(task.signature, cfg, policy_for(task).name):
            return TaskOutcome(False, None, "searched before")
        return _search_one(task, arch, cfg, scfg, cache, searched, evaluator, gpu, traj)

    return search


def cached_only(arch: str, why: str, min_speedup: float | None = None):
    """search(task) -> TaskOutcome from the cache of `arch` alone: kept when it has a usable kernel
    for the task (at least min_speedup, default OptimizeConfig's), else not, its stop saying `why`.
    What precompile_fleet runs where nothing can be searched (no GPU here, or --no-search), and
    the first look of searcher()'s search."""
    from torch_htam.cache import KernelCache
    from torch_htam.config import OptimizeConfig
    from torch_htam.policy import admitted
    cache = KernelCache(arch)
    min_speedup = OptimizeConfig().min_speedup if min_speedup is None else min_speedup

    def search(task) -> TaskOutcome:
        entry = admitted(cache.get(task.signature), task)
        if entry is not None and entry.usable(min_speedup):
            return TaskOutcome(True, entry.speedup, "cached")
        return TaskOutcome(False, None, why)

    return search


def _search_one(task, arch, cfg, scfg, cache, searched, evaluator, gpu, traj) -> TaskOutcome:
    from torch_htam import paths
    from torch_htam.htg import HTG
    from torch_htam.pipeline import _Keeper
    from torch_htam.proposers.expert import ExpertProposer
    from torch_htam.search import search_many
    memory_path = paths.memory_path(arch, ExpertProposer().name)
    memory = HTG.load(memory_path)
    seen = {"before": memory.experience_json()}

    def save_memory() -> None:   # _Keeper calls it after each pass: add only what is new since
        after = memory.experience_json()
        merge_experience(memory_path, seen["before"], after)
        seen["before"] = after

    keep = _Keeper(evaluator, cache, searched, cfg, gpu.name if gpu else "?", save_memory)
    res = search_many([task], ExpertProposer, evaluator, memory, scfg, progress=False,
                      trajectory_dir=traj, on_result=keep, gpu=gpu)[task.signature]
    return TaskOutcome(task.signature in keep.cached, keep.speedup(task.signature, res), res.stop)


def _locked_log(path: Path):
    """pipeline.SearchedLog for concurrent searches: add() rewrites the whole file from one tmp
    name per process, so two threads at once could tear it; its add() goes under a lock."""
    from torch_htam.pipeline import SearchedLog
    searched, lock = SearchedLog(path), threading.Lock()
    add = searched.add

    def locked_add(*a, **kw) -> None:
        with lock:
            add(*a, **kw)
    searched.add = locked_add
    return searched


# --------------------------------------------------------------------------- from model specs

def precompile_specs(specs: list[str], out_dir: str | Path, arch: str, cfg=None,
                     address: str | None = None, pool=None, parallel: int | None = None,
                     progress: str | Path | None = None, device: str | None = None,
                     search: Callable | None = None) -> FleetProgress:
    """`torch-htam precompile SPEC... --out DIR --ray ADDRESS`: load each model spec, capture its
    tasks, search the distinct ones over a Ray cluster's GPUs of `arch`, and write
    DIR/<model>/ (one bundle per model, the kernels cached for `arch`).

    address: the Ray cluster ("auto", "ray://head:10001"); pool: a pool to use instead (e.g. a
    RayPool made by the caller, or a stand-in). parallel: searches at once (default: one per GPU
    of the pool). progress: default DIR/fleet-progress.json. search: a stand-in for searcher().
    """
    from torch_htam.config import OptimizeConfig
    cfg = cfg or OptimizeConfig()
    out = Path(out_dir)
    models, loaded = _load_specs(specs, device)
    own_pool = pool is None and search is None
    if own_pool:
        from torch_htam.ray_pool import RayPool
        pool = RayPool(address=address, arch=arch, timeout=60.0)
    try:
        search = search or searcher(arch, cfg, pool)
        n = parallel or max(1, len(getattr(pool, "workers", ())))
        with contextlib.ExitStack() as stack:
            from torch_htam.pipeline import _examples
            for found, _ in models.values():   # real inputs, for verification (Task.example)
                stack.enter_context(_examples(found, found.tasks))

            def bundle(model: str, kept: list[str]) -> Path:
                # every usable kernel cached for arch (pipeline.precompile's no-search path); the
                # end-to-end check needs the model on a GPU of arch, and load's golden check runs there
                from torch_htam.pipeline import precompile
                m, inputs = loaded[model]
                return precompile(m, inputs, out / model, cfg, arch=arch)

            return precompile_fleet({k: f.tasks for k, (f, _) in models.items()}, search, bundle,
                                    progress or out / "fleet-progress.json", parallel=n, arch=arch,
                                    on_progress=lambda p: log.info("%s", p.line()))
    finally:
        if own_pool:
            pool.close()


def _load_specs(specs: list[str], device: str | None):
    """{model name: (extract's Found, spec)} and {model name: (model, inputs)}; the name is the
    spec's file or function, made unique."""
    from torch_htam.extract import extract
    from torch_htam.modelspec import load_model_spec
    models, loaded = {}, {}
    for spec in specs:
        model, inputs = load_model_spec(spec, device)
        name = _model_name(spec, models)
        loaded[name] = (model, tuple(inputs))
        models[name] = (extract(model, tuple(inputs)), spec)
    return models, loaded


def _model_name(spec: str, taken: dict) -> str:
    base = spec.replace("\\", "/").rstrip("/").split("/")[-1].replace(".py", "").replace(":", "-") or "model"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name
