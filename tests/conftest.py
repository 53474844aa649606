"""Shared test setup: the `gpu` marker skips cleanly where CUDA is absent, the default run says how
many `build` tests it left out (pyproject addopts: -m "not build"), and every test writes its
kernels, HTG and logs under a temporary cache root, never into the user's ~/.cache."""
import os
import tempfile

import pytest
import torch

# NOTE: set at import, before any test module imports torch_htam: paths.cache_root() reads the
# variable on each call, but a module-level default computed at import would otherwise see ~/.cache.
_ROOT = tempfile.TemporaryDirectory(prefix="htam-test-cache-")
os.environ["HTAM_CACHE_DIR"] = _ROOT.name


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cutlass_libraries_unbuilt(monkeypatch):
    """CUTLASS's conv and GEMM libraries count as not built unless a test says otherwise
    (test_conv_cutlass.py's and test_gemm_cutlass.py's `built`): on a GPU machine the first match
    of a region they run starts their build in the background, and the expert's defaults would
    change part way through a session."""
    from torch_htam.proposers.expert import conv_cutlass, gemm_cutlass
    for lib in (conv_cutlass, gemm_cutlass):
        monkeypatch.setattr(lib, "library_ready", lambda: False)


_deselected_builds: list = []


def pytest_deselected(items):
    """Counts the `build` tests that pyproject's addopts (-m "not build") left out of this run."""
    _deselected_builds.extend(i for i in items if i.get_closest_marker("build"))


def pytest_terminal_summary(terminalreporter, config):
    if _deselected_builds and config.option.markexpr == "not build":
        terminalreporter.write_line(
            f"{len(_deselected_builds)} build tests deselected (nvcc builds, Inductor in subprocesses: about "
            f"25 min on 2 CPU cores); CI runs them: python3 -m pytest -q -m build")


def pytest_unconfigure(config):
    _ROOT.cleanup()
