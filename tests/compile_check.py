"""Shared by the nvcc compile tests: the expert's first candidates of named tasks, a build of
named CUDA sources for sm_90a in one batch that fails with every failing source's name and
compiler output, a library of ours built once for sm_90a only, and its path leading a target."""
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


def assert_checked_and_compiles(named: list[tuple[str, str]]) -> None:
    """Each source passes build.check_source's static rules, then all compile (assert_compiles)."""
    for name, src in named:
        assert build.check_source(src) == [], name
    assert_compiles(named)


def assert_library_builds_once(name: str):
    """The library of ours (build.OUR_LIBRARIES) built for sm_90a, once (a second call finds it),
    and refused for an arch without wgmma; its .so path. Set HTAM_CACHE_DIR to a folder of the
    test's own first: the session's other tests see no library built."""
    so, err = build.library(name, "sm_90a")
    assert so is not None and so.exists(), err
    assert build.library(name, "sm_90a") == (so, "")
    none, why = build.library(name, "sm_80")
    assert none is None and "sm_90a" in why
    return so


def assert_library_leads(target, m, key: str, tiles: int) -> dict:
    """A CUTLASS library's path is the target's default for region m and leads its grid, one
    distinct setting a tile (params[key]), the rest of the grid off it; returns the defaults."""
    base = target.defaults(m)
    assert base["cutlass"] and "CUTLASS" in target.render(m, base).splitlines()[0]
    grid = target.grid(m, base)
    lib = [p for p in grid if p.get("cutlass")]
    assert grid[:tiles] == lib and sorted(p[key] for p in lib) == list(range(tiles))
    assert len({target.render(m, p) for p in lib}) == tiles
    assert not any("CUTLASS" in target.render(m, p).splitlines()[0] for p in grid[tiles:])
    return base
