"""The one decision: what runs the user's model, chosen from arms timed side by side.

Arms (ArmKind): torch.compile of the model as nn.Module.compile traces it (the floor), the same
with Inductor's C++ wrapper (a host-bound call on a GPU, no CUDA graphs), Inductor on our
re-exported graph, torch.compile with channels-last convs (symbolic conv sizes), torch.compile
with a subset of our kernels inside Inductor's graph (built on the fastest of those; the C++
wrapper only on graphs without our kernels), the replay of the captured graph with our kernels,
and the model's original forward. Each arm is built and warmed in its own try: an arm that fails
(a compile error, a kernel that fails at run time) is dropped with its reason, never the run.

The floor by construction: with compile=True, torch.compile is the first arm and stays the choice
unless another arm beats it beyond noise on one timing and is no worse beyond noise on the other
(synced latency and back-to-back throughput, timing.time_arms). Only when torch.compile itself
fails does the original forward stay, and the decision says so.

    >>> d = decide(model, inputs, cfg, found, kernels, deadline)
    >>> d.chosen.kind, d.outcome, d.reason
    (<ArmKind.KERNELS: ...>, <Outcome.KERNELS: ...>, '2 of 3 kernels: 1.412 ms against ...')
    >>> install(model, d, found, kernels)       # the model runs the chosen arm
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from torch_htam import build
from torch_htam.serving import (BucketSplit, ExampleSplit, at_size, common_sizes, entries_kept, first_call_s,
                                has_conv, held_sizes, high_end_inputs, one_range, prime, served_sizes,
                                size_one_inputs, split_at_example)
from torch_htam.timing import ArmTimes, GradMode, quantile

log = logging.getLogger("torch_htam")

# The decision's timing: ITERS synced calls per arm in ROUNDS rotating rounds (plus a batch of
# back-to-back calls per round, timing.time_arms).
ITERS, ROUNDS = 45, 15
# NOTE: a choice is kept only if it wins by more than the timing's noise. GPT-2 bf16 under
# torch.compile is host-bound on an H100 (2.7 ms of device time in 4.2-6.9 ms a call, moving by
# 1-2 ms between runs): a guard that took any lower median kept 24 swaps that the same run's
# interleaved benchmark then measured at 0.92x of torch.compile (bench_models-20261123-230318.json).
MARGIN = 0.02
# Timings of the bisection for the largest size a kernels arm that lost at the declared range's
# high end may serve (Trials.range_cut): each halves the gap, in log scale, between the sizes it
# was no slower and slower at; three leave a gap of about 1.2x on a range 4x the example (16-64).
CUT_STEPS = 3
# Dynamo's recompile limits while the trials compile: each trial is another backend on the same
# frames (a graph break's resume frames are the user's code objects), which Dynamo counts as
# recompiles; the trials' entries are dropped from those frames after the decision.
TRIAL_RECOMPILE_LIMIT = 64
# Inductor's layout optimization (convs in channels-last, the layout cuDNN's fast kernels take) is
# off wherever a conv's sizes are symbolic (torch/_inductor/graph.py, decide_layout_opt; pytorch
# #102670), so a model served over a declared batch range runs its convs NCHW, converted to NHWC
# inside each cuDNN call. Forced on, ResNet-50 bf16 under torch.compile(dynamic=True) on an H200
# ran 0.901 / 1.704 / 3.077 ms of device time at batch 13 / 32 / 64 against 1.874 / 3.309 / 6.099
# ms, and 4.138 / 5.167 / 5.198 ms synced against 4.560 / 5.484 / 7.617 ms (a diagnostic, not in
# bench/results). The decision times it as one more arm: the issue it was turned off for may bite
# another model.
LAYOUT_OPTIONS = {"force_layout_optimization": True}
# Inductor's C++ wrapper: the compiled graph's kernels launched from generated C++ instead of
# generated Python. Where a model's calls take more host time than GPU time it is most of the call:
# on an H200, torch.compile default ran ConvNeXt-T / ViT-B / MobileNetV3 bf16 and T5 fp32 at 3.30 /
# 2.53 / 2.66 / 4.31 ms a call with it off and 2.11 / 2.10 / 1.78 / 2.76 ms with it on, at equal
# device time (host_wrapper-20261127-124521). Its compile costs more (WRAPPER_COLD_S below).
# Offered where the mode has no CUDA graphs (they take the host out of the call already) and the
# floor's call is host-bound, with inductor.WRAPPER_OPTIONS.
# Its compile is the Python wrapper's graph compile plus the C++'s, seconds BEYOND the floor's that
# barely depend on the model: the host's precompiled header (once per host), the process's first C++
# compile (once per process: 48-50 s beyond the floor's on 16 cores of an H100 host, 28 s of it
# the CPU vector-ISA look, inductor.warm_vec_isa), the wrapper's own C++ (seconds). The header and
# the ISA look run while the search does (inductor.warm_cpp_wrapper, warm_vec_isa). NOTE: neither
# ready, it was 43-59 s (GPT-2 53 s over its floor's 7.7 s, BERT 49 over 4.3, MobileNetV3 43 over
# 19, Llama 43 over 8.0: zoo-20261127-2157*, -2158*, -2200*).
WRAPPER_COLD_S = 55.0        # the header not built yet
VEC_ISA_S = 30.0             # the ISA look, expected from its start
ISA_LATE_S = 5.0             # ... and while it runs past VEC_ISA_S
# Header and ISA ready: the rest of a process's first C++ compile (GPT-2 bf16's arm took 25.8 s
# beyond its floor's after the look, zoo-20261128-015247), until this host has its own figures
# (inductor.wrapper_extras).
WRAPPER_WARM_EXTRA_S = 25.0
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
# The floor's synced call against its GPU time from which the C++ wrapper is offered: it can save
# at most the host time beyond the GPU's. ViT-B bf16 at 1.37x of its GPU time gained 1.20x from it
# (host_wrapper-20261127-124521); a call at its GPU time has nothing for it to save.
HOST_BOUND = 1.2
# Said to a host-bound model's user in a mode without CUDA graphs. NOTE: on host-bound zoo models
# (H100, bf16), optimize in reduce-overhead mode ran 1.12-2.16x faster than in the default mode
# with the C++ wrapper (ViT 1.12x, Llama 1.19x, ResNet-18 1.84x, GPT-2 1.77x, BERT 2.03x,
# MLP-Mixer 2.16x: zoo-20261127-221440 to -222409).
CUDAGRAPHS_HINT = ("Where the inputs keep their shapes from call to call, mode='reduce-overhead' (CUDA "
                   "graphs) takes the host out of each call: on host-bound models it ran 1.1-2.2x faster "
                   "than the default mode")


def host_bound(share: float | None) -> bool:
    """Whether torch.compile's synced call (share: over its GPU time; None off a GPU) waits on its
    host enough for the C++ wrapper's arm."""
    return share is not None and share >= HOST_BOUND
# first_trial_s's estimate times this: a compile is not the floor's twin, and a host busy after
# the search times slower than the floor's second call. NOTE: a Swin-T bf16 (H100, budget 120)
# kept 33.5 s for its first kernel trial; after the floor's timing 31.5 s were left, against 32.2 s
# wanted for a compile like the floor's (29.5 s) and two arms at the 5.8 ms a call the floor had
# just timed (its second call had taken 3.5 ms): two attention kernels at 2.8x and 6.0x of
# Inductor's code went untried (zoo-20261127-035237).
TRIAL_MARGIN = 1.25
# Seconds a timing of arms already compiled may run past the deadline (Trials.time's overrun): the
# deadline gates compiles, tens of seconds and hard to foresee (a C++ wrapper arm: 62-69 s on an
# H100, 5x the floor's), not the few seconds of timing what they made (two ViT-B arms: 3.9 s).
# Without it a compiled arm that beat the floor 1.6x was dropped untimed (zoo-20261127-184411).
TIMING_OVERRUN_S = 15.0
# The most of the time left (when it is measured) that settle()'s priming keeps from the trials
# (Trials.time_first_call): a model whose first calls take long primes what the rest leaves.
PRIME_KEEP_SHARE = 0.05


class ArmKind(enum.Enum):
    COMPILE = "torch.compile"
    STATIC = "torch.compile's graph for the example's sizes"   # declared dynamic sizes: ExampleSplit
    REEXPORT = "Inductor on our re-exported graph"
    LAYOUT = "torch.compile with channels-last convs"   # LAYOUT_OPTIONS on a graph of symbolic convs
    WRAPPER = "torch.compile with Inductor's C++ wrapper"  # inductor.WRAPPER_OPTIONS, modes without CUDA graphs
    KERNELS = "torch.compile with our kernels"
    REPLAY = "replay of the captured graph with our kernels"
    ORIGINAL = "the original forward"


class Outcome(enum.Enum):
    """What the model runs after optimize(), in one word, for the report and for callers."""
    KERNELS = "kernels"                  # torch.compile with our kernels inside
    COMPILE = "torch.compile"            # the floor: no arm beat it
    REEXPORT = "reexport"                # Inductor on our re-exported graph, no kernel
    LAYOUT = "channels-last convs"       # torch.compile with LAYOUT_OPTIONS, no kernel
    WRAPPER = "C++ wrapper"              # torch.compile with inductor.WRAPPER_OPTIONS, no kernel
    REPLAY = "replay"                    # the captured graph with our kernels, op by op
    ORIGINAL_FASTER = "original"         # the original forward beat torch.compile
    ORIGINAL = "original forward"        # compile=False: no replay beat the original forward
    COMPILE_FAILED = "compile failed"    # torch.compile raised on this model: the original stays
    NOT_TIMED = "not timed"              # the deadline left no time to time: the floor, untimed


@dataclass
class Arm:
    """One way to run the model. kernels: the task signatures of our kernels inside it;
    options: Inductor config on top of the mode's (LAYOUT_OPTIONS for a LAYOUT arm and the kernel
    arms built on it)."""
    kind: ArmKind
    kernels: tuple[str, ...] = ()
    keep_reexport: bool = False
    options: dict = field(default_factory=dict)
    call: Callable | None = field(default=None, repr=False)
    backend: Any = field(default=None, repr=False)     # inductor.HtamBackend of a compiled arm
    replay_report: Any = field(default=None, repr=False)
    times: ArmTimes | None = None
    high: ArmTimes | None = None   # timed at the declared ranges' high end too (base())
    upto: int | None = None   # a kernels arm's largest size of the one declared range it serves
                              # (above it, it lost to its base: Trials.range_cut); None: all of it
    gain: float | None = None   # a kernels arm's ratio() over its base in its own trial's timing
    error: str | None = None
    setup_s: float = 0.0      # building it and its first call (where torch.compile compiles)
    failed_kernels: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        from torch_htam.inductor import CPP_WRAPPER_KEYS
        n = len(self.kernels)
        # NOTE: at_example() times the example's graph with and without the C++ wrapper side by side
        wrapper = (" with Inductor's C++ wrapper" if self.kind is ArmKind.STATIC
                   and any(self.options.get(k) for k in CPP_WRAPPER_KEYS) else "")
        return self.kind.value + (f" ({n} kernel{'s' * (n != 1)})" if self.kind in
                                  (ArmKind.KERNELS, ArmKind.REPLAY) else " with our kernels" if n else "") + wrapper

    def handles(self) -> dict[str, int]:
        """{task signature: kernel handle} of our kernels this arm loaded (its compiled graphs'
        or its replayed graph's)."""
        handles = dict(getattr(self.backend, "handles", None) or {})
        if self.replay_report is not None and self.call is not None:
            handles |= getattr(self.call.htam.gm, "htam_handles", {})
        return handles

    def ms(self, high: bool = False) -> str:
        t = self.high if high else self.times
        return (f"{t.latency.median_ms:.3f} ms synced / {t.throughput.median_ms:.3f} ms back to back"
                if t else "not timed")

    def to_json(self) -> dict:
        t = self.times
        return {"kind": self.kind.name, "kernels": len(self.kernels), "error": self.error,
                "setup_s": round(self.setup_s, 3),
                "latency_ms": t.latency.median_ms if t else None,
                "throughput_ms": t.throughput.median_ms if t else None,
                # better() also asks the 80th percentile: a wide spread is refused however low the median
                "latency_p80_ms": t.latency.p80_ms if t else None,
                "throughput_p80_ms": t.throughput.p80_ms if t else None,
                # the GPU's share: latency well above it means the arm is bound by its host time
                "device_ms": t.device.median_ms if t and t.device else None,
                "high_latency_ms": self.high.latency.median_ms if self.high else None,
                "high_throughput_ms": self.high.throughput.median_ms if self.high else None,
                "high_device_ms": self.high.device.median_ms if self.high and self.high.device else None,
                # per graph it compiled: with Inductor's C++ wrapper or not (a graph with our kernels
                # keeps it only where every launch can do without Python: inductor.stable_launches)
                "cpp_wrapper": [r.cpp_wrapper for r in getattr(self.backend, "records", None) or []],
                # per graph that was to take it and did not: why (inductor.unstable_launch)
                "python_wrapper_why": [r.python_wrapper_why for r in getattr(self.backend, "records", None) or []
                                       if r.python_wrapper_why]}


@dataclass
class Decision:
    """The chosen arm and every arm tried, with why. grad: the caller's mode, compiled and timed."""
    chosen: Arm
    outcome: Outcome
    reason: str
    arms: list[Arm] = field(default_factory=list)
    grad: GradMode = GradMode.INFERENCE
    host_notes: list[str] = field(default_factory=list)   # timings that began on a busy host
    host_share: float | None = None   # torch.compile's synced call / its GPU time (Trials.host_share)
    wrapper_hazards: list[str] = field(default_factory=list)   # why the C++ wrapper was not offered
    mode: str = "default"             # the torch.compile mode optimize ran in (OptimizeConfig.mode)
    at_example: Arm | None = None     # what serves the example's own sizes where not `chosen` (ExampleSplit)
    timings: list[dict] = field(default_factory=list)   # every timing that made it, in order (Trials.time)
    by_bucket: Arm | None = None      # what serves the sizes outside the kernels' buckets (BucketSplit)
    # arms of a subset of the chosen kernels, each with the sizes it serves (BucketSplit.more)
    bucket_arms: list[tuple[Arm, frozenset]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"outcome": self.outcome.value, "chosen": self.chosen.kind.name, "reason": self.reason,
                "grad": self.grad.value, "arms": [a.to_json() for a in self.arms], "host": self.host_notes,
                "host_share": self.host_share,
                "at_example": self.at_example.kind.name if self.at_example is not None else None,
                "bucket_arms": [{"kernels": list(a.kernels), "sizes": _spans(n)} for a, n in self.bucket_arms],
                "upto": self.chosen.upto,
                "timings": self.timings}

    def host_line(self) -> str | None:
        """How much of torch.compile's call was its host's, for the report; None off a GPU."""
        if self.host_share is None:
            return None
        if not host_bound(self.host_share):
            bound = "not host-bound"
        elif self.wrapper_hazards:
            bound = (f"host-bound at {HOST_BOUND}x or more; the C++ wrapper's arm is not offered: "
                     f"{', '.join(self.wrapper_hazards)} returns a one-tensor list, which its C++ can "
                     "crash on (pytorch#190551)")
        else:
            bound = f"host-bound at {HOST_BOUND}x or more: the C++ wrapper's arm is offered"
        line = f"torch.compile's call took {self.host_share:.2f}x its GPU time ({bound})"
        if host_bound(self.host_share) and self.mode not in CUDAGRAPH_MODES:
            line += f". {CUDAGRAPHS_HINT}"
        return line


def better(base: ArmTimes, ours: ArmTimes, margin: float = MARGIN) -> bool:
    """ours beats base beyond noise on one timing and is no worse beyond noise on the other.

    Arms timed in the same rounds (time_arms: each round times every arm, one after the other)
    are compared round by round: ours pays where the median of the rounds' ratios clears the
    margin and ours was the faster in at least 80% of the rounds. NOTE: a host-bound model's
    calls drift during a timing (ResNet-50 bf16 under torch.compile with a dynamic batch, on an
    idle H200 host: a median of 3.78 ms and a p80 of 4.44 ms in one timing, 2.6-3.0 ms in
    others), and the arms of one round share that drift: the medians' rule (ours' 80th
    percentile under base's median) refuses every gain smaller than the spread, where a round's
    ratio cancels what the arms share. Arms without common rounds fall back to that rule.

        >>> better(_t(1.0, 1.0), _t(0.9, 1.0)), better(_t(1.0, 1.0), _t(0.9, 1.1))
        (True, False)
    """
    def pays(b, o):
        rounds = _round_ratios(b, o)
        if rounds:
            return statistics.median(rounds) >= 1.0 / (1.0 - margin) and quantile(rounds, 0.2) > 1.0
        return o.median_ms <= b.median_ms * (1.0 - margin) and o.p80_ms < b.median_ms

    return (pays(base.latency, ours.latency) or pays(base.throughput, ours.throughput)) and no_worse(base, ours, margin)


def no_worse(base: ArmTimes, ours: ArmTimes, margin: float = MARGIN) -> bool:
    """ours is no slower than base beyond noise on either timing (round by round, as better())."""
    def fine(b, o):
        rounds = _round_ratios(b, o)
        if rounds:
            return statistics.median(rounds) >= 1.0 / (1.0 + margin)
        return o.median_ms <= b.median_ms * (1.0 + margin)
    return fine(base.latency, ours.latency) and fine(base.throughput, ours.throughput)


# Rounds a paired comparison needs: fewer fall back to the medians.
MIN_ROUNDS = 5


def _round_ratios(b, o) -> list[float] | None:
    """base / ours per round where both were timed in the same MIN_ROUNDS or more rounds."""
    if len(b.round_ms) != len(o.round_ms) or len(b.round_ms) < MIN_ROUNDS:
        return None
    return [x / y for x, y in zip(b.round_ms, o.round_ms) if y > 0] or None


def _reach(arm: Arm) -> tuple[float, float]:
    """How a kernels trial ranks: by the sizes of the declared range it serves first (all of them
    before a cut at some size, Arm.upto), then by how much faster than its base it was at the
    example's sizes in its own trial (Arm.gain: the base is timed again in every trial, and the
    host drifts between them; served vision bf16 timed its base at 1.489 ms synced in one trial
    and 1.023 in the next, H200, bench_serve-20261129-203558)."""
    return (math.inf if arm.upto is None else arm.upto), arm.gain or 0.0


def ratio(base: Arm, ours: Arm) -> float:
    """How much faster ours is, the geometric mean of both timings' median ratios."""
    b, o = base.times, ours.times
    return ((b.latency.median_ms / o.latency.median_ms) * (b.throughput.median_ms / o.throughput.median_ms)) ** 0.5


def timing_record(arms: list[Arm], times: list[ArmTimes], at: str) -> dict:
    """One timing of arms, for the decision's JSON: each arm's medians (ms) and, from the second
    on, the paired ratio of the first arm's rounds to its own (timing.paired_ratio; above 1: faster
    than the first). A choice made on one timing and confirmed on another can be read from these.

        >>> timing_record([Arm(ArmKind.COMPILE)], [_t(1.0, 1.0)], "example")["arms"][0]["latency_ms"]
        1.0
    """
    from torch_htam.timing import paired_ratio
    first = times[0]

    def row(a: Arm, t: ArmTimes) -> dict:
        out = {"arm": a.name, "latency_ms": round(t.latency.median_ms, 4),
               "throughput_ms": round(t.throughput.median_ms, 4),
               "device_ms": round(t.device.median_ms, 4) if t.device else None}
        if t is not first:
            for k in ("latency", "throughput"):
                r = paired_ratio(getattr(first, k).round_ms, getattr(t, k).round_ms)
                out[f"{k}_vs_first"] = round(r, 4) if r is not None else None
        return out
    return {"at": at, "arms": [row(a, t) for a, t in zip(arms, times)]}


# ---- the procedure -------------------------------------------------------------------------------

def decide(model: nn.Module, inputs: tuple, cfg, found, kernels: dict, deadline,
           grad: GradMode | None = None, ranked: list[str] | None = None,
           every: list[str] | None = None) -> Decision:
    """Choose what runs `model` in one go (optimize() interleaves its search between
    Trials.start and Trials.finish; see those)."""
    t = Trials(model, inputs, cfg, grad or GradMode.current(), deadline)
    with t.limits():
        t.start()
        d = t.finish(found, kernels, ranked or [], every or [])
    return t.settle(d)


@dataclass
class Trials:
    """The arms of one decision, built, warmed and timed in the caller's grad mode.

        >>> t = Trials(model, inputs, cfg, GradMode.current(), deadline)
        >>> with t.limits():
        ...     t.start()                        # the floor: torch.compile, compiled now
        ...     budget = deadline.left(t.reserve_s(n_tasks))   # the search's share
        ...     d = t.finish(found, kernels, ranked, every)
        >>> t.settle(d)
    """
    model: nn.Module
    inputs: tuple
    cfg: Any
    grad: GradMode
    deadline: Any
    found: Any = None
    kernels: dict = field(default_factory=dict)
    arms: list[Arm] = field(default_factory=list)
    compile_s: float = 0.0      # the floor's first call: what one more compile is expected to cost
    call_s: float = 0.0         # the floor's second call, synchronized: what one timed call costs
    prime_s: float = 0.0        # what settle()'s priming is expected to take, kept from every trial
                                # (time_first_call; 0 where it primes nothing)
    grown: list = field(default_factory=list)   # the user's frames the trials compiled (limits())
    expected: list | None = None   # the original forward's float outputs on the example inputs
    host_notes: list[str] = field(default_factory=list)   # timings that began on a busy host
    base_why: str = ""          # base()'s choice, in the figures of the timing that made it
    untried: int = 0            # kernels that beat Inductor's code, left out of every trial for time
    keep_s: float = 0.0         # seconds the optional arms and a wait for a quiet host leave for
                                # the kernel trial to come
    trial_compile_s: float = 0.0   # what a kernel arm is expected to compile in: its base's own
                                   # setup (base()); 0 before, where the floor's compile stands for it
    host_share: float | None = None   # the floor's synced call / its GPU time (start(); None: not on a GPU)
    plain: tuple | None = None   # the example inputs without the declared dynamic dims' marks, where
                                 # `inputs` carry them (capture.marked): the STATIC arm's
    _hazards: tuple | None = None     # (found, wrapper_hazards() of its capture)
    timings: list[dict] = field(default_factory=list)   # what each time() measured (timing_record)
    base_arm: Arm | None = None   # the arm the kernel trials were built on (base())

    # -- the phases ------------------------------------------------------------------------------

    def start(self) -> Arm:
        """The floor (torch.compile with compile=True, else the original forward) and the original
        forward, built and warmed: what the model runs if nothing after this works. With declared
        dynamic sizes, torch.compile's graph for the example's sizes too (the STATIC arm): the
        floor is then both, split by shape (floor_call) as plain torch.compile serves them."""
        with self.deadline.phase("decide: compile"):
            if self.cfg.compile:
                floor = self.ready(Arm(ArmKind.COMPILE))
                if not floor.error:
                    self.host_share = self.measure_host_share(floor)
                    if self.plain is not None:
                        self.ready(Arm(ArmKind.STATIC))
            self.ready(Arm(ArmKind.ORIGINAL))
        return self.arms[0]

    def time_first_call(self, found) -> None:
        """Where settle() will prime the chosen arm (the capture's graphs hold convs of symbolic
        sizes: prime_sizes), the floor called once at a size of the declared ranges it has not
        met, timed (serving.first_call_s): each of the priming's calls is such a first call.
        prime_s is that times their number, at most PRIME_KEEP_SHARE of the time left; the
        trials and the size-1 compile then leave it (affords, warm_size_one). NOTE: served vision
        bf16 (H200, budget 300 s) primed its 62 sizes in 1.4 s, and when its trials had taken
        the time, skipped 45 of them: its first pass ran 0.715x torch.compile's throughput
        against 2.05x primed, a new size's first request taking 35-40 ms
        (bench_serve-20261129-071829, -072823)."""
        floor = self.arms[0] if self.arms else None
        if (floor is None or floor.kind is not ArmKind.COMPILE or floor.error or floor.call is None
                or not self.symbolic_convs(found)):
            return
        try:
            with self.deadline.phase("decide: a first call's time"), self.grad.enter():
                timed = first_call_s(floor.call, self.plain or self.inputs, self.cfg.dynamic or {})
        except Exception as e:  # noqa: BLE001 -- priming calls the same and reports it; keep nothing for it
            log.warning("torch_htam: the floor's call at a new size failed: %s: %s", type(e).__name__, e)
            return
        if timed is None:
            return
        seconds, count = timed
        left = self.deadline.remaining()
        self.prime_s = seconds * count if left is None else min(seconds * count, PRIME_KEEP_SHARE * max(left, 0.0))

    def floor_call(self) -> Callable:
        """What runs the model while optimize goes on: the floor, split at the example's sizes
        where the STATIC arm was built (ExampleSplit)."""
        floor, static = self.arms[0], self.static()
        return floor.call if static is None else self.split(static, floor)

    def static(self) -> Arm | None:
        """The STATIC arm, where built and working."""
        return next((a for a in self.arms if a.kind is ArmKind.STATIC and not a.error), None)

    def split(self, static: Arm, arm: Arm) -> ExampleSplit:
        """`arm` for every size but the example's own, which `static` serves."""
        return split_at_example(static.call, arm.call, self.plain, self.cfg.dynamic or {})

    def measure_host_share(self, arm: Arm) -> float | None:
        """The arm's synced call (median of 5) over its GPU time (timing._device_ms), on a GPU:
        above 1, the call waits on its host. None on the CPU. That median also becomes call_s,
        what timing_s expects a call to cost: ready()'s second call is no steady call in the
        CUDA-graph modes, where it records the graph. NOTE: a ResNet-50 bf16 in reduce-overhead mode
        (2.3 ms a call) had its search cut by the budget after 23 s, and optimize then ended at
        50 s of its 120 (zoo-20261128-013505): the reserve had been sized for trials timed at the
        recording call's cost."""
        from torch_htam.timing import _device_ms, _sync_for, _synced, on_cuda
        if not on_cuda(self.inputs):
            return None
        with self.grad.enter():
            wall = statistics.median(_synced(arm.call, self.inputs, 5, _sync_for(self.inputs)))
            gpu = _device_ms(arm.call, self.inputs, 1.5 * wall)
        self.call_s = wall / 1e3
        return wall / gpu if gpu > 0 else None

    def reserve_s(self, n_tasks: int, ahead_s: float = 0.0) -> float:
        """Seconds to keep for finish() after the search: a compile like the floor's per trial
        arm (wrapper_compile_s for the C++ wrapper's arm, where offered; ahead_s: the search's
        seconds before it), and the timing of every arm, for the trials n_tasks kernels could bring."""
        if not self.cfg.compile:
            return self.timing_s(2 * min(n_tasks, 4) + 1)
        trials = 1 + min(n_tasks, 4) + (1 if n_tasks else 0)   # re-export, kernel subsets, replay
        trials += 1 if self.cfg.dynamic else 0                 # channels-last convs (base())
        trials += 1 if self.cfg.dynamic and n_tasks > 1 else 0  # the kernels kept at some sizes (bucket_arm)
        # base()'s layout arm at the high end, and a kernel trial's (wins_at_high_end: the floor,
        # the base, the kernel arm; range_cut's bisection: the base and the kernel arm a step)
        high_end = 2 + (3 + 2 * CUT_STEPS if n_tasks else 0) if self.cfg.dynamic else 0
        wrapper = self.wrapper_offered()
        # at_example(): the STATIC arm and the choice, and the STATIC arm with the C++ wrapper
        static_wrapper = wrapper and self.plain is not None
        static_kernels = bool(n_tasks) and self.plain is not None   # ... and with the kernels chosen
        high_end += (2 if self.plain is not None else 0) + static_wrapper + static_kernels
        compile_s = ((trials + static_wrapper + static_kernels) * self.compile_s
                     + (self.wrapper_compile_s(ahead_s) if wrapper else 0.0))
        # against_eager's timing: the floor, the base, the choice, the original forward, the replay;
        # then settle()'s priming
        return compile_s + self.timing_s(2 + 2 * (trials - 1 + wrapper) + 5 + high_end) + self.prime_s

    def wrapper_s(self, ahead_s: float = 0.0) -> float:
        """Seconds for the C++ wrapper's arm where offered (0 where not), ahead_s seconds from now
        (wrapper_cxx_s): compiled, then timed
        beside the floor. The search never takes this time (pipeline.reserve_s): on a host-bound
        model the wrapper alone was worth 1.2-1.73x (host_wrapper-20261127-124521, zoo rows), more
        than the search finds on most models. TRIAL_MARGIN covers its graph's compile and timing,
        which vary like the floor's; its C++'s seconds are the host's longest recent figure
        already. NOTE: with the margin on those too, a MobileNetV3 (floor 23.3 s) no longer fitted
        after its capture and ran without the wrapper it had gained 1.5x from
        (zoo-20261127-221751)."""
        if not self.wrapper_offered():
            return 0.0
        return TRIAL_MARGIN * (self.compile_s + self.timing_s(2)) + self.wrapper_cxx_s(ahead_s)

    def first_trial_s(self, ahead_s: float = 0.0) -> float:
        """Seconds for the one trial that can keep a kernel: the floor timed (beside the C++
        wrapper's arm, compiled for it, where offered), then a kernels arm compiled like the floor
        and timed against the faster, then both timed again beside the original forward
        (against_eager's confirmation), with TRIAL_MARGIN; ahead_s as wrapper_s."""
        return self.kernel_trial_s(self.compile_s) + self.wrapper_s(ahead_s)

    def wrapper_compile_s(self, ahead_s: float = 0.0) -> float:
        """Seconds the C++ wrapper's arm is expected to compile in, ahead_s seconds from now: the
        floor's compile plus its C++ (wrapper_cxx_s)."""
        return self.compile_s + self.wrapper_cxx_s(ahead_s)

    def wrapper_cxx_s(self, ahead_s: float = 0.0) -> float:
        """The C++ wrapper's compile seconds beyond the floor's, for a compile ahead_s seconds from
        now: WRAPPER_COLD_S until the header is built (inductor.header_built), then the longest of
        this host's last warm ones (inductor.wrapper_extras; WRAPPER_WARM_EXTRA_S before it has
        any) plus what is left then of the wait for the vector-ISA look (isa_wait_s)."""
        from torch_htam import inductor
        if not inductor.header_built():
            return WRAPPER_COLD_S
        return max(inductor.wrapper_extras(), default=WRAPPER_WARM_EXTRA_S) + max(0.0, self.isa_wait_s() - ahead_s)

    def isa_wait_s(self) -> float:
        """Seconds until this process's vector-ISA look (inductor.warm_vec_isa) is expected done: 0
        once it is, VEC_ISA_S less the seconds it has run (ISA_LATE_S at least while it runs past
        that), VEC_ISA_S before it starts."""
        from torch_htam import inductor
        if inductor.vec_isa_found():
            return 0.0
        ran = inductor.vec_isa_ran_s()
        return VEC_ISA_S if ran is None else max(VEC_ISA_S - ran, ISA_LATE_S)

    def kernel_trial_s(self, compile_s: float) -> float:
        """One kernel arm compiled in compile_s, timed beside the base, then confirmed beside the
        floor and the original forward (timing_s(6)), with TRIAL_MARGIN."""
        return TRIAL_MARGIN * (compile_s + self.timing_s(6))

    def wrapper_offered(self) -> bool:
        """Whether base() tries Inductor's C++ wrapper: where the floor's call is host-bound on a
        GPU (host_share, HOST_BOUND), in the modes without CUDA graphs, where the end-to-end check
        times arms at all."""
        return (self.cfg.compile and self.cfg.check_end_to_end and self.cfg.mode not in CUDAGRAPH_MODES
                and host_bound(self.host_share) and not self.wrapper_hazards())

    def wrapper_hazards(self) -> list[str]:
        """The captured graphs' ops that Inductor's C++ wrapper could crash on
        (inductor.cpp_wrapper_hazards): a crash is no arm error a try can catch, so with any the
        arm is not offered. None known before the capture is handed over (finish())."""
        from torch_htam.inductor import cpp_wrapper_hazards
        if self._hazards is None or self._hazards[0] is not self.found:   # one walk per capture
            graphs = getattr(getattr(self.found, "capture", None), "graphs", None) or []
            self._hazards = (self.found, cpp_wrapper_hazards(graphs))
        return self._hazards[1]

    def finish(self, found, kernels: dict, ranked: list[str], every: list[str]) -> Decision:
        self.found, self.kernels = found, kernels
        with self.deadline.phase("decide: trials"):
            if not self.cfg.compile:
                return self.replayed(kernels, every)
            return self.at_example(self.by_bucket(self.compiled(kernels, ranked, every)))

    def settle(self, d: Decision) -> Decision:
        """After limits(): drop the trials' entries from the user's frames and let the chosen arm
        compile its own again, here rather than in the user's first call."""
        if self.grown and d.chosen.kind is not ArmKind.ORIGINAL:
            _forget(self.grown)
            with d.grad.enter():
                call = d.chosen.call
                if isinstance(call, ExampleSplit):   # each side on the inputs it compiled for
                    call.at_example(*self.plain)
                    call = call.elsewhere
                call(*self.inputs)
        if d.chosen.kind not in (ArmKind.ORIGINAL, ArmKind.REPLAY):
            self.warm_size_one(d)
            if self.symbolic_convs():
                self.prime_sizes(d)
        return d

    def prime_sizes(self, d: Decision) -> None:
        """One call of the chosen arm at every size of each short declared range (serving.prime),
        within the deadline, so that a conv's per-size planning is done before the first request
        of that size; what the deadline left out is in the report."""
        with self.deadline.phase("decide: priming sizes"), d.grad.enter():
            left = prime(d.chosen.call, self.plain or self.inputs, self.cfg.dynamic or {}, self.deadline.allows)
        if left:
            self.out_of_time(f"calling the model once at {left} (each first call at a new size plans its convs)")

    def warm_size_one(self, d: Decision) -> None:
        """Compile the chosen arm's size-1 graphs of the declared ranges (size_one_inputs) now,
        where the deadline leaves a compile for each, rather than on the user's first request at
        size 1. A call that fails is left to the user's own first call (the report says so)."""
        for args in size_one_inputs(self.plain or self.inputs, self.cfg.dynamic):
            if not self.deadline.allows(self.compile_s, self.prime_s):   # the priming after it comes first
                self.out_of_time("compiling the graph for size 1 (it compiles on the first call at that size)")
                return
            try:
                with self.deadline.phase("decide: size-1 graphs"), d.grad.enter():
                    d.chosen.call(*args)
            except Exception as e:  # noqa: BLE001 -- the model's own call at size 1 raises the same, later
                log.warning("torch_htam: the size-1 call failed: %s: %s", type(e).__name__, e)
                self.deadline.skip(f"compiling the graph for size 1: the call failed ({type(e).__name__})")
                return

    def at_example(self, d: Decision) -> Decision:
        """With declared dynamic sizes, what serves the example's own sizes: the chosen arm where
        it beats torch.compile's graph for them (the STATIC arm) beyond noise, timed beside it
        there, else that graph (ExampleSplit), as plain torch.compile would serve them. Untimed
        (no time left even past the deadline), that graph: the floor by construction. Where the
        chosen arm runs Inductor's C++ wrapper, that graph compiled with it too is a third rival,
        where it fits the deadline: a host-bound model gains the wrapper's host time there as well
        as the specialized graph's device time (served ViT-style bf16 on an H200: 0.82 ms of GPU
        time in the chosen wrapper's dynamic graph, 0.55 ms in the static one,
        bench_serve-20261128-081949)."""
        from torch_htam.inductor import CPP_WRAPPER_KEYS
        static, chosen = self.static(), d.chosen
        if static is None or chosen.kind in (ArmKind.ORIGINAL, ArmKind.REPLAY):
            return d
        rivals = [static]
        if any(k in chosen.options for k in CPP_WRAPPER_KEYS) and self.affords(3, 0.0, self.compile_s):   # this process's C++ compile is warm
            # the wrapper's other options (its -O level) with it
            rival = self.ready(Arm(ArmKind.STATIC, options=dict(chosen.options)))
            rivals += [] if rival.error else [rival]
        # NOTE: with kernels chosen, the example's graph with them too: served vision bf16 (H200)
        # ran its kernels on 71% of requests, the rest at batch 1 and at the example's batch,
        # where the example's own graph served 0.699 against 0.984 ms synced without them
        # (bench_serve-20261128-212414)
        if (chosen.kind is ArmKind.KERNELS and self.twin_kernels(chosen.kernels)
                and self.affords(len(rivals) + 2, 0.0, self.compile_s)):
            rival = self.ready(Arm(ArmKind.STATIC, kernels=chosen.kernels, options=dict(chosen.options)))
            rivals += [] if rival.error else [rival]
        if not self.time([*rivals, chosen], overrun=True):
            return self.split_off(d, static, "untimed: the time budget ran out")
        if all(better(r.times, chosen.times) for r in rivals):
            d.reason += f"; at the example's sizes too ({chosen.ms()} against {static.ms()} for {static.name})"
            return d
        # torch.compile's own graph unless its C++-wrapper twin beats it beyond noise
        best = max(rivals[1:], key=lambda r: ratio(static, r), default=static)
        best = best if best is not static and better(static.times, best.times) else static
        return self.split_off(d, best, f"{best.ms()} against {chosen.ms()}")

    def by_bucket(self, d: Decision) -> Decision:
        """A chosen kernels arm over a declared range runs only at the sizes where each of its
        ranged kernels was kept (serving.kept_sizes), and none above its cut (Arm.upto,
        range_cut); the other sizes run the arm it was built on (BucketSplit), not its kernels'
        regions op by op."""
        base, upto = self.base_arm, d.chosen.upto
        if d.chosen.kind is not ArmKind.KERNELS or not self.cfg.dynamic or base is None or base.call is None:
            return d
        kept = entries_kept([self.kernels_of(s) for s in d.chosen.kernels])
        found = held_sizes(kept, self.cfg.dynamic) if kept is not None else None
        if found is None and upto is None:
            return d
        # low: 2 where declared 1 (size 1 has graphs of its own); kernels without buckets with a cut:
        # every size up to it
        at, (low, high), held = found or (*one_range(self.cfg.dynamic), [])
        at, sizes = served_sizes((at, common_sizes((low, high), held)), self.cfg.dynamic, upto)
        left = [n for n in range(low, high + 1) if n not in sizes]
        if left:
            d.chosen.call = BucketSplit(d.chosen.call, base.call, at, sizes)
            d.by_bucket = base
            d.reason += (f"; {len(left)} of the sizes {low}-{high} lie outside a kernel's buckets"
                         f"{' or above the cut' if upto is not None else ''} and run {base.name} "
                         f"({_spans(sizes)} run the kernels)")
            self.bucket_arm(d, base, held, [n for n in left if upto is None or n <= upto])
        return d

    def bucket_arm(self, d: Decision, base: Arm, held: list, left: list[int]) -> None:
        """Of the sizes `left` that d's BucketSplit sends to `base`, the largest group at which the
        same subset of the chosen kernels was kept (serving.subsets_by_size over held: per kernel,
        serving.held_sizes) runs an arm of just those kernels, where it beats `base` beyond noise
        at a size of the group (the one nearest its geometric middle); BucketSplit.more then sends
        the group there."""
        from torch_htam.serving import subsets_by_size
        split, sigs = d.chosen.call, d.chosen.kernels
        groups = subsets_by_size(held, left)
        if not groups:
            return
        idx, sizes = max(groups.items(), key=lambda g: (len(g[1]), len(g[0])))
        subset = tuple(sigs[i] for i in sorted(idx))
        mid = math.log(min(sizes) * max(sizes)) / 2
        n = min(sizes, key=lambda m: (abs(math.log(m) - mid), m))
        (r,) = {r for dims in self.cfg.dynamic.values() for r in dims.values()}   # held_sizes: one range
        inputs = at_size(self.inputs, self.cfg.dynamic, r, n) or self.inputs    # None: n is the example's
        if not self.affords(2, compile_s=self.trial_compile_s or None):
            return
        arm = self.ready(Arm(ArmKind.KERNELS, subset, options=dict(d.chosen.options)))
        times = None if arm.error else self.timed([base, arm], inputs, f"size {n}")
        what = f"sizes {_spans(sizes)} ({len(subset)} of the kernels kept there, timed at {n})"
        if times is None or not better(times[0], times[1]):
            why = arm.error or ("untimed" if times is None else "not faster there")
            d.reason += f"; {what} stay on {base.name}: {why}"
            return
        d.chosen.call = dataclasses.replace(split, more=((sizes, arm.call),))
        d.bucket_arms = [(arm, sizes)]
        d.reason += (f"; {what} run those: {times[1].latency.median_ms:.3f} against "
                     f"{times[0].latency.median_ms:.3f} ms synced")

    def split_off(self, d: Decision, static: Arm, why: str) -> Decision:
        """d with the example's own sizes on `static` (ExampleSplit), saying why."""
        d.chosen.call = self.split(static, d.chosen)
        d.at_example = static
        d.reason += f"; at the example's sizes {static.name} ({why})"
        return d

    def compiled(self, kernels: dict, ranked: list[str], every: list[str]) -> Decision:
        floor = self.arm(ArmKind.COMPILE)
        original = self.arm(ArmKind.ORIGINAL)
        if floor.error:
            return self.done(original, Outcome.COMPILE_FAILED,
                             f"torch.compile failed on this model ({floor.error}): the original forward stays")
        if not self.cfg.check_end_to_end:
            arm = self.ready(Arm(ArmKind.KERNELS, tuple(ranked))) if ranked else None
            return (self.done(arm, Outcome.KERNELS, "end-to-end check off: every kernel that beat Inductor")
                    if arm is not None and not arm.error else self.done(floor, Outcome.COMPILE, "torch.compile"))
        self.keep_s = self.first_trial_s() if ranked else 0.0
        base = self.base_arm = self.base(floor)
        if base is None:
            return self.done(floor, Outcome.NOT_TIMED, self.out_of_time("the decision"))
        best, why, compared = base, "", ""
        timed: list[tuple[frozenset, float]] = []
        for subset in _sets(ranked, every, timed, lambda: best is not base):
            subset = tuple(s for s in subset if s not in self.failed())
            if not subset:
                break
            if not self.affords(2):
                self.untried = self.untried or len(subset)
                break
            self.keep_s = 0.0   # the trial kept for is this one
            arm = self.ready(Arm(ArmKind.KERNELS, subset, keep_reexport=base.kind is ArmKind.REEXPORT,
                                 options=dict(base.options)))
            if arm.error or not self.time([base, arm]):
                continue
            arm.gain = ratio(base, arm)
            timed.append((frozenset(subset), arm.gain))
            # the first trial's own timing (base is timed again with later arms)
            compared = compared or f"{arm.name}: {arm.ms()} against {base.ms()}"
            wins = better(base.times, arm.times)
            if wins:
                wins, arm.upto = self.range_cut(base, arm)
            high = not wins and arm.high is None and self.wins_at_high_end(base, arm, floor)
            if (wins or high) and (best is base or _reach(arm) > _reach(best)):
                at_high = (f"; at the declared ranges' high end {arm.ms(high=True)} against "
                           f"{base.ms(high=True)}" if high else "")
                cut = (f"; up to size {arm.upto}: above it they lost to {base.kind.value} (at the high end "
                       f"{arm.ms(high=True)} against {base.ms(high=True)})" if arm.upto is not None else "")
                best, why = arm, (f"{len(subset)} of {len(every)} kernels: {arm.ms()} against {base.ms()} "
                                  f"for {base.kind.value}{at_high}{cut}")
            if best is not base and not (set(subset) == set(every) and set(ranked) != set(every)):
                break   # every kernel together paid, and no smaller set is left to compare: done
        return self.against_eager(best, base, floor, original, kernels, why, compared)

    def replayed(self, kernels: dict, every: list[str]) -> Decision:
        original = self.arm(ArmKind.ORIGINAL)
        if every and not self.cfg.check_end_to_end:
            arm = self.ready(Arm(ArmKind.REPLAY, tuple(every)))
            if not arm.error:
                return self.done(arm, Outcome.REPLAY, "end-to-end check off: every kernel, replayed")
        timed: list[tuple[frozenset, float]] = []
        for subset in _sets(every, every, timed, lambda: False):
            subset = tuple(s for s in subset if s not in self.failed())
            if not subset or not self.affords(1):
                break
            arm = self.ready(Arm(ArmKind.REPLAY, subset))
            if arm.error or not self.time([original, arm]):
                continue
            timed.append((frozenset(subset), ratio(original, arm)))
            if better(original.times, arm.times):
                return self.done(arm, Outcome.REPLAY, f"{len(subset)} of {len(every)} kernels: {arm.ms()} "
                                 f"against {original.ms()} for the original forward")
        return self.done(original, Outcome.ORIGINAL,
                         "no set of kernels made the replay faster than the original forward"
                         if len(self.arms) > 1 else "no kernel to replay")

    # -- steps -----------------------------------------------------------------------------------

    def base(self, floor: Arm) -> Arm | None:
        """The fastest of torch.compile, torch.compile with Inductor's C++ wrapper
        (inductor.WRAPPER_OPTIONS, wrapper_offered), Inductor on our re-exported graph and, where the graphs
        hold convs of symbolic sizes, torch.compile with channels-last convs (LAYOUT_OPTIONS),
        timed together: an arm replaces the floor where it beats it beyond noise, and the kernel
        arms are built on it (its options, its re-export) and timed against it; a graph with our
        kernels in it keeps the C++ wrapper only where the wrapper can call each of them without
        Python (inductor.stable_launches). The re-export
        folds constant attention masks; on an H100 it alone made a Llama-style model 1.10x faster
        than torch.compile in reduce-overhead mode (scripts/probe_graph.py). The optional arms
        leave self.keep_s seconds for what comes after (one kernel trial, where kernels beat
        Inductor's code: an arm with kernels measured faster than Inductor's code for their
        regions comes before arms not measured at all)."""
        arms = [floor]
        # NOTE: the C++ wrapper keeps no time for a kernel trial: its own gain (1.2-1.57x on
        # host-bound zoo rows) comes before a kernel's; where it wins, its kernel arms compile with
        # it too (trial_compile_s below) and run only where that time is left
        if self.wrapper_offered() and self.affords(2, 0.0, self.wrapper_compile_s()):
            from torch_htam.inductor import WRAPPER_OPTIONS
            arms.append(self.ready(Arm(ArmKind.WRAPPER, options=dict(WRAPPER_OPTIONS))))
        if self.single_graph() and self.affords(len(arms) + 1, self.keep_s, self.compile_s):
            arms.append(self.ready(Arm(ArmKind.REEXPORT, keep_reexport=True)))
        if self.symbolic_convs() and self.affords(len(arms) + 1, self.keep_s, self.compile_s):
            arms.append(self.ready(Arm(ArmKind.LAYOUT, options=dict(LAYOUT_OPTIONS))))
        arms = [a for a in arms if not a.error]
        if not self.time(arms, overrun=len(arms) > 1):
            return None
        wins = [a for a in arms[1:] if better(floor.times, a.times)]
        layout = next((a for a in arms if a.kind is ArmKind.LAYOUT and a not in wins), None)
        if layout is not None and self.wins_at_high_end(floor, layout, floor):
            wins.append(layout)
        best = max(wins, key=lambda a: ratio(floor, a)) if wins else floor
        # a kernel arm compiles like its base (a graph whose launches the C++ wrapper cannot call
        # without Python compiles like the floor: the base's time is the safe side)
        like_base = best.kind in (ArmKind.REEXPORT, ArmKind.LAYOUT)
        # NOTE: the wrapper's arm paid the process's first C++ compile, which its kernel arms do
        # not: GPT-2 bf16's compiled in 2.2 s against the floor's 6.7 s (zoo-20261128-015247)
        self.trial_compile_s = best.setup_s if like_base else self.compile_s
        # the figures that chose it: the kernel trials time `best` again, the floor not
        high = (f"; at the declared ranges' high end {best.ms(high=True)} against {floor.ms(high=True)}"
                if best.high and floor.high else "")
        self.base_why = f"{best.name}: {best.ms()} against {floor.ms()} for torch.compile{high}"
        return best

    def range_cut(self, base: Arm, arm: Arm) -> tuple[bool, int | None]:
        """For a kernels arm that beat `base` at the example's sizes: whether it may run the model,
        and the largest size of the declared range it may serve there (None: all of it).

        Timed beside base at the declared ranges' high end: no slower there beyond noise, all of
        it. Slower there, with one range declared, the largest size between the example's and
        the high end at which it was no slower (a bisection of CUT_STEPS timings; by_bucket sends
        the sizes above to base); with several ranges, it is not taken. Where the deadline leaves
        no time for the high end, the example's size with one range (the sizes above were never
        timed), else not taken.

        NOTE: served vision bf16 (batch 1-64, example 16, H200) kept 14 conv kernels that together
        beat torch.compile with the C++ wrapper at the example's batch, 0.890 against 1.024 ms
        synced, and ran the mix's large batches slower than torch.compile: its p99 (batches 42-63)
        was 0.943x the better torch.compile arm's (bench_serve-20261129-201958)."""
        high = high_end_inputs(self.inputs, self.cfg.dynamic)
        if high is None:
            return True, None
        one = one_range(self.cfg.dynamic)
        example = None if one is None else self.inputs[one[0][0]].shape[one[0][1]]
        if not self.affords(2) or not self.time([base, arm], high):
            return (one is not None), example
        if no_worse(base.high, arm.high):
            return True, None
        if one is None:
            return False, None
        (r,) = {r for dims in self.cfg.dynamic.values() for r in dims.values()}
        lo, hi = example, one[1][1]        # no slower at lo, slower at hi
        for _ in range(CUT_STEPS):
            m = round(math.sqrt(lo * hi))
            inputs = at_size(self.inputs, self.cfg.dynamic, r, m) if lo < m < hi and self.affords(2) else None
            times = None if inputs is None else self.timed([base, arm], inputs, f"size {m}")
            if times is None:
                break
            lo, hi = (m, hi) if no_worse(*times) else (lo, m)
        return True, lo

    def wins_at_high_end(self, base: Arm, arm: Arm, floor: Arm) -> bool:
        """Whether `arm`, no slower than `base` at the example's sizes, beats it at the declared
        ranges' high end; the floor is timed there beside them (confirmed() asks it again).

        NOTE: a host-bound example hides what channels-last convs or our kernels save: ViT-style
        bf16 at its example batch on an H100 took 0.59 ms of GPU time against the floor's 0.85 ms
        in a call of 2.3 ms either way (bench_serve-20261126-233515); ResNet-50 bf16 served at a
        declared batch of 1-64 (example 32, H200) took 1.81-1.85 ms of GPU time with 1-3 of our
        conv kernels against the floor's 2.56 ms, in calls of 2.9-4.3 ms either way
        (bench_serve-20261128-205850). The served mix's larger batches are bound by the GPU."""
        high = high_end_inputs(self.inputs, self.cfg.dynamic)
        arms = [floor, arm] if base is floor else [floor, base, arm]
        if high is None or not no_worse(base.times, arm.times) or not self.affords(len(arms)):
            return False
        if not self.time(arms, high):
            return False
        return better(base.high, arm.high)

    def against_eager(self, best: Arm, base: Arm, floor: Arm, original: Arm, kernels: dict, why: str,
                      compared: str = "") -> Decision:
        """The compiled choice confirmed against the floor, then against the original forward and
        the replay with every kernel: either replaces it where it is better beyond noise both ways
        (torch.compile can be slower than eager: BERT-base bf16 on an H100 ran 11.4 ms compiled
        against 7.6 ms eager).

        NOTE: a choice other than the floor was made on its own timing, the best of several
        noisy comparisons; here it is timed again beside the floor and kept only if it still
        beats it (confirmed()). On an H100, ResNet-50 bf16 kept 10 kernels at 4.09 ms a call
        against 4.38 ms for torch.compile, both timed just after the search on a host that then
        settled; timed clean, the same two ran 2.61 and 2.57 ms synced, 2.68 and 2.54 ms back to
        back (zoo-20261127-094335)."""
        rivals = [original]
        usable = tuple(s for s in kernels if s not in self.failed())
        # NOTE: the replay runs the graph captured at the example's sizes; with declared dynamic
        # sizes it would run every other size on the original forward
        if usable and self.single_graph() and not self.found.capture.dynamic and self.affords(1):
            replay = self.ready(Arm(ArmKind.REPLAY, usable))
            if not replay.error:
                rivals.append(replay)
        chosen = [floor] if best is floor else [floor, *([base] if base not in (floor, best) else []), best]
        if self.time([*chosen, *rivals], overrun=best is not floor):
            best, other_why = self.confirmed(chosen)
            why = other_why or why
            faster = [r for r in rivals if better(best.times, r.times)]
            if faster:
                r = max(faster, key=lambda a: ratio(best, a))
                outcome = Outcome.ORIGINAL_FASTER if r.kind is ArmKind.ORIGINAL else Outcome.REPLAY
                return self.done(r, outcome, f"{r.name}: {r.ms()} against {best.ms()} for {best.name}")
        elif best is not floor:   # NOTE: the floor by construction: no second timing, no other arm
            return self.done(floor, Outcome.NOT_TIMED, self.out_of_time(f"confirming {best.name}"))
        if best.kind is ArmKind.KERNELS:
            return self.done(best, Outcome.KERNELS, why)
        if best.kind in (ArmKind.REEXPORT, ArmKind.LAYOUT, ArmKind.WRAPPER):
            return self.done(best, Outcome[best.kind.name], why or self.base_why)
        tried = [a for a in self.arms if a.kind is ArmKind.KERNELS]
        why = (why if why.startswith("not confirmed") else
               f"no set of our kernels beat it ({compared})" if compared else "no kernel to try" if not kernels else
               f"the time budget ran out before a trial of {self.untried} kernel(s) that beat Inductor's code "
               "for their regions" if self.untried and not tried else
               "no kernel beat Inductor's code for its region" if not tried else "no trial could be timed")
        return self.done(floor, Outcome.COMPILE, f"torch.compile: {why}")

    def confirmed(self, chosen: list[Arm]) -> tuple[Arm, str | None]:
        """The last of `chosen` ([floor, (base,) best], just timed together) that still beats the
        floor beyond noise on this timing, with the reason to report where it is not the choice
        (None: the choice held; its own timing's reason stands). The floor where none does."""
        floor, *others = chosen
        for arm in reversed(others):
            # an arm chosen for the declared ranges' high end (wins_at_high_end) must still be no
            # worse at the example's sizes
            high = arm.high is not None and floor.high is not None and better(floor.high, arm.high)
            if better(floor.times, arm.times) or (high and no_worse(floor.times, arm.times)):
                return arm, (None if arm is others[-1] else
                             f"{arm.name}: {arm.ms()} against {floor.ms()} for torch.compile")
        if not others:
            return floor, None
        last = others[-1]
        return floor, (f"not confirmed: {last.name} ran {last.ms()} against {floor.ms()} when timed "
                       "again beside it")

    def ready(self, arm: Arm) -> Arm:
        """Build the arm's callable and make its first calls in the caller's grad mode (where
        torch.compile compiles); any exception becomes arm.error. A kernel that failed at run time
        in those calls (fallback.py) fails the arm too: its region ran instead, so its time is not
        the kernel's; so does an output unlike the original forward's (wrong_output)."""
        from torch_htam import fallback, inductor
        from torch_htam.timing import _sync_for
        self.arms.append(arm)
        inputs = self.plain if arm.kind is ArmKind.STATIC else self.inputs
        sync, t0 = _sync_for(inputs), time.perf_counter()
        if arm.kind is ArmKind.WRAPPER:   # its compile needs the vector ISA: one look, not two
            inductor.warm_vec_isa().join()
        warm = arm.kind is ArmKind.WRAPPER and inductor.cpp_wrapper_warmed()
        try:
            arm.call = self.build(arm)
            before = fallback.failures()
            with self.grad.enter():
                arm.call(*inputs)
                sync()
                t1 = time.perf_counter()
                arm.call(*inputs)
                sync()
                t2 = time.perf_counter()
                out = _float_leaves(arm.call(*inputs))
            if arm.kind is ArmKind.COMPILE:
                self.compile_s, self.call_s = t1 - t0, t2 - t1
            if arm.kind is ArmKind.ORIGINAL:
                self.expected = out
            failed = self.newly_failed(arm, before)
            if failed:
                arm.failed_kernels = failed
                arm.error = f"{len(failed)} kernel(s) failed at run time (their regions ran instead)"
            elif arm.kind in CHECKED or arm.kernels:
                arm.error = self.wrong_output(out)
        except Exception as e:  # noqa: BLE001 -- an arm that fails is dropped, not the run
            log.warning("torch_htam: %s failed: %s: %s", arm.name, type(e).__name__, e, exc_info=True)
            arm.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        arm.setup_s = time.perf_counter() - t0
        if warm and not arm.error:   # the host's own figure for the next estimate
            inductor.note_wrapper_extra(arm.setup_s - self.compile_s)
        return arm

    def wrong_output(self, out: list) -> str | None:
        """Why the arm's outputs on the example inputs are not the original forward's within the
        model's end-to-end tolerance (policy.end_to_end_tolerance, norm-relative), or None.

        NOTE: every kernel was verified on its region, but regions compose inside the model
        (layouts between them, a re-exported graph's folded masks): an arm is checked whole
        before it can be chosen, as the user will run it."""
        from torch_htam.policy import end_to_end_tolerance, rel_err
        if self.expected is None:
            return None
        if len(out) != len(self.expected):
            return f"wrong output: {len(out)} tensors against {len(self.expected)} from the original forward"
        tol = end_to_end_tolerance(self.model)
        for i, (o, e) in enumerate(zip(out, self.expected)):
            err = rel_err(o, e) if o.shape == e.shape else float("inf")
            if not err <= tol:
                return f"wrong output {i}: relative error {err:.2e} against the original forward (tolerance {tol:g})"
        return None

    def build(self, arm: Arm) -> Callable:
        from torch_htam import inductor, runtime
        mode = self.cfg.mode
        if arm.kind is ArmKind.ORIGINAL:
            return self.model._call_impl
        if arm.kind is ArmKind.STATIC and arm.kernels:   # the example's own graph with the kernels' twins
            arm.backend = inductor.HtamBackend(self.twin_kernels(arm.kernels), mode, options=arm.options, twins=True)
            return inductor.compile_with(self.model, arm.backend)
        if arm.kind in (ArmKind.COMPILE, ArmKind.STATIC, ArmKind.LAYOUT, ArmKind.WRAPPER):
            # the backend names the mode and options for bundles; Inductor compiles without it
            arm.backend = inductor.HtamBackend({}, mode, options=arm.options)
            return inductor.compile_with(self.model, None, mode, arm.options or None)
        if arm.kind is ArmKind.REPLAY:
            fwd, report = runtime.replay(self.model, self.found, {s: self.kernels_of(s) for s in arm.kernels},
                                         min_speedup=self.cfg.min_speedup)
            if fwd is None:
                raise RuntimeError(report.note)
            arm.replay_report = report
            return fwd
        kernels = {s: self.kernels_of(s) for s in arm.kernels}
        arm.backend = inductor.HtamBackend(kernels, mode, keep_reexport=arm.keep_reexport, options=arm.options)
        return inductor.compile_with(self.model, arm.backend)

    def time(self, arms: list[Arm], high: tuple | None = None, overrun: bool = False) -> bool:
        """Time the arms interleaved (both ways) on the example inputs, or on `high` (the declared
        ranges' high end: into Arm.high); False where the deadline leaves no time. overrun: arms
        compiled for a choice are timed even past the deadline, where that takes at most
        TIMING_OVERRUN_S (and the report says by how much)."""
        arms = [a for a in arms if not a.error]
        # NOTE: the STATIC arm recompiles on an input marked dynamic; the other arms' graphs serve
        # the unmarked example inputs as they are (Dynamo guards a mark only where a call has one)
        plain = any(a.kind is ArmKind.STATIC for a in arms)
        times = self.timed(arms, high or (self.plain if plain else self.inputs),
                           "example" if high is None else "high end", overrun)
        if times is None:
            return False
        for a, t in zip(arms, times):
            if high is None:
                a.times = t
            else:
                a.high = t
        return True

    def timed(self, arms: list[Arm], inputs: tuple, at: str, overrun: bool = False) -> list[ArmTimes] | None:
        """The arms' times on `inputs`, interleaved, recorded in the decision's timings as taken
        `at` (e.g. "example", "size 4"); None where the deadline leaves no time (overrun as time())."""
        from torch_htam.timing import time_arms
        need = self.timing_s(len(arms))
        if not self.deadline.allows(need):
            if not (overrun and need <= TIMING_OVERRUN_S):
                self.out_of_time("timing " + ", ".join(a.name for a in arms))
                return None
            past = -min(0.0, self.deadline.remaining() or 0.0) + need
            self.deadline.overrun(f"timing {', '.join(a.name for a in arms)}: about {past:.0f} s past the "
                                  "time budget, the arms being compiled already")
        self.settle_graphs(arms, inputs)
        # our own background builds (a library's, a prebuild's) stop while the host must be quiet
        with build.background_paused():
            self.quiet_host(need)
            with self.deadline.phase("decide: timing"):
                times = time_arms({i: a.call for i, a in enumerate(arms)}, inputs, ITERS, ROUNDS, self.grad)
        out = [times[i] for i in range(len(arms))]
        self.timings.append(timing_record(arms, out, at))
        return out

    def settle_graphs(self, arms: list[Arm], inputs: tuple) -> None:
        """Call each arm with our kernels on `inputs` until their launches run as CUDA graphs
        (launcher.settle_graphs), so the timing measures them as steady serving runs them: the
        launcher captures at most one launch per 2 ms, so a timing started right after an arm
        was built would time plain launches and captures that steady serving does not make."""
        from torch_htam.launcher import settle_graphs
        with self.deadline.phase("decide: settling graph launches"), self.grad.enter():
            for a in arms:
                if a.kernels:
                    settle_graphs(lambda a=a: a.call(*inputs))

    def quiet_host(self, timing_s: float) -> None:
        """Wait (within the deadline, at most timing.QUIET_MAX_S) until other processes leave the
        host's cores alone: a host-bound model's timing would carry their load (timing.py). A
        timing that had to start on a busy host is noted in the decision, and later timings of
        this decision do not wait again (a host busy for that long is the user's host as it is)."""
        from torch_htam.timing import QUIET_MAX_S, on_cuda, wait_for_quiet_host
        if not on_cuda(self.inputs):    # a CPU model's timing is the host's own work
            return
        left = self.deadline.remaining()
        max_s = 0.0 if self.host_notes else QUIET_MAX_S
        with self.deadline.phase("decide: waiting for a quiet host"):
            load = wait_for_quiet_host(max_s if left is None else
                                       min(max_s, max(0.0, left - timing_s - self.keep_s)))
        if not load.quiet:
            note = (f"timed while other processes used {load.others_cores:.1f} CPU cores "
                    f"(after waiting {load.waited_s:.0f} s for them to finish)")
            log.warning("torch_htam: %s", note)
            self.host_notes.append(note)

    def done(self, arm: Arm, outcome: Outcome, reason: str) -> Decision:
        hazards = self.wrapper_hazards() if host_bound(self.host_share) else []
        return Decision(arm, outcome, reason, self.arms, self.grad, list(self.host_notes), self.host_share, hazards,
                        self.cfg.mode, timings=self.timings)

    # -- bookkeeping -----------------------------------------------------------------------------

    def arm(self, kind: ArmKind) -> Arm:
        """The first arm of this kind built so far (start() builds the floor and the original)."""
        return next(a for a in self.arms if a.kind is kind)

    def kernels_of(self, sig: str):
        return self.kernels[sig]

    def twin_kernels(self, sigs) -> dict[str, Any]:
        """{static twin signature (extract.static_twin): kernel} of the ranged tasks `sigs`: what
        the graph specialized to the example's sizes can run."""
        from torch_htam.extract import static_twins
        return static_twins(getattr(self.found, "tasks", None) or [], {s: self.kernels_of(s) for s in sigs})

    def failed(self) -> set[str]:
        return {s for a in self.arms for s in a.failed_kernels}

    def newly_failed(self, arm: Arm, before: dict) -> tuple[str, ...]:
        from torch_htam import fallback
        handles = arm.handles()
        now = fallback.failures(set(handles.values()))
        return tuple(s for s, h in handles.items() if now.get(h, 0) > before.get(h, 0))

    def symbolic_convs(self, found=None) -> bool:
        """Whether the captured graphs (found's, default the decision's) are dynamic (declared
        dims) and hold a conv: where Inductor's layout optimization is off (LAYOUT_OPTIONS), and
        settle() primes the chosen arm's sizes."""
        cap = getattr(found if found is not None else self.found, "capture", None)
        return bool(cap is not None and cap.dynamic and has_conv(cap.graphs))

    def single_graph(self) -> bool:
        cap = getattr(self.found, "capture", None)
        return cap is not None and cap.exported is not None and len(cap.graphs) == 1

    def timing_s(self, n_arms: int) -> float:
        """Expected seconds to time n arms: per arm ITERS synced calls, plus per round 2 untimed
        calls, THROUGHPUT_CALLS back-to-back calls and the device-time call behind its sleep
        (1.5 calls long), at the floor's last known call time."""
        from torch_htam.timing import THROUGHPUT_CALLS
        ms = max((a.times.latency.median_ms for a in self.arms if a.times), default=None)
        if ms is None:   # not timed yet: the floor's second call stands for it
            ms = 1e3 * self.call_s
        return n_arms * (ITERS + ROUNDS * (2 + THROUGHPUT_CALLS + 2.5)) * ms / 1e3

    def affords(self, n_arms: int, keep_s: float = 0.0, compile_s: float | None = None) -> bool:
        """One more arm: a compile of compile_s seconds (default: a kernel arm's, trial_compile_s,
        else the floor's), then timing n_arms arms, with keep_s seconds left after them."""
        compile_s = compile_s if compile_s is not None else (self.trial_compile_s or self.compile_s)
        need = compile_s + self.timing_s(n_arms) + keep_s + self.prime_s
        if self.deadline.allows(need):
            return True
        self.out_of_time(f"further trials (each about {need:.0f} s)")
        return False

    def out_of_time(self, what: str) -> str:
        note = f"{what}: skipped, the time budget ran out"
        if note not in self.deadline.skipped:
            self.deadline.skip(note)
        return note

    @contextlib.contextmanager
    def limits(self):
        """Dynamo's recompile limits raised while the trials compile, and the trials' cache
        entries dropped afterwards from the frames they share with the user's code (graph breaks'
        frames), so that neither the trials nor a user's later compiles run out of recompiles."""
        import torch._dynamo.config as dcfg
        before = _cache_sizes()
        with dcfg.patch(recompile_limit=max(dcfg.recompile_limit, TRIAL_RECOMPILE_LIMIT),
                        accumulated_recompile_limit=max(dcfg.accumulated_recompile_limit,
                                                        4 * TRIAL_RECOMPILE_LIMIT)):
            yield
        self.grown = [c for c, n in _cache_sizes().items() if n > before.get(c, 0)
                      and not c.co_name.startswith("htam_call_")]


# The arms whose outputs must match the original forward's before they can be chosen (the floor
# is torch.compile's own answer; the original is the reference; the layout arm is Inductor with an
# option it turns off on these graphs, so it is checked too).
CHECKED = (ArmKind.REEXPORT, ArmKind.LAYOUT, ArmKind.WRAPPER, ArmKind.KERNELS, ArmKind.REPLAY)


def _spans(sizes) -> str:
    """Sizes as runs: {1, 2, 3, 9} -> '1-3, 9'."""
    out, run = [], []
    for n in sorted(sizes):
        if run and n != run[-1] + 1:
            out.append(run)
            run = []
        run.append(n)
    out += [run] if run else []
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out) or "none"


def _float_leaves(out) -> list:
    """The floating-point tensors of a model's output (any pytree: tuples, dicts, HF outputs),
    detached and cloned at once (a CUDA-graph arm's next replay overwrites its outputs)."""
    import torch
    from torch.utils import _pytree as pytree
    return [x.detach().clone() for x in pytree.tree_leaves(out)
            if isinstance(x, torch.Tensor) and x.is_floating_point()]


def _trials(ranked: list[str], every: list[str]):
    """The kernel subsets to try, in order: every kernel (where some lost to Inductor's code for
    their region alone: a host-bound model can still gain), those that beat it, then its top half
    and top quarter by estimated saving (none empty, none twice)."""
    seen, out = set(), []
    for subset in ([every] if len(every) > len(ranked) else []) + [ranked, ranked[: len(ranked) // 2],
                                                                   ranked[: len(ranked) // 4]]:
        key = frozenset(subset)
        if subset and key not in seen:
            seen.add(key)
            out.append(tuple(subset))
    return out


def _sets(ranked: list[str], every: list[str], timed: list[tuple[frozenset, float]], paid: Callable[[], bool]):
    """The kernel sets a decision times, in order: _trials', then, where none of them paid (paid()),
    those the timings of them imply (_implied over `timed`, which the caller appends each timed
    set and its gain to)."""
    yield from _trials(ranked, every)
    if not paid():
        yield from _implied(timed, every)


def _implied(timed: list[tuple[frozenset, float]], every: list[str]) -> list[tuple[str, ...]]:
    """Kernel sets no trial timed that the trials imply pay, the most first: where a set S and a
    set T within it were timed (gain: ratio() against the base), S without T is estimated at
    gain(S) / gain(T), the kernels' effects on the model taken as independent; those estimated to
    clear the margin better() asks. NOTE: a kernel can lose in the model what it won on its
    region (one that replaces a fused Inductor kernel splits that fusion): BERT bf16's three
    winners together came 0.4% ahead and the top one alone 2.9% behind, so the other two were
    estimated 3.4% ahead (zoo-20261130-232930), a set _trials never times.

        >>> _implied([(frozenset("abc"), 1.004), (frozenset("a"), 0.971)], list("abc"))
        [('b', 'c')]
    """
    seen, est = {s for s, _ in timed}, {}
    for s, gain_s in timed:
        for t, gain_t in timed:
            if t < s and gain_t > 0 and s - t not in seen:
                est[s - t] = max(est.get(s - t, 0.0), gain_s / gain_t)
    ordered = sorted(est.items(), key=lambda kv: -kv[1])
    return [tuple(k for k in every if k in c) for c, g in ordered if g >= 1.0 / (1.0 - MARGIN)]


def _cache_sizes() -> dict:
    """{code object: Dynamo cache entries} for every code object Dynamo has compiled."""
    import torch
    from torch._dynamo.convert_frame import input_codes
    get = torch._C._dynamo.eval_frame._debug_get_cache_entry_list
    out = {}
    for ref in list(input_codes.seen):
        code = ref()
        if code is not None:
            out[code] = len(get(code))
    return out


def _forget(codes: list) -> None:
    """Drop the trials' Dynamo cache entries from the user's own frames (a graph break's frames,
    which every trial's backend compiled once); the chosen arm compiles them again on its next
    call (from Inductor's caches: seconds). NOTE: Dynamo can drop a frame's entries only all at
    once, so a compile the user made of the same class's forward compiles again too."""
    import torch
    for code in codes:
        torch._C._dynamo.eval_frame.reset_code(code)


# ---- the decision on the model ---------------------------------------------------------------------

def install(model: nn.Module, d: Decision, found, kernels: dict, ranked: list[str] | None = None,
            notes: list[str] | None = None) -> nn.Module:
    """Make `model` run the chosen arm, with the report built from the decision (attach.py sets
    the attributes). ranked: the kernels that beat Inductor's code for their region alone."""
    from torch_htam import attach, inductor, runtime
    arm, ranked = d.chosen, set(ranked or [])
    tasks = found.tasks if found is not None else []
    method = found.capture.method if found is not None else "none"
    if arm.kind is ArmKind.REPLAY:
        report = arm.replay_report
    else:
        compiled = arm.kind in (ArmKind.COMPILE, ArmKind.KERNELS, ArmKind.REEXPORT, ArmKind.LAYOUT, ArmKind.WRAPPER)
        report = runtime.Report(method=f"{method} + inductor ({getattr(arm.backend, 'mode', 'default')})"
                                if compiled else f"{method} + {d.outcome.value}")
        report.tasks = runtime._task_reports(tasks, kernels, [], {}, {})
    failed = {s for a in d.arms for s in a.failed_kernels}
    tried = {s for a in d.arms if a.kind is ArmKind.KERNELS for s in a.kernels}
    errors = _failure_messages(d)
    for t in report.tasks:
        if t.signature in arm.kernels and arm.kind is ArmKind.KERNELS:
            t.status = runtime.TaskStatus.READY
        elif t.signature in failed:
            why = f" ({errors[t.signature]})" if errors.get(t.signature) else ""
            t.status, t.detail = runtime.TaskStatus.FAILED_AT_RUN_TIME, f"its region ran instead{why}; dropped"
        elif t.signature in kernels and t.signature not in arm.kernels:
            t.status = runtime.TaskStatus.NOT_USED
            t.detail = _unused_why(d.outcome, t.signature in ranked, t.signature in tried)
    report.outcome, report.decision = d.outcome, d
    report.note = "; ".join(x for x in (d.reason, *(notes or ())) if x)
    report.e2e = _e2e(d)
    report.kernel_failures = _failures(d)
    if arm.kind is ArmKind.ORIGINAL:
        report.swapped = 0
        return attach.leave(model, report.note, tasks, report)
    if arm.kind is ArmKind.REPLAY:
        report.fast_calls = report.fallback_calls = 0       # the trials' calls are not the user's
        report.fallback_reasons.clear()
        return attach.forward(model, arm.call, report)
    attach.compiled(model, arm.call, report, arm.backend)
    inductor.sync_report(model)
    return model


def _unused_why(outcome: Outcome, beat_inductor: bool, tried: bool = True) -> str:
    """Why a verified kernel is not in what the model runs, by the decision's outcome (tried:
    whether any trial ran the model with it)."""
    return {Outcome.ORIGINAL_FASTER: "the original forward was faster than torch.compile",
            Outcome.ORIGINAL: "the replay with it was not faster than the original forward",
            Outcome.COMPILE_FAILED: "torch.compile failed on this model",
            Outcome.NOT_TIMED: "the time budget ran out before it could be tried"}.get(
        outcome, "slower than Inductor's code for the region" if not beat_inductor
        else "the model was not faster with it" if tried
        else "the time budget ran out before a trial with it")


def _e2e(d: Decision) -> dict[str, float]:
    """Each timed arm's medians, the last timing of each (ms): what the report shows."""
    out: dict[str, float] = {}
    for a in d.arms:
        if a.times is not None:
            out[f"{a.name}, synced"] = a.times.latency.median_ms
            out[f"{a.name}, back to back"] = a.times.throughput.median_ms
    return out


def _arm_handles(d: Decision) -> dict[str, int]:
    """{signature: kernel handle}, over every arm tried."""
    handles = {}
    for a in d.arms:
        handles |= a.handles()
    return handles


def _failure_messages(d: Decision) -> dict[str, str]:
    """{signature: the first message of its kernel's failed launch}, over every arm tried."""
    from torch_htam import fallback
    handles = _arm_handles(d)
    errors = fallback.failure_messages(set(handles.values()))
    return {s: errors[h] for s, h in handles.items() if h in errors}


def _failures(d: Decision) -> dict[str, int]:
    """{signature: calls in which its kernel failed and its region ran}, over every arm tried."""
    from torch_htam import fallback
    handles = _arm_handles(d)
    failures = fallback.failures(set(handles.values()))
    return {s: failures[h] for s, h in handles.items() if h in failures}
