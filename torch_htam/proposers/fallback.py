"""LLM first, the expert when the endpoint is gone: FallbackProposer and make_proposer.

    >>> proposer, message = make_proposer(use_llm=True, config=None, expert=ExpertProposer())
    >>> print(message)    # says which proposer runs, and why the LLM does not when it doesn't
    >>> proposal = proposer.propose(request)

A failed endpoint call yields an empty Proposal (note "endpoint_error: ...") so the loop moves on;
after `max_failures` consecutive failures, or one permanent failure (bad key, unknown model), the
rest of the run uses the expert and every note from then on says so.
"""
from __future__ import annotations

import dataclasses
import threading

from torch_htam.proposers.base import Parent, Proposal, ProposalRequest
from torch_htam.proposers.llm import EndpointError, LLMConfig, LLMProposer


class FallbackProposer:
    """Runs `llm`; switches to `expert` for good when the endpoint fails for good.

    baseline_parent: when a request has no parent (first step), the LLM starts from the expert's
    baseline kernel instead of a blank page (shown to it as not measured yet).

    >>> p = FallbackProposer(LLMProposer(cfg), expert, max_failures=3)
    >>> p.propose(request).note
    """
    name = "llm+expert"

    def __init__(self, llm: LLMProposer, expert, max_failures: int = 3, baseline_parent: bool = True):
        self.llm, self.expert = llm, expert
        self.max_failures = max_failures
        self.baseline_parent = baseline_parent
        self.failures = 0              # consecutive endpoint failures
        self.switched: str | None = None   # why the run moved to the expert, once it has
        self._lock = threading.Lock()

    def supports(self, task) -> set[str]:
        """What either can realize while the LLM runs; the expert's alone once the run switched."""
        if self.switched:
            return self.expert.supports(task)
        return self.llm.supports(task) | self.expert.supports(task)

    def propose(self, request: ProposalRequest) -> Proposal:
        if self.switched:
            return self._expert(request, f"expert ({self.switched})")
        try:
            proposal = self.llm.propose_or_raise(self._from_baseline(request))
        except EndpointError as e:
            with self._lock:
                self.failures += 1
                if e.permanent or self.failures >= self.max_failures:
                    self.switched = (f"LLM endpoint failed {self.failures} time(s) in a row, last: {e}; "
                                     "using the expert proposer for the rest of the run")
            if self.switched:
                return self._expert(request, f"endpoint_error: {e}; expert ({self.switched})")
            return Proposal([], note=f"endpoint_error: {e} ({self.failures}/{self.max_failures} "
                                     "before switching to the expert)")
        with self._lock:
            self.failures = 0
        return proposal

    def _expert(self, request: ProposalRequest, why: str) -> Proposal:
        p = self.expert.propose(request)
        return Proposal(p.candidates, note=f"{why}; {p.note}" if p.note else why, usage=p.usage)

    def _from_baseline(self, request: ProposalRequest) -> ProposalRequest:
        if request.parent is not None or not self.baseline_parent:
            return request
        # The expert's baseline: no strategies asked for, so nothing it cannot apply filters it out.
        baseline = self.expert.propose(dataclasses.replace(request, n=1, strategies=[], feedback=[])).candidates
        if not baseline:
            return request
        nan = float("nan")   # NOTE: not measured yet; the prompt says so instead of inventing numbers
        parent = Parent(baseline[0].source, list(baseline[0].tags), nan, nan, None, dict(baseline[0].params))
        return dataclasses.replace(request, parent=parent)


def make_proposer(use_llm: bool, config: LLMConfig | None, expert, max_failures: int = 3):
    """(proposer, message): the LLM with expert fallback when asked for and configured, else the
    expert with a message that says what to set.

    >>> proposer, msg = make_proposer(True, None, expert)   # reads the environment
    """
    if not use_llm:
        return expert, f"proposer: {expert.name} (built-in, offline)"
    config = config or LLMConfig.from_env()
    problem = config.check()
    if problem:
        return expert, f"--llm not used: {problem}. Using the {expert.name} proposer."
    try:
        llm = LLMProposer(config)
    except ImportError:
        return expert, f"--llm not used: the openai package is missing (pip install openai). " \
                       f"Using the {expert.name} proposer."
    where = config.base_url or "api.openai.com"
    return (FallbackProposer(llm, expert, max_failures),
            f"proposer: llm {config.model} at {where} (expert after {max_failures} endpoint failures)")
