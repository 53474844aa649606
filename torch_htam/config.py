"""OptimizeConfig: what optimize() may spend and use, validated when it is made."""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad OptimizeConfig value: field, value and what is allowed, said in one line."""

    def __init__(self, name: str, value: Any, allowed: str, none_ok: bool = False):
        self.field, self.value, self.allowed = name, value, allowed
        super().__init__(f"OptimizeConfig.{name}={value!r}: must be {allowed}"
                         + (" or None" if none_ok else ""))


def _int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _num(v) -> bool:   # an int where a float is wanted is fine (time_budget_s=300)
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


# torch.compile's modes (torch.compile(mode=...)); inductor.py reads them here
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _modes() -> tuple[str, ...]:
    return MODES


MEMORIES = ("htg", "flat", "none")


def _ranges(v) -> bool:
    """{input index: {dim: (low, high)}} of ints, 1 <= low <= high (that the example's size lies
    inside is checked where the inputs are seen: extract.check_dynamic)."""
    def dims_ok(dims) -> bool:
        return isinstance(dims, dict) and all(
            _int(d) and d >= 0 and isinstance(r, (tuple, list)) and len(r) == 2
            and all(_int(n) for n in r) and 1 <= r[0] <= r[1] for d, r in dims.items())
    return isinstance(v, dict) and all(_int(i) and i >= 0 and dims_ok(dims) for i, dims in v.items())

# One row per field: (test of the value, what is allowed (text, or a function giving it), None
# allowed too). A new field adds a row here (tests/test_config.py checks that every field has one).
RULES: dict[str, tuple] = {
    "steps": (lambda v: _int(v) and v >= 0, "an int >= 0", False),
    "candidates_per_step": (lambda v: _int(v) and v >= 1, "an int >= 1", False),
    "memory": (lambda v: v in MEMORIES, "one of " + ", ".join(map(repr, MEMORIES)), False),
    "use_llm": (lambda v: isinstance(v, bool), "True or False", False),
    "llm": (lambda v: True, "an LLMConfig", True),
    "search": (lambda v: isinstance(v, bool), "True or False", False),
    "max_tasks": (lambda v: _int(v) and v >= 1, "an int >= 1", True),
    "time_budget_s": (lambda v: _num(v) and v > 0, "a finite number of seconds > 0", True),
    "task_time_s": (lambda v: _num(v) and v > 0, "a finite number of seconds > 0", True),
    # below 1.0 a kernel slower than the original would be swapped in
    "min_speedup": (lambda v: _num(v) and v >= 1.0, "a finite number >= 1.0", False),
    "progress": (lambda v: isinstance(v, bool), "True or False", False),
    "prebuild": (lambda v: isinstance(v, bool), "True or False", False),
    "check_end_to_end": (lambda v: isinstance(v, bool), "True or False", False),
    "compile": (lambda v: isinstance(v, bool), "True or False", False),
    "mode": (lambda v: isinstance(v, str) and v in _modes(),
             lambda: "a torch.compile mode: " + ", ".join(map(repr, _modes())), False),
    "trajectory_dir": (lambda v: isinstance(v, (str, os.PathLike)), "a path", True),
    "extra": (lambda v: isinstance(v, dict), "a dict", False),
    "dynamic": (_ranges, "a dict {input index: {dim: (low, high)}} of ints with 1 <= low <= high", True),
}


# optimize's wall time when the caller names none. NOTE: at 120 s on an H100 a Swin-T (43 tasks)
# and a T5-small kept their attention kernels, 1.09-1.17x and 1.23x of torch.compile, in 112 and 105 s
# (bench/results/zoo-20261127-043427.json, -035914.json); without a deadline the search runs each
# task's 16 candidates, about 25 s a task for ResNet-50's convs (bench/findings.md).
DEFAULT_TIME_BUDGET_S = 300.0


@dataclass
class OptimizeConfig:
    """What optimize may spend and use.

    steps / candidates_per_step: HTAM evolution budget per task: step 0 plus `steps` steps of up to
    `candidates_per_step` kernels (under time_budget_s, step 0 is the proposer's defaults alone:
    search.SearchConfig.cover_candidates). The default, 16 candidates, is where the HTG's anytime curve
    reached the oracle of the expert's search space on bench/tasks (bench/anytime.py, H100: geomean
    100% of the oracle with warm memory, 99.7% cold; bench/results/anytime-20261123-202559.json).
    min_speedup: a verified kernel is swapped in only if it beats the original region by this
    factor; below it the gain is inside timing noise and not worth a custom op.
    check_end_to_end: time ours against the alternative on the example inputs and keep only the
    kernels that make the whole model faster (per-region wins need not add up).
    compile: the model runs under torch.compile with our kernels inside Inductor's graph (the
    alternative then is torch.compile of the model in the same mode); with check_end_to_end, the
    replay below replaces it where that is faster beyond noise. False replays the captured graph
    op by op with the kernels swapped in (the alternative: the original forward).
    mode: torch.compile's mode for compile=True ("default", "reduce-overhead", ...).
    time_budget_s: wall time for the whole call, capture to decision (DEFAULT_TIME_BUDGET_S; None:
    only the steps and task_time_s bound it, which on a model of 40 tasks is most of an hour).
    dynamic: the sizes real traffic brings, {input index: {dim: (low, high)}} (batch 1-64:
    {0: {0: (1, 64)}}), as torch.export.Dim declares them; the regions those dims reach get tasks
    over the range, verified per bucket of sizes (verify.verify_range). None: every task is
    specialized to the example's shapes.
    """
    steps: int = 3
    candidates_per_step: int = 4
    memory: str = "htg"                # "htg" | "flat" | "none" (ablation switch)
    use_llm: bool = False
    llm: Any = None                    # proposers.llm.LLMConfig; None = from the environment
    search: bool = True                # False: cached kernels only
    max_tasks: int | None = None       # search only the N costliest tasks
    time_budget_s: float | None = DEFAULT_TIME_BUDGET_S
    task_time_s: float | None = 300.0  # per-task wall limit
    min_speedup: float = 1.03
    progress: bool = True
    prebuild: bool = True              # build the search's coming candidates ahead (prebuild.py)
    check_end_to_end: bool = True      # keep the swap only if the whole model got faster
    compile: bool = True               # kernels inside torch.compile (else: graph replay)
    mode: str = "default"              # torch.compile mode when compile=True
    trajectory_dir: str | None = None  # default: <arch cache dir>/trajectories
    extra: dict = field(default_factory=dict)
    dynamic: dict | None = None        # {input index: {dim: (low, high)}}

    def __post_init__(self):
        # A config mistake is the caller's: say so at once, before any capture or search.
        for name, (ok, allowed, none_ok) in RULES.items():
            value = getattr(self, name)
            if not ((value is None and none_ok) or (value is not None and ok(value))):
                raise ConfigError(name, value, allowed() if callable(allowed) else allowed, none_ok)
