"""bench/arm_profile.py's CPU side: the per-kernel comparison of two arms."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("arm_profile", ROOT / "bench" / "arm_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_name_every_kernel_of_either_arm_largest_difference_first():
    ap = _load()
    compile_k = {"triton_bn_relu": (10.0, 50.0), "cudnn_conv": (10.0, 200.0), "copy_": (1.0, 1.0)}
    ours_k = {"cutlass_conv": (10.0, 180.0), "copy_": (3.0, 9.0), "triton_bn_relu": (2.0, 10.0)}
    rows = ap.diff_rows(compile_k, ours_k)
    assert [r["kernel"] for r in rows] == ["cudnn_conv", "cutlass_conv", "triton_bn_relu", "copy_"]
    cudnn, cutlass, _, copy = rows
    assert (cudnn["ours_n"], cudnn["ours_us"], cudnn["delta_us"]) == (0.0, 0.0, -200.0)
    assert (cutlass["compile_n"], cutlass["delta_us"]) == (0.0, 180.0)
    assert (copy["compile_n"], copy["ours_n"], copy["delta_us"]) == (1.0, 3.0, 8.0)
