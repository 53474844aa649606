"""The verdict on one candidate: Evaluation, and the public `evaluate(task, source)`.

Every rejection has a reason from REASONS, so the search and the HTG can learn failure kinds.

    >>> ev = torch_htam.evaluate(task, source)
    >>> ev.correct, ev.reason, ev.speedup
    (True, 'ok', 1.84)
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from torch_htam.worker import await_result

REASONS = (
    "ok",
    "static_check",      # rejected before compiling (no stream, threads, new streams, sync, timer)
    "compile_error",
    "load_error",        # .so would not load / no htam_run symbol
    "launch_error",      # htam_run returned a CUDA error (or raised) on the task's own inputs
    "refused",           # htam_run returned HTAM_ERR_SHAPE on inputs the task declares (its example's,
                         # or a size of its ranges): it does not take their sizes, strides or dtypes
    "crash",             # worker process died (illegal address, abort)
    "timeout",           # hang or far too slow
    "shape_mismatch", "dtype_mismatch",
    "partial_write",     # poisoned output elements survived
    "nan",               # NaN/Inf where the reference has none
    "mismatch",          # values outside the precision policy's tolerance
    "input_mutated",
    "nondeterministic",  # two runs on the same inputs differ
    "above_roofline",    # faster than the hardware allows: the timer was fooled
    "no_gpu",
    "deadline",          # optimize's time budget ran out before or while the job ran: no verdict
    "unverified",        # a cache record that carries no verdict (written by hand, or torn)
)
# Reasons that judge nothing about the candidate's source: its strategies learn nothing from them.
UNJUDGED = frozenset({"deadline"})


# Wall seconds a worker job may add to compile the reference with Inductor (one region: seconds).
INDUCTOR_COMPILE_S = 240.0
BUILD_TIMEOUT_S = 300.0   # one ninja run of a batch of candidates
# A ranged kernel keeps a bucket only if its time there is at most its baseline's * (1 + this):
# time_fn's median moves by about 2% from one run to the next on the same shape, so a bucket
# within it is a tie (kept), not a loss.
BUCKET_NOISE = 0.02


@dataclass
class Evaluation:
    correct: bool
    reason: str                      # one of REASONS
    detail: str = ""                 # short, human- and proposer-readable
    source_hash: str = ""
    policy: dict[str, Any] = field(default_factory=dict)   # policy.Precision.to_json()
    ref_ms: float | None = None      # median reference time, same process
    kernel_ms: float | None = None   # median candidate time
    spread: float | None = None      # (p80 - p20) / median of the candidate's times
    speedup: float | None = None     # ref_ms / kernel_ms
    compile_ms: float | None = None  # the reference under torch.compile (Inductor), when timed
    compile_speedup: float | None = None   # compile_ms / kernel_ms
    # Inductor's code for the region where it was compiled here (inductor_kernels: its Triton
    # kernels and its call), for a proposer to see what it must beat; "" where not captured
    inductor_code: str = ""
    # a second, independent timing of the candidate (Evaluator(retime=True)): the figure to report
    # for a best chosen by kernel_ms, free of the winner's curse (bench/anytime.py)
    retime_ms: float | None = None
    # kernel_ms's two series (timing.Timing): CUDA events on the stream, and the host's drain to an
    # idle device; kernel_ms is the larger. A kernel_ms over its event_ms is work off the stream or
    # the host's noise: on an H200 host the events of 34 small references varied by at most 3.3%
    # over 12 timings, while one reference's reported time varied 1.38x over 10 back-to-back
    # timings, its events 1.01x (docs/experiments/timing_noise/)
    kernel_event_ms: float | None = None
    kernel_drain_ms: float | None = None
    roofline_fraction: float | None = None   # roofline time / kernel time (1.0 = at the roof)
    build_s: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    shapes_checked: list[list[list[int]]] = field(default_factory=list)
    so_path: str | None = None       # the built library this verdict is about (None if not built)
    # a task with a declared range: the buckets [input, dim, low, high] the kernel verified in
    # (verify.verify_range; what the runtime may launch it for); [] for a static task
    buckets: list[list[int]] = field(default_factory=list)
    # False: verified and timed at the example's sizes only, a ranged candidate slower than its
    # batch's fastest that passed the range (Evaluator.evaluate_many); never a task's kernel
    range_checked: bool = True
    # per kept bucket away from the example size: [low, high, size, kernel_ms, base_ms], both
    # timed at one size verified in it (the baseline: the compiled reference when it was timed,
    # else the eager one); a bucket whose kernel lost there is not in `buckets`
    bucket_times: list[list[float]] = field(default_factory=list)
    # ptxas's account of the built kernels (build.Resources): the most registers a thread of one
    # uses, and the bytes they spill (None where the build log had no ptxas report)
    registers: int | None = None
    spill_bytes: int | None = None
    # wall seconds of the worker's job by part: "verify", "time" (candidate and eager reference),
    # "inductor" (the reference compiled by torch.compile and its first call, where asked) and
    # "inductor_time"; where a task's search time goes
    job_s: dict[str, float] = field(default_factory=dict)

    @property
    def faster(self) -> bool:
        return self.correct and (self.speedup or 0.0) > 1.0

    def ptxas(self) -> str:
        """The resources in words for a proposer ("" when unknown), e.g. '168 registers, no spills'."""
        if self.registers is None:
            return ""
        return f"{self.registers} registers, " + (f"{self.spill_bytes} bytes spilled" if self.spill_bytes
                                                   else "no spills")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Evaluation":
        return Evaluation(**d)


# ---------------------------------------------------------------------------------- parent side

def _from_result(res: dict[str, Any], source_hash: str, policy: dict, build_s: float,
                 so_path: str | None) -> Evaluation:
    """A worker's result dict (or the pool's timeout/crash dict) -> Evaluation."""
    known = {k: v for k, v in res.items() if k in Evaluation.__dataclass_fields__}
    known.setdefault("correct", res.get("reason") == "ok")
    return Evaluation(**{**known, "source_hash": source_hash, "policy": policy, "build_s": build_s,
                         "so_path": so_path})


class Evaluator:
    """Builds candidates in parallel, then verifies and times them in isolated GPU workers.

    One WorkerPool (one process per GPU) lives as long as the Evaluator; use it as a context
    manager or call close(). timeout: wall seconds per candidate in a worker (hang -> "timeout").

        >>> with Evaluator() as ev:
        ...     results = ev.evaluate_many(task, [src_a, src_b])
        >>> [(r.reason, r.speedup) for r in results]
        [('ok', 1.84), ('mismatch', None)]
    """

    def __init__(self, arch: str | None = None, timeout: float = 60.0, time: bool = True,
                 pool=None, n_workers: int | None = None, retime: bool = False, deadline=None):
        from torch_htam import build, gpu
        from torch_htam.deadline import Deadline
        self.gpu = gpu.detect()   # GpuInfo or None; the search reads it for its state
        self.arch = arch or build.default_arch()
        self.timeout, self.time, self.retime = timeout, time, retime
        # NOTE: builds and worker jobs end at the deadline (a job past it is cut like a hang)
        self.deadline = deadline or Deadline()
        self._pool, self._n = pool, n_workers

    def start(self) -> "Evaluator":
        """Start the GPU workers now, in the background (each builds or loads the launcher and
        opens its CUDA context: 20-60 s on a machine that never built the launcher, a few s
        after), so that time overlaps the caller's own work (optimize: weighing the tasks)
        instead of the first candidate's."""
        self.pool
        return self

    @contextlib.contextmanager
    def until(self, deadline):
        """Builds and worker jobs end at `deadline` inside the block (a search's own, shorter one)."""
        was, self.deadline = self.deadline, deadline
        try:
            yield self
        finally:
            self.deadline = was

    def background_builder(self):
        """build_many(sources, cancel=event) into the cache evaluate_many reads, niced, for
        candidates it may be asked for later (prebuild.py); None where its pool builds elsewhere
        (ray_pool.RayPool)."""
        from torch_htam import build
        if getattr(self._pool, "build_many", None) is not None:
            return None
        return functools.partial(build.build_many, arch=self.arch, background=True,
                                 timeout_s=BUILD_TIMEOUT_S)

    @property
    def pool(self):
        if self._pool is None:   # started on first use: building never waits for it
            from torch_htam.worker import WorkerPool
            self._pool = WorkerPool(self._n, timeout=self.timeout)
        return self._pool

    def evaluate_many(self, task, sources: list[str], policy=None, inductor: bool = False) -> list[Evaluation]:
        """One Evaluation per source, in order: static check and build for all, then the built ones
        verified (and, if correct, timed against the reference) across the workers. inductor: also
        time the reference under torch.compile (the bar a kernel must clear inside a compiled
        model; seconds of compile per task, so the search asks for it only for its winner)."""
        import torch
        from torch_htam import build
        from torch_htam.policy import policy_for
        from torch_htam.verify import leading_dim
        pol = (policy or policy_for(task)).to_json()
        # NOTE: a pool with its own build_many (ray_pool.RayPool: CPU tasks across a cluster) builds
        # too; the default WorkerPool does not, and is not started for it
        build_many = getattr(self._pool, "build_many", None) or build.build_many
        builds = build_many(sources, arch=self.arch, timeout_s=self.deadline.cap(BUILD_TIMEOUT_S))
        out: list[Evaluation | None] = [None] * len(sources)
        futures = {}
        # NOTE: a ranged task's candidates are verified and timed at the example's sizes first, and
        # only the fastest over the whole range (_range_fastest): a conv candidate on cuDNN plans
        # each size it meets, and verifying four over the range took up to 25 s of a 30 s task
        # search (served vision bf16, budget 300 s, H200), so only 7 of its 18 tasks were searched
        by_range = not inductor and self.time and len(sources) > 1 and leading_dim(task) is not None
        for i, b in enumerate(builds):
            if not b.ok and b.timed_out and self.deadline.expired():
                # the budget's cut, not the source's failure (worker.cut_at_deadline)
                out[i] = Evaluation(False, "deadline", f"cut at optimize's deadline ({b.error})", b.source_hash, pol,
                                    build_s=b.seconds)
            elif not b.ok:
                static = b.error.startswith("static check:")
                detail = b.error.removeprefix("static check:").strip() if static else b.error
                out[i] = Evaluation(False, "static_check" if static else "compile_error", detail,
                                    b.source_hash, pol, build_s=b.seconds)
            elif not (torch.cuda.is_available() or getattr(self._pool, "remote_gpus", False)):
                out[i] = Evaluation(False, "no_gpu", "no CUDA device: built, but cannot verify here",
                                    b.source_hash, pol, build_s=b.seconds, so_path=b.so_path)
            else:
                futures[i] = self.pool.submit(self._job(task, b.so_path, pol, inductor, not by_range))
        for i, fut in futures.items():
            b = builds[i]
            out[i] = _from_result(await_result(fut, self.deadline.at), b.source_hash, pol, b.seconds, b.so_path)
        if by_range:
            self._range_fastest(task, out, builds, pol)
        for ev, b in zip(out, builds):
            if b.resources is not None:
                ev.registers, ev.spill_bytes = b.resources.registers, b.resources.spill_bytes
        return out

    def _job(self, task, so_path: str, pol: dict, inductor: bool, whole: bool) -> dict:
        """The worker job for one built candidate (run_job); whole: verified over the task's range."""
        job = {"kind": "evaluate", "task": task.to_json(), "so_path": so_path, "policy": pol,
               "time": self.time, "inductor": inductor, "retime": self.retime, "range": whole}
        if inductor:   # NOTE: plus Inductor's compile of the reference, once per worker
            job["timeout"] = self.timeout + INDUCTOR_COMPILE_S
        if self.deadline.at is not None:
            job["deadline"] = self.deadline.at
        return job

    def _range_fastest(self, task, out: list, builds: list, pol: dict) -> None:
        """Candidates verified and timed at the example's sizes: the fastest correct one verified
        over the whole range (a full job: its buckets and their times), and the next while that
        fails. So every candidate faster than the batch's best over the range was checked over it,
        and the others (range_checked False) are slower: never the task's kernel."""
        for i in sorted((i for i, ev in enumerate(out) if ev.correct and ev.kernel_ms),
                        key=lambda i: out[i].kernel_ms):
            b, first = builds[i], out[i]
            fut = self.pool.submit(self._job(task, b.so_path, pol, False, True))
            out[i] = _from_result(await_result(fut, self.deadline.at), b.source_hash, pol, b.seconds, b.so_path)
            for part, seconds in first.job_s.items():   # both jobs' seconds: where the search's time went
                _add(out[i].job_s, part, seconds)
            if out[i].correct:
                return

    def evaluate(self, task, source: str, policy=None) -> Evaluation:
        return self.evaluate_many(task, [source], policy)[0]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.lru_cache(maxsize=1)
def _shared_evaluator() -> Evaluator:
    ev = Evaluator()
    atexit.register(ev.close)
    return ev


def evaluate(task, source: str, policy=None) -> Evaluation:
    """Build, verify and time one candidate for a task (workers are started once and reused).

        >>> ev = torch_htam.evaluate(task, open("gelu.cu").read())
        >>> ev.correct, ev.reason, ev.speedup
        (True, 'ok', 1.84)
    """
    import torch
    if not torch.cuda.is_available():
        return Evaluation(False, "no_gpu", "no CUDA device: torch.cuda.is_available() is False; "
                                           "run on a machine with an NVIDIA GPU and a CUDA build of torch")
    return _shared_evaluator().evaluate(task, source, policy)


# ---------------------------------------------------------------------------------- worker side
# worker.WorkerPool resolves DEFAULT_RUNNER = "torch_htam.evaluation:run_job" in each child.

def prepare_worker() -> None:
    """Child start-up, before it reports ready: CUDA context, launcher, ceilings (all cached), so
    no job's timeout pays for them. Failures here are left for the first job to report."""
    import torch
    if not torch.cuda.is_available():
        return
    torch.cuda.init()
    try:
        from torch_htam import launcher, timing
        launcher.get()
        timing.measure_ceilings()
    except Exception:   # reported per job as load_error by run_job
        pass


@functools.lru_cache(maxsize=8)
def _reference_model(source: str, name: str):
    from torch_htam.task import load_reference
    from types import SimpleNamespace
    return load_reference(SimpleNamespace(source=source, name=name)).cuda().eval()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one built candidate in this (worker) process; a dict of Evaluation fields.

    "exit": True in the result means the CUDA context is dead and the worker must restart.
    """
    import torch
    from torch_htam.policy import Precision
    from torch_htam.task import Task
    from torch_htam.verify import leading_dim, verify_range
    if job.get("kind") != "evaluate":
        raise ValueError(f"unknown job kind {job.get('kind')!r}; this runner handles 'evaluate'")
    if not torch.cuda.is_available():
        return {"reason": "no_gpu", "detail": "the worker sees no CUDA device"}
    task, policy = Task.from_json(job["task"]), Precision.from_json(job["policy"])
    try:
        from torch_htam.launcher import Kernel
        kernel = Kernel(job["so_path"])
    except Exception as e:
        return {"reason": "load_error", "detail": f"{type(e).__name__}: {str(e)[:500]}"}
    ref = _reference_model(task.source, task.name)
    t0 = time.perf_counter()
    # a static task gets verify's verdict; a ranged one is judged per bucket over its range, or
    # at the example's sizes alone where the job says "range": False
    whole = job.get("range", True)
    v = verify_range(task, kernel, ref, policy, seeds=tuple(job.get("seeds", (0, 1, 2))), other_sizes=whole)
    ok, reason, detail, errs = v.ok, v.reason, v.detail, v.errs
    job_s = {"verify": time.perf_counter() - t0}
    res = {"correct": ok, "reason": reason, "detail": detail, "max_abs_err": errs.get("max_abs_err"),
           "max_rel_err": errs.get("max_rel_err"), "shapes_checked": errs.get("shapes", []),
           "buckets": [[b.input, b.dim, b.low, b.high] for b in v.kept], "job_s": job_s,
           "range_checked": whole or leading_dim(task) is None}
    if reason == "crash":
        return {**res, "exit": True}
    if ok and job.get("time", True):
        try:
            res.update(_time(task, kernel, ref, policy, job.get("inductor", False), job.get("retime", False),
                             job_s))
            if res["correct"] and v.kept:   # a ranged task: its kept buckets must also be won
                res.update(_time_buckets(task, kernel, ref, policy, job.get("inductor", False), v))
        except Exception as e:   # torch.AcceleratorError on recent torch, RuntimeError before
            from torch_htam.verify import is_crash_message
            if not is_crash_message(str(e)):
                raise
            return {**res, "correct": False, "reason": "crash", "exit": True,
                    "detail": f"while timing: {str(e)[:300]}"}
    return res


@functools.lru_cache(maxsize=8)
def _compiled_reference(source: str, name: str):
    """The task's reference under torch.compile (default mode), compiled once per worker."""
    import torch
    return torch.compile(_reference_model(source, name))


# Characters of Inductor's code for a region a proposer is shown (inductor_kernels)
INDUCTOR_CODE_CHARS = 6000
_TRITON_KERNEL = re.compile(r"@triton\.jit\n(def .*?)'{3}", re.S)
# (reference source, name) -> Inductor's code for it (inductor_kernels), captured where this worker
# compiled it (_compiled_reference compiles once)
_INDUCTOR_CODE: dict[tuple[str, str], str] = {}


def inductor_kernels(code: str, limit: int = INDUCTOR_CODE_CHARS) -> str:
    """What a proposer needs of the module Inductor wrote for a region: each Triton kernel's
    definition, and the call() that runs them and its extern kernels (cuBLAS, cuDNN), at most
    `limit` characters; "" where the code has neither."""
    parts = [m.group(1).strip() for m in _TRITON_KERNEL.finditer(code)] + _calls(code)
    text = "\n\n".join(parts)
    return text if len(text) <= limit else text[:limit] + "\n# ... cut"


def _calls(code: str) -> list[str]:
    """Each `def call(...)` of the module with its body (a function, or a method of its Runner),
    dedented."""
    import textwrap
    lines, out = code.splitlines(), []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("def call("):
            indent = len(line) - len(line.lstrip())
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) <= indent), len(lines))
            out.append(textwrap.dedent("\n".join(lines[i:end])).rstrip())
    return out


def _first_call_code(compiled, args) -> str:
    """Call `compiled` (torch.compile'd, not run yet) once and return the code Inductor wrote for
    it (inductor_kernels), through the hook torch's own run_and_get_code uses
    (GraphLowering.save_output_code), without that function's reset of Dynamo; "" where nothing
    was written (a graph from Inductor's cache may come back without its code)."""
    try:
        from torch._inductor.graph import GraphLowering
    except ImportError:
        compiled(*args)
        return ""
    codes: list[str] = []
    was = getattr(GraphLowering, "save_output_code", None)
    GraphLowering.save_output_code = codes.append
    try:
        compiled(*args)
    finally:
        GraphLowering.save_output_code = was
    return inductor_kernels("\n".join(codes))


@dataclass
class BucketTime:
    """A kept bucket's kernel and baseline medians (ms) at one size verified in it."""
    low: int
    high: int
    size: int
    kernel_ms: float
    base_ms: float

    def to_json(self) -> list:
        return [self.low, self.high, self.size, self.kernel_ms, self.base_ms]


def winning_buckets(kept: list, example_size: int, times: list[BucketTime],
                    noise: float = BUCKET_NOISE) -> list:
    """The buckets of `kept` (verify.Bucket) the kernel is launched for: the one holding the example
    size (the example timing judged it, and the kernel as a whole), and each other one whose
    kernel_ms is at most base_ms * (1 + noise). A bucket without a time has no evidence of a win
    (its timing launch was refused) and is dropped. A static task keeps none, as before: [].

        >>> [str(b) for b in winning_buckets(kept, 32, [BucketTime(2, 8, 4, 0.011, 0.009)])]
        ['in0 dim 0 in [9, 64]']
    """
    by_span = {(t.low, t.high): t for t in times}

    def won(b) -> bool:
        t = by_span.get((b.low, b.high))
        return b.holds(example_size) or (t is not None and t.kernel_ms <= t.base_ms * (1 + noise))
    return [b for b in kept if won(b)]


def representative_size(verdict) -> int:
    """The size verified in a bucket (verify.BucketVerdict.sizes) nearest its geometric middle
    sqrt(low * high), by ratio: in [9, 128] both ends are 3.8x from its middle 34 (the arithmetic
    middle, 68, would lean to the large sizes of a bucket spanning 16x)."""
    mid = math.log(verdict.bucket.low * verdict.bucket.high) / 2
    return min(verdict.sizes, key=lambda n: (abs(math.log(n) - mid), n))


def _time_buckets(task, kernel, ref, policy, inductor: bool, verdict) -> dict[str, Any]:
    """"buckets" and "bucket_times" for a ranged task's verdict (verify.RangeVerdict): each kept
    bucket away from the example size timed at its representative size against the baseline,
    the ones the kernel loses dropped (winning_buckets)."""
    from torch_htam.verify import leading_dim, range_shapes
    i, d = leading_dim(task)
    example = task.inputs[i].shape[d]
    rs = range_shapes(task)   # the sets verify_range ran: every verified size has one
    times = []
    for bv in verdict.buckets:
        if not bv.ok or bv.bucket.holds(example):
            continue
        size = representative_size(bv)
        try:
            t = _time_at(task, kernel, ref, policy, rs.sets[rs.sizes.index(size)], inductor)
        except _Refused:
            continue   # no time: dropped
        base = t.compiled if t.compiled is not None else t.ref
        times.append(BucketTime(bv.bucket.low, bv.bucket.high, size, t.kernel.median_ms, base.median_ms))
    kept = winning_buckets(verdict.kept, example, times)
    return {"buckets": [[b.input, b.dim, b.low, b.high] for b in kept],
            "bucket_times": [t.to_json() for t in times]}


class _Refused(Exception):
    """The kernel returned a nonzero htam_run code on the timing inputs."""

    def __init__(self, code: int):
        super().__init__(f"htam_run returned {code} on the timing inputs")
        self.code = code


@dataclass
class _Times:
    """time_fn's Timings of one input shape set: candidate, reference, compiled reference (with
    inductor) and the candidate's second timing (with retime)."""
    kernel: Any
    ref: Any
    compiled: Any = None
    retime: Any = None
    code: str = ""     # with inductor: Inductor's code for the region (inductor_kernels)


def _time_at(task, kernel, ref, policy, shapes, inductor: bool = False, retime: bool = False,
             job_s: dict | None = None) -> _Times:
    """Candidate and references timed in this process on the same inputs of `shapes` ((input
    shapes, output shapes), as verify's shape sets); raises _Refused if the kernel declines them.
    job_s: where given, gets the seconds of "time", "inductor" (compile and first call) and
    "inductor_time" added."""
    job_s = {} if job_s is None else job_s
    t0 = time.perf_counter()
    import torch
    from torch_htam import timing
    from torch_htam.policy import tf32_switches
    from torch_htam import verify
    gen = torch.Generator().manual_seed(7)

    def make_set():
        return verify.make_set(task, shapes, gen, "cuda")

    # NOTE: timing discards return codes, so a kernel that refuses these inputs would time as
    # nothing at all: one checked call first
    if (code := kernel(*make_set())) != 0:
        raise _Refused(code)
    k = timing.time_fn(lambda s: kernel(s[0], s[1]), make_set)
    # NOTE: the reference runs as the user would run it: TF32 exactly when the policy allows it.
    with tf32_switches(policy.allow_tf32), torch.no_grad():
        r = timing.time_fn(lambda s: ref(*s[0]), make_set)
        c, compile_s, compiled_s = None, 0.0, 0.0
        if inductor:
            t1 = time.perf_counter()
            compiled = _compiled_reference(task.source, task.name)
            key, args = (task.source, task.name), make_set()[0]
            if key not in _INDUCTOR_CODE:   # compiles here, once per worker and task
                _INDUCTOR_CODE[key] = _first_call_code(compiled, args)
            else:
                compiled(*args)
            t2 = time.perf_counter()
            c = timing.time_fn(lambda s: compiled(*s[0]), make_set)
            compile_s, compiled_s = t2 - t1, time.perf_counter() - t2
            _add(job_s, "inductor", compile_s)
            _add(job_s, "inductor_time", compiled_s)
    k2 = timing.time_fn(lambda s: kernel(s[0], s[1]), make_set) if retime else None
    _add(job_s, "time", time.perf_counter() - t0 - compile_s - compiled_s)
    return _Times(k, r, c, k2, _INDUCTOR_CODE.get((task.source, task.name), "") if inductor else "")


def _add(d: dict, key: str, seconds: float) -> None:
    d[key] = d.get(key, 0.0) + seconds


def _time(task, kernel, ref, policy, inductor: bool = False, retime: bool = False,
          job_s: dict | None = None) -> dict[str, Any]:
    """Candidate and reference (and with `inductor` the compiled reference) timed in this process
    on the same inputs at the task's shapes; roofline check. retime: the candidate timed once more,
    after the reference (an independent second figure: retime_ms)."""
    from torch_htam import timing
    shapes = ([s.shape for s in task.inputs], [s.shape for s in task.outputs])
    try:
        t = _time_at(task, kernel, ref, policy, shapes, inductor, retime, job_s)
    except _Refused as e:
        return {"correct": False, "reason": "launch_error", "detail": str(e)}
    k, r, c, k2 = t.kernel, t.ref, t.compiled, t.retime
    roof = timing.roofline_ms(task, timing.measure_ceilings(), policy.name)
    res = {"ref_ms": r.median_ms, "kernel_ms": k.median_ms, "spread": k.spread,
           "kernel_event_ms": k.event_ms, "kernel_drain_ms": k.drain_ms,
           "speedup": r.median_ms / k.median_ms if k.median_ms > 0 else None,
           "roofline_fraction": roof / k.median_ms if k.median_ms > 0 else None}
    if k2 is not None:
        res["retime_ms"] = k2.median_ms
    if c is not None:
        res.update(compile_ms=c.median_ms, inductor_code=t.code,
                   compile_speedup=c.median_ms / k.median_ms if k.median_ms > 0 else None)
    if timing.above_roofline(k.median_ms, roof):
        res.update(correct=False, reason="above_roofline",
                   detail=f"{k.median_ms:.4f} ms is under {timing.ROOFLINE_SLACK:g}x the roofline "
                          f"{roof:.4f} ms (event {k.event_ms:.4f} ms, drain {k.drain_ms:.4f} ms): the timer was fooled")
    return res
