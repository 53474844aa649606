"""bench/kernelbench.py: the table / summary arithmetic on fabricated rows, task loading on CPU,
the no-GPU exit, and (GPU) a small end-to-end run."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from torch_htam.policy import matmul_tf32

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("kernelbench_bench", ROOT / "bench" / "kernelbench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


kb = _load_script()


def _rows():
    R = kb.Row
    return [
        # correct, 2x faster than eager, 1.25x faster than compile
        R("a", "elementwise", "fp32", eager_ms=2.0, compile_ms=1.25, compile_s=3.0, ours_ms=1.0,
          roofline=0.8, bandwidth=0.8, correct=True, stop="roofline", candidates=8, search_s=10.0),
        # correct but slower than both: 0.5x eager, 0.25x compile
        R("b", "gemm", "bf16", eager_ms=1.0, compile_ms=0.5, ours_ms=2.0, correct=True,
          stop="steps", candidates=12, search_s=20.0, tokens=1000.0, cost_usd=0.5),
        # no verified kernel: counts 1.0x, never fast_1, even though eager/compile were timed
        R("c", "rowwise", "fp32", eager_ms=1.0, compile_ms=0.5, correct=False, stop="stagnation",
          candidates=12, search_s=30.0),
        # correct and 4x faster than eager, but torch.compile failed: out of the compile figures
        R("d", "conv", "fp32", eager_ms=4.0, ours_ms=1.0, correct=True, compile_error="boom",
          stop="steps", candidates=4, search_s=5.0),
        # export failed: no kernel, no times
        R("e", error="export: ValueError: nope", stop="export_error"),
    ]


def test_ratios_only_for_verified_kernels():
    a, b, c, d, e = _rows()
    assert a.vs_eager == pytest.approx(2.0) and a.vs_compile == pytest.approx(1.25)
    assert b.vs_eager == pytest.approx(0.5) and b.vs_compile == pytest.approx(0.25)
    assert c.vs_eager is None and c.vs_compile is None
    assert d.vs_eager == pytest.approx(4.0) and d.vs_compile is None
    assert e.vs_eager is None
    assert e.to_json()["vs_eager"] is None and a.to_json()["vs_compile"] == pytest.approx(1.25)


def test_summary_counts_and_geomeans():
    s = kb.summarize(_rows())
    assert s["tasks"] == 5 and s["correct"] == 3 and s["errors"] == 1
    assert s["fast1_eager"] == 2        # a and d
    assert s["fast1_compile"] == 1      # a only (d's compile failed)
    assert s["at_compile"] == 1         # a; b at 0.25x is not level
    # vs eager over all 5 tasks: 2, 0.5, 1 (c), 4, 1 (e)
    assert s["geomean_eager"] == pytest.approx(math.exp((math.log(2) + math.log(0.5) + math.log(4)) / 5))
    # vs compile over the 3 tasks compile handled: 1.25, 0.25, 0.5 (c runs eager: 0.5 / 1.0)
    assert s["compiled"] == 3
    assert s["geomean_compile"] == pytest.approx((1.25 * 0.25 * 0.5) ** (1 / 3))
    assert s["candidates"] == 36 and s["search_s"] == pytest.approx(65.0)
    assert s["tokens"] == 1000.0 and s["cost_usd"] == pytest.approx(0.5)


def test_level_with_compile_counts_a_kernel_within_two_percent():
    R = kb.Row
    rows = [R("x", eager_ms=1.0, compile_ms=0.985, ours_ms=1.0, correct=True),    # 0.985x: level
            R("y", eager_ms=1.0, compile_ms=0.97, ours_ms=1.0, correct=True),     # 0.97x: behind
            R("z", eager_ms=1.0, compile_ms=0.5, correct=False)]                   # no kernel
    s = kb.summarize(rows)
    assert (s["fast1_compile"], s["at_compile"]) == (0, 1)


def test_size_matched_bandwidth_is_the_copy_time_over_each_arm():
    r = kb.Row("x", eager_ms=3.0, compile_ms=0.02, ours_ms=0.025, copy_ms=0.02, correct=True)
    assert r.bw_size == pytest.approx(0.8) and r.compile_bw_size == pytest.approx(1.0)
    assert kb.Row("y", ours_ms=0.1).bw_size is None       # compute-bound: no copy timed


def test_geomean():
    assert kb.geomean([]) == 1.0
    assert kb.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_table_and_summary_text():
    rows = _rows()
    lines = kb.table(rows)
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    a, b, c, d, e = lines[2:]
    assert "| a | elem | fp32 | 2 | 1.25 | 3.0 | 1 | 2.00x | 1.25x | 80% | 80% | - | - | y | roofline |" in a
    assert "0.50x | 0.25x" in b
    assert "| n | stagnation |" in c and "| - | - |" in c
    assert "| fail |" in d and "4.00x" in d
    assert "export_error" in e
    text = "\n".join(kb.summary_lines(kb.summarize(rows), llm=True))
    assert "correct 3 (60%)" in text and "fast_1 vs eager 2 (40%)" in text
    assert "fast_1 vs torch.compile 1 (20%)" in text
    assert "over the 3 it compiled" in text and "runs PyTorch eager there" in text
    assert "1000 tokens, $0.50" in text and "1 task(s) had errors" in text
    assert "tokens" not in "\n".join(kb.summary_lines(kb.summarize(rows), llm=False))


def test_payload_is_the_raw_rows_and_renders_as_a_table():
    render = importlib.util.module_from_spec(
        spec := importlib.util.spec_from_file_location("bench_render", ROOT / "bench" / "render.py"))
    spec.loader.exec_module(render)
    rows = _rows()
    args = kb.parse_args(["--steps", "1", "--no-write"])
    data = json.loads(json.dumps(kb.payload(args, rows, kb.summarize(rows), 12.5)))
    assert data["rows"][0]["eager_ms"] == 2.0 and data["rows"][0]["vs_compile"] == pytest.approx(1.25)
    assert data["summary"]["correct"] == 3 and data["config"]["steps"] == 1 and data["wall_s"] == 12.5
    assert data["config"]["dir"].endswith("tasks") and data["proposer"] == "expert"
    text = "\n".join(render.section("kernelbench", Path("kernelbench-x.json"), data))
    assert "| a | elementwise | fp32 | 2 | 1.25 | 3.0 | 1 | 2.00x | 1.25x | 80% | 80% |" in text


@pytest.mark.build
def test_load_tasks_on_bench_tasks():
    loaded = kb.load_tasks(ROOT / "bench" / "tasks")
    assert len(loaded) == len(list((ROOT / "bench" / "tasks").glob("*.py"))) >= 20
    for row, task in loaded:
        assert row.error is None, row.error
        assert task.name == row.name and task.source and task.inputs and task.outputs
        assert row.kind == task.kind and row.dtype in ("fp32", "tf32", "bf16", "fp16")
    kinds = {row.name: row.kind for row, _ in loaded}
    assert kinds["rw_softmax_bf16"] == "rowwise" and kinds["gemm_linear_bias_gelu_fp32"] == "gemm"
    assert {row.name: row.dtype for row, _ in loaded}["ew_swiglu_bf16"] == "bf16"


def test_load_tasks_reports_a_broken_file_and_goes_on(tmp_path):
    src = (ROOT / "bench" / "tasks" / "rw_softmax_fp32.py").read_text()
    (tmp_path / "a_good.py").write_text(src)
    (tmp_path / "b_broken.py").write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    (tmp_path / "c_good.py").write_text(src)
    loaded = kb.load_tasks(tmp_path)
    assert [r.name for r, _ in loaded] == ["a_good", "b_broken", "c_good"]
    (ra, ta), (rb, tb), (rc, tc) = loaded
    assert ta is not None and tc is not None and tb is None
    assert rb.stop == "export_error" and rb.error.startswith("export: ") and "get_inputs" in rb.error
    assert len(kb.load_tasks(tmp_path, limit=1)) == 1
    with pytest.raises(SystemExit, match="no KernelBench task files"):
        kb.load_tasks(tmp_path / "empty")


def test_list_mode_needs_no_gpu(capsys):
    assert kb.main(["--list", "--limit", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    # the first two files by name: MinGPT's attention, its registered mask the fourth input
    policy = "tf32" if matmul_tf32() else "fp32"
    assert len(out) == 2 and out[0].startswith("attn_mingpt_bf16: attention, bf16, 4 inputs")
    assert out[1].startswith(f"attn_mingpt_fp32: attention, {policy}, 4 inputs")


class _FakeTimer:
    """Stands in for timing.time_fn on the CPU: runs fn on one set, returns the next given time."""

    def __init__(self, times_ms):
        self.times, self.calls = list(times_ms), 0

    def __call__(self, fn, make_inputs, **kw):
        from torch_htam.timing import Timing
        fn(make_inputs())
        self.calls += 1
        ms = self.times.pop(0)
        return Timing(ms, ms, ms, 1, ms, ms)


@pytest.fixture
def on_cpu(monkeypatch):
    """measure() on the CPU: DEVICE cpu, no CUDA sync, our 'kernel' is the reference (+ shift)."""
    from torch_htam.task import load_reference
    monkeypatch.setattr(kb, "DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def use_kernel(shift):
        def ours(task, so_path):
            ref = load_reference(task)
            return lambda s: [ref(*s[0]) + shift]
        monkeypatch.setattr(kb, "ours", ours)
    return use_kernel


def _softmax_task():
    from torch_htam.extract import task_from_source
    task = task_from_source((ROOT / "bench" / "tasks" / "rw_softmax_fp32.py").read_text(), "softmax")
    return kb.Row(task.name, task.kind, "fp32"), task


def _ceilings():
    from torch_htam.timing import Ceilings
    return Ceilings(bandwidth=2e12, fp32=5e13, tf32=4e14, bf16=8e14)


def test_measure_fills_the_row_and_a_compile_failure_is_not_fatal(monkeypatch, on_cpu):
    from types import SimpleNamespace
    from torch_htam import timing
    on_cpu(0.0)
    timer = _FakeTimer([2.0, 0.5])   # eager, ours (compile never gets timed)
    monkeypatch.setattr(timing, "time_fn", timer)
    monkeypatch.setattr(timing, "copy_ms", lambda nbytes: nbytes / 4e9)   # 4 GB/s in ms, fake

    def broken_compile(model, **kw):
        raise RuntimeError("inductor exploded\nlong traceback")
    monkeypatch.setattr(torch, "compile", broken_compile)
    row, task = _softmax_task()
    kb.measure(row, task, SimpleNamespace(so_path="unused.so"), _ceilings())
    assert timer.calls == 2 and row.eager_ms == 2.0 and row.ours_ms == 0.5
    assert row.compile_ms is None and row.compile_error == "RuntimeError: inductor exploded"
    roof = timing.roofline_ms(task, _ceilings(), "fp32")
    assert row.roofline == pytest.approx(roof / 0.5)
    assert row.bandwidth == pytest.approx(task.bytes / 0.5e-3 / 2e12)   # softmax is memory-bound
    assert row.copy_ms == pytest.approx(task.bytes / 4e9) and row.bw_size == pytest.approx(row.copy_ms / 0.5)
    row.correct = True
    assert row.vs_eager == pytest.approx(4.0) and row.vs_compile is None


def test_measure_times_compile_and_skips_ours_without_a_kernel(monkeypatch, on_cpu):
    from torch_htam import timing
    on_cpu(0.0)
    monkeypatch.setattr(timing, "time_fn", _FakeTimer([2.0, 1.5]))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)   # no C++ toolchain needed
    row, task = _softmax_task()
    kb.measure(row, task, None, _ceilings())
    assert (row.eager_ms, row.compile_ms, row.ours_ms) == (2.0, 1.5, None)
    assert row.compile_s is not None and row.compile_s >= 0 and row.roofline is None


def test_measure_rejects_a_kernel_whose_launch_disagrees(monkeypatch, on_cpu):
    from types import SimpleNamespace
    from torch_htam import timing
    on_cpu(1e-2)   # far outside fp32's 1e-4
    monkeypatch.setattr(timing, "time_fn", _FakeTimer([2.0, 1.0, 0.5]))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    row, task = _softmax_task()
    with pytest.raises(RuntimeError, match="launch check failed \\(mismatch\\)"):
        kb.measure(row, task, SimpleNamespace(so_path="unused.so"), _ceilings())
    assert row.ours_ms is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_without_gpu_exits_with_a_clear_message():
    with pytest.raises(SystemExit, match="needs a CUDA GPU.*--list"):
        kb.main(["--limit", "1", "--no-write"])


@pytest.mark.gpu
def test_small_run_on_gpu(tmp_path, capsys):
    out = tmp_path / "kb.json"
    assert kb.main(["--limit", "3", "--steps", "0", "--candidates", "2", "--no-write",
                    "--out", str(out), str(ROOT / "bench" / "tasks")]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["tasks"] == 3 and len(data["rows"]) == 3
    for r in data["rows"]:
        assert r["error"] is None, r["error"]
        assert r["eager_ms"] > 0 and (r["compile_ms"] or 0) >= 0
        if r["correct"]:
            assert r["ours_ms"] > 0 and r["vs_eager"] == pytest.approx(r["eager_ms"] / r["ours_ms"])
            assert 0 < r["roofline"] < 1 / 0.9 + 1e-9
    assert "geomean speedup" in capsys.readouterr().out
