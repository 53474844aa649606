"""Isolated worker processes: a candidate kernel can hang, crash or kill its CUDA context; that must
cost one job, never the caller's process or the search.

One worker process per visible GPU (CUDA_VISIBLE_DEVICES set in its environment before the
interpreter starts). Jobs are plain picklable dicts sent over a pipe; the child resolves `runner`
("module:function") and returns its dict. The parent enforces a wall timeout per job and restarts
a worker that timed out, died (segfault, abort, os._exit) or reported a dead CUDA context
(result["exit"] is true).

NOTE: workers are `python -m torch_htam.worker` subprocesses rather than multiprocessing 'spawn'
children: spawn re-imports the caller's __main__, which breaks user scripts without an
`if __name__ == "__main__"` guard. The pipe is a multiprocessing Connection all the same.

    >>> with WorkerPool(timeout=30) as pool:
    ...     results = pool.run_many([{"kind": "evaluate", ...}, ...])
    >>> results[0]["reason"]
    'ok'
"""
from __future__ import annotations

import importlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection, Pipe

from torch_htam.deadline import passed

DEFAULT_RUNNER = "torch_htam.evaluation:run_job"
START_TIMEOUT_S = 180.0    # importing torch + CUDA init on a cold machine


def _visible_devices() -> list[str]:
    """GPU ids the pool may use: from CUDA_VISIBLE_DEVICES if set, else 0..device_count-1."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())]


class _Worker:
    """One child process bound to one device; owned and driven by a single pool thread."""

    def __init__(self, device: str | None, runner: str):
        self.device, self.runner = device, runner
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="htam_worker_", suffix=".log", delete=False)

    def start(self) -> None:
        parent, child = Pipe()
        env = dict(os.environ)
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
        # The child imports whatever the parent can (editable installs, test modules).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.log.seek(0)
        self.log.truncate()
        # NOTE: a session of its own, so stop() kills what the child started too (a launcher
        # build's ninja and c++, a candidate's nvcc): killed alone, it left them building on
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch_htam.worker", str(child.fileno()), self.runner],
            pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, start_new_session=True)
        child.close()
        self.conn = parent
        if not self.conn.poll(START_TIMEOUT_S) or self._recv() != ("ready", None):
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"worker for device {self.device} did not start; its log ends:\n{tail}")

    def _recv(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            return None

    def run(self, job: dict, timeout: float) -> dict:
        """Send one job and wait; on timeout/death the process is gone when this returns."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.conn.send(job)
        except (BrokenPipeError, OSError):
            self.stop()
            return {"reason": "crash", "detail": "worker died before the job was sent"}
        if not self.conn.poll(timeout):
            self.stop()
            return {"reason": "timeout", "detail": f"no result after {timeout:g} s; worker killed"}
        msg = self._recv()
        if msg is None:   # EOF: the process died mid-job
            code = self.proc.wait()
            detail = f"worker died (exit code {code}); its log ends:\n{self.log_tail()}"
            self.stop()
            return {"reason": "crash", "detail": detail}
        kind, payload = msg
        if kind == "error":
            return {"reason": "crash", "detail": f"job raised in the worker:\n{payload}"}
        if payload.get("exit"):   # dead CUDA context: the child is exiting; the next job restarts it
            self.stop()
        return payload

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log.name, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log.name) - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a worker and every process of its session (start_new_session in _Worker.start), while
    it is not yet reaped: until then its pid, the group's id, cannot name another process's group."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# Seconds a job is waited for past its deadline: its worker cuts it at the deadline (job_timeout)
# and is killed, which takes a moment.
JOB_GRACE_S = 5.0


def await_result(fut: Future, deadline_at: float | None, grace_s: float = JOB_GRACE_S) -> dict:
    """A job's result, waited for no later than deadline_at (a time.monotonic(); None: no limit)
    plus grace_s for a job cut at it; past that, PAST_DEADLINE (the job cancelled where it has not
    begun). NOTE: a pool starts its workers eagerly and a start may take START_TIMEOUT_S; a job
    queued behind one held a search 175 s past its 60 s budget (zoo-20261128-043036, ResNet-50)."""
    timeout = None if deadline_at is None else max(deadline_at - time.monotonic(), 0.0) + grace_s
    try:
        return fut.result(timeout=timeout)
    except FutureTimeout:
        fut.cancel()
        return dict(PAST_DEADLINE)

# A job that reached a worker after optimize's deadline: never run.
PAST_DEADLINE = {"reason": "deadline", "detail": "optimize's time budget ran out first"}


def cut_at_deadline(res: dict, job: dict) -> dict:
    """res as the search must read it: a "timeout" that came back once optimize's deadline
    (job["deadline"], a time.monotonic()) had passed is the budget's cut, reason "deadline", not the
    kernel's hang. Why: a timeout is a crash-class failure (state.FAILURE_CLASS) that the HTG
    learns against the candidate's strategies; a cut says nothing about them. A cold vision search
    at a 150 s budget (H200) had its first candidate cut at 24 s, recorded as a timeout."""
    at = job.get("deadline")
    if res.get("reason") != "timeout" or not passed(None if at is None else float(at)):
        return res
    return {**res, "reason": "deadline", "detail": f"cut at optimize's deadline ({res.get('detail', '')})"}


def job_timeout(job: dict, default: float) -> float | None:
    """The seconds a job may run: its "timeout" (else `default`), cut at its "deadline" (a
    time.monotonic() of this host, optimize's); None where the deadline has passed."""
    timeout = float(job.get("timeout", default))
    if job.get("deadline") is None:
        return timeout
    left = float(job["deadline"]) - time.monotonic()
    return None if left <= 0 else min(timeout, left)


def serve_jobs(jobs: queue.Queue, run, default_timeout: float) -> None:
    """One worker's job loop (WorkerPool's and RayPool's), until a None: each (job, Future) runs as
    run(job, seconds) for its job_timeout, or reports PAST_DEADLINE unrun once optimize's deadline
    has passed; a run that raises (the worker could not even start) reports "crash" and the loop
    goes on; results are cut at the deadline (cut_at_deadline) and carry "worker_s"."""
    while True:
        item = jobs.get()
        if item is None:
            return
        job, fut = item
        if not fut.set_running_or_notify_cancel():
            continue
        t0 = time.perf_counter()
        timeout = job_timeout(job, default_timeout)
        if timeout is None:
            fut.set_result(dict(PAST_DEADLINE))
            continue
        try:
            res = run(job, timeout)
        except Exception as e:   # noqa: BLE001 -- report, keep serving
            res = {"reason": "crash", "detail": f"{type(e).__name__}: {e}"}
        res = cut_at_deadline(res, job)
        res.setdefault("worker_s", time.perf_counter() - t0)
        fut.set_result(res)


def cancel_queued(jobs: queue.Queue) -> None:
    """Cancel every (job, Future) still waiting in a pool's queue (the stop markers, None, stay
    out of it: they are put after this)."""
    while True:
        try:
            item = jobs.get_nowait()
        except queue.Empty:
            return
        if item is not None:
            item[1].cancel()


class WorkerPool:
    """n worker processes (default: one per visible GPU), each fed by its own thread from one queue.

    timeout: wall seconds per job (a job dict may override it with "timeout"). devices: GPU ids
    for the workers; None devices run without a GPU binding (CPU tests).

        >>> with WorkerPool() as pool:
        ...     fut = pool.submit({"kind": "evaluate", ...})
        ...     fut.result()["reason"]
        'ok'
    """

    def __init__(self, n: int | None = None, runner: str = DEFAULT_RUNNER, timeout: float = 60.0,
                 devices: list[str | None] | None = None):
        if devices is None:
            vis = _visible_devices()
            n = n or len(vis)
            if n < 1:
                raise RuntimeError("WorkerPool found no CUDA device; pass n= and devices=[None] for CPU jobs")
            devices = [vis[i % len(vis)] if vis else None for i in range(n)]
        self.timeout = timeout
        self._jobs: queue.Queue = queue.Queue()
        self._workers = [_Worker(d, runner) for d in devices]
        self._threads = [threading.Thread(target=self._serve, args=(w,), daemon=True) for w in self._workers]
        for t in self._threads:
            t.start()

    def _serve(self, w: _Worker) -> None:
        try:
            w.start()   # eagerly, so workers are warm when the first jobs arrive
        except RuntimeError:
            pass        # retried by the first job, which then reports the failure
        serve_jobs(self._jobs, w.run, self.timeout)
        w.close()

    def submit(self, job: dict) -> Future:
        """Queue one job; the Future's result is the runner's dict, or {"reason": "timeout"|"crash", ...}."""
        fut: Future = Future()
        self._jobs.put((job, fut))
        return fut

    def run_many(self, jobs: list[dict]) -> list[dict]:
        """Run jobs across all workers; results in the jobs' order."""
        return [f.result() for f in [self.submit(j) for j in jobs]]

    def close(self) -> None:
        """Cancel queued jobs, kill running ones (close must not wait on a hang), stop the workers."""
        cancel_queued(self._jobs)
        for _ in self._threads:
            self._jobs.put(None)
        for w in self._workers:
            proc = w.proc
            if proc is not None:
                _kill_group(proc)   # its thread sees EOF, reports "crash", then takes its None and exits
        for t in self._threads:
            t.join(timeout=30)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------- child side

def _resolve(runner: str):
    mod, _, fn = runner.partition(":")
    return getattr(importlib.import_module(mod), fn)


def _child_main(fd: int, runner: str) -> None:
    conn = Connection(fd)
    run = _resolve(runner)
    prepare = getattr(sys.modules[run.__module__], "prepare_worker", None)
    if prepare is not None:
        prepare()   # e.g. CUDA init, so the first job's timeout doesn't pay for it
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):   # the parent went away
            return
        try:
            res = run(job)
            conn.send(("ok", res))
        except Exception:
            conn.send(("error", traceback.format_exc()[-4000:]))
            continue
        if res.get("exit"):
            os._exit(0)   # NOTE: no cleanup; a dead CUDA context can hang in teardown


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), sys.argv[2])
