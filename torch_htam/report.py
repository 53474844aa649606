"""What torch_htam did to a model, and how its calls have gone since: model.htam_report."""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class TaskStatus(str, enum.Enum):
    """What became of one task's region; TaskReport.detail says why where there is a why."""
    SWAPPED = "swapped"
    READY = "kernel ready"                 # in the compiled call, swapped when Dynamo compiles
    NO_KERNEL = "no kernel"
    NOT_USED = "not used"                  # verified, left out by the end-to-end decision
    UNUSABLE = "not usable"                # a cache entry that is corrupt, unverified or slow
    NOT_LOADED = "not loaded"
    NOT_FOUND = "region not found"
    FAILED_AT_RUN_TIME = "failed at run time"   # its region ran instead (fallback.py), then dropped
    GOLDEN_FAILED = "golden check failed"       # a bundle's kernel that missed its recorded output here

    def __str__(self) -> str:
        return self.value


@dataclass
class TaskReport:
    """One distinct task: its status, and in detail why (e.g. "slower than Inductor's code for
    the region", "the time budget ran out before its search found one")."""
    name: str
    signature: str
    count: int = 1
    speedup: float | None = None     # kernel vs original region (eager), from its verification
    policy: str = ""
    status: TaskStatus = TaskStatus.NO_KERNEL
    vs_inductor: float | None = None  # kernel vs the region under torch.compile, when timed
    detail: str = ""
    kind: str = ""                   # Task.kind: "conv", "gemm", "attention", "rowwise", ...
    ref_ms: float | None = None      # the region's eager time per call, from its verification
    # a ranged task's kernel: the buckets [input, dim, low, high] it runs in, and per bucket away
    # from the example size [low, high, size, kernel_ms, base_ms] (Evaluation.bucket_times: where
    # it lost, the region runs instead)
    buckets: list[list[int]] = field(default_factory=list)
    bucket_times: list[list[float]] = field(default_factory=list)
    # the kernel's settings as its proposer made it (the expert's knobs: which path, which tile)
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        out = f"{self.status.value}: {self.detail}" if self.detail else self.status.value
        runs = self.buckets and self.status in (TaskStatus.SWAPPED, TaskStatus.READY)
        return out + (f" (sizes {self.sizes()})" if runs else "")

    def sizes(self) -> str:
        """The leading dim's sizes a ranged kernel runs at, as its kept buckets: "2-8, 9-64"."""
        return ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for *_, lo, hi in self.buckets)


@dataclass
class SearchPlan:
    """How optimize shared its time before the search (pipeline._Run.search), in seconds: what was
    left of the budget, what it kept back for the decision's trials, and what the search got."""
    left_s: float
    reserve_s: float
    given_s: float
    misses: int          # tasks the search was to look at (the cache had no usable kernel)

    def describe(self) -> str:
        return (f"search: {self.given_s:.0f} s for {self.misses} task(s) of the {self.left_s:.0f} s left; "
                f"{self.reserve_s:.0f} s kept for the decision's trials")


@dataclass
class Report:
    """What torch_htam did to a model, and how its calls have gone since.

    swapped: regions replaced in the graph (a task used in 12 layers counts 12). fast_calls /
    fallback_calls: forward calls that ran the rewritten graph / the original forward, with the
    reason of each fallback. e2e: end-to-end figures in ms when measured (e.g. "eager", "htam").
    """
    method: str = "none"
    note: str = ""
    tasks: list[TaskReport] = field(default_factory=list)
    swapped: int = 0
    fast_calls: int = 0
    fallback_calls: int = 0
    fallback_reasons: Counter = field(default_factory=Counter)
    e2e: dict[str, float] = field(default_factory=dict)
    optimize_s: float | None = None
    usage: dict[str, float] = field(default_factory=dict)   # LLM tokens/cost of this run's search
    outcome: Any = None        # decide.Outcome: what the model runs, in one word
    decision: Any = None       # decide.Decision: every arm tried, timed, and why the chosen one
    phases: dict[str, float] = field(default_factory=dict)  # optimize's wall seconds per phase
    skipped: list[str] = field(default_factory=list)        # phases the time budget left out
    overran: list[str] = field(default_factory=list)        # steps let run past it (deadline.Deadline.overrun)
    kernel_failures: dict[str, int] = field(default_factory=dict)  # {signature: calls its region ran}
    search_plan: SearchPlan | None = None   # None: no search ran, or no time budget

    def speedups(self) -> dict[str, float]:
        """{task name: verified speedup} for the swapped tasks."""
        return {t.name: t.speedup for t in self.tasks if t.status is TaskStatus.SWAPPED and t.speedup}

    def format(self) -> str:
        lines = [f"torch_htam: {self.swapped} region(s) swapped, capture: {self.method}"
                 + (f", {self.optimize_s:.1f} s" if self.optimize_s is not None else ""),
                 f"  {'task':40} {'signature':12} {'n':4} {'eager':>7} {'inductor':>7} policy status"
                 if self.tasks else ""]
        lines = [x for x in lines if x]
        if self.outcome is not None:
            lines.append(f"  runs: {self.outcome.value}")
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.phases:
            lines.append("  time: " + format_phases(self.phases))
        if self.search_plan is not None:
            lines.append("  " + self.search_plan.describe())
        for s in self.skipped:
            lines.append(f"  skipped: {s}")
        for s in self.overran:
            lines.append(f"  over budget: {s}")
        host = self.decision.host_line() if hasattr(self.decision, "host_line") else None
        for s in [*(getattr(self.decision, "host_notes", None) or ()), *([host] if host else [])]:
            lines.append(f"  host: {s}")
        for sig, n in self.kernel_failures.items():
            lines.append(f"  kernel {sig[:12]} failed at run time in {n} call(s); its region ran instead")
        for t in self.tasks:
            sp = f"{t.speedup:.2f}x" if t.speedup else "-"
            ind = f"{t.vs_inductor:.2f}x" if t.vs_inductor else "-"
            lines.append(f"  {t.name[:40]:40} {t.signature[:12]:12} x{t.count:<3} {sp:>7} {ind:>7} "
                         f"{t.policy:5} {t.describe()}")
        if self.fast_calls or self.fallback_calls:
            why = ", ".join(f"{k}: {v}" for k, v in self.fallback_reasons.items())
            lines.append(f"  calls: {self.fast_calls} swapped, {self.fallback_calls} original path"
                         + (f" ({why})" if why else ""))
            if self.fallback_reasons.get("autograd"):
                lines.append("  hint: kernels have no backward; run inference under "
                             "torch.inference_mode() / torch.no_grad()")
        for k, v in self.e2e.items():
            lines.append(f"  {k}: {v:.3f} ms")
        if self.usage.get("requests"):
            tokens = self.usage.get("prompt_tokens", 0) + self.usage.get("completion_tokens", 0)
            cost = (f"${self.usage.get('cost_usd', 0):.4f}" if self.usage.get("cost_known", 1)
                    else "cost unknown (no prices set)")
            lines.append(f"  LLM: {int(self.usage['requests'])} requests, {int(tokens)} tokens, {cost}")
        return "\n".join(lines)


def format_phases(phases: dict[str, float]) -> str:
    """Phase seconds in order, a part ("search: confirming winners") inside its whole ("search")
    where the whole is a phase too, its seconds being counted in the whole's:

        >>> format_phases({"capture": 1.6, "search: confirming winners": 21.2, "search": 60.0})
        'capture 1.6 s, search 60.0 s (confirming winners 21.2 s)'
    """
    parts: dict[str, list[str]] = {}
    for k, v in phases.items():
        whole, _, part = k.partition(": ")
        if part and whole in phases:
            parts.setdefault(whole, []).append(f"{part} {v:.1f} s")
    out = []
    for k, v in phases.items():
        whole, _, part = k.partition(": ")
        if part and whole in phases:
            continue
        out.append(f"{k} {v:.1f} s" + (f" ({', '.join(parts[k])})" if k in parts else ""))
    return ", ".join(out)
