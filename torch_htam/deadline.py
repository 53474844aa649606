"""One deadline for all of optimize(): every phase asks it how long it may take.

`OptimizeConfig.time_budget_s` bounds optimize's whole wall time: capture, search, builds and
worker jobs in flight, the winner's confirmation, Inductor timings, the end-to-end decision's
compiles and timings. A phase that cannot start in the time left is skipped and named in the
report; work in flight is cut where it can be (a build's or a worker job's timeout is capped at the
time left, so the deadline kills it like a hang).

    >>> d = Deadline(60.0)
    >>> with d.phase("capture"):
    ...     found = extract(model, inputs)
    >>> d.cap(300.0)          # a build's timeout: 300 s, or the time left if less
    >>> d.phases              # {"capture": 1.9}
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field


# Seconds before the deadline within which a stop counts as the deadline's: a build's or a worker
# job's timeout capped at the time left fires at the deadline or just after it.
SLACK_S = 0.05


def passed(at: float | None) -> bool:
    """Whether a deadline at time.monotonic() value `at` (None: none) has passed, within SLACK_S."""
    return at is not None and time.monotonic() >= at - SLACK_S


@dataclass
class Deadline:
    """budget_s: seconds from now (None: no deadline; every query then answers 'plenty').

    phases: wall seconds spent per named phase, in the order run (a phase run twice adds up);
    skipped: the optional phases left out for lack of time, with why, for the report;
    overran: the steps let run past it (a few seconds of timing arms already compiled), and by how much.
    """
    budget_s: float | None = None
    start: float = field(default_factory=time.monotonic)
    phases: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    overran: list[str] = field(default_factory=list)

    @property
    def at(self) -> float | None:
        """The deadline as a time.monotonic() value (None: none)."""
        return None if self.budget_s is None else self.start + self.budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float | None:
        """Seconds left (may be negative), None without a deadline."""
        return None if self.budget_s is None else self.budget_s - self.elapsed()

    def left(self, reserve: float = 0.0) -> float | None:
        """Seconds left for this phase, keeping `reserve` seconds for the phases after it
        (never negative; None without a deadline)."""
        r = self.remaining()
        return None if r is None else max(0.0, r - reserve)

    def expired(self) -> bool:
        """Whether the deadline has passed (within SLACK_S)."""
        return passed(self.at)

    def allows(self, seconds: float, reserve: float = 0.0) -> bool:
        """True when a step expected to take `seconds` fits before the deadline less `reserve`."""
        r = self.remaining()
        return r is None or r - reserve >= seconds

    def cap(self, timeout_s: float, floor_s: float = 1.0) -> float:
        """A timeout no later than the deadline: min(timeout_s, time left), at least floor_s so
        that a call made just before the deadline still fails by timing out, not by argument."""
        r = self.remaining()
        return timeout_s if r is None else max(floor_s, min(timeout_s, r))

    def overrun(self, what: str) -> None:
        """Record a step let run past the deadline (Trials.time's timing of compiled arms)."""
        self.overran.append(what)

    def skip(self, what: str) -> None:
        """Record an optional phase left out for lack of time."""
        self.skipped.append(what)

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - t0
