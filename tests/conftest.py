"""Shared test setup: the `gpu` marker skips cleanly where CUDA is absent, and every test writes its
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


def pytest_unconfigure(config):
    _ROOT.cleanup()
