"""Builds the search's coming candidates in the background, so its cover pass finds them built.

A time-budgeted search_many first runs every task's step 0 (the cover pass), one task after the
other: build its candidates (nvcc, seconds), then verify and time them on the GPU. While one task
is verified and timed, the cores that built it sit idle, and every later task waits for its own
build in turn. A Prebuild walks the same tasks in the same order on a thread of its own: it works
out the step-0 candidates each task will get (the proposer's proposal for the HTG's step-0 choice,
on a snapshot of the memory), and builds them niced (build.BACKGROUND_NICE) into the same cache.
The search's own build of a source the Prebuild built is a cache hit, and of one it is building
now waits for it (build.build_many).

The guess is only a guess: where memory learned something from an earlier task that changes a
later task's choice, that task's step 0 builds what it needs itself, as without a Prebuild. Only a
proposer whose proposal is cheap and offline (Proposer.speculative: the expert) is asked ahead;
an LLM's is not. stop() ends the thread and its nvcc before the search hands the host on to the
decision's timing, which background compiles would slow (build._stop_ninja).
"""
from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("torch_htam")


@dataclass
class Prebuild:
    """sources_of(task) -> the task's step-0 sources (guessed; [] where none); build_many(sources,
    cancel=event) builds them (an Evaluator.background_builder). Start with start(), tell it where
    the search is with reached(), end with stop() (idempotent); `built` counts the sources built,
    `failed` the tasks whose guess raised."""
    tasks: list
    sources_of: Callable[[Any], list[str]]
    build_many: Callable[..., list]
    built: int = 0
    failed: int = 0
    _reached: int = -1       # the search's place in `tasks`: tasks up to it need no build ahead
    _cancel: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Prebuild":
        self._thread = threading.Thread(target=self._run, name="htam-prebuild", daemon=True)
        self._thread.start()
        return self

    def reached(self, index: int) -> None:
        """The search is at tasks[index] now: the thread skips it and every task before it (the
        search builds those itself, and a guess that missed would be built for nothing)."""
        self._reached = max(self._reached, index)

    def stop(self) -> None:
        """Cancel what is left and wait for the thread (its running nvcc are stopped)."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        # NOTE: one build_many per task: the search waits for a source the Prebuild is building
        # until that whole build_many is done, so a batch of several tasks would hold up the first
        for i, task in enumerate(self.tasks):
            if self._cancel.is_set():
                return
            if i <= self._reached:
                continue
            try:
                sources = self.sources_of(task)
            except Exception as e:  # noqa: BLE001 - a guess: the task's step 0 builds for itself
                self.failed += 1
                log.debug("prebuild: no step-0 guess for %s (%s: %s)", getattr(task, "name", task),
                          type(e).__name__, e)
                continue
            if sources:
                self._build(sources)

    def _build(self, sources: list[str]) -> None:
        try:
            res = self.build_many(sources, cancel=self._cancel)
            self.built += sum(1 for r in res if r.ok and not r.cached)
        except Exception as e:  # noqa: BLE001 - the search builds whatever is missing itself
            log.debug("prebuild: a background build failed (%s: %s)", type(e).__name__, e)


def step0_guesser(proposer_factory: Callable[[], Any], memory, plan: Callable[..., Any]) -> Callable:
    """sources_of(task) for a Prebuild: a fresh proposer's step-0 proposal, the HTG's choice taken on
    a snapshot of `memory` (copied now, on the caller's thread: the search records into the live
    one while the Prebuild reads). plan(task, proposer, memory) -> ProposalRequest | None is the
    search's own step-0 request (search._step0_request)."""
    snapshot = copy.deepcopy(memory)

    def sources_of(task) -> list[str]:
        proposer = proposer_factory()
        request = plan(task, proposer, snapshot)
        return [] if request is None else [c.source for c in proposer.propose(request).candidates]
    return sources_of
