"""Proposers turn a search step (direction + strategies + parent + feedback) into CUDA candidates.

Two share one contract (base.Proposer): the built-in expert generator (offline, deterministic, the
default) and the LLM proposer (any OpenAI-compatible endpoint). The HTG and the loop don't know
which one runs.
"""
from torch_htam.proposers.base import Attempt, Candidate, Proposal, ProposalRequest, Proposer

__all__ = ["Attempt", "Candidate", "Proposal", "ProposalRequest", "Proposer"]
