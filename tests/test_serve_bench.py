"""bench/bench_serve.py and bench/serve_models.py on the CPU: the seeded request mix, the per-request
interleaved server loop with a fake clock and probes, the vs-compile arithmetic on made-up
latencies, the row schema from a CPU run with stand-in arms, a failing or crashed row recorded with
"error" while the run goes on, --list, the results file and its RESULTS.md table (temp folders
only), and every model at a tiny size (and at full size on the meta device). No GPU, no optimize()."""
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


from test_floor_bench import _load   # a bench/ script as a module (bench/ is no package)


bs = _load("bench_serve", ROOT / "bench" / "bench_serve.py")
sm = bs.serve_models
render = _load("bench_render", ROOT / "bench" / "render.py")

FIELDS = ("model", "throughput_vs_compile", "p99_vs_compile", "cold_throughput_vs_compile", "cold_p99_vs_compile",
          "kernel_share", "kernels_kept", "optimize_s", "recompiles", "requests", "mix", "arms", "max_err",
          "correct", "floor_ok", "within_budget", "tf32")


def _opts(*extra):
    return bs.parse(["--device", "cpu", "--small", "--requests", "12", *extra])


# ---- the request mix -------------------------------------------------------------------------------

@pytest.mark.parametrize("low,high,example", [(16, 1024, 512), (1, 64, 8), (1, 64, 16)])
def test_mix_is_seeded_in_range_with_a_mode_at_the_example(low, high, example):
    mix = bs.request_mix(low, high, example, 200, seed=0)
    assert mix.sizes == bs.request_mix(low, high, example, 200, seed=0).sizes          # reproducible
    assert mix.sizes != bs.request_mix(low, high, example, 200, seed=1).sizes
    assert len(mix.sizes) == 200 and all(isinstance(x, int) and low <= x <= high for x in mix.sizes)
    share = mix.sizes.count(example) / 200
    assert 0.2 <= share <= 0.27                                   # 40 forced, plus log-uniform hits
    assert mix.summary()["distinct"] > 10 and mix.summary()["at_example"] == mix.sizes.count(example)
    text = mix.describe()
    assert "log-uniform" in text and f"[{low}, {high}]" in text and "20%" in text and "Random(0)" in text


def test_mix_is_log_uniform_and_may_hold_a_batch_of_one():
    sizes = bs.request_mix(1, 64, 16, 2000, seed=0).sizes
    free = [x for x in sizes if x != 16]
    assert 1 in sizes                                             # a batch of 1 occurs
    # log-uniform: about as many draws below sqrt(64) = 8 as above it
    below = sum(x < 8 for x in free) / len(free)
    assert 0.4 < below < 0.6
    assert bs.request_mix(4, 4, 4, 5).sizes == [4] * 5


# ---- the server loop -------------------------------------------------------------------------------

class FakeClock:
    """A clock that moves only when an arm runs (by the arm's cost in ms, which may depend on the size)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def arm(self, ms, log=None, name=None):
        def run(x):
            if log is not None:
                log.append(name)
            self.t += (ms(x) if callable(ms) else ms) / 1e3
        return run


def test_serve_pass_rotates_arms_per_request_and_reads_probes_around_each_call():
    clock, log, counter = FakeClock(), [], {"graphs": 0, "kernel": 0}

    def ours(x):
        log.append("ours")
        counter["kernel"] += x > 2                                # our kernel runs on sizes above 2
        clock.t += 1e-3

    arms = {"eager": clock.arm(3.0, log, "eager"), "compile": clock.arm(lambda x: float(x), log, "compile"),
            "ours": ours}
    probes = {"ours": lambda: dict(counter)}
    calls = bs.serve_pass(arms, [1, 2, 3, 4], lambda size: (size,), lambda: None, probes, clock=clock)
    assert log[:3] == ["eager", "compile", "ours"] and log[3:6] == ["compile", "ours", "eager"]
    assert log[6:9] == ["ours", "eager", "compile"]
    assert calls["compile"].ms == pytest.approx([1.0, 2.0, 3.0, 4.0]) and calls["eager"].sizes == [1, 2, 3, 4]
    assert calls["ours"].deltas == {"graphs": [0, 0, 0, 0], "kernel": [0, 0, 1, 1]}
    assert calls["eager"].deltas == {}


def test_serve_pass_puts_each_arm_first_on_an_equal_share_of_new_sizes():
    # a size's first call pays the process's shared per-shape caches, whichever arm makes it
    clock, log = FakeClock(), []
    arms = {n: clock.arm(1.0, log, n) for n in ("a", "b", "c")}
    sizes = [5, 5, 5, 7, 7, 7, 9, 9, 9]          # rotated by r, all three new sizes would start with "a"
    bs.serve_pass(arms, sizes, lambda size: (size,), lambda: None, clock=clock)
    firsts = [log[3 * r] for r in range(len(sizes)) if sizes[r] not in sizes[:r]]
    assert sorted(firsts) == ["a", "b", "c"]
    assert [log[3 * r] for r in (1, 2)] == ["b", "c"]             # repeats still rotate by r


def test_timed_call_syncs_around_the_call_and_probes_outside_it():
    clock, events = FakeClock(), []

    def probe():
        events.append("probe")
        clock.t += 1.0                                            # a slow probe is not timed
        return {"n": len(events)}

    ms, deltas = bs.timed_call(lambda: clock.arm(2.0)(0), (), lambda: events.append("sync"), probe, clock)
    assert ms == pytest.approx(2.0) and events == ["probe", "sync", "sync", "probe"]
    assert deltas == {"n": 3}


# ---- figures ---------------------------------------------------------------------------------------

def _calls(ms, sizes=None, **deltas):
    c = bs.Calls(sizes=list(sizes or [1] * len(ms)), ms=list(ms))
    c.deltas = {k: list(v) for k, v in deltas.items()}
    return c


def test_percentile_interpolates_like_numpy():
    xs = list(range(1, 101))                                      # 1..100
    assert bs.percentile(xs, 0.5) == pytest.approx(50.5)
    assert bs.percentile(xs, 0.99) == pytest.approx(99.01)
    assert bs.percentile([5.0], 0.99) == 5.0 and bs.percentile([], 0.5) is None


def test_arm_stats_throughput_latency_and_shares():
    s = bs.arm_stats(_calls([10.0, 30.0], sizes=[4, 12], graphs=[1, 0], kernel=[1, 0], outside=[0, 2], failed=[0, 0]))
    assert s["requests_per_s"] == pytest.approx(2 / 0.04) and s["items_per_s"] == pytest.approx(16 / 0.04)
    assert s["p50_ms"] == pytest.approx(20.0) and s["max_ms"] == 30.0 and s["graphs"] == 1
    assert s["kernel_share"] == 0.5 and s["outside_share"] == 0.5 and s["kernel_failed"] == 0
    plain = bs.arm_stats(_calls([1.0]))
    assert plain["kernel_share"] is None and plain["graphs"] is None


def _pass(dyn, default, ours, ours_kernel=None):
    arms = {"eager": _calls([5.0] * len(ours)), "compile_dynamic": _calls(dyn), "compile_default": _calls(default),
            "ours": _calls(ours, kernel=ours_kernel or [0] * len(ours))}
    for c in arms.values():
        c.deltas.setdefault("graphs", [0] * len(c.ms))
    return arms


def test_vs_compile_ratios_take_the_better_compile_arm_each_way():
    # 100 requests: dynamic 2 ms flat; default 1 ms but two 10 ms spikes (better throughput, worse p99);
    # ours 1.5 ms flat
    dyn, default, ours = [2.0] * 100, [1.0] * 98 + [10.0, 10.0], [1.5] * 100
    stats = {a: bs.arm_stats(c) for a, c in _pass(dyn, default, ours).items()}
    r = bs.vs_compile(stats)
    default_rps = 100 / (sum(default) / 1e3)
    assert r["best_compile_throughput"] == "compile_default" and r["best_compile_p99"] == "compile_dynamic"
    assert r["throughput_vs_compile"] == pytest.approx((100 / 0.15) / default_rps)           # ours / best
    assert r["p99_vs_compile"] == pytest.approx(2.0 / 1.5)                                     # best / ours
    assert bs.vs_compile({"ours": stats["ours"]})["throughput_vs_compile"] is None


def test_pass_fields_and_verdicts_make_a_row():
    cold = _pass([2.0] * 10, [1.0] * 10, [2.0] * 10, ours_kernel=[1] * 5 + [0] * 5)
    cold["compile_default"].deltas["graphs"] = [1] + [0] * 9
    cold["ours"].deltas["graphs"] = [2] + [0] * 9
    warm = _pass([2.0] * 10, [1.0] * 10, [0.5] * 10, ours_kernel=[1] * 8 + [0] * 2)
    row = bs.build_row("encoder:bf16", {"cold": cold, "warm": warm}, optimize_s=100.0, budget_s=120.0)
    assert set(FIELDS) <= set(row)
    assert row["throughput_vs_compile"] == pytest.approx(2.0) and row["p99_vs_compile"] == pytest.approx(2.0)
    assert row["cold_throughput_vs_compile"] == pytest.approx(0.5) and row["cold_p99_vs_compile"] == pytest.approx(0.5)
    assert row["kernel_share"] == 0.8 and row["cold_kernel_share"] == 0.5
    assert row["recompiles"] == {"eager": 0, "compile_dynamic": 0, "compile_default": 1, "ours": 2}
    assert row["warm_recompiles"]["ours"] == 0
    assert row["floor_ok"] is True and row["within_budget"] is True
    assert row["arms"]["ours"]["warm"]["p99_ms"] == pytest.approx(0.5)
    json.dumps(row, allow_nan=False)
    slow = bs.build_row("encoder:bf16", {"warm": _pass([1.0] * 10, [1.0] * 10, [1.03] * 10)}, 200.0, 120.0)
    assert slow["floor_ok"] is False and slow["within_budget"] is False                 # 0.97x; over 162 s
    assert bs.verdicts(dict(bs.empty_row("m:bf16"), optimize_s_at_least=500.0))["within_budget"] is False


def test_summary_and_table():
    good = bs.build_row("a:bf16", {"warm": _pass([2.0] * 4, [2.0] * 4, [1.0] * 4, [1] * 4)}, 10.0, 120.0)
    bad = dict(bs.empty_row("b:fp32"), error="RuntimeError: boom")
    s = bs.summarize([good, bad])
    assert s["rows"] == 2 and s["errors"] == 1 and s["floor_ok"] == 1 and s["all_ok"] is False
    assert s["min_throughput_vs_compile"] == pytest.approx(2.0) and s["kernel_share"] == {"a:bf16": 1.0, "b:fp32": None}
    text = bs.format_table([good, bad], s)
    assert "a:bf16" in text and "RuntimeError: boom" in text and "all ok: n" in text


# ---- the output check ------------------------------------------------------------------------------

def test_error_is_absolute_and_relative_to_the_largest_reference_value():
    ref = torch.tensor([[4.0, -2.0]])
    assert bs.error(ref + torch.tensor([[0.0, 0.2]]), ref) == (pytest.approx(0.2), pytest.approx(0.05))
    assert bs.error(ref[:, :1], ref) == (None, None) and bs.error(ref * float("nan"), ref) == (None, None)
    arms = {"eager": lambda x: x * 2, "compile_dynamic": lambda x: x * 2, "compile_default": lambda x: x * 2 + 1,
            "ours": lambda x: x * 2.01}
    out = bs.check_outputs(arms, [1, 3], lambda n: (torch.full((n,), 10.0),), tol=1e-2)
    assert out["max_err"]["compile_dynamic"] == 0.0 and out["correct"] == {
        "compile_dynamic": True, "compile_default": False, "ours": True}
    assert out["max_rel_err"]["ours"] == pytest.approx(0.005, rel=1e-4) and out["check_sizes"] == [1, 3]
    assert bs.check_sizes(bs.Mix([5, 1, 9, 3, 7], 1, 9, 4, 0)) == [1, 4, 5, 9]


# ---- a row measured on the CPU with stand-in arms --------------------------------------------------

def test_measure_on_cpu_with_stand_in_arms(monkeypatch):
    from torch_htam.report import Report, TaskReport, TaskStatus
    kernel_calls, stages, seen = {"kernel": 0, "outside": 0, "failed": 0}, [], []

    def optimize(model, inputs, dynamic, budget):
        seen.append((torch.is_inference_mode_enabled(), dynamic, budget, [tuple(x.shape) for x in inputs]))
        forward = model.forward

        def counted(*args):                                       # "our kernel" ran on every call
            kernel_calls["kernel"] += 1
            return forward(*args)
        model.forward = counted
        model.htam_report = Report(tasks=[TaskReport("a", "s1", status=TaskStatus.SWAPPED),
                                          TaskReport("b", "s2", status=TaskStatus.NOT_USED, detail="slower")],
                                   swapped=3, phases={"search": 1.5})
        return model

    monkeypatch.setattr(bs, "kernel_counts", lambda: dict(kernel_calls))
    row = bs.measure("encoder:fp32", _opts("--budget", "7"), device="cpu", optimize=optimize,
                     compile_fn=lambda m, dynamic: m, progress=lambda r: stages.append(r["stage"]))
    assert "error" not in row and row["stage"] == "done"
    assert stages == ["build", "optimize", "warmup", "cold", "warm", "check"]
    assert seen == [(True, {0: {0: (1, 8)}}, 7.0, [(4, 8, 32)])]
    assert set(FIELDS) <= set(row) and row["requests"] == 12 and len(row["mix_sizes"]) == 12
    assert row["kernels_kept"] == 1 and row["task_status"] == {"swapped": 1, "not used": 1} and row["swapped"] == 3
    assert [(r["task"], r["status"], r["detail"]) for r in row["regions"]] == [("a", "swapped", ""),
                                                                              ("b", "not used", "slower")]
    assert row["phases"] == {"search": 1.5}
    assert row["kernel_share"] == 1.0 and row["cold_kernel_share"] == 1.0
    assert row["correct"] == {"compile_dynamic": True, "compile_default": True, "ours": True}
    assert row["max_err"]["ours"] == 0.0 and row["tf32"] is True and row["tolerance"] == 1e-2
    assert row["recompiles"] == {a: 0 for a in bs.ARMS} and row["unit"] == "sequences"
    # start-up warms every arm at the example (4) and the declared range's ends (1, 8): 3 calls each,
    # so ours ran its "kernel" 3 times before the passes' requests
    assert row["warmup_sizes"] == [4, 1, 8] and set(row["warmup_s"]) == set(bs.ARMS)
    assert all(row["arms"][a]["cold"]["requests"] == 12 for a in bs.ARMS)
    assert all(row["arms"][a]["warm"]["requests"] == 12 * bs.WARM_PASSES for a in bs.ARMS)
    json.dumps(row, allow_nan=False)


def test_measure_records_a_failing_optimize():
    def broken(model, inputs, dynamic, budget):
        raise ValueError("no kernels today")

    row = bs.measure("vision:bf16", _opts(), device="cpu", optimize=broken, compile_fn=lambda m, dynamic: m)
    assert row["error"] == "ValueError: no kernels today" and row["stage"] == "optimize"
    assert row["floor_ok"] is None and row["tf32"] is False and row["mix"].startswith("log-uniform")


# ---- the run: failing rows, child processes, the results file, RESULTS.md ---------------------------

def _script(tmp_path: Path, body: str):
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return lambda name, opts, row_out: [sys.executable, str(path), str(row_out), name]


def test_child_rows_done_and_crashed(tmp_path):
    done = _script(tmp_path, """
        import json, sys
        json.dump({"model": sys.argv[2], "stage": "done", "kernel_share": 1.0}, open(sys.argv[1], "w"))
    """)
    assert bs.run_child("decoder:bf16", _opts(), 20, command=done)["kernel_share"] == 1.0
    crash = _script(tmp_path, "import sys; sys.exit(3)")
    row = bs.run_child("decoder:bf16", _opts(), 20, command=crash)
    assert row["error"] == "the row's process exited with status 3" and set(FIELDS) <= set(row)


def test_failing_row_is_recorded_and_run_goes_on():
    seen = []

    def run_one(name):
        if name == "encoder:bf16":
            raise RuntimeError("boom")
        return bs.empty_row(name)

    rows = bs.run_rows(["decoder:bf16", "encoder:bf16", "vision:bf16"], _opts(), run_one,
                       keep=lambda rows: seen.append(len(rows)))
    assert [r["model"] for r in rows] == ["decoder:bf16", "encoder:bf16", "vision:bf16"]
    assert rows[1]["error"] == "RuntimeError: boom" and set(FIELDS) <= set(rows[1]) and seen == [1, 2, 3]


def _measured(name: str) -> dict:
    cold = _pass([2.0] * 4, [1.0] * 4, [2.0] * 4, [1] * 4)
    cold["compile_default"].deltas["graphs"] = [2, 0, 0, 0]
    return bs.build_row(name, {"cold": cold, "warm": _pass([2.0] * 4, [1.0] * 4, [0.95] * 4, [1, 1, 0, 0])},
                        optimize_s=90.0, budget_s=120.0, kernels_kept=3)


def test_main_writes_results_after_each_row_and_render_shows_them(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_child(name, opts, timeout):
        calls.append((name, timeout))
        assert len(list(tmp_path.glob("bench_serve-*.json"))) == (1 if calls[:-1] else 0)   # one file, rewritten
        if name == "vision:fp32":
            return dict(bs.empty_row(name), error="RuntimeError: CUDA error")
        return _measured(name)

    monkeypatch.setattr(bs, "run_child", fake_child)
    rc = bs.main(["--dtype", "fp32", "--budget", "10", "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0 and calls == [(n, 461.0) for n in ("decoder:fp32", "encoder:fp32", "vision:fp32", "resnet50:fp32")]
    (path,) = tmp_path.glob("bench_serve-*.json")
    data = json.loads(path.read_text())
    assert data["suite"] == "bench_serve" and data["requests"] == 200 and data["seed"] == 0
    assert {"command", "device", "date", "commit"} <= set(data) and "log-uniform" in data["mix_rule"]
    assert [r["model"] for r in data["rows"]] == ["decoder:fp32", "encoder:fp32", "vision:fp32", "resnet50:fp32"]
    assert data["summary"]["errors"] == 1 and data["summary"]["min_p99_vs_compile"] == pytest.approx(1.0 / 0.95)
    assert "floor_ok 3" in capsys.readouterr().out
    text = render.render(tmp_path, findings=None)
    assert "## bench_serve: the latest row of each model and dtype" in text
    line = next(x for x in text.splitlines() if x.startswith("| decoder:fp32"))
    assert line.startswith("| decoder:fp32 | 3 | 50% | 1.053x | 1.053x | 0.500x | 0.500x |")
    assert "| 0 | 2 | 0 | 90 |" in line                                   # recompiles dyn/default/ours, optimize s
    assert "CUDA error" in text


def test_render_handles_a_synthetic_bench_serve_file(tmp_path):
    rows = [_measured("encoder:bf16"), {"model": "vision:bf16", "error": "timed out after 600 s in stage 'cold'"}]
    for i, (date, rs) in enumerate((("2027-01-01", rows), ("2027-01-02", [dict(rows[0], kernels_kept=7)]))):
        data = {"suite": "bench_serve", "date": f"{date}T00:00:00+00:00", "commit": "abc1234", "device": "H100",
                "torch": "2.11", "command": "python3 bench/bench_serve.py", "rows": rs}
        (tmp_path / f"bench_serve-{i}.json").write_text(json.dumps(data))
    text = render.render(tmp_path, findings=None)
    assert "| encoder:bf16 | 7 |" in text and "| 2 |" in text             # the later run's row, named run 2
    assert "| vision:bf16 |" in text and "timed out after 600 s" in text   # the earlier run's other row stays


def test_list_and_row_selection(capsys):
    assert bs.main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert names == sm.ROWS == ["decoder:bf16", "decoder:fp32", "encoder:bf16", "encoder:fp32",
                                "vision:bf16", "vision:fp32", "resnet50:bf16", "resnet50:fp32"]
    assert bs.selected(bs.parse(["--dtype", "bf16"])) == ["decoder:bf16", "encoder:bf16", "vision:bf16",
                                                          "resnet50:bf16"]
    assert bs.selected(bs.parse(["vision:fp32", "decoder:bf16", "--dtype", "fp32"])) == ["vision:fp32"]
    a = bs.parse([])
    assert (a.requests, a.seed, a.budget, a.timeout) == (200, 0, 120.0, None)
    with pytest.raises(SystemExit):
        bs.parse(["no_such_model:bf16"])


# ---- the models ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sm.ROWS)
def test_model_builds_small_on_cpu_and_make_inputs_shapes(name):
    from torch_htam.config import OptimizeConfig
    from torch_htam.extract import check_dynamic
    model, example, dynamic, make_inputs = sm.make(name, small=True, device="cpu")
    dtype = sm.DTYPES[name.split(":")[1]]
    assert not model.training and all(p.dtype == dtype for p in model.parameters())
    OptimizeConfig(dynamic=dynamic)                                  # OptimizeConfig.dynamic's format
    assert check_dynamic(dynamic, example) == dynamic                # the example lies in the range
    index, dim, low, high = sm.dynamic_dim(dynamic)
    for size in (low, high):
        inputs = make_inputs(size)
        shape = list(example[index].shape)
        shape[dim] = size
        assert list(inputs[index].shape) == shape and inputs[index].dtype == example[index].dtype
        assert all(torch.equal(a, b) for a, b in zip(inputs, make_inputs(size)))     # seeded
        with torch.no_grad():
            out = model(*inputs)
        assert out.dtype == dtype and out.shape[0] == inputs[0].shape[0] and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("name,example,dynamic,out", [
    ("decoder:bf16", (1, 512), {0: {1: (16, 1024)}}, (1, 512, 1024)),
    ("encoder:bf16", (8, 128, 768), {0: {0: (1, 64)}}, (8, 128, 768)),
    ("vision:bf16", (16, 3, 224, 224), {0: {0: (1, 64)}}, (16, 1000)),
    ("resnet50:bf16", (32, 3, 224, 224), {0: {0: (1, 64)}}, (32, 1000))])
def test_full_size_models_on_meta(name, example, dynamic, out):
    """The full-size configs (meta tensors: no memory, no compute)."""
    model, inputs, dyn, make_inputs = sm.make(name, device="meta")
    assert tuple(inputs[0].shape) == example and dyn == dynamic
    assert tuple(model(*inputs).shape) == out
    assert tuple(make_inputs(3)[0].shape)[:2] == ((1, 3) if name.startswith("decoder") else (3, example[1]))
    assert math.isclose(sum(p.numel() for p in model.parameters()) / 1e6,
                        {"decoder": 77.9, "encoder": 28.4, "vision": 11.7, "resnet50": 25.6}[name.split(":")[0]], rel_tol=0.01)


def test_every_model_names_its_unit():
    assert set(sm.UNITS) == set(sm.MODELS)


def test_a_pass_runs_with_the_cyclic_gc_off_and_collects_around_it(monkeypatch):
    import gc
    seen, collected = [], []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(gc.isenabled()) or 0)
    with bs.collected_between():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled() and collected == [True, True]
