"""Shared by the nvcc compile tests: the expert's first candidates of named tasks, and a build of
named CUDA sources for sm_90a in one batch that fails with every failing source's name and
compiler output."""
from torch_htam import build


def seed_sources(tasks: dict, n: int = 2) -> list[tuple[str, str]]:
    """("name/i", source) of the expert's first n candidates (step 0) of each named task."""
    from torch_htam.policy import policy_for
    from torch_htam.proposers.base import ProposalRequest
    from torch_htam.proposers.expert import ExpertProposer
    out = []
    for name, task in tasks.items():
        req = ProposalRequest(task, "seed", [], n=n, policy=policy_for(task))
        out += [(f"{name}/{i}", c.source) for i, c in enumerate(ExpertProposer().propose(req).candidates)]
    return out


def assert_compiles(named: list[tuple[str, str]], **build_kw) -> None:
    """named: (name, CUDA source) pairs; build_kw: build.build_many's options (e.g. timeout_s)."""
    results = build.build_many([s for _, s in named], arch="sm_90a", **build_kw)
    bad = [(n, r.error[:800]) for (n, _), r in zip(named, results) if not r.ok]
    assert not bad, bad
