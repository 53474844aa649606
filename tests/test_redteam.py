"""Red team: kernels that cheat (tests/redteam/*.cu) must each be rejected for the RIGHT reason,
the honest ones accepted, and this process must survive all of it (hangs and illegal addresses
happen in the worker). Each .cu file names its task and verdict in its first line:

    // task: gelu_affine   expect: partial_write
"""
import re
from pathlib import Path

import pytest
import torch

from torch_htam import build
from torch_htam.evaluation import Evaluator
from torch_htam.task import Task, TensorSpec

HERE = Path(__file__).parent / "redteam"
N = 4096 * 4096


def _spec(shape, dynamic=()):
    stride = tuple(int(torch.empty(shape).stride()[d]) for d in range(len(shape)))
    return TensorSpec(tuple(shape), "float32", stride, tuple(dynamic))


def _task(name: str) -> Task:
    src = (HERE / f"{name}.py").read_text()
    if name == "gelu_affine":   # reads x, w, b once, writes y once; flops: only the affine counted
        return Task(name, "elementwise", src,
                    [_spec((4096, 4096), (0,)), _spec((4096,)), _spec((4096,))],
                    [_spec((4096, 4096), (0,))], "redteam-gelu", ["aten.gelu.default", "aten.mul.Tensor",
                                                                 "aten.add.Tensor"],
                    flops=2.0 * N, bytes=4.0 * (2 * N + 2 * 4096))
    return Task(name, "rowwise", src, [_spec((4096, 4096), (0,))], [_spec((4096, 4096), (0,))],
                "redteam-softmax", ["aten.softmax.int"], flops=3.0 * N, bytes=4.0 * 2 * N)


def _cases() -> list[tuple[str, str, str]]:
    """(file name, task name, expected reason) for every red-team kernel."""
    out = []
    for f in sorted(HERE.glob("*.cu")):
        m = re.match(r"//\s*task:\s*(\w+)\s+expect:\s*(\w+)", f.read_text())
        assert m, f"{f.name}: first line must be '// task: NAME   expect: REASON'"
        out.append((f.name, m.group(1), m.group(2)))
    return out


def test_red_team_is_big_enough():
    cases = _cases()
    cheats = [c for c in cases if c[2] != "ok"]
    assert len(cheats) >= 10 and {c[1] for c in cases if c[2] == "ok"} == {"gelu_affine", "softmax"}


@pytest.mark.parametrize("name, task, expect", _cases())
def test_static_check_verdicts(name, task, expect):
    """CPU: exactly the cheats that must never compile fail the static check."""
    problems = build.check_source((HERE / name).read_text())
    assert bool(problems) == (expect == "static_check"), problems


@pytest.mark.gpu
def test_every_cheat_rejected_for_its_reason_and_honest_kernels_accepted():
    cases = _cases()
    got = {}
    with Evaluator(timeout=20.0) as ev:
        for task_name in ("gelu_affine", "softmax"):
            mine = [c for c in cases if c[1] == task_name]
            evs = ev.evaluate_many(_task(task_name), [(HERE / c[0]).read_text() for c in mine])
            got.update({c[0]: e for c, e in zip(mine, evs)})
    wrong = {n: (e.reason, e.detail[:300]) for n, _, expect in cases
             for e in [got[n]] if e.reason != expect}
    assert not wrong, f"wrong verdicts: {wrong}"
    for n, _, expect in cases:
        assert got[n].correct == (expect == "ok"), n
    for n in ("gelu_honest.cu", "softmax_honest.cu"):
        e = got[n]
        assert e.kernel_ms > 0 and e.ref_ms > 0 and e.speedup == pytest.approx(e.ref_ms / e.kernel_ms)
        assert e.kernel_ms == max(e.kernel_event_ms, e.kernel_drain_ms)   # the series that decided it
        # NOTE: accuracy is already judged by `correct` under the fp32 policy (|err| <= 1e-4 +
        # 1e-4 |ref|); max_rel_err alone is no bound (it is relative wherever |ref| > atol, so it
        # reached 1e-3 on an H100 near small references while the kernel was within policy).
        assert 0 < e.roofline_fraction <= 1 / 0.9
        assert [4096, 4096] in [s[0] for s in e.shapes_checked]
        assert {s[0][0] for s in e.shapes_checked} == {2048, 4096, 8192}   # the dynamic dim moved
    assert "HTAM_ERR_SHAPE" in got["gelu_refuse_shape.cu"].detail
    assert "illegal" in got["gelu_illegal_address.cu"].detail.lower()
    # The test process's own CUDA context is untouched by the worker's crash and hang.
    assert torch.ones(4, device="cuda").sum().item() == 4.0


@pytest.mark.gpu
def test_side_stream_work_is_still_timed():
    """Events on the current stream miss work on another stream; the device-wide wall clock does not."""
    from torch_htam.timing import time_fn
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def on_side(s):
        with torch.cuda.stream(side):
            for _ in range(4):
                s[0] @ s[0]

    def on_main(s):
        for _ in range(4):
            s[0] @ s[0]
    hidden = time_fn(on_side, lambda: (torch.randn_like(a),), warmup=2, reps=10)
    honest = time_fn(on_main, lambda: (torch.randn_like(a),), warmup=2, reps=10)
    assert hidden.event_ms < 0.5 * honest.median_ms          # the events were fooled...
    assert hidden.median_ms > 0.8 * honest.median_ms         # ...the reported time was not


@pytest.mark.gpu
def test_measured_ceilings_bound_a_plain_copy():
    from torch_htam.timing import measure_ceilings, time_fn
    c = measure_ceilings()
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    t = time_fn(lambda s: s[1].copy_(s[0]), lambda: (torch.empty_like(x).fill_(1), torch.empty_like(x)))
    copy_bw = 2 * x.numel() / (t.median_ms * 1e-3)
    assert 0.5 * c.bandwidth < copy_bw < 1.1 * c.bandwidth
    assert c.bf16 > c.tf32 > c.fp32 > 1e12


def test_build_failures_map_to_reasons_without_a_gpu(tmp_path, monkeypatch):
    """CPU: static-check and compile failures become Evaluations before any worker is involved."""
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    sync = (HERE / "gelu_device_sync.cu").read_text()
    broken = (HERE / "gelu_honest.cu").read_text().replace("erff(", "erff_typo(")
    with Evaluator(arch="sm_90a") as ev:
        static, compile_err = ev.evaluate_many(_task("gelu_affine"), [sync, broken])
    assert (static.correct, static.reason) == (False, "static_check")
    assert "synchronizes the host" in static.detail and static.policy["name"] == "fp32"
    assert compile_err.reason == "compile_error" and compile_err.detail
    assert ev._pool is None    # nothing to run: no worker was started
