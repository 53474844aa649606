"""Coarse kernel state: what the HTG conditions its experience on.

The state is deliberately coarse (a few hundred keys at most) so experience gathered on one task
applies to the next: "memory-bound fp32 row reduction at 45% of the roofline whose last attempt
failed verification" is a situation that recurs across models; a shape or an op list is not.

    >>> s = state_of(task, evaluation, gpu)
    >>> s.key()
    'memory|red|fp32|high|ok'
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_htam import ops

# Evaluation.reason -> coarse failure class used in keys and preconditions. A class, not the
# reason, because "mismatch" and "partial_write" call for the same next move (boundary handling).
FAILURE_CLASS = {
    "static_check": "build", "compile_error": "build", "load_error": "build",
    # a refusal, like a build failure, ran nothing: the source does not fit the task
    "refused": "build",
    "launch_error": "crash", "crash": "crash", "timeout": "crash",
    "shape_mismatch": "wrong", "dtype_mismatch": "wrong", "partial_write": "wrong", "nan": "wrong",
    "mismatch": "wrong", "input_mutated": "wrong", "nondeterministic": "wrong",
    "above_roofline": "wrong",
}

# KernelSkill's headroom tiers on the fraction of the roofline reached.
HEADROOM_TIERS = ((0.6, "high"), (0.8, "medium"))


@dataclass(frozen=True)
class KernelState:
    """Where a task's best kernel stands.

    bound: "memory" | "compute" | "unknown" (arithmetic intensity vs the GPU's ridge point).
    headroom: "high" (<60% of the roofline) | "medium" (60-80%) | "low" (>80%) | "unknown".
    last_failure: the Evaluation.reason that sank the last step (None when it produced a correct
    kernel or nothing has run). kind: Task.kind, used for strategy eligibility, not in the key.
    tf32_allowed: the precision policy lets fp32 matmuls use TF32 tensor cores.
    """
    bound: str = "unknown"
    has_reduction: bool = False
    has_gemm: bool = False
    has_conv: bool = False
    dtype_class: str = "fp32"
    headroom: str = "unknown"
    last_failure: str | None = None
    kind: str = "other"
    tf32_allowed: bool = False

    @property
    def failure_class(self) -> str:
        """"ok" | "build" | "crash" | "wrong" (the coarse form of last_failure)."""
        return failure_class(self.last_failure)

    @property
    def tensor_cores(self) -> bool:
        """The policy allows tensor-core matmuls (TF32 for fp32 tasks, or a half dtype)."""
        return self.tf32_allowed or self.dtype_class == "half"

    @property
    def work(self) -> str:
        """"conv" | "gemm+red" | "gemm" | "red" | "ew": the region's dominant work."""
        if self.has_conv:
            return "conv"
        if self.has_gemm:
            return "gemm+red" if self.has_reduction else "gemm"
        return "red" if self.has_reduction else "ew"

    def key(self) -> str:
        """Short conditioning key, e.g. 'memory|red|fp32|high|ok' (3*5*2*4*4 = 480 keys at most)."""
        return "|".join((self.bound, self.work, self.dtype_class, self.headroom, self.failure_class))

    def value(self, name: str):
        """A field, or the coarse failure class for "last_failure" (what preconditions test)."""
        return self.failure_class if name == "last_failure" else getattr(self, name)


def failure_class(reason: str | None) -> str:
    """Coarse class of an Evaluation.reason: "ok" for None/"ok", else "build"|"crash"|"wrong".

    >>> failure_class("compile_error"), failure_class(None)
    ('build', 'ok')
    """
    if reason in (None, "ok"):
        return "ok"
    return FAILURE_CLASS.get(reason, "crash")


def headroom_tier(roofline_fraction: float | None) -> str:
    if roofline_fraction is None:
        return "unknown"
    for bound, tier in HEADROOM_TIERS:
        if roofline_fraction < bound:
            return tier
    return "low"


def ridge_point(gpu, precision: str) -> float | None:
    """FLOP per byte where the GPU turns compute-bound under a precision policy; None if unknown."""
    if gpu is None or not gpu.mem_bandwidth:
        return None
    # NOTE: dense TF32 tensor-core rate is half the bf16/fp16 rate on A100/H100.
    peak = {"fp32": gpu.fp32_flops, "tf32": gpu.tensor_flops / 2}.get(precision, gpu.tensor_flops)
    return peak / gpu.mem_bandwidth if peak else None


def state_of(task, evaluation=None, gpu=None, last_failure: str | None = None) -> KernelState:
    """The coarse state of `task` given the best kernel's Evaluation (None before any) and the GPU.

    last_failure: reason that sank the latest step; defaults to evaluation.reason when that
    evaluation failed.

    >>> state_of(task).key()                    # before any kernel, no GPU known
    'unknown|red|fp32|unknown|ok'
    """
    from torch_htam.policy import policy_for
    rows = [r for r in (ops.info(ops.packet_of(o)) for o in task.ops) if r is not None]
    has_gemm = task.kind in ("gemm", "attention") or any(r.kind in ("gemm", "attention") for r in rows)
    has_conv = task.kind == "conv" or any(r.kind == "conv" for r in rows)
    has_reduction = task.kind in ("rowwise", "attention") or any(r.reduction for r in rows)
    policy = policy_for(task)
    dtype_class = "half" if policy.name in ("fp16", "bf16") else "fp32"
    if last_failure is None and evaluation is not None and not evaluation.correct:
        last_failure = evaluation.reason
    roof = evaluation.roofline_fraction if evaluation is not None and evaluation.correct else None
    return KernelState(bound=_bound(task, gpu, policy.name), has_reduction=has_reduction,
                       has_gemm=has_gemm, has_conv=has_conv, dtype_class=dtype_class,
                       headroom=headroom_tier(roof), last_failure=last_failure, kind=task.kind,
                       tf32_allowed=policy.allow_tf32)


def _bound(task, gpu, precision: str) -> str:
    ridge = ridge_point(gpu, precision)
    if ridge is None or not task.bytes:
        return "unknown"
    intensity = task.flops / task.bytes   # FLOP per byte of minimum traffic
    return "compute" if intensity >= ridge else "memory"
