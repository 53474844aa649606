"""Crash/hang containment of WorkerPool, on CPU: the runner below is resolved in the child by name,
so a job can hang, raise, exit or segfault there while this process keeps going."""
import ctypes
import os
import time

import pytest

from concurrent.futures import Future

from torch_htam.worker import PAST_DEADLINE, WorkerPool, await_result

RUNNER = "test_worker:job"


def job(j: dict) -> dict:
    """Runs in the worker process."""
    do = j["do"]
    if do == "echo":
        return {"reason": "ok", "pid": os.getpid(), "value": j.get("value")}
    if do == "sleep":
        time.sleep(j.get("seconds", 3600))
        return {"reason": "ok", "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if do == "exit":
        os._exit(3)
    if do == "abort":
        os.abort()
    if do == "segfault":
        ctypes.string_at(0)
    if do == "raise":
        raise ValueError("boom in the worker")
    if do == "dead_context":
        return {"reason": "crash", "detail": "illegal address", "exit": True}
    if do == "env":
        return {"reason": "ok", "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if do == "spawn_sleeper":   # a child of the worker's own, as a build's ninja is
        import subprocess
        child = subprocess.Popen(["sleep", "600"])
        return {"reason": "ok", "child": child.pid}
    raise AssertionError(f"unknown job {do}")


@pytest.fixture
def pool():
    with WorkerPool(runner=RUNNER, timeout=2.0, devices=[None]) as p:
        yield p


def test_results_come_back_in_order(pool):
    res = pool.run_many([{"do": "echo", "value": i} for i in range(5)])
    assert [r["value"] for r in res] == list(range(5))
    assert len({r["pid"] for r in res}) == 1          # one worker, reused across jobs


@pytest.mark.parametrize("do, reason, words", [
    ("sleep", "timeout", "no result after 2 s"),
    ("exit", "crash", "exit code 3"),
    ("abort", "crash", "exit code -6"),
    ("segfault", "crash", "exit code -11"),
    ("raise", "crash", "boom in the worker"),
])
def test_bad_job_costs_one_result_and_the_worker_restarts(pool, do, reason, words):
    before = pool.submit({"do": "echo"}).result()
    bad = pool.submit({"do": do}).result()
    after = pool.submit({"do": "echo", "value": 7}).result()
    assert bad["reason"] == reason and words in bad["detail"]
    assert after == {"reason": "ok", "pid": after["pid"], "value": 7, "worker_s": after["worker_s"]}
    if do != "raise":    # an exception is caught in the child: same process keeps serving
        assert after["pid"] != before["pid"]
    else:
        assert after["pid"] == before["pid"]


def test_dead_context_result_restarts_the_worker(pool):
    first = pool.submit({"do": "echo"}).result()
    dead = pool.submit({"do": "dead_context"}).result()
    after = pool.submit({"do": "echo"}).result()
    assert dead["reason"] == "crash" and after["pid"] != first["pid"]


def test_per_job_timeout_overrides_the_pool_default(pool):
    pool.submit({"do": "echo"}).result()     # worker start-up is not part of a job's time
    t0 = time.perf_counter()
    res = pool.submit({"do": "sleep", "seconds": 5, "timeout": 0.5}).result()
    assert res["reason"] == "timeout" and time.perf_counter() - t0 < 2.0


def test_jobs_spread_over_workers_with_their_own_devices():
    with WorkerPool(runner=RUNNER, timeout=5.0, devices=["0", "1"]) as p:
        # two 2-second jobs at once: the second must go to the other (idle) worker
        slow = p.run_many([{"do": "sleep", "seconds": 2.0}, {"do": "sleep", "seconds": 2.0}])
        envs = p.run_many([{"do": "env"} for _ in range(4)])
    assert [r["reason"] for r in slow] == ["ok", "ok"]
    assert {r["cuda_visible"] for r in slow} == {"0", "1"}
    assert {e["cuda_visible"] for e in envs} <= {"0", "1"}


def test_close_kills_a_hung_job_quickly():
    p = WorkerPool(runner=RUNNER, timeout=600.0, devices=[None])
    fut = p.submit({"do": "sleep"})
    queued = p.submit({"do": "echo"})
    deadline = time.perf_counter() + 60
    while not fut.running() and time.perf_counter() < deadline:   # worker start-up first
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.perf_counter()
    p.close()
    assert time.perf_counter() - t0 < 10
    assert fut.result(timeout=5)["reason"] == "crash"
    assert queued.cancelled()


def test_a_job_is_waited_for_no_later_than_its_deadline():
    """A job that has not come back by the deadline (a worker still starting, say) is given up
    as past the deadline, not waited on; one that came back is returned as it is."""
    never = Future()
    t0 = time.perf_counter()
    assert await_result(never, time.monotonic() + 0.2, grace_s=0.1) == PAST_DEADLINE
    assert time.perf_counter() - t0 < 2.0 and never.cancelled()
    done = Future()
    done.set_result({"reason": "ok"})
    assert await_result(done, time.monotonic() - 100.0) == {"reason": "ok"}
    assert await_result(done, None) == {"reason": "ok"}


def test_stopping_a_worker_kills_what_it_started():
    """A killed worker takes its children with it (a launcher build's ninja, a candidate's nvcc
    would otherwise build on, orphaned)."""
    p = WorkerPool(runner=RUNNER, timeout=30.0, devices=[None])
    child = p.submit({"do": "spawn_sleeper"}).result(timeout=60)["child"]
    assert os.path.exists(f"/proc/{child}")
    p.close()
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_job_cut_at_optimize_s_deadline_says_deadline_not_timeout(pool):
    """The worker waits min(the job's timeout, the time left to optimize's deadline): a job stopped
    at the deadline is the budget's cut (reason "deadline", which the search learns nothing
    from); one stopped by its own timeout before the deadline is a timeout (a hang)."""
    pool.submit({"do": "echo"}).result()     # worker start-up first
    cut = pool.submit({"do": "sleep", "seconds": 30, "timeout": 20.0, "deadline": time.monotonic() + 0.5}).result()
    assert cut["reason"] == "deadline" and "no result after" in cut["detail"]
    hung = pool.submit({"do": "sleep", "seconds": 30, "timeout": 0.5, "deadline": time.monotonic() + 60}).result()
    assert hung["reason"] == "timeout"
