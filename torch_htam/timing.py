"""Timing a GPU callable honestly, and the roofline it cannot beat.

`time_fn` warms up, then per repetition: rotates to another pre-made input set, flushes the L2 by
writing a buffer twice its size, and times fn two ways.

- device: CUDA events around fn, with the GPU held busy by a sleep kernel queued first, so the
  events see the GPU work of fn on the current stream and none of the host time it takes to issue
  it. Without the sleep a 10 us kernel reads as 30-50 us on an H100 host (Python + launch), and a
  one-kernel candidate and a three-kernel eager reference compare their host paths, not their GPU
  work. The host path is judged where it matters, end to end (pipeline's guard), not per kernel.
- drain: the host clock from fn's return to a device-wide synchronize, less the same clock for
  an empty kernel (its launch reaching the GPU, and the synchronize's wake-up). It sees work on
  every stream, so a kernel hiding work on a side stream is caught: the current stream's events
  stay short while the drain does not.

The result is the larger of the events' median and the drain's DRAIN_Q quantile. The drain's low
quantile, not its median: host noise (a busy CPU waking the synchronizing thread late) only adds to
a drain, while work hidden on a side stream is there in every repetition.

`roofline_ms` is the least time the task's bytes and flops allow on the measured ceilings; a
kernel timed well under it fooled the timer.

    >>> t = time_fn(lambda s: kernel(*s), lambda: (inputs(), outputs()))
    >>> t.median_ms, t.spread
    (0.0513, 0.02)
"""
from __future__ import annotations

import contextlib
import enum
import functools
import gc
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from torch_htam import paths

ROOFLINE_SLACK = 0.9   # kernel_ms < 0.9 * roofline_ms -> "above_roofline"
DRAIN_Q = 0.2          # the drain's quantile that time_fn reports (module docstring says why)


@dataclass
class Timing:
    median_ms: float    # max(event median, drain DRAIN_Q quantile)
    p20_ms: float
    p80_ms: float
    n: int              # timed repetitions
    event_ms: float = 0.0   # median by CUDA events on the current stream, host issue hidden
    drain_ms: float = 0.0   # DRAIN_Q quantile of host time from fn's return to device idle, less its floor

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the run's noise, relative."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else 0.0


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def time_fn(fn: Callable[[Any], Any], make_inputs: Callable[[], Any], warmup: int = 5, reps: int = 30,
            flush_l2: bool = True, n_sets: int = 3) -> Timing:
    """Time fn(inputs) on the current CUDA device; make_inputs() builds one fresh input set.

    n_sets sets are made up front and rotated, so a rep never starts with its inputs freshly
    written by the previous rep (and a cache keyed on pointers sees several of them).

        >>> x = torch.randn(4096, 4096, device="cuda")
        >>> time_fn(lambda s: torch.relu(s[0]), lambda: (torch.randn_like(x),)).median_ms
        0.105
    """
    import torch
    sets = [make_inputs() for _ in range(max(1, n_sets))]
    flush = _flush_buffer() if flush_l2 else None
    hosts = []
    for i in range(warmup):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(sets[i % len(sets)])
        hosts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    floor = _drain_floor_ms()
    # The sleep must outlast fn's issue on the host, or host gaps leak into the events.
    sleep = _sleep_cycles(3 * 1e3 * statistics.median(hosts) + 0.05)
    reps = _reps_for(fn, sets[0], reps)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with gc_paused():
        events, drains = _time_reps(fn, sets, flush, sleep, floor, reps, start, end)
    return reported(events, drains)


def reported(events: list[float], drains: list[float]) -> Timing:
    """The Timing of one run from its per-rep event and drain ms: the events' median, unless the
    drain's DRAIN_Q quantile is larger (work the events did not see).

        >>> reported([1.0] * 10, [0.2] * 8 + [5.0] * 2).median_ms    # two reps the host woke late
        1.0
        >>> reported([0.1] * 10, [1.0] * 10).median_ms               # work on another stream
        1.0
    """
    ev, drain = statistics.median(events), quantile(drains, DRAIN_Q)
    # NOTE: quantiles come from whichever series decided, so spread stays meaningful.
    series = events if ev >= drain else drains
    return Timing(max(ev, drain), quantile(series, 0.2), quantile(series, 0.8), len(events), ev, drain)


def _time_reps(fn, sets, flush, sleep: int, floor: float, reps: int, start, end):
    """time_fn's timed loop: (event ms, drain ms) per rep."""
    import torch
    events, drains = [], []
    for i in range(reps):
        s = sets[i % len(sets)]
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep)
        start.record()
        fn(s)
        end.record()
        torch.cuda.synchronize()
        events.append(start.elapsed_time(end))
        if flush is not None:
            flush.zero_()
        torch.cuda.synchronize()
        fn(s)
        t1 = time.perf_counter()
        torch.cuda.synchronize()   # device-wide: waits for every stream, not only the current one
        drains.append(max(0.0, (time.perf_counter() - t1) * 1e3 - floor))
    return events, drains


@functools.lru_cache(maxsize=None)
def _cycles_per_ms() -> float:
    """GPU clock cycles of torch.cuda._sleep per ms, measured once per process."""
    import torch
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 2_000_000
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return n / max(start.elapsed_time(end), 1e-3)


def _sleep_cycles(ms: float) -> int:
    """Cycles for a sleep of about ms (capped at 20 ms: a slower issue is itself the problem)."""
    return int(min(ms, 20.0) * _cycles_per_ms())


SHORT_MS = 0.2      # under this, one call is dominated by launch and timer noise
SHORT_REPS = 100


def _reps_for(fn, inputs, reps: int) -> int:
    """More reps for short calls: their medians move by tens of percent between runs at 30 reps
    (seen on an H100 for 40-90 us kernels), and 100 more reps of 0.1 ms cost 10 ms."""
    import torch
    t0 = time.perf_counter()
    fn(inputs)
    torch.cuda.synchronize()
    return max(reps, SHORT_REPS) if (time.perf_counter() - t0) * 1e3 < SHORT_MS else reps


def _flush_buffer():
    import torch
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size or (50 << 20)
    return torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")


def _drain_floor_ms(n: int = 20) -> float:
    """Median host time from an empty kernel's launch returning to a device-wide synchronize()
    returning: the drain's floor, what any launch costs it beyond the kernel's own work.

    NOTE: an idle synchronize as the floor leaves the launch's trip to the GPU in every drain. On an
    H200, 12 timings of one 6-10 us reference then varied by up to 1.51x with the drain's 20th
    percentile (1.71x with its median); with this floor and the 20th percentile, by at most 1.024x
    (docs/experiments/timing_noise/drain_rule-h200.txt)."""
    import torch
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda._sleep(1)
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


# ---------------------------------------------------------------------------------- roofline

@dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings. bandwidth: B/s of a large device-to-device copy (read + write);
    fp32/tf32/bf16: FLOP/s of torch.matmul; l2_bytes: L2 size."""
    bandwidth: float
    fp32: float
    tf32: float
    bf16: float
    l2_bytes: int = 0

    def flops(self, precision: str) -> float:
        """Peak for a policy name ("fp32" | "tf32" | "fp16" | "bf16"); fp16 shares bf16's rate."""
        return {"fp32": self.fp32, "tf32": self.tf32, "fp16": self.bf16, "bf16": self.bf16}[precision]

    def to_json(self) -> dict:
        return asdict(self)


def roofline_ms(task, ceilings: Ceilings, precision: str = "fp32") -> float:
    """Least possible time for the task: max(bytes / bandwidth, flops / peak), in ms.

    NOTE: outputs that fit in half the L2 can stay there past the end of the timed region (the
    write-back to DRAM happens later), so their bytes are not charged: a roofline must never be
    tighter than what an honest kernel can reach.

        >>> roofline_ms(task, Ceilings(bandwidth=3e12, fp32=5e13, tf32=4e14, bf16=7e14))
        0.0447
    """
    out_bytes = sum(s.kernel_nbytes for s in task.outputs)
    bytes_ = task.bytes
    if ceilings.l2_bytes and out_bytes <= ceilings.l2_bytes // 2:
        bytes_ = max(0.0, bytes_ - out_bytes)
    t_mem = bytes_ / ceilings.bandwidth if ceilings.bandwidth > 0 else 0.0
    peak = ceilings.flops(precision)
    t_flop = task.flops / peak if peak > 0 else 0.0
    return 1e3 * max(t_mem, t_flop)


def above_roofline(kernel_ms: float, roof_ms: float) -> bool:
    return roof_ms > 0 and kernel_ms < ROOFLINE_SLACK * roof_ms


def measure_ceilings(device: int = 0, refresh: bool = False) -> Ceilings:
    """Bandwidth and matmul peaks of this GPU, cached in paths.arch_dir(arch)/ceilings.json.

    Takes a few seconds the first time per arch (a 1 GiB copy; 8192^3 fp32 / tf32 / bf16 GEMMs).

        >>> measure_ceilings().bandwidth / 1e12    # TB/s on an H100 SXM
        2.9
    """
    import torch
    from torch_htam import gpu
    info = gpu.detect(device)
    if info is None:
        raise RuntimeError("measure_ceilings needs a CUDA device; none is visible to torch")
    path = paths.arch_dir(info.arch) / "ceilings.json"
    if path.exists() and not refresh:
        return Ceilings(**json.loads(path.read_text()))
    with torch.cuda.device(device):
        c = Ceilings(_copy_bandwidth(), _matmul_flops(torch.float32, False),
                     _matmul_flops(torch.float32, True), _matmul_flops(torch.bfloat16, False),
                     info.l2_bytes)
    torch.cuda.empty_cache()   # ~3 GiB of probe buffers: give them back to other processes
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(c.to_json(), indent=1))
    tmp.replace(path)   # atomic: concurrent workers never read half a file
    return c


def _best_ms(fn, reps: int = 10) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    start, end, ts = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ts.append(start.elapsed_time(end))
    return min(ts)   # a ceiling is the best the hardware did, not the typical


def _copy_bandwidth(nbytes: int = 1 << 30) -> float:
    import torch
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = _best_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3)   # read + write


def copy_ms(nbytes: int, flush_l2: bool = True) -> float:
    """Median ms of a device-to-device copy moving nbytes in all (nbytes / 2 read, nbytes / 2
    written), timed by time_fn exactly as kernels are (L2 flushed, sleep before the start event).

    The size-matched ceiling of a memory-bound kernel: a 12 MB kernel cannot run at the 1 GiB copy's
    rate, because the launch, the ramp-up of bytes in flight and the write-back of the L2 flush's
    dirty lines are fixed costs that a small kernel pays the same as a copy of its size.

        >>> copy_ms(3 * 8 * 512 * 768 * 4)    # the bytes of x * 0.5 + y at [8, 512, 768] fp32
    """
    import torch
    n = max(1, int(nbytes) // 8)   # float32 elements per side (task.bytes is a float)
    return time_fn(lambda s: s[1].copy_(s[0]),
                   lambda: (torch.empty(n, device="cuda").fill_(1.0), torch.empty(n, device="cuda")),
                   flush_l2=flush_l2).median_ms


def _matmul_flops(dtype, tf32: bool, n: int = 8192) -> float:
    import torch
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    from torch_htam.policy import tf32_switches
    with tf32_switches(tf32):
        ms = _best_ms(lambda: torch.matmul(a, b), reps=5)
    return 2 * n ** 3 / (ms * 1e-3)


# ---- whole models: callables timed side by side ---------------------------------------------

@dataclass
class ArmTime:
    median_ms: float
    p20_ms: float
    p80_ms: float
    setup_s: float = 0.0     # compile / optimize time before the first timed call
    # time_many: the median of each round, in the order run: a steady offset between two arms
    # shows in every round, drift or a disturbance in a few
    round_ms: list[float] = field(default_factory=list)


def paired_ratio(base_rounds: list[float], ours_rounds: list[float]) -> float | None:
    """base / ours, the median over rounds of each round's ratio (time_many's round_ms): a paired
    comparison. None without rounds.

    NOTE: on a host-bound model a noisy host moves whole rounds (ResNet-50 bf16's eager round
    medians ran from 4.8 to 14.2 ms in one process, bench_models-20261124-070215.json), and the two arms of a
    round ran next to each other, so a round's ratio cancels what the process's medians do not.

        >>> paired_ratio([4.0, 9.0, 4.2], [4.0, 4.5, 4.0])
        1.05
    """
    pairs = [b / o for b, o in zip(base_rounds, ours_rounds) if o > 0]
    return statistics.median(pairs) if pairs else None


def time_model(fn, inputs: tuple, iters: int = 50, warmup: int = 5) -> ArmTime:
    """Median of `iters` calls, each bracketed by CUDA events, after `warmup` calls (ms)."""
    return _arm(_times(fn, inputs, iters, warmup))


def time_pair(fn_a, fn_b, inputs: tuple, iters: int = 50, rounds: int = 5) -> tuple[ArmTime, ArmTime]:
    """Two callables timed in alternating rounds of iters/rounds calls each, so that clock and
    thermal drift over the run hit both alike (ms).

        >>> eager, ours = time_pair(model.forward.htam.original, model, (x,))
    """
    arms = time_many({"a": fn_a, "b": fn_b}, inputs, iters, rounds)
    return arms["a"], arms["b"]


def time_many(fns: dict, inputs: tuple, iters: int = 50, rounds: int = 5) -> dict[str, ArmTime]:
    """Several callables timed round-robin, iters/rounds calls each per round (see time_pair).

    NOTE: the order of the arms rotates each round and reverses every other round, and each arm's
    first calls of a round go untimed: an arm timed right after another pays for the CPU caches and allocator state that
    one left behind, which matters most for host-bound models, so no arm may always follow the
    same one.
    """
    times: dict[str, list[list[float]]] = {k: [] for k in fns}
    per = max(1, iters // rounds)
    order = list(fns)
    with gc_paused():
        for r in range(rounds):
            turn = order[r % len(order):] + order[: r % len(order)]
            for k in (turn if r % 2 == 0 else turn[::-1]):
                times[k].append(_times(fns[k], inputs, per, warmup=3))
    arms = {k: _arm([t for rnd in v for t in rnd]) for k, v in times.items()}
    for k, a in arms.items():
        a.round_ms = [statistics.median(rnd) for rnd in times[k]]
    return arms


def _times(fn, inputs: tuple, iters: int, warmup: int) -> list[float]:
    import torch
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*inputs)
        torch.cuda.synchronize()
        times = []
        with gc_paused():
            for _ in range(iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*inputs)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
    return times


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic GC off for the block (timeit's practice); nested blocks change nothing.

    NOTE: a host-bound model's call time is its Python time, and a gen-2 collection lands in
    whichever call crosses the allocation threshold, costing in proportion to every object the
    process holds (compiled graphs, captured models): one arm would pay for what the process
    holds. No collection is forced first (its cost grows with what the process holds); the
    garbage of the timed calls is collected after. This alone did not narrow bench_models'
    default-mode spreads (bench/findings.md).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _arm(times: list[float]) -> ArmTime:
    if len(times) < 2:
        return ArmTime(times[0], times[0], times[0])
    q = statistics.quantiles(times, n=5)
    return ArmTime(statistics.median(times), q[0], q[-1])


# ---- what a user sees: synced latency and back-to-back throughput --------------------------------

class GradMode(enum.Enum):
    """The caller's autograd mode, which optimize compiles and times in: Dynamo guards on it, so a
    model compiled under inference_mode and called under no_grad compiles again on that call."""
    INFERENCE = "inference_mode"
    NO_GRAD = "no_grad"
    GRAD = "grad"

    @staticmethod
    def current() -> "GradMode":
        import torch
        if torch.is_inference_mode_enabled():
            return GradMode.INFERENCE
        return GradMode.GRAD if torch.is_grad_enabled() else GradMode.NO_GRAD

    def enter(self):
        """A context manager that puts this mode on."""
        import torch
        if self is GradMode.INFERENCE:
            return torch.inference_mode()
        return torch.no_grad() if self is GradMode.NO_GRAD else torch.enable_grad()


@dataclass
class ArmTimes:
    """One arm timed both ways a serving loop can see it (ms a call).

    latency: each call synchronized before and after (one request on an idle device).
    throughput: THROUGHPUT_CALLS calls back to back, then one synchronize, divided by the calls
    (a loop that keeps the device fed; host time per call hides behind the device's).
    """
    latency: ArmTime
    throughput: ArmTime
    device: ArmTime | None = None   # GPU time of one call, host issue hidden (inputs on a GPU)


THROUGHPUT_CALLS = 8


def time_arms(fns: dict, inputs: tuple, iters: int = 45, rounds: int = 15,
              grad: GradMode = GradMode.INFERENCE) -> dict[str, ArmTimes]:
    """Callables timed round-robin both ways (ArmTimes), in `grad` mode, with the rotation of
    time_many. Per round and arm: 2 untimed calls, iters/rounds synced calls, then one batch of
    THROUGHPUT_CALLS back-to-back calls. The host clock times both (CUDA or CPU alike).

    NOTE: a guard that timed synced latency alone read 4.1-4.5 ms a call for torch.compile of a
    decoder whose back-to-back calls took 2.6 ms: a choice must hold up both ways.

        >>> t = time_arms({"compile": compiled, "ours": ours}, (x,), grad=GradMode.current())
        >>> t["ours"].throughput.median_ms
    """
    lat: dict[str, list[list[float]]] = {k: [] for k in fns}
    thr: dict[str, list[float]] = {k: [] for k in fns}
    dev: dict[str, list[float]] = {k: [] for k in fns}
    per, order = max(1, iters // rounds), list(fns)
    sync, cuda = _sync_for(inputs), on_cuda(inputs)
    with grad.enter(), gc_paused():
        for r in range(rounds):
            turn = order[r % len(order):] + order[: r % len(order)]
            for k in (turn if r % 2 == 0 else turn[::-1]):
                lat[k].append(_synced(fns[k], inputs, per, sync))
                thr[k].append(_back_to_back(fns[k], inputs, THROUGHPUT_CALLS, sync))
                if cuda:
                    dev[k].append(_device_ms(fns[k], inputs, 1.5 * max(lat[k][-1])))
    out = {}
    for k in fns:
        latency = _arm([t for rnd in lat[k] for t in rnd])
        latency.round_ms = [statistics.median(rnd) for rnd in lat[k]]
        throughput = _arm(thr[k])
        throughput.round_ms = list(thr[k])
        device = _arm(dev[k]) if dev[k] else None
        if device is not None:
            device.round_ms = list(dev[k])
        out[k] = ArmTimes(latency, throughput, device)
    return out


def _device_ms(fn, inputs: tuple, cover_ms: float) -> float:
    """GPU ms of one call of fn: CUDA events around it on the current stream, behind a sleep
    kernel of cover_ms (capped at 20 ms) so that the GPU runs the call's work back to back
    while the host issues it. Where the synced latency is well above it, the call is bound by
    its host time."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(_sleep_cycles(cover_ms))
    start.record()
    fn(*inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


# ---- a quiet host before timing a host-bound model ----------------------------------------------

# A host-bound model's call time is Python's, so CPU taken by other processes goes into the arm
# whose rounds it overlaps. NOTE: on an H100 host, ResNet-50 bf16's torch.compile (b32) timed
# 3.0 ms on a quiet host, 3.6-3.7 ms while nvcc builds ran, and 4.4 ms (p80 4.8) while Inductor's
# 16 compile workers started up after a trial's compile (they quiesce after 60 s idle and restart
# on the next compile): a kernel arm's gain smaller than that goes unseen.
QUIET_CORES = 1.0      # other processes' CPU use (cores) under which the host counts as quiet
QUIET_WINDOW_S = 0.25  # one sample of /proc/stat
QUIET_MAX_S = 20.0     # the longest wait for quiet before timing anyway


@dataclass
class HostLoad:
    """Other processes' CPU use over the last sampled window, and the seconds waited for it to
    fall under QUIET_CORES. others_cores is None where /proc/stat is not readable (not Linux)."""
    others_cores: float | None
    waited_s: float

    @property
    def quiet(self) -> bool:
        return self.others_cores is None or self.others_cores < QUIET_CORES


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container's or `taskset`'s share of the
    host), else all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_ticks(cpus: list[int]) -> tuple[int, int, int] | None:
    """(busy ticks of `cpus`, all ticks of `cpus`, this process's ticks), or None without /proc.
    /proc/stat's cpuN lines: user nice system idle iowait irq softirq steal [guest guest_nice]
    (guest time is counted inside user); /proc/self/stat: utime and stime, fields 14 and 15.
    Only this process's CPUs count: work another process runs on cores this one cannot use (a
    second benchmark pinned beside it) takes none of its host time."""
    want = {f"cpu{i}" for i in cpus}
    busy = total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name in want:
                    t = [int(x) for x in fields[:8]]
                    busy, total = busy + sum(t) - t[3] - t[4], total + sum(t)
        with open("/proc/self/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, int(rest[11]) + int(rest[12])) if total else None


def others_cores(window_s: float = QUIET_WINDOW_S, sleep=time.sleep) -> float | None:
    """CPU cores of this process's share used by other processes over the next window_s seconds."""
    cpus = usable_cpus()
    a = _cpu_ticks(cpus)
    sleep(window_s)
    b = _cpu_ticks(cpus)
    if a is None or b is None or b[1] <= a[1]:
        return None
    return max(0.0, (b[0] - a[0]) - (b[2] - a[2])) * len(cpus) / (b[1] - a[1])


def wait_for_quiet_host(max_s: float = QUIET_MAX_S, sample=others_cores, clock=time.monotonic) -> HostLoad:
    """Sample other processes' CPU use until it falls under QUIET_CORES or max_s has passed."""
    t0 = clock()
    while True:
        load = sample()
        waited = clock() - t0
        if load is None or load < QUIET_CORES or waited >= max_s:
            return HostLoad(load, waited)


def on_cuda(inputs: tuple) -> bool:
    """Whether any input tensor lives on a GPU."""
    import torch
    from torch.utils import _pytree as pytree
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in pytree.tree_leaves(inputs))


def _sync_for(inputs: tuple) -> Callable[[], None]:
    """torch.cuda.synchronize where the inputs live on a GPU, else nothing to wait for."""
    import torch
    return torch.cuda.synchronize if on_cuda(inputs) else (lambda: None)


def _synced(fn, inputs: tuple, n: int, sync) -> list[float]:
    for _ in range(2):
        fn(*inputs)
    sync()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(*inputs)
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _back_to_back(fn, inputs: tuple, n: int, sync) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    sync()
    return (time.perf_counter() - t0) * 1e3 / n
