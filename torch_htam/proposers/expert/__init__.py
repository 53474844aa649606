"""The built-in expert proposer: offline, deterministic CUDA generation from a task's aten graph.

    >>> from torch_htam.proposers.expert import ExpertProposer
    >>> ExpertProposer().propose(ProposalRequest(task, "seed", [], n=4)).candidates
"""
from torch_htam.proposers.expert.proposer import ExpertProposer

__all__ = ["ExpertProposer"]
