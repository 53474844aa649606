"""bench/launch_cost.py's conv-site kernel (bench/kernels/site_canary.cu): both of its forms build."""
import sys
from pathlib import Path

import pytest

from torch_htam import build, paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import launch_cost  # noqa: E402


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_the_site_kernel_builds_with_one_and_two_launches(tmp_path):
    src = launch_cost.SITE_CU.read_text()
    results = build.build_many([f"#define SITE_LAUNCHES {n}\n" + src for n in (1, 2)], arch="sm_90a",
                               out_dir=tmp_path, jobs=2)
    assert [(r.ok, r.error) for r in results] == [(True, ""), (True, "")]
    assert all(Path(r.so_path).is_file() for r in results)
    # two different libraries: the define reaches the build (one launch, or the per-channel one first)
    assert results[0].so_path != results[1].so_path
