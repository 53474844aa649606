"""bench/render.py and bench/record.py: RESULTS.md generated from bench/results/*.json (on temp
folders: nothing here writes into the repository)."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


render = _load("render")
record = _load("record")


def _run(folder: Path, name: str, suite: str, date: str, rows: list, **extra) -> Path:
    data = {"suite": suite, "date": date, "commit": "abc1234", "device": "NVIDIA H100 80GB HBM3",
            "torch": "2.14.1", "command": f"python3 bench/{suite}.py", "rows": rows, **extra}
    path = folder / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def runs(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    # the older run's file name sorts last: the date decides, not the name
    _run(d, "kernelbench-zzz.json", "kernelbench", "2027-01-01T10:00:00+00:00",
         [{"name": "old_task", "kind": "rowwise", "ours_ms": 9.0, "correct": True}])
    _run(d, "kernelbench-aaa.json", "kernelbench", "2027-01-02T10:00:00+00:00",
         [{"name": "softmax", "kind": "rowwise", "dtype": "bf16", "eager_ms": 0.05, "ours_ms": 0.025,
           "vs_eager": 2.0, "roofline": 0.8, "correct": True, "stop": "steps", "candidates": 8,
           "search_s": 12.0, "error": None},
          {"name": "conv", "kind": "conv", "correct": False, "error": "export: boom | bad"}],
         summary={"tasks": 2, "geomean_eager": 1.41421356})
    _run(d, "mystery-1.json", "mystery", "2027-01-01T00:00:00+00:00",
         [{"a": 1, "b": "x", "nested": {"no": 1}}, {"a": 2.5, "c": True}])
    return d


def test_render_takes_the_latest_run_per_suite_and_writes_its_table(runs, tmp_path):
    """The latest run per suite; for kernelbench (MERGED) the latest row of each task, naming its run."""
    findings = tmp_path / "findings.md"
    findings.write_text("## Findings\n\nsoftmax is at 80% of the roof.\n")
    text = render.render(runs, findings)
    assert text.splitlines()[0].startswith("<!-- GENERATED") and "do not edit by hand" in text.splitlines()[0]
    kb = text[text.index("## kernelbench"):text.index("## mystery")]
    # both runs listed oldest first (the date decides, not the name); each task's latest row
    assert kb.index("kernelbench-zzz.json") < kb.index("kernelbench-aaa.json")
    assert "`python3 bench/kernelbench.py`" in kb and "commit abc1234" in kb
    assert "| old_task | rowwise |" in kb and kb.count("| softmax |") == 1
    assert "| task | kind | dtype | eager ms |" in text
    # columns no row has (compile ms, compile s) are left out; a missing value is "-"
    assert "| softmax | rowwise | bf16 | 0.05 | 0.025 | 2.00x |" in text
    old = next(line for line in kb.splitlines() if line.startswith("| old_task |"))
    assert "| 9 |" in old and old.endswith("| 1 |")      # its ours ms, from run 1
    assert "| conv | conv | - | - | - | - |" in text
    assert "| 80% |" in text and "| y | steps | 8 | 12 |" in text
    assert "export: boom \\| bad" in text                  # a cell's pipe does not split the table
    # an unknown suite: its rows' scalar fields, first-seen order; nested values left out
    assert "## mystery" in text and "| a | b | c |" in text and "| 2.5 | - | y |" in text
    assert "nested" not in text
    assert text.index("## kernelbench") < text.index("## mystery") < text.index("softmax is at 80%")


def test_no_runs_says_so(tmp_path):
    text = render.render(tmp_path, None)
    assert "No runs are recorded" in text and "docs/RESULTS_LOG.md" in text


def test_check_fails_on_a_stale_file_and_passes_on_a_fresh_one(runs, tmp_path, capsys):
    out, findings = tmp_path / "RESULTS.md", tmp_path / "findings.md"
    args = ["--results", str(runs), "--findings", str(findings), "--out", str(out)]
    assert render.main(args + ["--check"]) == 1                  # missing
    assert "out of date: run python3 bench/render.py" in capsys.readouterr().err
    assert render.main(args) == 0
    assert render.main(args + ["--check"]) == 0
    _run(runs, "kernelbench-new.json", "kernelbench", "2027-02-01T00:00:00+00:00", [{"name": "new"}])
    assert render.main(args + ["--check"]) == 1                  # a newer run
    assert render.main(args) == 0 and "| new |" in out.read_text()
    out.write_text(out.read_text() + "hand edit\n")
    assert render.main(args + ["--check"]) == 1


def test_the_sweep_table_is_derived_per_task():
    data = {"tasks": [{"task": "t", "kind": "rowwise", "policy": "bf16", "settings": 3, "seconds": 2.0, "rows": [
        {"params": {"vec": 8, "packed": False}, "default": True, "kernel_ms": 0.04, "speedup": 0.75, "bw": 0.5},
        {"params": {"vec": 8, "packed": True}, "default": False, "kernel_ms": 0.02, "speedup": 1.5, "bw": 0.9},
        {"params": {"vec": 4, "packed": False}, "default": False, "kernel_ms": None}]}]}
    (row,) = render.ROWS["sweep"](data)
    assert row["best"] == "packed=True" and row["defaults_rank"] == 2 and row["verified"] == 2
    assert row["best_ms"] == 0.02 and row["defaults_ms"] == 0.04
    assert "| t | rowwise | bf16 | 2 | 3 | 2 | packed=True | 0.0200 | 0.0400 | 1.50x | 90% | 2 |" in \
        "\n".join(render.table([row], render.COLUMNS["sweep"]))


def test_record_write_puts_provenance_and_the_raw_payload(tmp_path, monkeypatch):
    monkeypatch.setenv("HTAM_COMMIT", "deadbee")
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "sweep.py"), "--top", "3"])
    p1 = record.write("sweep", {"rows": [{"ms": 0.0123456789}], "where": Path("/x")}, tmp_path)
    p2 = record.write("sweep", {"rows": []}, tmp_path)
    assert p1 != p2 and p1.name.startswith("sweep-") and p1.suffix == ".json"
    data = json.loads(p1.read_text())
    assert data["suite"] == "sweep" and data["commit"] == "deadbee" and data["device"]
    assert data["date"].endswith("+00:00") and data["torch"]
    assert data["command"] == "python3 bench/sweep.py --top 3"
    assert data["rows"] == [{"ms": 0.0123456789}] and data["where"] == "/x"
    assert render.load(tmp_path)["sweep"][0] == p2           # same second: the later file wins


def test_the_committed_results_md_is_up_to_date():
    assert render.main(["--check"]) == 0, render.STALE


def test_bench_models_data_is_raw_and_renders():
    from torch_htam.benchmark import ArmTime, BenchResult
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    arms = {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1, 20.0),
            "compile_ro": ArmTime(4.0, 3.9, 4.1, 30.0), "htam": ArmTime(4.0, 3.9, 4.2, 60.0),
            "htam_ro": ArmTime(3.2, 3.1, 3.3, 70.0)}
    tasks = [{"task": "rowwise_rms_norm", "count": 8, "status": "swapped", "speedup": 3.4}]
    res = BenchResult("m", "GPU", arms, tasks, {"compile": 1e-6, "htam": 2e-6, "htam_ro": 3e-6},
                      swapped_by_arm={"htam": 8, "htam_ro": 8})
    row = json.loads(json.dumps(bench_models.data("gpt2:bf16", res)))
    assert row["model"] == "gpt2:bf16" and row["vs_compile"] == 1.25 and row["vs_eager"] == 2.5
    assert row["vs_compile_ro"] == 1.25 and row["max_rel_err"] == 3e-6
    assert row["replay_vs_eager"] is None                       # an arm not run has no ratio
    assert row["ms"]["htam"] == 4.0 and row["arms"]["htam"]["p80_ms"] == 4.2
    assert row["task_rows"] == tasks and row["swapped"] == {"htam": 8, "htam_ro": 8}
    text = "\n".join(render.table([row], render.COLUMNS["bench_models"]))
    assert "| gpt2:bf16 | 10.00 | 5.00 | 4.00 | 4.00 | 3.20 | 1.25x | 1.25x | 2.50x | 8 | 8 | 1 | 60 | 3.0e-06 |" in text


def test_split_modes_rows_merge_each_ratio_within_its_process():
    """--split-modes: a default-mode process and a reduce-overhead one, each with its own eager;
    the merged row keeps every arm, eager from the first, and each ratio from its own process."""
    from torch_htam.benchmark import ArmTime, BenchResult
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    default = BenchResult("m", "GPU", {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1),
                                       "htam": ArmTime(4.0, 3.9, 4.2)}, [], {"htam": 2e-6},
                          swapped_by_arm={"htam": 8})
    ro = BenchResult("m", "GPU", {"eager": ArmTime(12.0, 11.0, 13.0), "compile_ro": ArmTime(4.0, 3.9, 4.1),
                                  "htam_ro": ArmTime(2.0, 1.9, 2.1)}, [], {"htam_ro": 3e-6},
                     swapped_by_arm={"htam_ro": 12})
    rows = [json.loads(json.dumps(bench_models.data("gpt2:bf16", r))) for r in (default, ro)]
    row = bench_models.merge(rows)
    assert row["vs_compile"] == 1.25 and row["vs_compile_ro"] == 2.0 and row["vs_eager"] == 2.5
    assert row["ms"] == {"eager": 10.0, "compile": 5.0, "htam": 4.0, "compile_ro": 4.0, "htam_ro": 2.0}
    assert row["swapped"] == {"htam": 8, "htam_ro": 12} and row["max_rel_err"] == 3e-6
    assert row["processes"] == [["eager", "compile", "htam"], ["eager", "compile_ro", "htam_ro"]]
    assert set(bench_models.MODE_ARMS[0]) | set(bench_models.MODE_ARMS[1]) == set(bench_models.ARMS)


def test_split_modes_hand_on_each_mode_as_its_child_finishes(monkeypatch):
    """--split-modes: the merged row goes to keep() after each mode's child, so a run cut while
    the reduce-overhead child runs still records the default mode's row."""
    from types import SimpleNamespace
    from torch_htam.benchmark import ArmTime, BenchResult
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    results = [BenchResult("m", "GPU", {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1),
                                        "htam": ArmTime(4.0, 3.9, 4.2)}, [], {"htam": 2e-6}),
               BenchResult("m", "GPU", {"eager": ArmTime(12.0, 11.0, 13.0), "compile_ro": ArmTime(4.0, 3.9, 4.1),
                                        "htam_ro": ArmTime(2.0, 1.9, 2.1)}, [], {"htam_ro": 3e-6})]

    def child(cmd, check):     # stands in for the child process: writes its row where asked
        out = Path(cmd[cmd.index("--row-out") + 1])
        out.write_text(json.dumps(bench_models.data("gpt2:bf16", results.pop(0))))

    monkeypatch.setattr(bench_models.subprocess, "run", child)
    kept = []
    a = SimpleNamespace(budget=60.0, steps=1, iters=10)
    row = bench_models._in_children("gpt2:bf16", tuple(bench_models.ARMS), a, keep=kept.append)
    assert [k["vs_compile_ro"] for k in kept] == [None, 2.0] and kept[0]["vs_compile"] == 1.25
    assert row == kept[-1]


def test_paired_ratios_come_from_each_process_rounds():
    """A slow spell that hit one arm's median is cancelled round by round (timing.paired_ratio)."""
    from torch_htam.benchmark import ArmTime, BenchResult
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    arm = lambda rounds: ArmTime(sorted(rounds)[len(rounds) // 2], min(rounds), max(rounds), round_ms=rounds)  # noqa: E731
    default = BenchResult("m", "GPU", {"eager": arm([10.0, 30.0, 10.0]), "compile": arm([4.0, 9.0, 9.0]),
                                       "htam": arm([4.0, 4.5, 4.5])}, [], {"htam": 1e-3})
    ro = BenchResult("m", "GPU", {"eager": arm([10.0, 10.0, 10.0]), "compile_ro": arm([3.0, 3.0, 3.3]),
                                  "htam_ro": arm([2.5, 2.5, 3.0])}, [], {"htam_ro": 1e-3})
    rows = [json.loads(json.dumps(bench_models.data("gpt2:bf16", r))) for r in (default, ro)]
    assert rows[0]["vs_compile"] == 2.0 and rows[0]["vs_compile_paired"] == 2.0
    merged = bench_models.merge(rows)
    assert merged["vs_compile_paired"] == 2.0 and merged["vs_compile_ro_paired"] == 1.2
    text = "\n".join(render.table([merged], render.COLUMNS["bench_models"]))
    assert "| 2.00x | 1.20x |" in text


def test_a_row_is_within_policy_only_when_every_check_of_every_arm_of_ours_is():
    """max_rel_err (example inputs), fresh values and a second batch size: the worst of our arms
    (torch.compile's own error is no part of it), held to the row's tolerance, also once merged."""
    from torch_htam.benchmark import ArmTime, BenchResult
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    arms = {"eager": ArmTime(10.0, 9.0, 11.0), "compile": ArmTime(5.0, 4.9, 5.1), "htam": ArmTime(4.0, 3.9, 4.2)}
    res = BenchResult("m", "GPU", arms, [], {"compile": 0.5, "htam": 1e-3}, tolerance=2e-2,
                      check_err={"fresh": {"htam": 4e-3}, "batch2": {"htam": 5e-3}})
    row = json.loads(json.dumps(bench_models.data("gpt2:bf16", res)))
    assert (row["max_rel_err"], row["fresh_rel_err"], row["batch2_rel_err"]) == (1e-3, 4e-3, 5e-3)
    assert row["within_policy"] is True
    ro = BenchResult("m", "GPU", {"eager": ArmTime(10.0, 9.0, 11.0), "compile_ro": ArmTime(4.0, 3.9, 4.1),
                                  "htam_ro": ArmTime(2.0, 1.9, 2.1)}, [], {"htam_ro": 1e-3}, tolerance=2e-2,
                     check_err={"fresh": {"htam_ro": 1e-3}, "batch2": {"htam_ro": 3e-2}})
    merged = bench_models.merge([row, json.loads(json.dumps(bench_models.data("gpt2:bf16", ro)))])
    assert merged["batch2_rel_err"] == 3e-2 and merged["within_policy"] is False
    assert merged["check_rel_err"]["batch2"] == {"htam": 5e-3, "htam_ro": 3e-2}
    text = "\n".join(render.table([merged], render.COLUMNS["bench_models"]))
    assert "| 1.0e-03 | 4.0e-03 | 3.0e-02 | n |" in text
    unchecked = bench_models.data("gpt2:bf16", BenchResult("m", "GPU", arms, [], {"htam": 1e-3}))
    assert unchecked["vs_compile_paired"] is None                # no rounds recorded: no paired ratio
    assert unchecked["within_policy"] is None and unchecked["fresh_rel_err"] is None


def test_split_modes_runs_one_child_per_mode_with_eager_in_each(monkeypatch):
    import argparse
    sys.path.insert(0, str(ROOT / "bench"))
    bench_models = _load("bench_models")
    calls = []

    def run(cmd, check):
        arms = cmd[cmd.index("--arms") + 1].split(",")
        calls.append((arms, "--no-record" in cmd))
        ms = {k: float(i + 1) for i, k in enumerate(arms)}
        row = {"model": cmd[2], "ms": ms, "setup_s": {}, "swapped": {}, "arms": {}, "rel_err": {},
               "vs_compile": 1.1 if "htam" in arms else None, "vs_compile_ro": 1.2 if "htam_ro" in arms else None,
               "vs_eager": 2.0 if "htam" in arms else None, "replay_vs_eager": None, "max_rel_err": 1e-3}
        Path(cmd[cmd.index("--row-out") + 1]).write_text(json.dumps(row))
    monkeypatch.setattr(bench_models.subprocess, "run", run)
    a = argparse.Namespace(budget=45.0, steps=1, iters=100)
    row = bench_models._in_children("gpt2:bf16", ("eager", "compile", "compile_ro", "htam", "htam_ro"), a)
    assert calls == [(["eager", "compile", "htam"], True), (["eager", "compile_ro", "htam_ro"], True)]
    assert row["vs_compile"] == 1.1 and row["vs_compile_ro"] == 1.2 and row["model"] == "gpt2:bf16"
    calls.clear()
    bench_models._in_children("gpt2:bf16", ("eager", "compile", "htam"), a)   # no reduce-overhead arm
    assert calls == [(["eager", "compile", "htam"], True)]


def test_runs_of_other_models_are_kept_and_a_later_run_of_one_model_replaces_it(tmp_path):
    """bench_models: one table, each model's latest row naming its run; a suite whose runs name one
    model each (bench_swaps) gets a section per model, the latest run of each."""
    _run(tmp_path, "bm-1.json", "bench_models", "2027-01-01T00:00:00+00:00", [{"model": "gpt2:bf16", "note": "old"}])
    _run(tmp_path, "bm-2.json", "bench_models", "2027-01-02T00:00:00+00:00", [{"model": "resnet50:bf16"}])
    _run(tmp_path, "bm-3.json", "bench_models", "2027-01-03T00:00:00+00:00", [{"model": "gpt2:bf16", "note": "new"}])
    text = render.render(tmp_path, None)
    rows = [line for line in text.splitlines() if line.startswith("| gpt2:bf16") or line.startswith("| resnet50")]
    assert len(rows) == 2 and rows[0].endswith("| new | 3 |") and rows[1].endswith("| 2 |")
    for i, d in enumerate(("2027-01-01", "2027-01-02", "2027-01-03")):
        _run(tmp_path, f"bs-{i}.json", "bench_swaps", d + "T00:00:00+00:00", [], model="gpt2:bf16" if i != 1 else "llama:bf16")
    assert {k: p.name for k, (p, _) in render.load(tmp_path).items()} == {
        "bench_swaps: gpt2:bf16": "bs-2.json", "bench_swaps: llama:bf16": "bs-1.json"}




def test_a_run_of_one_mode_keeps_the_other_modes_latest_figures(tmp_path):
    """bench_models --split-modes run one mode at a time (a device call each): the row shows each
    mode's latest ratio and note, and names both runs; a run of both modes replaces the row."""
    _run(tmp_path, "bm-1.json", "bench_models", "2027-01-01T00:00:00+00:00",
         [{"model": "resnet50:bf16", "vs_compile": 1.14, "vs_compile_ro": None, "note": "kept 15",
           "ms": {"compile": 2.5, "htam": 2.19}}])
    _run(tmp_path, "bm-2.json", "bench_models", "2027-01-02T00:00:00+00:00",
         [{"model": "resnet50:bf16", "vs_compile": None, "vs_compile_ro": 1.01, "note": "kept 0",
           "ms": {"compile_ro": 2.3, "htam_ro": 2.28, "compile": None}}])
    row = next(line for line in render.render(tmp_path, None).splitlines() if line.startswith("| resnet50"))
    assert "| 2.50 |" in row and "| 2.28 |" in row and "| 1.14x | 1.01x |" in row
    assert row.endswith("| default: kept 15; reduce-overhead: kept 0 | 1+2 |")
    _run(tmp_path, "bm-3.json", "bench_models", "2027-01-03T00:00:00+00:00",
         [{"model": "resnet50:bf16", "vs_compile": 1.2, "vs_compile_ro": 1.1, "note": "both"}])
    row = next(line for line in render.render(tmp_path, None).splitlines() if line.startswith("| resnet50"))
    assert row.endswith("| both | 3 |") and "2.50" not in row
