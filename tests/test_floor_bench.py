"""bench/bench_floor.py and bench/floor_models.py on the CPU: the interleaved timer and the row
arithmetic with stand-in arms and a fake clock, the row schema, a failing or cut-off row recorded
with "error" while the run goes on, --list, the results file, and every model builder at a tiny
size (the KernelBench-style problems loaded without touching sys.modules). No GPU, no optimize()."""
import dataclasses
import enum
import importlib.util
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


bf = _load("bench_floor", ROOT / "bench" / "bench_floor.py")
fm = bf.floor_models
render = _load("bench_render", ROOT / "bench" / "render.py")

FIELDS = ("model", "mode", "eager_ms_latency", "compile_ms_latency", "ours_ms_latency",
          "eager_ms_throughput", "compile_ms_throughput", "ours_ms_throughput", "vs_compile_latency",
          "vs_compile_throughput", "vs_eager_latency", "optimize_s", "budget_s", "within_budget",
          "floor_ok", "max_abs_err", "correct", "report_note", "swapped", "decision")


def _opts(*extra):
    return bf.parse(["--device", "cpu", "--small", "--rounds", "2", "--calls", "2", "--warmup", "1", *extra])


class FakeClock:
    """A clock that moves only when an arm runs (by the arm's cost in ms)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def arm(self, ms, log=None, name=None):
        def run():
            if log is not None:
                log.append(name)
            self.t += ms / 1e3
        return run


def _times(eager, compile_, ours, thr=None):
    thr = thr or (eager, compile_, ours)
    return {a: {"latency_ms": lat, "throughput_ms": t, "latency_round_ms": [lat], "throughput_round_ms": [t]}
            for a, lat, t in zip(bf.ARMS, (eager, compile_, ours), thr)}


# ---- timing ------------------------------------------------------------------------------------

def test_interleaved_timer_medians_and_rotation():
    clock, log, syncs = FakeClock(), [], []
    arms = {"eager": clock.arm(3.0, log, "eager"), "compile": clock.arm(2.0, log, "compile"),
            "ours": clock.arm(1.0, log, "ours")}
    res = bf.time_interleaved(arms, lambda: syncs.append(1), rounds=3, calls=4, clock=clock)
    for name, ms in (("eager", 3.0), ("compile", 2.0), ("ours", 1.0)):
        assert res[name]["latency_ms"] == pytest.approx(ms)
        assert res[name]["throughput_ms"] == pytest.approx(ms)
        assert len(res[name]["latency_round_ms"]) == len(res[name]["throughput_round_ms"]) == 3
    # each arm's turn is 4 synced calls then 4 back-to-back ones: 8 calls; round r starts with arm r
    firsts = [log[i * 24] for i in range(3)]
    assert firsts == ["eager", "compile", "ours"]
    # latency: a sync before and after each call; throughput: one before, one after the batch
    assert len(syncs) == 3 * 3 * (2 * 4 + 2)


def test_throughput_is_batch_time_over_calls():
    clock = FakeClock()
    assert bf.time_throughput(clock.arm(0.5), lambda: None, 10, clock=clock) == pytest.approx(0.5)
    assert bf.time_latency(clock.arm(0.25), lambda: None, 3, clock=clock) == pytest.approx([0.25] * 3)


# ---- rows --------------------------------------------------------------------------------------

def test_row_arithmetic_and_schema():
    row = bf.build_row("m:fp32", _times(3.0, 2.0, 1.0, thr=(6.0, 4.0, 5.0)), optimize_s=12.0, budget_s=30.0)
    assert set(FIELDS) <= set(row) and set(bf.REQUIRED) <= set(row)
    assert row["vs_compile_latency"] == pytest.approx(2.0)          # compile ms / ours ms
    assert row["vs_compile_throughput"] == pytest.approx(0.8)
    assert row["vs_eager_latency"] == pytest.approx(3.0)
    assert row["floor_ok"] is False                                   # throughput is below 0.98
    assert row["within_budget"] is True and row["budget_limit_s"] == pytest.approx(63.0)
    json.dumps(row)                                                   # JSON as it is


@pytest.mark.parametrize("compile_ms,ours_ms,ok", [(0.98, 1.0, True), (1.0, 1.0, True), (0.979, 1.0, False),
                                                   (2.0, 1.0, True)])
def test_floor_ok_both_ways(compile_ms, ours_ms, ok):
    row = bf.build_row("m:fp32", _times(1.0, compile_ms, ours_ms), optimize_s=1.0, budget_s=30.0)
    assert row["floor_ok"] is ok
    lat_only = bf.build_row("m:fp32", _times(1.0, compile_ms, ours_ms, thr=(1.0, 0.5, 1.0)), 1.0, 30.0)
    assert lat_only["floor_ok"] is False                              # throughput 0.5x fails it


@pytest.mark.parametrize("budget,spent,ok", [(30.0, 63.0, True), (30.0, 63.01, False), (120.0, 162.0, True),
                                             (120.0, 162.5, False), (0.0, 30.0, True)])
def test_within_budget(budget, spent, ok):
    assert bf.build_row("m:fp32", _times(1, 1, 1), optimize_s=spent, budget_s=budget)["within_budget"] is ok


def test_unmeasured_row_has_unknown_verdicts():
    row = bf.empty_row("m:bf16", budget_s=30.0)
    assert set(FIELDS) <= set(row)
    assert bf.verdicts(row) == {"floor_ok": None, "within_budget": None}
    # cut off in optimize past the limit: over budget although optimize_s was never measured
    assert bf.verdicts(dict(row, optimize_s_at_least=100.0))["within_budget"] is False
    assert bf.verdicts(dict(row, optimize_s_at_least=10.0))["within_budget"] is None


class Choice(enum.Enum):
    COMPILE = "compile"


@dataclasses.dataclass
class Decision:
    choice: Choice
    ms: dict


@dataclasses.dataclass
class Arm:
    kind: Choice
    call: object
    backend: object


class NoCopy:
    def __deepcopy__(self, memo):
        raise AssertionError("the decision must not be deep-copied")

    def __str__(self):
        return "x" * 1000


def test_report_fields_make_decision_jsonable():
    model = torch.nn.Linear(2, 2)
    decision = Decision(Choice.COMPILE, {"compile": 1.0, "nan": float("nan"),
                                         "arms": [Arm(Choice.COMPILE, model.forward, NoCopy())]})
    report = type("R", (), {"note": "kept torch.compile", "swapped": 2, "decision": decision})()
    f = bf.report_fields(report)
    assert f == {"report_note": "kept torch.compile", "swapped": 2,
                 "decision": {"choice": "Choice.COMPILE", "ms": {
                     "compile": 1.0, "nan": "nan",
                     "arms": [{"kind": "Choice.COMPILE", "call": "<Linear.forward>", "backend": "x" * 200 + "..."}]}}}
    json.dumps(f, allow_nan=False)
    assert bf.report_fields(type("R", (), {"note": "", "swapped": 0})())["decision"] is None
    assert bf.report_fields(None) == {"report_note": None, "swapped": None, "decision": None}


def test_compare_tolerances():
    x = torch.randn(4, 8)
    assert bf.compare(x + 5e-4, x) == {"max_abs_err": pytest.approx(5e-4, rel=1e-2), "correct": True,
                                       "tolerance": 1e-3}
    assert bf.compare(x + 5e-3, x)["correct"] is False
    assert bf.compare(x + 4e-3, x, tf32=True)["correct"] is True
    b = x.bfloat16()
    assert bf.compare(b + 0.01, b)["correct"] is True and bf.compare(b + 0.1, b)["correct"] is False
    assert bf.compare((x, x[:2]), (x, x))["correct"] is False                    # shape mismatch
    bad = bf.compare(x * float("nan"), x)
    assert bad["correct"] is False and bad["max_abs_err"] is None and bad["nonfinite"]


def test_summary_and_table():
    good = bf.build_row("a:fp32", _times(2, 1.0, 0.5), 10.0, 30.0)                # 2x both ways
    slow = bf.build_row("b:fp32", _times(2, 1.0, 1.25), 70.0, 30.0)               # 0.8x, over budget
    skipped = dict(bf.empty_row("c:bf16"), skipped="torchvision is not installed")
    s = bf.summarize([good, slow, skipped])
    assert (s["rows"], s["skipped"], s["floor_ok"], s["within_budget"]) == (3, 1, 1, 1)
    assert s["geomean_vs_compile_latency"] == pytest.approx((2.0 * 0.8) ** 0.5)
    assert s["min_vs_compile_throughput"] == pytest.approx(0.8) and s["all_ok"] is False
    assert bf.summarize([good, skipped])["all_ok"] is True
    text = bf.format_table([good, slow, skipped], s)
    assert "a:fp32" in text and "skipped: torchvision" in text and "all ok: n" in text


# ---- the run: failing rows, child processes, the results file -----------------------------------

def test_failing_row_is_recorded_and_run_goes_on():
    seen = []

    def run_one(name):
        if name == "b:fp32":
            raise RuntimeError("boom")
        return bf.build_row(name, _times(1, 1, 1), 1.0, 30.0)

    rows = bf.run_rows(["a:fp32", "b:fp32", "c:fp32"], _opts(), run_one, keep=lambda rows: seen.append(len(rows)))
    assert [r["model"] for r in rows] == ["a:fp32", "b:fp32", "c:fp32"]
    assert rows[1]["error"] == "RuntimeError: boom" and set(FIELDS) <= set(rows[1])
    assert "error" not in rows[0] and "error" not in rows[2]
    assert seen == [1, 2, 3]                                          # the file is rewritten per row


def _script(tmp_path: Path, body: str):
    """A stand-in for the row's process: python running `body` with ROW_OUT (the row file) set."""
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return lambda name, opts, row_out: [sys.executable, str(path), str(row_out), name]


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in status                                      # a zombie has ended


def test_child_rows_done_crashed_and_cut_off(tmp_path):
    opts = _opts()
    done = _script(tmp_path, """
        import json, sys
        json.dump({"model": sys.argv[2], "stage": "done", "vs_compile_latency": 1.0}, open(sys.argv[1], "w"))
    """)
    assert bf.run_child("a:fp32", opts, 20, command=done) == {"model": "a:fp32", "stage": "done",
                                                              "vs_compile_latency": 1.0}
    crash = _script(tmp_path, "import sys; sys.exit(3)")
    row = bf.run_child("b:fp32", opts, 20, command=crash)
    assert row["error"] == "the row's process exited with status 3" and set(FIELDS) <= set(row)
    # cut off in optimize, 100 s after it started; the process it left running is ended too
    hang = _script(tmp_path, """
        import json, subprocess, sys, time
        kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        row = {"model": sys.argv[2], "budget_s": 30.0, "stage": "optimize", "optimize_started": time.time() - 100,
               "optimize_s": None, "kid": kid.pid}
        json.dump(row, open(sys.argv[1], "w"))
        time.sleep(60)
    """)
    t0 = time.monotonic()
    row = bf.run_child("c:fp32", opts, 2, command=hang)
    assert time.monotonic() - t0 < 15
    assert row["error"] == "timed out after 2 s in stage 'optimize'"
    assert row["optimize_s_at_least"] > 100 and row["within_budget"] is False
    assert _gone(row["kid"])


def test_main_writes_results_after_each_row(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_child(name, opts, timeout, lane=None):
        calls.append((name, timeout))
        if name == "cnn_small:fp32":
            return dict(bf.empty_row(name, budget_s=opts.budget), error="RuntimeError: CUDA error")
        files = list(tmp_path.glob("bench_floor-*.json"))
        assert len(files) == (1 if calls[:-1] else 0)                 # one file, rewritten
        return bf.build_row(name, _times(2, 1, 1), 5.0, opts.budget)

    monkeypatch.setattr(bf, "run_child", fake_child)
    rc = bf.main(["cnn_small:fp32", "mlp_gelu:bf16", "--budget", "10", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0 and calls == [("cnn_small:fp32", 281.0), ("mlp_gelu:bf16", 281.0)]   # 1.1*10+30+240
    (path,) = tmp_path.glob("bench_floor-*.json")
    data = json.loads(path.read_text())
    assert data["suite"] == "bench_floor" and data["budget_s"] == 10.0 and data["mode"] == "default"
    assert [r["model"] for r in data["rows"]] == ["cnn_small:fp32", "mlp_gelu:bf16"]
    for r in data["rows"]:
        assert set(bf.REQUIRED) <= set(r)
    assert data["summary"]["errors"] == 1 and data["summary"]["floor_ok"] == 1
    assert "floor_ok 1, within_budget 1" in capsys.readouterr().out
    # RESULTS.md's table for the suite, one row per model
    text = render.render(tmp_path, findings=None)
    assert "## bench_floor: the latest row of each model and dtype" in text
    assert "| mlp_gelu:bf16 | default |" in text and "CUDA error" in text


def test_list_prints_every_row(capsys):
    assert bf.main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(names) >= 12 and names == list(fm.ROWS)
    with pytest.raises(SystemExit):
        bf.parse(["no_such_model:fp32"])


def test_measure_on_cpu_with_stand_in_optimize():
    stages, modes = [], []
    report = type("R", (), {"note": "kept torch.compile", "swapped": 0, "decision": None})()

    def optimize(model, inputs, budget, mode):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled(), budget, mode))
        model.htam_report = report
        return model

    row = bf.measure("cnn_small:fp32", _opts(), device="cpu", optimize=optimize,
                     compile_fn=lambda m, mode: m, progress=lambda r: stages.append(r["stage"]))
    assert stages == ["build", "optimize", "warm", "check", "time"] and row["stage"] == "done"
    assert "error" not in row and row["correct"] is True and row["max_abs_err"] == 0.0
    assert row["report_note"] == "kept torch.compile" and row["within_budget"] is True
    assert all(row[f"{a}_ms_{w}"] > 0 for a in bf.ARMS for w in ("latency", "throughput"))
    json.dumps(row)
    # optimize runs under the caller's grad mode (default: inference_mode), with the row's budget and mode
    bf.measure("cnn_small:fp32", _opts("--grad-mode", "no_grad", "--mode", "reduce-overhead", "--budget", "7"),
               device="cpu", optimize=optimize, compile_fn=lambda m, mode: m)
    assert modes == [(True, False, 30.0, "default"), (False, False, 7.0, "reduce-overhead")]

    def broken(model, inputs, budget, mode):
        raise ValueError("no kernels today")

    row = bf.measure("mlp_gelu:bf16", _opts(), device="cpu", optimize=broken, compile_fn=lambda m, mode: m)
    assert row["error"] == "ValueError: no kernels today" and row["stage"] == "optimize"
    assert row["floor_ok"] is None

    def wrong(model, inputs, budget, mode):
        model.forward = lambda x: torch.zeros(x.shape[0], 10)
        return model

    row = bf.measure("cnn_small:fp32", _opts(), device="cpu", optimize=wrong, compile_fn=lambda m, mode: m)
    assert row["correct"] is False and row["compile_correct"] is True and "error" not in row


# ---- the models --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(fm.ROWS))
def test_builder_runs_small_on_cpu(name):
    try:
        model, inputs = fm.make(name, small=True, device="cpu")
    except fm.Unavailable as e:
        pytest.skip(str(e))
    assert not model.training
    dtype = fm.DTYPES[name.split(":")[1]]
    assert all(p.dtype == dtype for p in model.parameters())
    with torch.no_grad():
        out = model(*inputs)
    assert out.dtype == dtype and torch.isfinite(out.float()).all()
    model2, inputs2 = fm.make(name, small=True, device="cpu")                 # seeded
    assert all(torch.equal(a, b) for a, b in zip(inputs, inputs2))


def test_problems_load_without_sys_modules():
    before = set(sys.modules)
    for key, (file, _) in fm.PROBLEMS.items():
        mod = fm.load_problem(fm.PROBLEMS_DIR / file)
        assert mod.__name__ not in sys.modules and mod.Model.__module__ not in sys.modules
        model, inputs = fm.make(f"{key}:fp32", small=True, device="cpu")
        assert type(model).__module__ not in sys.modules
        assert type(model).__module__.startswith("floor_problem_")
    assert set(sys.modules) == before
    assert len(fm.PROBLEMS) == 3 and len(fm.ROWS) >= 12


def test_full_size_shapes_on_meta():
    """The full-size rows' shapes agree (meta tensors: no memory, no compute)."""
    for name in ("kb_convt3d_ln:fp32", "cnn_pw_silu:bf16", "gqa_decoder:bf16", "mlp_mixer:fp32"):
        model, inputs = fm.make(name, device="meta")
        out = model(*inputs)
        assert out.shape[0] == inputs[0].shape[0]
