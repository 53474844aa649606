"""bench/conv_sites.py: the site's region takes both of our kernels (cuDNN's fused graph and the
implicit-GEMM one), and both build."""
import sys
from pathlib import Path

import pytest

from torch_htam import build, paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import conv_sites  # noqa: E402


def test_the_site_renders_on_both_of_our_paths():
    srcs = conv_sites.sources(64, 8)
    assert set(srcs) == {"cudnn", "igemm"}
    assert "cuDNN conv2d, channels-last" in srcs["cudnn"].splitlines()[0]
    assert "implicit-GEMM" in srcs["igemm"].splitlines()[0]


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn() is None, reason="needs nvcc + cuDNN")
def test_the_site_kernels_build(tmp_path):
    srcs = conv_sites.sources(64, 8)
    results = build.build_many(list(srcs.values()), arch="sm_90a", out_dir=tmp_path, jobs=2)
    assert [(r.ok, r.error[:500]) for r in results] == [(True, ""), (True, "")]
