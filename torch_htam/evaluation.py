"""The verdict on one candidate: Evaluation, and the public `evaluate(task, source)`.

Every rejection has a reason from REASONS, so the search and the HTG can learn failure kinds.

    >>> ev = torch_htam.evaluate(task, source)
    >>> ev.correct, ev.reason, ev.speedup
    (True, 'ok', 1.84)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

REASONS = (
    "ok",
    "static_check",      # rejected before compiling (no stream, threads, new streams, sync, timer)
    "compile_error",
    "load_error",        # .so would not load / no htam_run symbol
    "launch_error",      # htam_run returned a CUDA error or HTAM_ERR_SHAPE on the task's own shape
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
)


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
    roofline_fraction: float | None = None   # roofline time / kernel time (1.0 = at the roof)
    build_s: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    shapes_checked: list[list[list[int]]] = field(default_factory=list)

    @property
    def faster(self) -> bool:
        return self.correct and (self.speedup or 0.0) > 1.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Evaluation":
        return Evaluation(**d)
