"""The search's evaluator backend on Ray: GPU workers as actors, candidate builds as CPU tasks.

`RayPool` has WorkerPool's interface (submit -> Future, run_many, close, context manager), so
`Evaluator(pool=RayPool(...))` searches across every GPU of a Ray cluster, one or many hosts:

    >>> from torch_htam.evaluation import Evaluator
    >>> with Evaluator(pool=RayPool(address="auto", arch="sm_90a")) as ev:
    ...     results = ev.evaluate_many(task, sources)

- One actor per GPU (`num_gpus=1`; Ray sets its CUDA_VISIBLE_DEVICES), running the same runner as
  WorkerPool's child processes (worker.DEFAULT_RUNNER, resolved by name in the actor).
- Containment as in WorkerPool: a job past its timeout (or optimize's deadline) has its actor
  killed (ray.kill) and comes back {"reason": "timeout"}; an actor that dies mid-job (segfault,
  os._exit, node lost) comes back {"reason": "crash"}; either way the next job gets a fresh actor.
  A killed actor costs one candidate, never the search.
- `build_many` runs build.build_many as Ray CPU tasks (the Evaluator uses it when the pool has it),
  and ships the .so bytes back to the driver when the build ran on another host.
- Arch-aware: with arch=, actors are pinned to nodes whose GPUs (Ray's accelerator_type resource)
  are of that arch, and each actor checks its own GPU when it starts.

The single-host WorkerPool stays the default; nothing imports Ray unless a RayPool is made
(`pip install torch_htam[ray]`).

Multi-host notes: torch_htam (same version) and nvcc must be installed on every node; paths in the
driver's sys.path that exist on a node are added to its actors' (so a runner in a user's script dir
resolves as in WorkerPool). The .so a build made on one host is read by the actor on another, so
jobs carry the library's bytes when the cluster has more than one node (ship_so).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import queue
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from torch_htam.worker import (DEFAULT_RUNNER, PAST_DEADLINE, START_TIMEOUT_S, _resolve, cancel_queued,
                               serve_jobs)

INSTALL_HINT = "pip install torch_htam[ray]  (or: pip install ray)"

# Ray's accelerator_type names (ray.util.accelerators, and what Ray detects on a node) -> nvcc arch.
ACCELERATOR_ARCH = {"H100": "sm_90a", "H200": "sm_90a", "GH200": "sm_90a", "H20": "sm_90a",
                    "H800": "sm_90a", "A100": "sm_80", "A800": "sm_80", "A10G": "sm_86",
                    "A10": "sm_86", "A40": "sm_86", "L4": "sm_89", "L40": "sm_89", "L40S": "sm_89",
                    "B200": "sm_100a", "GB200": "sm_100a", "V100": "sm_70", "T4": "sm_75"}


def import_ray():
    """ray, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"the Ray backend needs Ray, which is not installed: {INSTALL_HINT}") from e
    return ray


def connect(address: str | None = None, **init_kw) -> bool:
    """Join a Ray cluster (address: "auto", "ray://host:10001", "host:6379"), or start a local one
    (address None) unless this process is already connected. Returns True when this call
    connected (the caller then owns the connection and shuts it down)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, **init_kw)
    return True


# ------------------------------------------------------------------------------------ actor side

class _RunnerActor:
    """Runs jobs in a Ray worker process bound to one GPU; created through ray.remote by the pool.

    NOTE: the job loop lives in the actor process itself, like WorkerPool's child: a job that
    segfaults or calls os._exit takes the actor down, the pool sees ActorDiedError and replaces it.
    """

    def __init__(self, runner: str, sys_path: list[str]):
        # The driver's import path, where it exists here: WorkerPool passes PYTHONPATH the same way.
        for p in sys_path:
            if p and p not in sys.path and os.path.isdir(p):
                sys.path.append(p)
        self.run_fn = _resolve(runner)
        prepare = getattr(sys.modules[self.run_fn.__module__], "prepare_worker", None)
        if prepare is not None:
            prepare()   # CUDA init, launcher: paid at start, not by the first job's timeout

    def ready(self) -> dict[str, Any]:
        """Where this actor runs: pid, node, CUDA_VISIBLE_DEVICES, and its GPU's arch (None without)."""
        import ray
        info = None
        try:
            import torch
            if torch.cuda.is_available():
                from torch_htam import gpu
                info = gpu.detect().to_json()
        except Exception:   # noqa: BLE001 -- the first job reports a broken GPU
            pass
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "arch": info["arch"] if info else None, "gpu": info}

    def ping(self) -> int:
        return os.getpid()

    def run(self, job: dict) -> tuple[str, Any]:
        """("ok", result) or ("error", traceback): a runner's exception costs the job, not the actor."""
        try:
            return "ok", self.run_fn(_localize(job))
        except Exception:
            return "error", traceback.format_exc()[-4000:]


def _localize(job: dict) -> dict:
    """A job whose files came from another host: the library (bytes) and the task's real inputs
    (an object ref) written here under content-hash names, and the job pointed at them."""
    if "so_bytes" not in job and "example_ref" not in job:
        return job
    import ray
    d = Path(tempfile.gettempdir()) / f"htam_ray_{os.getuid()}"
    d.mkdir(exist_ok=True)
    job = dict(job)
    blob = job.pop("so_bytes", None)
    if blob is not None:
        path = d / Path(job["so_path"]).name   # <source hash>.so
        if not path.exists():
            _write_atomic(path, blob)
        job["so_path"] = str(path)
    ref = job.pop("example_ref", None)
    if ref is not None:
        ref, name = ref
        path = d / name
        if not path.exists():
            _write_atomic(path, ray.get(ref))
        job["task"] = {**job["task"], "example": str(path)}
    return job


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers (a concurrent job, Kernel()) see no file or a whole one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------------- driver side

class _Slot:
    """One GPU's worth of the pool: its current actor, replaced after a timeout or a death.
    Driven by a single pool thread; close() may stop it from another (ray.kill twice is harmless)."""

    def __init__(self, pool: "RayPool", node: str | None):
        self.pool, self.node = pool, node
        self.actor = None
        self.info: dict[str, Any] | None = None

    def start(self) -> None:
        ray, p = self.pool.ray, self.pool
        opts: dict[str, Any] = {"num_gpus": p.num_gpus, "num_cpus": p.cpus_per_worker}
        if p.resources:
            opts["resources"] = p.resources
        if self.node is not None:   # arch-aware placement: only nodes with GPUs of the target arch
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node, soft=False)
        self.actor = p._actor_cls.options(**opts).remote(p.runner, p.sys_path)
        ref = self.actor.ready.remote()
        done, _ = ray.wait([ref], timeout=START_TIMEOUT_S)
        if not done:
            self.stop()
            raise RuntimeError(f"a Ray worker (num_gpus={p.num_gpus}) did not start within "
                               f"{START_TIMEOUT_S:g} s: no free GPU of the kind asked for in the "
                               "cluster? (`ray status` shows what is free)")
        try:
            self.info = ray.get(ref)
        except ray.exceptions.RayError as e:
            self.stop()
            raise RuntimeError(f"a Ray worker failed to start: {_short(e)}") from None
        if p.arch and self.info["arch"] and self.info["arch"] != p.arch:
            got = self.info["arch"]
            self.stop()
            raise RuntimeError(f"a Ray worker landed on a GPU of arch {got}, the pool targets {p.arch}: "
                               "start the pool with arch= matching the nodes, or resources= naming them")

    def run(self, job: dict, timeout: float, deadline: float | None = None) -> dict:
        """One job on this slot's actor; after a timeout or a death the actor is gone. deadline:
        a time.monotonic() here past which the job is cut like a hang."""
        for attempt in (1, 2):
            if self.actor is None:
                self.start()
            if deadline is not None:   # counted after any start-up: the deadline does not move
                left = deadline - time.monotonic()
                if left <= 0:
                    return dict(PAST_DEADLINE)
                timeout = min(timeout, left)
            # NOTE: a ping queued just before the job tells an actor that died idle (node lost, killed
            # from outside) from one the job killed: both fail only if it was dead before the job
            # began, and then the job runs again on a fresh actor instead of costing a candidate.
            ping, ref = self.actor.ping.remote(), self.actor.run.remote(job)
            res = self._wait(ref, timeout)
            died = res.pop("_died", False)
            if not (died and attempt == 1 and not self.pool._closed and not _ok(self.pool.ray, ping)):
                return res
        raise AssertionError("unreachable")

    def _wait(self, ref, timeout: float) -> dict:
        ray = self.pool.ray
        done, _ = ray.wait([ref], timeout=max(timeout, 0.0))
        if not done:
            self.stop()
            return {"reason": "timeout", "detail": f"no result after {timeout:g} s; worker killed"}
        try:
            kind, payload = ray.get(ref)
        except ray.exceptions.RayActorError as e:   # died mid-job: segfault, os._exit, node lost
            self.stop()
            return {"reason": "crash", "detail": f"worker died: {_short(e)}", "_died": True}
        except ray.exceptions.RayError as e:        # e.g. the job could not be (de)serialized
            return {"reason": "crash", "detail": f"Ray failed the job: {_short(e)}"}
        if kind == "error":
            return {"reason": "crash", "detail": f"job raised in the worker:\n{payload}"}
        if payload.get("exit"):   # dead CUDA context: this actor must not take another job
            self.stop()
        return payload

    def stop(self) -> None:
        if self.actor is not None:
            try:
                self.pool.ray.kill(self.actor, no_restart=True)
            except Exception:   # noqa: BLE001 -- already gone
                pass
            self.actor, self.info = None, None


def _ok(ray, ref) -> bool:
    """Whether a finished call succeeded."""
    try:
        ray.get(ref, timeout=5)   # done or failed already when the job after it failed
        return True
    except Exception:   # noqa: BLE001
        return False


def _short(e: BaseException, n: int = 1500) -> str:
    s = f"{type(e).__name__}: {e}"
    return s if len(s) <= n else s[:n] + " ..."


class RayPool:
    """WorkerPool's interface on Ray: n actors (default one per GPU of the target arch in the
    cluster), each fed by its own driver thread from one queue.

    address: the cluster to join ("auto", "ray://head:10001"); None starts a local Ray unless this
    process is already connected. timeout: wall seconds per job (a job may say "timeout").
    num_gpus: per actor (1; 0 for CPU runs and tests, then give n). arch: the GPU arch jobs were
    built for (actors only on nodes of that arch). resources: extra Ray resources per actor.
    build_cpus: CPUs per Ray build task (one nvcc each). ship_so: send .so bytes with jobs and
    builds (None: when the cluster has more than one node).

        >>> with RayPool(address="auto", arch="sm_90a") as pool:
        ...     fut = pool.submit({"kind": "evaluate", ...})
        ...     fut.result()["reason"]
        'ok'
    """

    # A pool whose GPUs are on other processes/hosts: the Evaluator submits jobs even when the
    # driver itself has no CUDA device.
    remote_gpus = True

    def __init__(self, n: int | None = None, runner: str = DEFAULT_RUNNER, timeout: float = 60.0,
                 address: str | None = None, num_gpus: float = 1, cpus_per_worker: float = 1,
                 arch: str | None = None, resources: dict[str, float] | None = None,
                 build_cpus: int = 4, ship_so: bool | None = None, init_kw: dict | None = None):
        self.ray = import_ray()
        self._owns_ray = connect(address, **(init_kw or {}))
        self.runner, self.timeout, self.arch = runner, timeout, arch
        self.num_gpus, self.cpus_per_worker, self.resources = num_gpus, cpus_per_worker, resources
        self.build_cpus = max(1, int(build_cpus))
        self.ship_so = self._multi_node() if ship_so is None else ship_so
        self.sys_path = [p for p in sys.path if p]
        self._actor_cls = self.ray.remote(max_restarts=0)(_RunnerActor)
        self._build_fn = self.ray.remote(_build_chunk)
        self._closed = False
        self._lock = threading.Lock()
        self._examples: dict[str, tuple] = {}   # example file -> (object ref, file name)
        self._jobs: queue.Queue = queue.Queue()
        try:
            placement = self._placement(n)
        except BaseException:
            if self._owns_ray:   # a pool that could not be made leaves no Ray running behind it
                self.ray.shutdown()
            raise
        self._slots = [_Slot(self, node) for node in placement]
        self._threads = [threading.Thread(target=self._serve, args=(s,), daemon=True) for s in self._slots]
        for t in self._threads:
            t.start()

    # ---- placement ---------------------------------------------------------------------------

    def _max_node_cpus(self) -> int:
        """The CPUs one build task may ask for: the largest node's, less what this pool's actors
        hold on a node (spread evenly): a task asking for more would wait forever (infeasible)."""
        cpus = [n.get("Resources", {}).get("CPU", 0) for n in self.ray.nodes() if n.get("Alive")]
        held = self.cpus_per_worker * math.ceil(len(self.workers) / max(len(cpus), 1))
        return max(1, int(max(cpus, default=1) - held))

    def _multi_node(self) -> bool:
        return sum(1 for node in self.ray.nodes() if node.get("Alive")) > 1

    def _placement(self, n: int | None) -> list[str | None]:
        """One entry per actor: the node it is pinned to, or None (anywhere Ray finds room)."""
        if self.num_gpus <= 0:
            if n is None:
                raise ValueError("RayPool(num_gpus=0) runs CPU workers: say how many with n=")
            return [None] * n
        # NOTE: resources= names the nodes (e.g. a custom resource their operators gave them), so
        # the arch then only checks each actor's GPU as it starts
        pinned = bool(self.arch) and not self.resources
        gpus = gpus_by_node(self.ray, self.arch if pinned else None)
        if pinned and not gpus:
            seen = sorted({a for a, _ in _node_accelerators(self.ray)})
            raise RuntimeError(f"no node of the Ray cluster has GPUs of arch {self.arch} (the cluster "
                               f"reports accelerator types: {', '.join(seen) or 'none'}); pass "
                               "arch=None to use any GPU, or resources= to name the nodes")
        slots = [node if pinned else None for node, k in gpus.items() for _ in range(int(k))]
        if n is None:
            if not slots:
                raise RuntimeError("the Ray cluster has no GPU: pass num_gpus=0 and n= for CPU jobs")
            return slots
        # n given: round-robin over the matching GPUs (or anywhere, without an arch)
        return [slots[i % len(slots)] if slots else None for i in range(n)]

    # ---- jobs --------------------------------------------------------------------------------

    def _serve(self, slot: _Slot) -> None:
        """One slot's thread: WorkerPool's job loop (worker.serve_jobs); optimize's deadline, a
        time.monotonic() of this host, is enforced here (Slot.run), not shipped."""
        try:
            slot.start()   # eagerly: actors warm (CUDA up) when the first jobs arrive
        except Exception:   # noqa: BLE001 -- retried by the first job, which reports it
            pass

        def run(job: dict, timeout: float) -> dict:
            deadline = job.get("deadline")
            return slot.run(self._outgoing(job), timeout, None if deadline is None else float(deadline))
        serve_jobs(self._jobs, run, self.timeout)
        slot.stop()

    def _outgoing(self, job: dict) -> dict:
        """The job as the actor gets it. NOTE: "deadline" is this host's time.monotonic(), which
        means nothing on another host, so the driver enforces it (Slot.run) and drops it. With
        ship_so the library's bytes travel with the job, and the task's real inputs (a file of the
        model's weights and activations, possibly large) as one object ref per file."""
        out = {k: v for k, v in job.items() if k != "deadline"}
        if not self.ship_so:
            return out
        if out.get("so_path") and "so_bytes" not in out:
            try:
                out["so_bytes"] = Path(out["so_path"]).read_bytes()
            except OSError:
                pass   # the runner reports load_error for the missing library
        example = (out.get("task") or {}).get("example")
        if example:
            ref = self._example_ref(example)
            if ref is not None:
                out["example_ref"] = ref
        return out

    def _example_ref(self, path: str):
        """(object ref, content-named file name) of an example file, put into Ray once."""
        with self._lock:
            if path not in self._examples:
                try:
                    data = Path(path).read_bytes()
                except OSError:
                    return None   # verification then runs on random inputs only, as without a file
                name = hashlib.sha256(data).hexdigest()[:20] + ".safetensors"
                self._examples[path] = (self.ray.put(data), name)
            return self._examples[path]

    def submit(self, job: dict) -> Future:
        """Queue one job; the Future's result is the runner's dict, or {"reason": "timeout"|"crash"|
        "deadline", ...}. Futures finish as jobs do (concurrent.futures.as_completed streams them)."""
        if self._closed:
            raise RuntimeError("RayPool is closed")
        fut: Future = Future()
        self._jobs.put((job, fut))
        return fut

    def run_many(self, jobs: list[dict]) -> list[dict]:
        """Run jobs across all actors; results in the jobs' order."""
        return [f.result() for f in [self.submit(j) for j in jobs]]

    @property
    def workers(self) -> list[dict[str, Any] | None]:
        """Each slot's live actor (pid, node, cuda_visible, arch, gpu), None where none runs now."""
        return [s.info for s in self._slots]

    @property
    def gpu(self):
        """The GpuInfo of an actor's GPU (the search's state when the driver has no GPU); waits for
        the first actor to start (they start as the pool is made). None on CPU workers."""
        from torch_htam.gpu import GpuInfo
        end = time.monotonic() + (START_TIMEOUT_S if self.num_gpus > 0 else 0)
        while True:
            info = next((w["gpu"] for w in self.workers if w and w.get("gpu")), None)
            if info or time.monotonic() >= end or self._closed:
                return GpuInfo(**info) if info else None
            time.sleep(0.1)

    # ---- builds ------------------------------------------------------------------------------

    def build_many(self, sources: list[str], arch: str | None = None, out_dir: str | Path | None = None,
                   jobs: int | None = None, timeout_s: float = 300):
        """build.build_many as Ray CPU tasks of up to build_cpus sources each; BuildResults in the
        order of `sources`, with so_path on this machine (shipped back from another host)."""
        from torch_htam import build
        arch = arch or self.arch or build.default_arch()
        unique = list(dict.fromkeys(sources))   # the same source twice builds once
        # NOTE: a task asking for more CPUs than any node has would wait forever (infeasible)
        per = max(1, min(jobs or self.build_cpus, self._max_node_cpus()))
        chunks = [unique[i:i + per] for i in range(0, len(unique), per)]
        here = self.ray.get_runtime_context().get_node_id()
        refs = [self._build_fn.options(num_cpus=min(per, len(c))).remote(
                    c, arch, None if out_dir is None else str(out_dir), per, timeout_s, here, self.ship_so)
                for c in chunks]
        done: dict[str, Any] = {}
        for chunk, ref in zip(chunks, refs):
            for src, res in zip(chunk, self._collect_build(ref, chunk, arch, out_dir, timeout_s)):
                done[src] = res
        return [done[s] for s in sources]

    def _collect_build(self, ref, chunk: list[str], arch: str, out_dir, timeout_s: float) -> list:
        from torch_htam import build, paths
        try:
            # NOTE: build_many kills its ninja at timeout_s; the margin covers Ray's scheduling
            results, blobs = self.ray.get(ref, timeout=timeout_s + 120)
        except Exception as e:   # noqa: BLE001 -- a lost node or worker fails its chunk only
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)   # a hung task must not hold its CPUs
            err = f"build task failed on Ray: {_short(e, 500)}"
            return [build.BuildResult(False, None, build.source_hash(s, arch), err) for s in chunk]
        local = Path(out_dir) if out_dir is not None else paths.arch_dir(arch) / "build"
        for r in results:
            blob = blobs.get(r.source_hash)
            if r.ok and blob is not None:   # built elsewhere: the library now lives here too
                local.mkdir(parents=True, exist_ok=True)
                path = local / f"{r.source_hash}.so"
                if not path.exists():
                    _write_atomic(path, blob)
                r.so_path = str(path)
        return results

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel queued jobs, kill running ones (close must not wait on a hang), stop the actors;
        disconnect from Ray if this pool connected."""
        if self._closed:
            return
        self._closed = True
        cancel_queued(self._jobs)
        for _ in self._threads:
            self._jobs.put(None)
        for s in self._slots:
            s.stop()   # a job in flight sees its actor die, reports "crash", its thread exits
        for t in self._threads:
            t.join(timeout=30)
        if self._owns_ray:
            self.ray.shutdown()

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _node_accelerators(ray) -> list[tuple[str, str]]:
    """(accelerator type, node id) for every alive node that reports one."""
    out = []
    for node in ray.nodes():
        if node.get("Alive"):
            for key in node.get("Resources", {}):
                if key.startswith("accelerator_type:"):
                    out.append((key.partition(":")[2], node["NodeID"]))
    return out


def gpus_by_node(ray, arch: str | None = None) -> dict[str, float]:
    """{node id: GPUs} of the alive nodes, only those whose accelerator type is of `arch` if given.

    NOTE: Ray reports a node's GPU model as an `accelerator_type:<name>` resource; a node whose
    model is not in ACCELERATOR_ARCH is left out for an arch (the actor's own check would refuse
    it anyway)."""
    types = {}
    for t, node in _node_accelerators(ray):
        types.setdefault(node, set()).add(t)
    out = {}
    for node in ray.nodes():
        n = node.get("Resources", {}).get("GPU", 0)
        if not node.get("Alive") or n <= 0:
            continue
        if arch is None or any(ACCELERATOR_ARCH.get(t) == arch for t in types.get(node["NodeID"], ())):
            out[node["NodeID"]] = n
    return out


# ------------------------------------------------------------------------------------ build task

def _build_chunk(sources: list[str], arch: str, out_dir: str | None, jobs: int, timeout_s: float,
                 driver_node: str, ship: bool):
    """Runs as a Ray task: build.build_many on this node; (BuildResults, {hash: .so bytes}) with
    the bytes only when the driver is on another node (or ship is set)."""
    import ray
    from torch_htam import build
    results = build.build_many(sources, arch=arch, out_dir=out_dir, jobs=jobs, timeout_s=timeout_s)
    blobs = {}
    if ship or ray.get_runtime_context().get_node_id() != driver_node:
        blobs = {r.source_hash: Path(r.so_path).read_bytes() for r in results if r.ok and r.so_path}
    return results, blobs
