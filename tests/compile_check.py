"""Shared by the nvcc compile tests: build named CUDA sources for sm_90a in one batch and fail
with every failing source's name and compiler output."""
from torch_htam import build


def assert_compiles(named: list[tuple[str, str]], **build_kw) -> None:
    """named: (name, CUDA source) pairs; build_kw: build.build_many's options (e.g. timeout_s)."""
    results = build.build_many([s for _, s in named], arch="sm_90a", **build_kw)
    bad = [(n, r.error[:800]) for (n, _), r in zip(named, results) if not r.ok]
    assert not bad, bad
