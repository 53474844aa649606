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


def test_fresh_inputs_keep_kinds_and_shapes_with_new_values():
    import torch
    from torch_htam.benchmark import fresh_inputs, second_batch
    torch.manual_seed(0)
    x, ids, mask = torch.randn(8, 3), torch.randint(0, 50, (8, 5)), torch.ones(8, 5, dtype=torch.bool)
    fx, fids, fmask = fresh_inputs((x, ids, mask))
    assert fx.shape == x.shape and not torch.equal(fx, x)
    assert fids.dtype == ids.dtype and int(fids.min()) >= 0 and int(fids.max()) <= int(ids.max())
    assert not torch.equal(fids, ids) and torch.equal(fmask, mask)          # a mask keeps its values
    assert [t.shape[0] for t in fresh_inputs((x, ids, mask), batch=4)] == [4, 4, 4]
    assert fresh_inputs((x[:1],), batch=2)[0].shape == (2, 3)               # a batch of 1 grows
    assert second_batch((x,)) == 4 and second_batch((x[:1],)) == 2 and second_batch((3.0,)) == 2


def test_end_to_end_tolerance_follows_the_precision_policy():
    import torch
    from torch_htam.benchmark import end_to_end_tolerance
    from torch_htam.policy import TOLERANCES, kept_precision
    linear, conv = torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1))
    assert end_to_end_tolerance(linear.to(torch.bfloat16)) == TOLERANCES["bf16"]
    with kept_precision():                   # the settings below undone for later tests
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True
        assert end_to_end_tolerance(torch.nn.Linear(4, 4)) == TOLERANCES["fp32"]
        assert end_to_end_tolerance(conv) == TOLERANCES["tf32"]                # PyTorch's convs run TF32
        torch.backends.cudnn.conv.fp32_precision = "ieee"                      # the new API, convs only
        assert end_to_end_tolerance(conv) == TOLERANCES["fp32"]
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert end_to_end_tolerance(torch.nn.Linear(4, 4)) == TOLERANCES["tf32"]


def test_check_outputs_compares_each_arm_with_eager_on_fresh_values_and_a_second_batch():
    import torch
    from torch_htam.benchmark import check_outputs
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    shapes = []

    def off(x):
        shapes.append(tuple(x.shape))
        return model(x) * 1.1

    errs = check_outputs(model, (torch.randn(8, 6),), {"right": model, "off": off})
    assert errs["fresh"]["right"] == errs["batch2"]["right"] == 0.0
    assert abs(errs["fresh"]["off"] - 0.1) < 1e-6 and abs(errs["batch2"]["off"] - 0.1) < 1e-6
    assert shapes == [(8, 6), (4, 6)]


def test_table_shows_the_checks_on_fresh_inputs_and_a_second_batch():
    res = _res(True)
    res.check_err, res.tolerance = {"fresh": {"htam": 3e-3}, "batch2": {"htam": 4e-3}}, 2e-2
    text = format_table(res)
    assert "on fresh inputs: htam 3.0e-03 (tolerance 2e-02)" in text
    assert "on a second batch size: htam 4.0e-03" in text


def test_table_gives_the_paired_ratio_beside_the_medians():
    res = _res(True)
    res.arms["compile"].round_ms, res.arms["htam"].round_ms = [5.0, 9.0, 5.0], [4.0, 4.5, 5.0]
    assert "htam vs compile: 0.62x (by rounds 1.25x)" in format_table(res)
