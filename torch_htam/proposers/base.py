"""The proposer contract: supports(task) -> strategy ids, propose(request) -> Proposal.

    >>> proposer.supports(t)            # what the search may ask this proposer for on task t
    {'vectorized_16b_access', 'ilp_unroll', ...}
    >>> req = ProposalRequest(task=t, direction="memory_access", strategies=[...], n=4)
    >>> prop = proposer.propose(req)
    >>> [c.tags for c in prop.candidates], prop.note
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch_htam.gpu import GpuInfo
from torch_htam.task import Task


@dataclass
class Candidate:
    """One proposed kernel. tags: ids of the local strategies applied to make it from its parent (or
    from the proposer's baseline when there is none); the HTG credits its outcome to them, so a
    default every kernel has is not a tag;
    params: tunable parameters the expert chose (block size, vector width, ...); origin: proposer name."""
    source: str
    tags: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    origin: str = "expert"


@dataclass
class Attempt:
    """Feedback on one earlier candidate, as the proposer sees it.
    outcome: "ok" or an Evaluation.reason ("compile_error", "mismatch", ...); detail: short text
    (trimmed compiler error, which output mismatched and by how much); speedup over the reference."""
    source_hash: str
    tags: list[str]
    outcome: str
    detail: str = ""
    speedup: float | None = None
    kernel_ms: float | None = None
    ptxas: str = ""     # its kernels' registers and spills, in words (Evaluation.ptxas); "" unknown


@dataclass
class Parent:
    """The kernel a step starts from: its source and measured profile."""
    source: str
    tags: list[str]
    speedup: float
    kernel_ms: float
    roofline_fraction: float | None
    params: dict[str, Any] = field(default_factory=dict)
    ptxas: str = ""     # its kernels' registers and spills, in words (Evaluation.ptxas); "" unknown


@dataclass
class ProposalRequest:
    """direction: id of the chosen global direction; strategies: retrieved local strategies
    (htg.Strategy, best first) with their recorded outcomes; transition: (previous, chosen) direction."""
    task: Task
    direction: str
    strategies: list[Any]
    n: int = 4
    parent: Parent | None = None
    feedback: list[Attempt] = field(default_factory=list)
    transition: tuple[str, str] | None = None
    gpu: GpuInfo | None = None
    policy: Any = None   # policy.Precision
    # source_key of every candidate this search evaluated (the parent included): a proposer that
    # walks a finite space skips them rather than spend the step's budget on a repeat
    tried: set[str] = field(default_factory=set)
    # settings that won on tasks of similar size (recall.py), best first, as changes to the
    # defaults (knob: value, None: the knob dropped): a proposer that walks a finite space applies
    # them to its defaults and tries them before its own order
    recall: list[dict] = field(default_factory=list)


def source_key(source: str) -> str:
    """A candidate source's identity in a search (sha256, 16 hex digits)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@dataclass
class Proposal:
    """candidates may be empty; note then says why (unsupported graph, no usable code, endpoint down).
    usage: tokens/cost for LLM proposers ({"prompt_tokens", "completion_tokens", "cost_usd"})."""
    candidates: list[Candidate]
    note: str = ""
    usage: dict[str, float] = field(default_factory=dict)


class Proposer(Protocol):
    """name keys the proposer's HTG memory (paths.memory_path). supports(task): the strategy ids it
    can realize on the task; the HTG chooses only among them (search treats a proposer without the
    method as realizing every strategy). speculative: its proposals are cheap, offline and depend
    only on the request, so a search may ask ahead to build them early (prebuild.py; search
    treats a proposer without the attribute as not speculative)."""
    name: str
    speculative: bool

    def supports(self, task: Task) -> set[str]: ...

    def propose(self, request: ProposalRequest) -> Proposal: ...
