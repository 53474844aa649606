"""torch_htam.benchmark and bench/bench_models.py: the tables on fabricated results (no GPU)."""
from pathlib import Path

from torch_htam.benchmark import ArmTime, BenchResult, format_table

ROOT = Path(__file__).resolve().parents[1]


def _res(swapped: bool) -> BenchResult:
    arms = {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1, 20.0),
            "htam": ArmTime(8.0, 7.5, 9.0, 60.0)}
    tasks = [{"task": "rowwise_rms_norm", "count": 8, "share": 0.12, "ref_ms": 0.08, "kernel_ms": 0.02,
              "speedup": 3.4, "vs_inductor": 1.31, "roofline": 0.74,
              "status": "swapped" if swapped else "not used: slower"},
             {"task": "gemm_linear", "count": 8, "share": 0.3, "ref_ms": 0.4, "kernel_ms": 0.39,
              "speedup": 1.02, "roofline": 0.001, "status": "no kernel"}]
    return BenchResult("m", "GPU", arms, tasks, {"compile": 1e-6, "htam": 0.0})


def test_table_says_how_many_regions_each_arm_swapped():
    res = _res(True)
    res.swapped_by_arm = {"htam": 3}
    text = format_table(res)
    assert "htam vs compile: 0.62x (3 regions swapped)" in text
    assert "<1%" in text and "74%" in text       # tiny roofline fractions are not shown as 0%
    row = next(line for line in text.splitlines() if line.startswith("rowwise_rms_norm"))
    assert "3.40x" in row and "1.31x" in row     # the region against eager and against Inductor
    res.swapped_by_arm = {}
    assert "(0 regions swapped)" in format_table(res)
