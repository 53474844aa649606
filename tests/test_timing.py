"""timing's side-by-side model timing: what every arm of a comparison gets (CPU: the CUDA-event
timer itself is replaced by a recorder)."""
import pytest

from torch_htam import timing


def test_time_many_rotates_the_order_so_no_arm_always_follows_the_same_one(monkeypatch):
    runs = []

    def fake_times(fn, inputs, iters, warmup):
        runs.append(fn)
        return [float(fn())] * iters
    monkeypatch.setattr(timing, "_times", fake_times)
    fns = {"a": lambda: 1, "b": lambda: 2, "c": lambda: 3}
    arms = timing.time_many(fns, (), iters=30, rounds=6)
    rounds = [runs[i:i + 3] for i in range(0, len(runs), 3)]
    assert all(sorted(r, key=id) == sorted(fns.values(), key=id) for r in rounds)   # each arm once a round
    before = {fn: {r[i - 1] for r in rounds for i in (1, 2) if r[i] is fn} for fn in fns.values()}
    assert len({r[0] for r in rounds}) == 3 and all(len(b) == 2 for b in before.values())
    assert {k: a.median_ms for k, a in arms.items()} == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert {k: a.round_ms for k, a in arms.items()} == {k: [v] * 6 for k, v in (("a", 1.0), ("b", 2.0), ("c", 3.0))}


class _FakeEvent:
    """torch.cuda.Event stand-in: elapsed time 1 ms."""
    def __init__(self, **kw):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


def test_timed_calls_run_with_the_cyclic_gc_paused_and_it_is_restored(monkeypatch):
    import gc
    import torch
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen = []
    assert gc.isenabled()
    times = timing._times(lambda: seen.append(gc.isenabled()), (), iters=4, warmup=2)
    assert times == [1.0] * 4 and seen == [True, True, False, False, False, False]
    assert gc.isenabled()
    gc.disable()
    try:
        with timing.gc_paused():
            pass
        assert not gc.isenabled()                 # a caller's choice is kept
    finally:
        gc.enable()
    try:
        with timing.gc_paused():
            raise KeyError
    except KeyError:
        pass
    assert gc.isenabled()


def test_paired_ratio_is_the_median_of_per_round_ratios():
    from torch_htam.timing import paired_ratio
    # the base's second round hit a slow spell: medians say 1.5x, rounds say 1.0x
    assert paired_ratio([4.0, 9.0, 6.0], [4.0, 6.0, 6.0]) == 1.0
    assert paired_ratio([2.0, 2.0], [1.0, 1.0]) == 2.0
    assert paired_ratio([], []) is None and paired_ratio([1.0], [0.0]) is None


def test_wait_for_quiet_host_waits_until_other_processes_leave_the_cores():
    loads, clock = iter([3.0, 2.0, 0.4, 0.1]), iter(range(100))
    load = timing.wait_for_quiet_host(10.0, sample=lambda: next(loads), clock=lambda: next(clock))
    assert load.quiet and load.others_cores == 0.4 and load.waited_s == 3


def test_wait_for_quiet_host_gives_up_at_its_limit_and_says_the_host_is_busy():
    clock = iter(range(100))
    load = timing.wait_for_quiet_host(5.0, sample=lambda: 4.0, clock=lambda: next(clock))
    assert not load.quiet and load.waited_s == 5 and load.others_cores == 4.0


def test_others_cores_sees_a_busy_process_and_not_this_one():
    import subprocess
    import sys
    import time
    if timing.others_cores(0.05) is None:
        pytest.skip("no /proc/stat here")
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:   # this process busy: not counted
        pass
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert timing.others_cores(0.5) >= 0.6
    finally:
        busy.kill()
        busy.wait()


def test_time_arms_times_each_arms_gpu_share_behind_a_sleep_on_a_gpu(monkeypatch):
    import torch
    sleeps = []
    monkeypatch.setattr(timing, "on_cuda", lambda inputs: True)
    monkeypatch.setattr(timing, "_sync_for", lambda inputs: lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append)
    monkeypatch.setattr(timing, "_sleep_cycles", lambda ms: ms)     # cycles = the ms asked for
    out = timing.time_arms({"a": lambda: None, "b": lambda: None}, (), iters=6, rounds=3)
    for t in out.values():
        assert t.device.median_ms == 1.0 and t.device.round_ms == [1.0] * 3
    # one sleep per arm and round, covering 1.5x the round's slowest synced call
    assert len(sleeps) == 6 and all(s > 0 for s in sleeps)


def test_time_arms_on_the_cpu_has_no_gpu_share():
    out = timing.time_arms({"a": lambda: None}, (), iters=4, rounds=2)
    assert out["a"].device is None and out["a"].latency.median_ms >= 0


@pytest.mark.gpu
def test_time_arms_device_time_leaves_out_the_hosts_share():
    """An arm that spends 3 ms on the host per call around a short kernel: its latency carries
    the host's 3 ms, its device time does not; a GPU-heavy arm's device time is most of its latency."""
    import time
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4096, 4096, device="cuda")

    def host_bound(x):
        time.sleep(0.003)
        return x[:8] + 1

    out = timing.time_arms({"host": host_bound, "gpu": lambda x: x @ x}, (x,), iters=10, rounds=5)
    assert out["host"].latency.median_ms > 3.0 and out["host"].device.median_ms < 1.0
    assert 0.5 * out["gpu"].latency.median_ms < out["gpu"].device.median_ms <= 1.05 * out["gpu"].latency.median_ms


def test_others_cores_counts_only_this_process_cpus():
    """A process pinned to other cores (a second benchmark beside this one) is not load here."""
    import os
    import subprocess
    import sys
    import time
    if timing.others_cores(0.05) is None or not hasattr(os, "sched_setaffinity") or len(timing.usable_cpus()) < 2:
        pytest.skip("needs /proc/stat, CPU affinity and two CPUs")
    cpus = timing.usable_cpus()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {cpus[0]})
        time.sleep(0.3)
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(cpus[1:]))
        try:
            apart = timing.others_cores(0.5)
        finally:
            os.sched_setaffinity(0, before)
        beside = timing.others_cores(0.5)
    finally:
        busy.kill()
        busy.wait()
    assert beside >= 0.6 and apart < 0.5


def test_a_decisions_timing_record_pairs_each_arm_with_the_first_round_by_round():
    """decide.timing_record: each arm's medians, and from the second arm on the median of the
    first arm's round times over its own (above 1: faster than the first)."""
    from torch_htam.decide import Arm, ArmKind, timing_record
    from torch_htam.timing import ArmTime, ArmTimes

    def t(rounds):
        a = ArmTime(sorted(rounds)[len(rounds) // 2], min(rounds), max(rounds), round_ms=list(rounds))
        return ArmTimes(a, a)
    rec = timing_record([Arm(ArmKind.COMPILE), Arm(ArmKind.WRAPPER)],
                        [t([2.0, 4.0, 2.0, 4.0, 2.0]), t([1.0, 2.0, 1.0, 2.0, 1.0])], "high end")
    assert rec["at"] == "high end"
    first, second = rec["arms"]
    assert "latency_vs_first" not in first and second["latency_vs_first"] == 2.0
    assert second["throughput_vs_first"] == 2.0 and second["device_ms"] is None
    assert [a["arm"] for a in rec["arms"]] == ["torch.compile", "torch.compile with Inductor's C++ wrapper"]


def test_a_few_late_host_wakeups_do_not_decide_the_timing():
    """Host noise only lengthens some reps' drains (here most of them, as under parallel builds);
    the events' median stands."""
    t = timing.reported([0.010] * 30, [0.004] * 12 + [0.030] * 18)
    assert t.median_ms == pytest.approx(0.010) and t.event_ms == pytest.approx(0.010)


def test_work_hidden_off_the_stream_decides_the_timing():
    """A side stream's work lengthens every rep's drain: the drain decides, and the spread is its own."""
    t = timing.reported([0.010] * 30, [0.100 + 0.001 * i for i in range(30)])
    assert t.median_ms == pytest.approx(t.drain_ms) and t.median_ms > 0.1
    assert t.p20_ms >= 0.1 and t.n == 30
