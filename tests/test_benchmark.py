"""torch_htam.benchmark and bench/bench_models.py: the tables on fabricated results (no GPU)."""
import importlib.util
import sys
from pathlib import Path

from torch_htam.benchmark import ArmTime, BenchResult, format_table

ROOT = Path(__file__).resolve().parents[1]


def _res(swapped: bool) -> BenchResult:
    arms = {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1, 20.0),
            "htam": ArmTime(8.0, 7.5, 9.0, 60.0)}
    tasks = [{"task": "rowwise_rms_norm", "count": 8, "share": 0.12, "ref_ms": 0.08, "kernel_ms": 0.02,
              "speedup": 3.4, "roofline": 0.74, "status": "swapped" if swapped else "not used: slower"},
             {"task": "gemm_linear", "count": 8, "share": 0.3, "ref_ms": 0.4, "kernel_ms": 0.39,
              "speedup": 1.02, "roofline": 0.001, "status": "no kernel"}]
    return BenchResult("m", "GPU", arms, tasks, {"compile": 1e-6, "htam": 0.0})


def test_table_marks_an_unswapped_model_as_the_original_forward():
    assert _res(True).swapped == 1 and _res(False).swapped == 0
    assert "original forward" not in format_table(_res(True))
    text = format_table(_res(False))
    assert "htam runs the original forward (nothing swapped)" in text
    assert "<1%" in text and "74%" in text       # tiny roofline fractions are not shown as 0%


def test_bench_models_row_says_same_forward_instead_of_a_noise_ratio():
    spec = importlib.util.spec_from_file_location("bench_models", ROOT / "bench" / "bench_models.py")
    sys.path.insert(0, str(ROOT / "bench"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "| 1.25x | 0.62x | 1/2 |" in mod.row("m:bf16", _res(True))
    assert "| same forward | 0.62x | 0/2 |" in mod.row("m:bf16", _res(False))
