"""bench/bench_serve.py and bench/serve_models.py on the CPU: the seeded request mix, the per-request
interleaved server loop with a fake clock and probes, the vs-compile arithmetic on made-up
latencies, the row schema from a CPU run with stand-in arms, a failing or crashed row recorded with
"error" while the run goes on, --list, the results file and its RESULTS.md table (temp folders
only), and every model at a tiny size (and at full size on the meta device). No GPU, no optimize()."""
import copy
import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


from test_floor_bench import _load   # a bench/ script as a module (bench/ is no package)


bs = _load("bench_serve", ROOT / "bench" / "bench_serve.py")
sm = bs.serve_models
render = _load("bench_render", ROOT / "bench" / "render.py")

FIELDS = ("model", "throughput_vs_compile", "p99_vs_compile", "cold_throughput_vs_compile", "cold_p99_vs_compile",
          "kernel_share", "kernels_kept", "optimize_s", "recompiles", "requests", "mix", "arms", "max_err",
          "correct", "floor_ok", "within_budget", "tf32")


@pytest.fixture(autouse=True)
def _no_wait_for_a_quiet_host(monkeypatch):
    """A pass here starts at once: bench_floor.quiet_host waits up to 20 s a pass for other processes
    to leave the cores, which on a busy test box is every pass."""
    monkeypatch.setattr(bs.bench_floor, "quiet_host", lambda: 0.0)


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
    assert s["slowest"] == [[12, 30.0], [4, 10.0]]           # which sizes the tail comes from
    many = bs.arm_stats(_calls([float(i) for i in range(20)], sizes=list(range(20))))
    assert len(many["slowest"]) == bs.SLOWEST and many["slowest"][0] == [19, 19.0]
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
    children = []

    def run_cold(name, opts, arm, limit_s, bundle):
        children.append((arm, bundle, limit_s))
        return bs.ColdRun(arm, _calls([1.0] * 12), wall_s=2.0, limit_s=limit_s)

    row = bs.measure("encoder:fp32", _opts("--budget", "7"), device="cpu", optimize=optimize,
                     compile_fn=lambda m, dynamic: m, progress=lambda r: stages.append(r["stage"]), run_cold=run_cold)
    assert "error" not in row and row["stage"] == "done"
    assert stages == ["build", "optimize", "bundle", "warmup", "cold", "warm", "check", "cold_isolated compile_dynamic",
                      "cold_isolated compile_default", "cold_isolated ours"]
    # the stand-in ours runs no torch.compile (no backend): no bundle, its child optimizes again, with
    # optimize's limit on top of its own
    assert row["cold_isolated_ours"].startswith("optimize again") and "replay" in row["cold_isolated_ours"]
    assert [(a, b) for a, b, _ in children] == [(a, None) for a in bs.CHECKED]
    assert [lim for _, _, lim in children] == [bs.COLD_ARM_TIMEOUT_S] * 2 + [bs.COLD_ARM_TIMEOUT_S + 37.7]
    assert row["cold_isolated_s"] == 6.0 and row["cold_isolated_error"] is None
    assert seen == [(True, {0: {0: (1, 8)}}, 7.0, [(4, 8, 32)])]
    assert set(FIELDS) <= set(row) and row["requests"] == 12 and len(row["mix_sizes"]) == 12
    assert row["kernels_kept"] == 1 and row["task_status"] == {"swapped": 1, "not used": 1} and row["swapped"] == 3
    assert [(r["task"], r["status"], r["detail"]) for r in row["regions"]] == [("a", "swapped", ""),
                                                                              ("b", "not used", "slower")]
    assert row["phases"] == {"search": 1.5}
    assert row["kernel_share"] == 1.0 and row["cold_kernel_share"] == 1.0
    assert row["correct"] == {"compile_dynamic": True, "compile_default": True, "ours": True}
    assert row["max_err"]["ours"] == 0.0 and row["tf32"] is True and row["tolerance"] == 1e-2
    arms = [a for a in bs.ARMS if a != "ours_graphs"]   # ours_graphs: with --graph-launches-ab only
    assert row["recompiles"] == {a: 0 for a in arms} and row["unit"] == "sequences"
    # start-up warms every arm at the example (4) and the declared range's ends (1, 8): 3 calls each,
    # so ours ran its "kernel" 3 times before the passes' requests
    assert row["warmup_sizes"] == [4, 1, 8] and set(row["warmup_s"]) == set(arms)
    assert all(row["arms"][a]["cold"]["requests"] == 12 for a in arms)
    assert all(row["arms"][a]["warm"]["requests"] == 12 * bs.WARM_PASSES for a in arms)
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

    def fake_child(name, opts, timeout, lane=None):
        calls.append((name, timeout))
        assert len(list(tmp_path.glob("bench_serve-*.json"))) == (1 if calls[:-1] else 0)   # one file, rewritten
        if name == "vision:fp32":
            return dict(bs.empty_row(name), error="RuntimeError: CUDA error")
        return _measured(name)

    monkeypatch.setattr(bs, "run_child", fake_child)
    rc = bs.main(["--dtype", "fp32", "--budget", "10", "--device", "cpu", "--out", str(tmp_path)])
    # 1.1 x 10 + 30 + 420, plus 3 x 60 for the isolated cold pass's children
    assert rc == 0 and calls == [(n, 641.0) for n in ("decoder:fp32", "encoder:fp32", "vision:fp32", "resnet50:fp32")]
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


# ---- the isolated cold pass: each checked arm cold in a child process of its own -------------------

def _cold_child(tmp_path, arm, *extra):
    """The cold child's command line run in this process; what it wrote to --row-out."""
    out = tmp_path / f"{arm}.json"
    rc = bs.main(["--one", "encoder:bf16", "--cold-arm", arm, "--row-out", str(out), "--device", "cpu", "--small",
                  "--requests", "12", "--seed", "3", *extra])
    return rc, json.loads(out.read_text())


def test_cold_child_serves_the_mix_in_order_with_its_arm_alone(tmp_path, monkeypatch):
    compiled = []

    def compile_fn(model, dynamic):
        compiled.append(dynamic)
        return model

    monkeypatch.setattr(bs, "_torch_compile", compile_fn)
    monkeypatch.setattr(bs, "_optimize", lambda *a: pytest.fail("a compile arm's child optimizes nothing"))
    rc, got = _cold_child(tmp_path, "compile_default")
    mix = bs.request_mix(1, 8, 4, 12, seed=3)                           # encoder small: B 1-8, example 4
    assert rc == 0 and got["error"] is None and got["stage"] == "done" and got["arm"] == "compile_default"
    assert compiled == [None]                                           # that arm alone, as setup() compiles it
    assert got["calls"]["sizes"] == mix.sizes and len(got["calls"]["ms"]) == 12   # the mix, in its order
    assert got["calls"]["deltas"]["graphs"] == [0] * 12 and "kernel" not in got["calls"]["deltas"]
    assert got["warmup_sizes"] == [4, 1, 8] and isinstance(got["warmup_s"], float)
    assert got["built"] == "torch.compile(dynamic=None)"
    run = bs.cold_run_of("compile_default", got, 1.0, 180.0, None)
    assert run.error is None and run.calls.sizes == mix.sizes and run.info["warmup_graphs"] == 0


def test_cold_child_loads_ours_from_the_bundle_and_counts_its_kernels(tmp_path, monkeypatch):
    counter, loaded = {"kernel": 0, "outside": 0, "failed": 0}, []

    def load(model, bundle, inputs):
        loaded.append((bundle, tuple(inputs[0].shape), torch.is_inference_mode_enabled()))
        forward = model.forward

        def with_kernel(*args):
            counter["kernel"] += args[0].shape[0] > 1                   # "our kernel" on batches above 1
            return forward(*args)
        model.forward = with_kernel
        return model

    monkeypatch.setattr(bs, "_load_bundle", load)
    monkeypatch.setattr(bs, "_torch_compile", lambda *a: pytest.fail("ours' child compiles no other arm"))
    monkeypatch.setattr(bs, "kernel_counts", lambda: dict(counter))
    rc, got = _cold_child(tmp_path, "ours", "--bundle", str(tmp_path / "bundle"))
    sizes = bs.request_mix(1, 8, 4, 12, seed=3).sizes
    assert rc == 0 and got["built"] == "bundle" and loaded == [(tmp_path / "bundle", (4, 8, 32), True)]
    assert got["calls"]["sizes"] == sizes and got["calls"]["deltas"]["kernel"] == [int(x > 1) for x in sizes]


def test_cold_child_without_a_bundle_optimizes_ours_again_and_records_a_failure(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(bs, "_optimize", lambda model, inputs, dynamic, budget: seen.append((dynamic, budget)) or model)
    rc, got = _cold_child(tmp_path, "ours", "--budget", "9")
    assert rc == 0 and got["built"] == "optimize again" and seen == [({0: {0: (1, 8)}}, 9.0)]
    monkeypatch.setattr(bs, "_optimize", lambda *a: (_ for _ in ()).throw(RuntimeError("no GPU today")))
    rc, got = _cold_child(tmp_path, "ours")
    assert rc == 1 and got["error"] == "RuntimeError: no GPU today" and got["stage"] == "build" and got["calls"] is None
    run = bs.cold_run_of("ours", got, 2.0, 180.0, "the child exited with status 1")
    assert run.calls is None and run.error == "RuntimeError: no GPU today"
    with pytest.raises(SystemExit):
        bs.parse(["--cold-arm", "ours"])                                # needs --one
    with pytest.raises(SystemExit):
        bs.parse(["--one", "encoder:bf16", "--cold-arm", "eager"])      # eager is not served cold


def _cold_script(tmp_path: Path, body: str):
    path = tmp_path / "cold_child.py"
    path.write_text(textwrap.dedent(body))
    return lambda name, opts, arm, out, bundle: [sys.executable, str(path), str(out), arm]


def test_run_cold_arm_reads_the_childs_calls_or_says_why_not(tmp_path):
    done = _cold_script(tmp_path, """
        import json, sys
        calls = {"sizes": [2, 5], "ms": [1.5, 2.5], "deltas": {"graphs": [1, 0]}}
        json.dump({"arm": sys.argv[2], "stage": "done", "calls": calls, "error": None, "warmup_s": 3.0},
                  open(sys.argv[1], "w"))
        sys.exit(int(sys.argv[2] == "ours"))          # ours' child crashes at exit, after writing
    """)
    run = bs.run_cold_arm("encoder:bf16", _opts(), "compile_dynamic", 20, None, command=done)
    assert run.error is None and run.calls.ms == [1.5, 2.5] and run.calls.deltas == {"graphs": [1, 0]}
    assert run.info == {"stage": "done", "warmup_s": 3.0} and run.limit_s == 20 and run.wall_s > 0
    ours = bs.run_cold_arm("encoder:bf16", _opts(), "ours", 20, None, command=done)
    assert ours.calls is not None and ours.info["exit"] == "the child exited with status 1"
    crash = _cold_script(tmp_path, "import sys; sys.exit(3)")
    run = bs.run_cold_arm("encoder:bf16", _opts(), "ours", 20, None, command=crash)
    assert run.calls is None and run.error == "the child exited with status 3"
    stuck = _cold_script(tmp_path, """
        import json, sys, time
        json.dump({"stage": "warmup", "calls": None, "error": None}, open(sys.argv[1], "w"))
        time.sleep(60)
    """)
    run = bs.run_cold_arm("encoder:bf16", _opts(), "compile_default", 1, None, command=stuck)
    assert run.error == "timed out after 1 s in stage 'warmup'" and run.wall_s < 30


def test_cold_command_names_the_arm_and_the_bundle():
    cmd = bs.cold_command("resnet50:bf16", _opts("--timeout", "500"), "ours", Path("/t/calls.json"), Path("/t/b"))
    assert cmd[cmd.index("--one") + 1] == "resnet50:bf16" and cmd[cmd.index("--row-out") + 1] == "/t/calls.json"
    assert cmd[-4:] == ["--cold-arm", "ours", "--bundle", "/t/b"] and "--small" in cmd
    assert "--bundle" not in bs.cold_command("resnet50:bf16", _opts(), "compile_dynamic", Path("/t/c"), None)
    row_cmd = bs.child_command("resnet50:bf16", _opts("--timeout", "500", "--no-cold-isolated"), Path("/t/r"))
    assert row_cmd[row_cmd.index("--timeout") + 1] == "500.0" and "--no-cold-isolated" in row_cmd


def _stand_in_ours(model, inputs, dynamic, budget):
    return model


def _measure_with_children(run_cold, *extra, **kw):
    return bs.measure("encoder:bf16", _opts(*extra), device="cpu", optimize=_stand_in_ours,
                      compile_fn=lambda m, dynamic: m, run_cold=run_cold, **kw)


def test_isolated_ratios_come_from_the_childrens_calls(tmp_path):
    # each child's latencies made up: compile_dynamic 2 ms, compile_default 1 ms with a 9 ms first call
    # (a recompile), ours 0.5 ms but 4 ms on its first call
    made = {"compile_dynamic": [2.0] * 12, "compile_default": [9.0] + [1.0] * 11, "ours": [4.0] + [0.5] * 11}
    bundles = []

    def run_cold(name, opts, arm, limit_s, bundle):
        bundles.append(bundle)
        graphs = [1] + [0] * 11 if arm == "compile_default" else [0] * 12
        return bs.ColdRun(arm, _calls(made[arm], graphs=graphs), wall_s=5.0, limit_s=limit_s, info={"built": arm})

    def write_bundle(ours, original, example, dynamic, out_dir):
        assert original is not ours and dynamic == {0: {0: (1, 8)}}
        out_dir.mkdir()
        (out_dir / "manifest.json").write_text("{}")

    row = _measure_with_children(run_cold, write_bundle=write_bundle)
    assert "error" not in row and row["cold_isolated_ours"] == "bundle" and row["bundle_s"] >= 0
    assert len(bundles) == 3 and bundles[0].name == "bundle" and len(set(bundles)) == 1
    stats = {a: bs.arm_stats(_calls(ms)) for a, ms in made.items()}
    best_thr = max(stats[a]["requests_per_s"] for a in bs.COMPILE_ARMS)          # compile_default's
    best_p99 = min(stats[a]["p99_ms"] for a in bs.COMPILE_ARMS)
    assert row["cold_isolated_throughput_vs_compile"] == pytest.approx(stats["ours"]["requests_per_s"] / best_thr)
    assert row["cold_isolated_p99_vs_compile"] == pytest.approx(best_p99 / stats["ours"]["p99_ms"])
    assert row["cold_isolated_best_compile_throughput"] == "compile_default"
    assert row["cold_isolated_best_compile_p99"] == "compile_dynamic"
    assert row["cold_isolated_p99_vs_compile"] != row["cold_p99_vs_compile"]    # not the in-process pass
    assert row["arms"]["ours"]["cold_isolated"]["p99_ms"] == pytest.approx(stats["ours"]["p99_ms"])
    assert "cold_isolated" not in row["arms"]["eager"]                          # eager is not served cold
    assert row["cold_isolated_recompiles"] == {"compile_dynamic": 0, "compile_default": 1, "ours": 0}
    assert row["cold_isolated_runs"]["ours"] == {"wall_s": 5.0, "limit_s": bs.COLD_ARM_TIMEOUT_S, "built": "ours"}
    assert row["cold_isolated_s"] == 15.0 and row["cold_isolated_error"] is None
    json.dumps(row, allow_nan=False)
    assert "iso thr" in bs.format_table([row], bs.summarize([row]))
    assert bs.summarize([row])["min_cold_isolated_p99_vs_compile"] == pytest.approx(row["cold_isolated_p99_vs_compile"])


def test_a_failing_child_is_recorded_and_the_row_keeps_its_warm_figures():
    def run_cold(name, opts, arm, limit_s, bundle):
        if arm == "compile_default":
            return bs.ColdRun(arm, wall_s=1.0, limit_s=limit_s, error="timed out after 180 s in stage 'warmup'")
        if arm == "ours":
            raise OSError("cannot start the child")
        return bs.ColdRun(arm, _calls([1.0] * 12), wall_s=3.0, limit_s=limit_s)

    row = _measure_with_children(run_cold)
    assert "error" not in row and row["stage"] == "done"
    assert row["throughput_vs_compile"] is not None and row["cold_p99_vs_compile"] is not None
    assert row["arms"]["ours"]["warm"]["requests"] == 12 * bs.WARM_PASSES
    assert row["cold_isolated_error"] == {"compile_default": "timed out after 180 s in stage 'warmup'",
                                          "ours": "OSError: cannot start the child"}
    # with a checked arm missing, no ratio: the better compile arm cannot be told from one
    assert row["cold_isolated_throughput_vs_compile"] is None and row["cold_isolated_p99_vs_compile"] is None
    assert row["arms"]["compile_dynamic"]["cold_isolated"]["requests"] == 12
    assert row["cold_isolated_s"] == 4.0 and row["floor_ok"] is not None


def test_children_stay_within_the_rows_limit_and_can_be_skipped():
    ran = []
    run_cold = lambda name, opts, arm, limit_s, bundle: ran.append(arm)    # noqa: E731
    row = _measure_with_children(run_cold, "--timeout", "35")              # 35 - ROW_MARGIN_S: 5 s left
    assert ran == [] and row["stage"] == "done" and "error" not in row
    assert set(row["cold_isolated_error"]) == set(bs.CHECKED)
    assert all(e.startswith("skipped:") and "row's time limit" in e for e in row["cold_isolated_error"].values())
    assert row["throughput_vs_compile"] is not None
    off = _measure_with_children(run_cold, "--no-cold-isolated")
    assert ran == [] and off["stage"] == "done" and off["bundle_s"] is None and off["cold_isolated_s"] is None
    assert set(bs.empty_row("x:bf16")) >= {"cold_isolated_throughput_vs_compile", "cold_isolated_p99_vs_compile",
                                          "cold_isolated_s", "cold_isolated_error", "cold_isolated_runs"}
    assert bs.default_timeout(10.0, cold_isolated=False) == 461.0


def test_save_ours_falls_back_to_optimize_again_where_no_bundle_is_written(tmp_path):
    s = bs.Setup({}, (torch.zeros(4, 2),), {0: {0: (1, 8)}}, lambda n: (torch.zeros(n, 2),), bs.Mix([4], 1, 8, 4, 0))
    plain = torch.nn.Linear(2, 2)
    saved = bs.save_ours(plain, plain, s, tmp_path / "b")             # the real writer: ours runs no compile
    assert saved.path is None and saved.how.startswith("optimize again") and "replay" in saved.how
    assert not (tmp_path / "b").exists()
    ok = bs.save_ours(plain, plain, s, tmp_path / "b", write=lambda *a: None)
    assert ok.path == tmp_path / "b" and ok.how == "bundle" and ok.seconds >= 0


def test_the_bundle_of_ours_loads_back_what_optimize_kept(tmp_path, monkeypatch):
    """_write_bundle on a model run under torch.compile with one of its two kernels (stand-ins on the
    CPU, tests/test_bundle.py's way): the bundle records that run with the declared sizes and that
    kernel alone, and load() puts the same kernel back on a fresh copy, computing the same."""
    from torch_htam import bundle, inductor, runtime
    from torch_htam.cache import KernelCache
    from torch_htam.capture import marked
    from torch_htam.extract import extract
    from test_bundle import _ev
    from test_runtime import MLP, CpuKernel, PROVIDER
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HTAM_ARCH", "sm_fake")
    torch.manual_seed(0)
    torch._dynamo.reset()
    original, x, dynamic = MLP().eval(), torch.randn(4, 8, 32), {0: {0: (1, 16)}}
    found = extract(original, (x,), dynamic=dynamic)
    cache = KernelCache("sm_fake")                       # the default cache, as optimize fills it
    for t in found.tasks:
        so = tmp_path / f"{t.signature}.so"
        so.write_bytes(b"\x7fELF fake library for " + t.signature.encode() * 50)
        ev = _ev()
        ev.buckets = [[0, 0, 2, 8], [0, 0, 9, 16]]
        cache.put(t, f"// kernel for {t.name}\n", so, ev, {"proposer": "expert"})
    stand_ins = {t.signature: CpuKernel(t) for t in found.tasks}
    provider = runtime.Provider(PROVIDER.op, lambda entry: stand_ins[entry.signature])
    kept = found.tasks[0].signature
    ours = inductor.install(copy.deepcopy(original), found, {kept: cache.get(kept)}, provider=provider)
    with torch.inference_mode():
        ours(*marked((x,), found.capture.dynamic))       # compiled dynamic, as optimize's: the kernel in
        bs._write_bundle(ours, original, (x,), dynamic, tmp_path / "b")
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert man["run"] == {"compile": True, "mode": "default", "reexport": False, "dynamic": {"0": {"0": [1, 16]}},
                          "at_example": None, "by_bucket": None,   # ours (no decision here) serves every size itself
                          "at_example_kernels": False, "bucket_arms": [], "upto": None}
    assert {t["signature"] for t in man["tasks"] if t["kernel"]} == {kept} and len(man["tasks"]) == len(found.tasks)
    assert "forward" not in original.__dict__ and "_htam_backend" not in original.__dict__   # left as it was
    torch._dynamo.reset()
    y = torch.randn(11, 8, 32)                           # made outside inference mode, as the row's inputs
    with torch.inference_mode():
        torch.manual_seed(0)                             # the same weights, as serve_models builds them
        fresh = bundle.load(MLP().eval(), tmp_path / "b", (x,), provider=provider, arch="sm_fake")
        before = stand_ins[kept].calls
        assert torch.allclose(fresh(y), original(y), atol=1e-5)
        assert stand_ins[kept].calls == before + 1       # a new size, served by the kernel in the one graph
    inductor.sync_report(fresh)
    assert [t.signature for t in fresh.htam_report.tasks if t.status == "swapped"] == [kept]
    torch._dynamo.reset()


@pytest.mark.build
def test_a_real_cold_child_on_cpu(tmp_path):
    """The child process as step 6 starts it (this script, --cold-arm), with torch.compile on the CPU
    (Inductor's C++ code: several seconds)."""
    opts = _opts("--seed", "5")
    run = bs.run_cold_arm("encoder:fp32", opts, "compile_dynamic", 300, None)
    assert run.error is None, run
    assert run.calls.sizes == bs.request_mix(1, 8, 4, 12, seed=5).sizes and all(ms > 0 for ms in run.calls.ms)
    assert run.info["built"] == "torch.compile(dynamic=True)" and run.info["warmup_graphs"] >= 1


@pytest.mark.parametrize("name, without", [("vision:bf16", []), ("decoder:bf16", []),
                                           ("encoder:bf16", ["attention_scaled_dot_product_attention"])])
def test_the_served_models_ranged_tasks_have_static_twins(name, without):
    """Each ranged task of a served model (small config) has its static twin among the tasks of
    the graph specialized to the example's sizes (extract.static_twin), so its kernel can serve
    the example's sizes there too; the encoder's attention does not (its region differs there)."""
    from torch_htam.extract import extract, static_twin
    model, example, dynamic, _ = sm.make(name, small=True, device="cpu")
    torch._dynamo.reset()
    with torch.inference_mode():
        static = {t.signature for t in extract(model, example).tasks}
        torch._dynamo.reset()
        ranged = [t for t in extract(model, example, dynamic=dynamic).tasks if static_twin(t) is not None]
    assert ranged and sorted(t.name for t in ranged if static_twin(t) not in static) == without
    torch._dynamo.reset()


def test_routes_count_the_mix_by_the_graph_ours_runs():
    """bench_serve.routes: the mix's requests by the graph ours' splits send them to."""
    from torch_htam.serving import BucketSplit, Route
    mix = bs.request_mix(1, 16, 4, 50, seed=0)
    s = bs.Setup({}, (torch.randn(4, 3),), {0: {0: (1, 16)}}, lambda n: (torch.randn(n, 3),), mix)
    model = nn.Identity()
    model._compiled_call_impl = BucketSplit(model, model, (0, 0), frozenset(range(9, 17)))
    big = sum(n >= 9 for n in mix.sizes)
    assert 0 < big < len(mix.sizes)
    assert bs.routes(model, s) == {Route.KERNELS.value: big, Route.BASE.value: len(mix.sizes) - big}
    assert bs.routes(nn.Identity(), s) == {Route.CHOSEN.value: len(mix.sizes)}


def test_launcher_counts_sum_our_kernels_less_the_start(monkeypatch):
    from torch_htam import launcher
    per = {1: {"graphs": 2, "plain": 5, "replays": 10, "replay_ns": 900},
           2: {"graphs": 1, "plain": 1, "replays": 4, "replay_ns": 100}}
    monkeypatch.setattr(launcher, "graph_launches", lambda: per)
    start = {"kernels": 2, "graphs": 1, "plain": 2, "replays": 3, "replay_ns": 500}
    assert bs.launcher_counts("graph_launches", since=start) == {"kernels": 2, "graphs": 3, "plain": 4,
                                                                 "replays": 11, "replay_ns": 500}
    monkeypatch.setattr(launcher, "graph_launches", lambda: {})
    assert bs.launcher_counts("graph_launches") == {"kernels": 0}
    monkeypatch.setattr(launcher, "host_times", lambda: {1: {"launches": 9, "launch_ns": 900, "runs": 9, "run_ns": 600}})
    assert bs.launcher_counts("host_times", since={"launches": 4, "launch_ns": 400, "runs": 4, "run_ns": 250}) == {
        "kernels": 1, "launches": 5, "launch_ns": 500, "runs": 5, "run_ns": 350}
    monkeypatch.delattr(launcher, "host_times")
    assert bs.launcher_counts("host_times") is None          # a torch_htam whose launcher keeps none


def test_the_graph_launch_ab_arm_switches_them_on_around_each_call_and_compares(monkeypatch):
    from torch_htam import launcher
    setting, seen = [False], []

    def switch(on):
        last, setting[0] = setting[0], on
        return last
    monkeypatch.setattr(launcher, "set_graph_launches", switch)
    graphed = bs.with_graph_launches(lambda x: seen.append(setting[0]) or x + 1)
    assert graphed(1) == 2 and seen == [True] and setting == [False]   # on during the call only
    with pytest.raises(ZeroDivisionError):
        bs.with_graph_launches(lambda: 1 / 0)()
    assert setting == [False]                                           # back off after a failure too

    warm = _pass([2.0] * 100, [1.0] * 100, [1.0] * 99 + [4.0])
    warm["ours_graphs"] = _calls([2.0] * 100)
    warm["ours_graphs"].deltas["graphs"] = [0] * 100
    out = bs.pass_fields({"warm": warm})
    assert out["graph_launches_ab"]["throughput"] == pytest.approx(103 / 200)
    assert out["graph_launches_ab"]["p99"] == pytest.approx(bs.percentile([1.0] * 99 + [4.0], 0.99) / 2.0)
    assert "ours_graphs" in out["arms"]
    without = bs.pass_fields({"warm": _pass([2.0] * 4, [1.0] * 4, [1.0] * 4)})
    assert "graph_launches_ab" not in without and "ours_graphs" not in without["arms"]
