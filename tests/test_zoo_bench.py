"""bench/bench_zoo.py on the CPU: one small zoo row measured with stand-in optimize and compile
functions (every field present, the ratios from the timings given, kernels kept from the report),
a failing optimize recorded as the row's error while the other arms are measured, the summary's
geomeans, a crashed row process, and main() writing the results file after each row. No GPU, no
optimize()."""
import enum
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from test_floor_bench import _load, bf   # a bench/ script as a module (bench/ is no package)

ROOT = Path(__file__).resolve().parents[1]

bz = _load("bench_zoo", ROOT / "bench" / "bench_zoo.py")
from torch_htam.report import Report, TaskReport, TaskStatus  # noqa: E402

ROW = "gpt2:fp32"          # the cheapest small zoo row on the CPU
FIELDS = bz.REQUIRED + ("vs_compile_b2b", "vs_compile_ro_b2b", "vs_max_autotune_b2b", "ours_ro_optimize_s",
                        "ours_ro_kernels_kept", "outcome", "ours_ro_outcome", "report_note", "tf32",
                        "decision_reason") + tuple(f"{a}_max_abs_err" for a in bz.ARMS) + tuple(
                            f"{a}_ms_{w}" for a in bz.ARMS for w in ("latency", "throughput"))
# the timings the stand-in timer gives: arm -> (latency ms, back-to-back ms)
MS = {"eager": (8.0, 6.0), "compile": (4.0, 3.0), "compile_ro": (3.0, 2.0), "compile_ma": (3.6, 2.7),
      "ours": (2.0, 2.0), "ours_ro": (2.0, 1.0)}


def _opts(*extra):
    return bz.parse(["--device", "cpu", "--small", "--rounds", "1", "--calls", "1", "--warmup", "1", *extra])


class Outcome(enum.Enum):
    KERNELS = "kernels"


class Decision:
    reason = "2 of 3 kernels: 1.4 ms against 1.6 ms"
    outcome = Outcome.KERNELS


def _report(kept: int, mode: str) -> Report:
    """kept tasks READY: the stand-in's first call marks them SWAPPED (as Dynamo's compile does)."""
    # t0 beats Inductor's code for its region (1.3x), the others do not; 2 calls of 0.5 ms each
    tasks = [TaskReport(f"t{i}", f"sig{i}", 2, 1.8, status=TaskStatus.READY, vs_inductor=1.3 if i == 0 else 0.9,
                        kind="attention" if i == 0 else "gemm", ref_ms=0.5) for i in range(kept)]
    tasks.append(TaskReport("other", "sigx", status=TaskStatus.NOT_USED, kind="conv"))
    return Report(note=f"kept {kept} ({mode})", tasks=tasks, swapped=kept, outcome=Outcome.KERNELS,
                  decision=Decision())


def _stand_ins(calls, fail_mode=None):
    def optimize(model, inputs, budget, mode):
        # under the grad mode, on inputs made as requests are (inference tensors: no other guard)
        calls.append(("optimize", budget, mode, torch.is_inference_mode_enabled()
                      and all(x.is_inference() for x in inputs if isinstance(x, torch.Tensor))))
        if mode == fail_mode:
            raise ValueError(f"no kernels in {mode}")
        report = model.htam_report = _report(2 if mode == "default" else 1, mode)

        def swap_in(module, args):
            for t in report.tasks:
                if t.status is TaskStatus.READY:
                    t.status = TaskStatus.SWAPPED

        model.register_forward_pre_hook(swap_in)
        return model

    def compile_fn(model, mode):
        calls.append(("compile", mode))
        return model

    def time_fn(arms, sync, rounds, calls_):
        real = bf.time_interleaved(arms, sync, rounds, calls_)   # the real timer runs every arm
        assert set(real) == set(arms)
        return {a: {"latency_ms": MS[a][0], "throughput_ms": MS[a][1], "latency_round_ms": [MS[a][0]],
                    "throughput_round_ms": [MS[a][1]]} for a in arms}

    return optimize, compile_fn, time_fn


def test_row_fields_ratios_and_kernels_kept():
    calls, stages = [], []
    optimize, compile_fn, time_fn = _stand_ins(calls)
    at_ma = []
    row = bz.measure(ROW, _opts("--budget", "7"), device="cpu", optimize=optimize, compile_fn=compile_fn,
                     time_fn=time_fn, progress=lambda r: stages.append(r["stage"]) or (
                         r["stage"] == "warm compile_ma" and at_ma.append(dict(r))))
    assert "error" not in row and row["stage"] == "done", row.get("error")
    assert set(FIELDS) <= set(row)
    # every copy before any optimize; ours in the default mode first, then reduce-overhead
    assert calls == [("compile", "default"), ("compile", "reduce-overhead"), ("compile", "max-autotune"),
                     ("optimize", 7.0, "default", True), ("optimize", 7.0, "reduce-overhead", True)]
    # max-autotune's compile (minutes) comes after the others are checked and timed, so a row cut
    # off there still has their figures; then every arm is timed again beside it
    assert stages == ["build", "optimize", "optimize", "warm ours", "warm ours_ro", "warm eager", "warm compile",
                      "warm compile_ro", "check", "time", "warm compile_ma", "check", "time"]
    assert at_ma[0]["vs_compile"] == pytest.approx(2.0) and at_ma[0]["vs_max_autotune"] is None
    assert at_ma[0]["ours_correct"] is True and at_ma[0]["compile_ma_correct"] is None
    assert row["vs_compile"] == pytest.approx(2.0)            # compile 4 ms / ours 2 ms
    assert row["vs_compile_ro"] == pytest.approx(1.5)         # compile_ro 3 / ours_ro 2
    assert row["vs_max_autotune"] == pytest.approx(1.8)       # compile_ma 3.6 / ours 2
    assert row["vs_max_autotune_ro"] == pytest.approx(1.8)    # compile_ma 3.6 / ours_ro 2
    assert row["vs_compile_b2b"] == pytest.approx(1.5)
    assert row["vs_compile_ro_b2b"] == pytest.approx(2.0)
    assert row["vs_max_autotune_b2b"] == pytest.approx(1.35)
    assert row["vs_eager"] == pytest.approx(4.0)
    assert row["vs_compile_latency"] == row["vs_compile"] and row["floor_ok"] is True
    assert row["ours_ms_latency"] == 2.0 and row["compile_ro_ms_throughput"] == 2.0
    assert row["kernels_kept"] == 2 and row["ours_ro_kernels_kept"] == 1     # read after the first calls
    assert row["task_status"] == {"swapped": 2, "not used": 1}
    assert row["outcome"] == "kernels" and row["report_note"] == "kept 2 (default)"
    assert row["ours_ro_report_note"] == "kept 1 (reduce-overhead)"
    assert row["decision_reason"] == Decision.reason
    # the per-region records: 2 calls x 0.5 ms of an 8 ms eager model is 12.5% of its time
    t0 = row["regions"][0]
    assert (t0["task"], t0["kind"], t0["status"], t0["vs_inductor"]) == ("t0", "attention", "swapped", 1.3)
    assert t0["share_of_eager"] == pytest.approx(2 * 0.5 / MS["eager"][0])
    assert row["regions"][-1]["share_of_eager"] is None                       # never timed alone
    beat = bz.beat_inductor([row])
    assert list(beat) == ["attention"] and [(b["arm"], b["task"]) for b in beat["attention"]] == [
        ("ours", "t0"), ("ours_ro", "t0")]
    assert row["optimize_s"] >= 0 and row["ours_ro_optimize_s"] >= 0 and row["within_budget"] is True
    assert row["tf32"] is True and row["dtype"] == "fp32"
    assert all(row[f"{a}_max_abs_err"] == 0.0 and row[f"{a}_correct"] is True for a in bz.ARMS)
    assert set(row["first_call_s"]) == set(bz.ARMS)
    json.loads(json.dumps(row))                                # JSON as it is


def test_skipped_compile_arm_and_ours_reports_before_the_compile_arms_warm():
    calls, seen = [], []
    optimize, compile_fn, time_fn = _stand_ins(calls)
    row = bz.measure(ROW, _opts("--skip", "compile_ma"), device="cpu", optimize=optimize, compile_fn=compile_fn,
                     time_fn=time_fn, progress=lambda r: seen.append((r["stage"], r["kernels_kept"])))
    assert ("compile", "max-autotune") not in calls and row["skipped_arms"] == ["compile_ma"]
    assert row["vs_max_autotune"] is None and row["vs_compile"] == pytest.approx(2.0)
    assert "compile_ma" not in row["first_call_s"]
    # a row cut off while a compile arm warms already holds what ours kept
    assert ("warm compile", 2) in seen
    with pytest.raises(SystemExit):
        bz.parse(["--skip", "ours"])


def test_a_default_mode_run_leaves_the_reduce_overhead_arms_out():
    """--modes default: one optimize (default mode), no reduce-overhead arm compiled or timed, the
    row saying which modes it ran."""
    calls = []
    optimize, compile_fn, time_fn = _stand_ins(calls)
    row = bz.measure(ROW, _opts("--budget", "7", "--modes", "default"), device="cpu", optimize=optimize,
                     compile_fn=compile_fn, time_fn=time_fn)
    assert "error" not in row, row.get("error")
    assert calls == [("compile", "default"), ("compile", "max-autotune"), ("optimize", 7.0, "default", True)]
    assert row["modes"] == ["default"] and "compile_ro" in row["skipped_arms"]
    assert row["vs_compile"] == pytest.approx(2.0) and row["vs_compile_ro"] is None
    assert row["ours_ro_optimize_s"] is None and "ours_ro" not in row["first_call_s"]
    for bad in ("", "eager", "default,max-autotune"):
        with pytest.raises(SystemExit):
            bz.parse(["--modes", bad])


def test_failing_optimize_is_the_rows_error_and_the_rest_is_measured():
    calls = []
    optimize, compile_fn, time_fn = _stand_ins(calls, fail_mode="reduce-overhead")
    row = bz.measure(ROW, _opts(), device="cpu", optimize=optimize, compile_fn=compile_fn, time_fn=time_fn)
    assert row["error"] == "ours_ro: ValueError: no kernels in reduce-overhead"
    assert row["ours_ro_error"] == "ValueError: no kernels in reduce-overhead" and row["stage"] == "done"
    assert row["vs_compile"] == pytest.approx(2.0) and row["vs_compile_ro"] is None
    assert row["ours_ro_ms_latency"] is None and row["ours_ro_kernels_kept"] is None
    assert row["ours_ro_optimize_s"] is None and row["ours_ro_failed_after_s"] >= 0
    assert row["kernels_kept"] == 2
    json.dumps(row)
    # a failure outside any arm (the model cannot be built) ends the row

    def broken_compile(model, mode):
        raise RuntimeError("inductor down")

    row = bz.measure(ROW, _opts(), device="cpu", optimize=optimize, compile_fn=broken_compile, time_fn=time_fn)
    assert row["error"] == "RuntimeError: inductor down" and row["stage"] == "build"
    assert set(bz.REQUIRED) <= set(row) and row["vs_compile"] is None


def test_summary_geomeans_minimums_kept_and_slow_rows():
    rows = [dict(bz.empty_row("a:fp32"), vs_compile=2.0, vs_compile_ro=1.0, vs_max_autotune=0.5,
                 vs_compile_b2b=1.0, kernels_kept=1, optimize_s=100.0),
            dict(bz.empty_row("b:bf16"), vs_compile=0.5, vs_compile_ro=4.0, vs_max_autotune=2.0,
                 kernels_kept=0, ours_ro_kernels_kept=0, optimize_s=30.0, ours_ro_optimize_s=700.0),
            dict(bz.empty_row("c:bf16"), error="timed out", optimize_s_at_least=650.0)]
    s = bz.summarize(rows)
    assert s["rows"] == 3 and s["errors"] == 1
    assert s["geomean_vs_compile"] == pytest.approx(1.0) and s["min_vs_compile"] == 0.5
    assert s["geomean_vs_compile_ro"] == pytest.approx(2.0) and s["min_vs_compile_ro"] == 1.0
    assert s["geomean_vs_max_autotune"] == pytest.approx(1.0) and s["n_vs_max_autotune"] == 2
    assert s["geomean_vs_compile_b2b"] == pytest.approx(1.0) and s["n_vs_compile_b2b"] == 1
    assert s["geomean_vs_compile_ro_b2b"] is None and s["min_vs_compile_ro_b2b"] is None
    assert s["kernels_kept_rows"] == ["a:fp32"]
    assert s["over_600_s"] == ["b:bf16", "c:bf16"] and s["max_optimize_s"] == 700.0
    json.dumps(s)
    assert "vs compile 1.000x (0.500)" in bz.format_table(rows, s)


def test_crashed_child_row_keeps_the_zoo_schema(tmp_path):
    path = tmp_path / "child.py"
    path.write_text("import sys; sys.exit(3)")
    row = bz.run_child(ROW, _opts(), 20, command=lambda name, opts, row_out: [sys.executable, str(path)])
    assert row["error"] == "the row's process exited with status 3" and set(FIELDS) <= set(row)
    cmd = bz.child_command(ROW, _opts("--budget", "9"), tmp_path / "row.json")
    assert cmd[2:4] == ["--one", ROW] and "--small" in cmd and cmd[cmd.index("--budget") + 1] == "9.0"


def test_main_writes_results_after_each_row(tmp_path, monkeypatch, capsys):
    seen = []

    def fake_child(name, opts, timeout, lane=None):
        seen.append((name, timeout, len(list(tmp_path.glob("zoo-*.json")))))
        if name == "vit:bf16":
            raise RuntimeError("no row process")
        return dict(bz.empty_row(name, opts.budget), vs_compile=1.25, kernels_kept=3, optimize_s=40.0, stage="done")

    monkeypatch.setattr(bz, "run_child", fake_child)
    assert bz.main([ROW, "vit:bf16", "--budget", "10", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert seen == [(ROW, 682.0, 0), ("vit:bf16", 682.0, 1)]            # 2 x (1.1 x 10 + 30) + 600; one file
    (path,) = tmp_path.glob("zoo-*.json")
    data = json.loads(path.read_text())
    assert data["suite"] == "zoo" and data["budget_s"] == 10.0
    assert [r["model"] for r in data["rows"]] == [ROW, "vit:bf16"]
    for r in data["rows"]:
        assert set(bz.REQUIRED) <= set(r)
    assert data["rows"][1]["error"] == "RuntimeError: no row process"
    assert data["summary"]["geomean_vs_compile"] == 1.25 and data["summary"]["kernels_kept_rows"] == [ROW]
    assert "kernels kept in: gpt2:fp32" in capsys.readouterr().out


def test_split_modes_runs_each_rows_modes_as_rows_of_their_own(tmp_path, monkeypatch):
    seen = []

    def fake_child(name, opts, timeout, lane=None):
        seen.append((name, opts.modes))
        if opts.modes == ("reduce-overhead",) and name == "vit:bf16":
            raise RuntimeError("no row process")
        return dict(bz.empty_row(name, opts.budget), modes=list(opts.modes), stage="done")

    monkeypatch.setattr(bz, "run_child", fake_child)
    assert bz.main([ROW, "vit:bf16", "--split-modes", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert seen == [(ROW, ("default",)), (ROW, ("reduce-overhead",)),
                    ("vit:bf16", ("default",)), ("vit:bf16", ("reduce-overhead",))]
    (path,) = tmp_path.glob("zoo-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [r["model"] for r in rows] == [ROW, ROW, "vit:bf16", "vit:bf16"]
    assert [r.get("modes") for r in rows[:3]] == [["default"], ["reduce-overhead"], ["default"]]
    assert rows[3]["error"] == "RuntimeError: no row process"


def test_list_and_unknown_rows(capsys):
    assert bz.main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert names == list(bz.model_zoo.ROWS)
    with pytest.raises(SystemExit):
        bz.parse(["no_such_model:fp32"])
    assert math.isclose(bz.default_timeout(120.0), 2 * 162.0 + 600.0)


def test_an_ours_arm_is_as_close_as_compile_only_where_compile_is_off_by_as_much():
    row = {"ours_correct": False, "ours_max_abs_err": 0.039, "compile_correct": False, "compile_max_abs_err": 0.035,
           "ours_ro_correct": False, "ours_ro_max_abs_err": 0.06, "compile_ro_correct": False,
           "compile_ro_max_abs_err": 0.035}
    assert bz.close_as_compile(row) == {"ours_close_as_compile": True, "ours_ro_close_as_compile": False}
    row.update(compile_correct=True, compile_max_abs_err=0.01)        # torch.compile within the tolerance
    assert bz.close_as_compile(row)["ours_close_as_compile"] is False
    row.update(ours_correct=True)
    assert bz.close_as_compile(row)["ours_close_as_compile"] is True
    assert bz.close_as_compile({"ours_correct": False})["ours_close_as_compile"] is None


def test_the_low_ratios_read_each_arms_lower_rounds_so_a_slow_round_does_not_count():
    """Median and 20th-percentile-round ratios from the same rounds: ours lost 6 of 10 rounds to a
    busy host; its median moves, its low round does not."""
    rounds = {"compile": [2.0] * 10, "ours": [2.0] * 4 + [4.0] * 6}
    times = {a: {"latency_ms": sorted(r)[len(r) // 2], "throughput_ms": sorted(r)[len(r) // 2],
                 "latency_round_ms": r, "throughput_round_ms": r} for a, r in rounds.items()}
    out = bz.ratio_fields(times)
    assert out["vs_compile"] == pytest.approx(0.5) and out["vs_compile_low"] == pytest.approx(1.0)
    assert out["vs_compile_low_b2b"] == pytest.approx(1.0) and out["vs_compile_ro_low"] is None


def test_results_md_shows_each_models_latest_zoo_row_with_the_zoo_figures(tmp_path):
    render = _load("bench_render", ROOT / "bench" / "render.py")

    def region(kind, status, vs_inductor):
        return {"task": f"{kind}_t", "kind": kind, "count": 2, "status": status, "vs_inductor": vs_inductor,
                "share_of_eager": 0.25}

    def run(stamp, rows):
        data = {"suite": "zoo", "date": f"2026-01-0{stamp}T00:00:00", "commit": f"c{stamp}", "device": "H100",
                "command": f"python3 bench/bench_zoo.py run{stamp}", "rows": rows}
        (tmp_path / f"zoo-2026010{stamp}-000000.json").write_text(json.dumps(data))

    old_a = dict(bz.empty_row("a:bf16"), vs_compile=0.5, kernels_kept=1)
    run(1, [old_a, dict(bz.empty_row("b:bf16"), vs_compile=2.0, vs_compile_ro=1.21, ours_ro_kernels_kept=2,
                        outcome="torch.compile", ours_ro_outcome="kernels",
                        ours_ro_regions=[region("attention", "swapped", 3.0), region("gemm", "not used", 1.5)])])
    run(2, [dict(bz.empty_row("a:bf16"), vs_compile=1.125, kernels_kept=0, ours_ro_kernels_kept=0,
                 outcome="C++ wrapper", regions=[region("conv", "swapped", 0.9)])])
    text = render.render(tmp_path, findings=None)
    assert "## zoo: the latest row of each model and dtype" in text
    assert "| a:bf16 | 1.125x |" in text and "0.500x" not in text         # run 2's row replaces run 1's
    assert "| models keeping a kernel (either mode) | 1: b |" in text
    assert "| vs_compile: geomean (min) over rows | 1.500x (1.125x) over 2 |" in text
    assert "| vs_max_autotune: geomean (min) over rows | not measured |" in text
    assert "| what ran ours (default), rows | C++ wrapper: 1, torch.compile: 1 |" in text
    assert "| what ran ours (reduce-overhead), rows | kernels: 1 |" in text
    # only a kernel that ran and beat Inductor's code is a family's win
    assert "| attention | b:bf16 | ours_ro | attention_t | 3.00x | 25% |" in text
    assert "gemm_t" not in text and "conv_t" not in text


def test_a_default_mode_row_keeps_the_models_previous_reduce_overhead_figures(tmp_path):
    """In RESULTS.md a --modes default row shows its own default-mode figures and the model's
    previous reduce-overhead ones, naming both runs; a row of both modes replaces the previous."""
    render = _load("bench_render", ROOT / "bench" / "render.py")

    def run(stamp, rows):
        data = {"suite": "zoo", "date": f"2026-01-0{stamp}T00:00:00", "commit": f"c{stamp}", "device": "H100",
                "command": f"python3 bench/bench_zoo.py run{stamp}", "rows": rows}
        (tmp_path / f"zoo-2026010{stamp}-000000.json").write_text(json.dumps(data))

    run(1, [dict(bz.empty_row("a:bf16"), vs_compile=0.5, vs_compile_ro=1.25, ours_ro_kernels_kept=3),
            dict(bz.empty_row("b:bf16"), vs_compile=0.75, vs_compile_ro=1.5)])
    run(2, [dict(bz.empty_row("a:bf16"), vs_compile=1.5, modes=["default"]),
            dict(bz.empty_row("b:bf16"), vs_compile=1.0)])
    text = render.render(tmp_path, findings=None)
    row_a = next(line for line in text.splitlines() if line.startswith("| a:bf16 |"))
    row_b = next(line for line in text.splitlines() if line.startswith("| b:bf16 |"))
    assert "| 1.500x |" in row_a and "| 1.250x |" in row_a and row_a.endswith("| 2+1 |")
    assert "| 1.000x |" in row_b and "1.500x" not in row_b and row_b.endswith("| 2 |")


def test_a_reduce_overhead_mode_run_times_that_modes_arms_alone():
    """--modes reduce-overhead: one optimize (reduce-overhead), no default-mode arm of ours or of
    torch.compile; eager and max-autotune still run."""
    calls = []
    optimize, compile_fn, time_fn = _stand_ins(calls)
    row = bz.measure(ROW, _opts("--budget", "7", "--modes", "reduce-overhead"), device="cpu",
                     optimize=optimize, compile_fn=compile_fn, time_fn=time_fn)
    assert "error" not in row, row.get("error")
    assert [c for c in calls if c[0] == "optimize"] == [("optimize", 7.0, "reduce-overhead", True)]
    assert ("compile", "default") not in calls and ("compile", "reduce-overhead") in calls
    assert row["modes"] == ["reduce-overhead"] and "compile" in row["skipped_arms"]
    assert row["vs_compile"] is None and row["vs_compile_ro"] is not None
    assert row["optimize_s"] is None and row["ours_ro_optimize_s"] is not None
    assert row["correct"] is row["ours_ro_correct"] is True


def test_a_reduce_overhead_mode_row_keeps_the_models_previous_default_figures(tmp_path):
    """In RESULTS.md a --modes reduce-overhead row shows the model's previous default-mode
    figures beside its own reduce-overhead ones, naming both runs, default's first."""
    render = _load("bench_render", ROOT / "bench" / "render.py")

    def run(stamp, rows):
        data = {"suite": "zoo", "date": f"2026-01-0{stamp}T00:00:00", "commit": f"c{stamp}", "device": "H100",
                "command": f"python3 bench/bench_zoo.py run{stamp}", "rows": rows}
        (tmp_path / f"zoo-2026010{stamp}-000000.json").write_text(json.dumps(data))

    run(1, [dict(bz.empty_row("a:bf16"), vs_compile=1.5, kernels_kept=2, vs_compile_ro=0.75, modes=["default"])])
    run(2, [dict(bz.empty_row("a:bf16"), vs_compile_ro=1.25, ours_ro_kernels_kept=3, modes=["reduce-overhead"])])
    text = render.render(tmp_path, findings=None)
    row_a = next(line for line in text.splitlines() if line.startswith("| a:bf16 |"))
    assert "| 1.500x |" in row_a and "| 1.250x |" in row_a and "0.750x" not in row_a
    assert row_a.endswith("| 1+2 |")
    assert "| vs_compile_ro: geomean (min) over rows | 1.250x (1.250x) over 1 |" in text


def test_a_row_without_max_autotune_keeps_the_models_previous_max_autotune_figures(tmp_path):
    """In RESULTS.md a row run with --skip compile_ma shows the model's previous max-autotune
    ratios (each measured within its own run) and names that run; its own figures stay its own."""
    render = _load("bench_render", ROOT / "bench" / "render.py")

    def run(stamp, rows):
        data = {"suite": "zoo", "date": f"2026-01-0{stamp}T00:00:00", "commit": f"c{stamp}", "device": "H100",
                "command": f"python3 bench/bench_zoo.py run{stamp}", "rows": rows}
        (tmp_path / f"zoo-2026010{stamp}-000000.json").write_text(json.dumps(data))

    run(1, [dict(bz.empty_row("a:bf16"), vs_compile=0.5, vs_max_autotune=0.75)])
    run(2, [dict(bz.empty_row("a:bf16"), vs_compile=1.5, skipped_arms=["compile_ma"])])
    text = render.render(tmp_path, findings=None)
    row_a = next(line for line in text.splitlines() if line.startswith("| a:bf16 |"))
    assert "| 1.500x |" in row_a and "| 0.750x |" in row_a and "0.500x" not in row_a
    assert row_a.endswith("| 2, ma 1 |")
    assert "| vs_max_autotune: geomean (min) over rows | 0.750x (0.750x) over 1 |" in text
