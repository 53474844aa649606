"""bench/anytime.py on the CPU: curves and summaries on fabricated tables of real tasks' spaces, the
table evaluator's contract, and the search arms proposing only what the table holds."""
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("anytime_bench", ROOT / "bench" / "anytime.py")
anytime = importlib.util.module_from_spec(spec)
sys.modules["anytime_bench"] = anytime     # replay(jobs > 1) hands its workers functions by name
spec.loader.exec_module(anytime)


def _row(ms: float | None, retime: float | None = None, params=None) -> dict:
    ok = ms is not None
    return {"params": params or {}, "correct": ok, "reason": "ok" if ok else "mismatch",
            "speedup": 0.1 / ms if ok else None, "kernel_ms": ms, "retime_ms": retime or ms,
            "ref_ms": 0.1, "roofline_fraction": 0.3}


def _table(stem: str, limit: int = 12) -> dict:
    """A real task's first `limit` settings with made-up, deterministic verdicts and timings."""
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.proposer import tuning_grid
    path = ROOT / "bench" / "tasks" / f"{stem}.py"
    task = task_from_source(path.read_text(), stem)
    rows = []
    for p in tuning_grid(task, policy_for(task), limit):
        h = int(hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()[:8], 16)
        rows.append(_row(None if h % 7 == 0 else 0.05 + (h % 1000) / 1e4, params=p))
    return {"task": stem, "path": str(path), "kind": "?", "policy": "?", "limit": limit, "seconds": 0, "rows": rows}


def test_kept_is_the_fastest_by_first_timing_reported_by_its_second():
    rows = [_row(0.05, retime=0.08), _row(0.06), _row(None)]
    assert anytime.kept(rows) == pytest.approx(0.1 / 0.08)     # the winner's curse stays out
    assert anytime.kept([_row(None)]) is None


def test_curve_holds_its_last_point_and_to_oracle_finds_the_first_k():
    c = anytime.curve([_row(0.1), _row(0.05)], budget=4)
    assert c == [pytest.approx(1.0), pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0)]
    assert anytime.to_oracle(c, 2.0) == 2 and anytime.to_oracle(c, 2.2) is None
    assert anytime.to_oracle(c, 2.0 / 0.95 * 1.0001) is None and anytime.to_oracle(c, None) is None


def test_summary_counts_a_task_that_never_gets_there_past_the_budget():
    curves = {"a": [1.0, 2.0], "b": [1.0, 1.0], "c": [2.0, 2.0]}
    s = anytime.summarize(curves, {"a": 2.0, "b": 2.0, "c": 2.0}, budget=2)
    assert s["to_95"] == {"a": 2, "b": None, "c": 1}
    assert s["median_to_95"] == 2 and s["reached"] == 2 and s["mean_to_95"] == pytest.approx(2.0)


def test_table_evaluator_answers_from_the_table_and_refuses_anything_else():
    from torch_htam.extract import task_from_source
    table = _table("ew_bias_gelu_bf16", limit=3)
    task = task_from_source(Path(table["path"]).read_text(), table["task"])
    ev = anytime.TableEvaluator(anytime.table_keys(task, table))
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.proposer import match_task
    src = match_task(task, policy_for(task)).render(table["rows"][1]["params"])
    got = ev.evaluate_many(task, [src])[0]
    assert got.correct == table["rows"][1]["correct"]
    # the row as measured, with the setting the replay's proposer may walk (its canonical params)
    assert ev.log == [dict(table["rows"][1], setting=tuple(sorted(table["rows"][1]["params"].items())))]
    with pytest.raises(KeyError, match="outside the measured table"):
        ev.evaluate_many(task, ["// not a setting of this table"])


def test_every_arm_walks_only_the_table_and_none_tries_the_defaults_first():
    """Every arm runs the search loop: the no-memory arm too starts from the defaults (step 0),
    as optimize with memory="none" does, instead of a shuffle of the whole table."""
    tables = [_table("ew_bias_gelu_bf16"), _table("rw_softmax_fp32")]
    res = anytime.replay(tables, budget=12, seeds=2)
    assert set(res["arms"]) == set(anytime.ARMS) and res["seeds"] == 2
    for arm in anytime.ARMS:
        a = res["arms"][arm]
        assert set(a["curves"]) == {"ew_bias_gelu_bf16", "rw_softmax_fp32"}
        assert all(len(c) == 12 for c in a["curves"].values())
        assert all(len(runs) == 2 for runs in a["runs"].values())
        for t, runs in a["runs"].items():    # nothing beats the oracle of the same table
            assert all(v is None or v <= res["oracle"][t] + 1e-12 for c in runs for v in c)
    for table in tables:                     # the table's first row is the defaults (tuning_grid)
        defaults = anytime.kept(table["rows"][:1])
        for arm in anytime.ARMS:
            assert all(c[0] == defaults for c in res["arms"][arm]["runs"][table["task"]]), arm
    for row in res["rows"]:                  # held-out figures: one value per seed and arm
        assert set(row["to99"]) == set(anytime.ARMS)
        assert all(len(v) == 2 and all(1 <= k <= 13 for k in v) for v in row["to99"].values())
    assert res["saving_vs_none"] == res["savings"]["htg_warm"]["saving"]
    assert res["ci_low"] <= res["saving_vs_none"] <= res["ci_high"]


def test_replay_reads_a_table_measured_before_knobs_were_added():
    """bench/results/anytime-20261123-215252.json was measured before the rowwise target gained
    knobs: its rows' params lack them, and a bf16 row task's settings rendered without them are
    other sources. Replayed here, every arm proposes only settings of that table (this raised
    "candidate outside the measured table")."""
    data = json.loads((ROOT / "bench" / "results" / "anytime-20261123-215252.json").read_text())
    tables = [t for t in data["tables"] if t["task"] in ("rw_rmsnorm_bf16", "ew_bias_gelu_bf16")]
    res = anytime.replay(tables, budget=8, seeds=1, arms=("htg_cold", "none"))
    assert {r["task"] for r in res["rows"]} == {"rw_rmsnorm_bf16", "ew_bias_gelu_bf16"}
    assert all(r["best"] for r in res["rows"])


def test_replay_in_processes_gives_the_same_result():
    tables = [_table("ew_bias_gelu_bf16", 6), _table("rw_softmax_fp32", 6)]
    one = anytime.replay(tables, budget=6, seeds=2)
    two = anytime.replay(tables, budget=6, seeds=2, jobs=2)
    assert one == two


# --- held-out figures ----------------------------------------------------------------------------

def test_to99_counts_candidates_to_the_best_any_arm_found():
    runs = {"a": {"t": [[1.0, 2.0, 2.0], [1.0, 1.0, 1.0]]},      # seed 1 never gets there
            "b": {"t": [[1.99, 2.0, 2.0], [None, 1.5, 1.985]]}}
    rows = anytime.held_out_rows(runs, budget=3)
    assert rows == [{"task": "t", "best": 2.0, "to99": {"a": [2, 4], "b": [1, 3]}}]
    none = anytime.held_out_rows({"a": {"t": [[None, None]]}}, budget=2)
    assert none == [{"task": "t", "best": None, "to99": {"a": [None]}}]


def test_bootstrap_of_an_exact_saving_is_that_saving():
    base = [[10, 20], [4, 6], [30, 30], [8, 12]]
    arm = [[0.6 * v for v in seeds] for seeds in base]
    est, low, high = anytime.paired_bootstrap(arm, base, resamples=500)
    assert est == pytest.approx(0.4) and low == pytest.approx(0.4) and high == pytest.approx(0.4)


def test_bootstrap_interval_covers_the_true_saving_about_95_percent_of_the_time():
    """Synthetic tasks whose true relative saving is 0.3: per task a base cost, the arm 0.7 of it
    times noise of mean 1. Over 200 data sets the interval holds 0.3 in about 95% of them, and is
    seeded (same data, same interval)."""
    import numpy as np
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        cost = rng.uniform(2, 20, size=40)
        base = [[c * rng.uniform(0.5, 1.5) for _ in range(3)] for c in cost]
        arm = [[c * 0.7 * rng.uniform(0.5, 1.5) for _ in range(3)] for c in cost]
        est, low, high = anytime.paired_bootstrap(arm, base, resamples=1000, seed=3)
        hits += low <= 0.3 <= high
    assert 0.88 <= hits / 200 <= 0.99
    assert anytime.paired_bootstrap(arm, base, 1000, seed=3) == (est, low, high)


def test_no_difference_gives_an_interval_around_zero_and_a_clear_one_excludes_it():
    import numpy as np
    rng = np.random.default_rng(2)
    cost = rng.uniform(2, 20, size=60)
    base = [[c * rng.uniform(0.5, 1.5) for _ in range(3)] for c in cost]
    same = [[c * rng.uniform(0.5, 1.5) for _ in range(3)] for c in cost]
    half = [[c * 0.5 * rng.uniform(0.9, 1.1) for _ in range(3)] for c in cost]
    _, low, high = anytime.paired_bootstrap(same, base)
    assert low < 0 < high
    est, low, high = anytime.paired_bootstrap(half, base)
    assert 0.4 < low <= est <= high < 0.6


def test_saving_leaves_out_tasks_no_arm_solved():
    rows = [{"task": "t", "best": 2.0, "to99": {"htg_warm": [1, 1], "none": [2, 2]}},
            {"task": "u", "best": None, "to99": {"htg_warm": [None, None], "none": [None, None]}}]
    s = anytime.saving(rows, "htg_warm", "none", resamples=100)
    assert s["saving"] == pytest.approx(0.5) and s["tasks"] == 1 and s["runs"] == 2
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(0.5), pytest.approx(0.5))


# --- held-out protocol: htg_warm learns from train tables only -----------------------------------

def _record_searches(monkeypatch) -> list[tuple[str, int, str]]:
    """Each search_log call as (task, seed, the memory's experience when the search starts)."""
    calls, real = [], anytime.search_log

    def spy(task, by_key, memory, mode, budget, limit, gpu, seed=0):
        exp = memory.experience_json() if memory is not None else {}
        calls.append((task.name, seed, json.dumps({k: exp.get(k) for k in ("edges", "strategies")},
                                                  sort_keys=True)))
        return real(task, by_key, memory, mode, budget, limit, gpu, seed)
    monkeypatch.setattr(anytime, "search_log", spy)
    return calls


def test_warm_learns_from_the_train_tasks_only_and_every_test_task_starts_from_them(monkeypatch):
    import random
    train = [_table("ew_bias_gelu_bf16", 6), _table("rw_rmsnorm_bf16", 6)]
    test = [_table("rw_softmax_fp32", 6), _table("ew_bias_gelu_fp32", 6)]
    calls = _record_searches(monkeypatch)
    res = anytime.replay(test, budget=6, seeds=2, arms=("htg_warm",), train=train)
    assert res["train"] == ["ew_bias_gelu_bf16", "rw_rmsnorm_bf16"]
    assert set(res["arms"]["htg_warm"]["runs"]) == {"rw_softmax_fp32", "ew_bias_gelu_fp32"}
    test_names = {t["task"] for t in test}
    for seed in range(2):
        seen = [c for c in calls if c[1] == seed]
        order = [t["task"] for t in train]
        random.Random(seed).shuffle(order)
        # the train tasks first, in the seed's order; then each test task once, never as experience
        assert [c[0] for c in seen[:2]] == order
        assert sorted(c[0] for c in seen[2:]) == sorted(test_names)
        # every test search starts from the same trained memory: no test task taught another
        starts = {c[2] for c in seen[2:]}
        assert len(starts) == 1 and starts != {seen[0][2]}


def test_warm_with_train_gives_the_same_result_in_processes():
    train = [_table("ew_bias_gelu_bf16", 6)]
    test = [_table("rw_softmax_fp32", 6), _table("ew_bias_gelu_fp32", 6)]
    one = anytime.replay(test, budget=6, seeds=2, arms=("htg_warm", "none"), train=train)
    two = anytime.replay(test, budget=6, seeds=2, arms=("htg_warm", "none"), train=train, jobs=2)
    assert one == two


def test_a_train_task_that_is_also_tested_is_refused():
    tables = [_table("ew_bias_gelu_bf16", 6), _table("rw_softmax_fp32", 6)]
    with pytest.raises(ValueError, match=r"include test tasks \['ew_bias_gelu_bf16'\].*held out"):
        anytime.replay(tables[:1], budget=6, train=tables[1:] + tables[:1])


def test_without_train_warm_learns_leave_one_out(monkeypatch):
    tables = [_table("ew_bias_gelu_bf16", 6), _table("rw_softmax_fp32", 6)]
    calls = _record_searches(monkeypatch)
    res = anytime.replay(tables, budget=6, seeds=1, arms=("htg_warm",))
    assert res["train"] == []
    # per test task: the other task, then the task itself
    assert [c[0] for c in calls] == ["rw_softmax_fp32", "ew_bias_gelu_bf16", "ew_bias_gelu_bf16", "rw_softmax_fp32"]


def test_cli_train_loads_table_files_and_records_the_train_tasks(tmp_path, monkeypatch):
    test = tmp_path / "test.json"
    test.write_text(json.dumps([_table("rw_softmax_fp32", 6)]))
    train = tmp_path / "train.json"       # a results file: its tables, and where they were measured
    train.write_text(json.dumps({"date": "d", "commit": "c", "tables": [_table("ew_bias_gelu_bf16", 6)]}))
    seen, written = {}, {}
    real = anytime.replay

    def spy(tables, *a, **kw):
        seen.update(test=[t["task"] for t in tables], train=[t["task"] for t in kw["train"]])
        return real(tables, *a, **kw)
    monkeypatch.setattr(anytime, "replay", spy)
    monkeypatch.setattr(anytime.record, "write", lambda suite, payload, **kw: written.update(payload))
    assert anytime.main(["--replay", str(test), "--train", str(train), "--budget", "6", "--seeds", "1"]) == 0
    assert seen == {"test": ["rw_softmax_fp32"], "train": ["ew_bias_gelu_bf16"]}
    assert written["train"] == ["ew_bias_gelu_bf16"]
    assert [t["task"] for t in written["tables"]] == ["rw_softmax_fp32"]
    assert written["train_measured"] == [{"date": "d", "commit": "c", "device": None, "command": None,
                                          "file": str(train)}]


def test_a_task_measured_again_in_a_later_file_replaces_its_earlier_table(tmp_path):
    """Re-measured GEMM tables (a new knob) named after the tables they update: the replay sees
    each task once, the later table in the earlier one's place."""
    old = [_table("rw_softmax_fp32", 4), _table("ew_bias_gelu_bf16", 4)]
    new = _table("rw_softmax_fp32", 6)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"date": "1", "tables": old}))
    b.write_text(json.dumps([new]))
    tables, sources = anytime.load_tables([str(a), str(b)])
    assert [t["task"] for t in tables] == ["rw_softmax_fp32", "ew_bias_gelu_bf16"]
    assert len(tables[0]["rows"]) == 6
    assert [s["file"] for s in sources] == [str(a)]


def test_save_memory_writes_the_memory_htg_warm_starts_from(tmp_path):
    """--save-memory: the file HTG.load reads back is the experience the replay's htg_warm (seed 0)
    searches its test tasks from, and no replay runs."""
    from torch_htam.htg import HTG
    train = tmp_path / "train.json"
    tables = [_table("ew_bias_gelu_bf16", 6), _table("rw_rmsnorm_bf16", 6)]
    train.write_text(json.dumps(tables))
    out = tmp_path / "warm.json"
    assert anytime.main(["--train", str(train), "--budget", "6", "--save-memory", str(out), "--no-record"]) == 0
    loaded = HTG.load(out).experience_json()
    assert loaded["strategies"] and loaded["edges"]
    anytime._prepare([_table("rw_softmax_fp32", 6)], 6, None, ("htg_warm",), tables)
    want = anytime._trained(0).experience_json()
    assert {k: loaded[k] for k in ("edges", "strategies")} == {k: want[k] for k in ("edges", "strategies")}


def test_save_memory_needs_train_tables(tmp_path):
    with pytest.raises(SystemExit):
        anytime.main(["--save-memory", str(tmp_path / "warm.json"), "--no-record"])


def test_a_table_measured_in_another_checkout_finds_its_task_file_here():
    here = anytime.HERE / "heldout" / "test"
    name = sorted(here.glob("*.py"))[0]
    elsewhere = {"path": f"/tmp/new/bench/heldout/test/{name.name}", "task": name.stem}
    assert anytime.task_path(elsewhere) == name
    moved = {"path": "/nowhere/rw_softmax_fp32.py", "task": "rw_softmax_fp32"}
    assert anytime.task_path(moved) == anytime.HERE / "tasks" / "rw_softmax_fp32.py"


def test_space_facts_count_the_defaults_ties_and_timing_noise():
    a = [_row(1.0), _row(0.5), _row(0.498), _row(None)]          # best 0.2x: defaults at 50%
    b = [_row(0.5, retime=0.51), _row(0.6, retime=0.612)]          # defaults are the best
    f = anytime.space_facts([{"rows": a}, {"rows": b}, {"rows": [_row(None)]}])
    assert (f["tasks"], f["defaults_95"], f["defaults_99"]) == (2, 1, 1)
    # a: 2 of its 3 verified settings within 1% of its best; b: 1 of 2
    assert f["median_share_within_1pct"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert f["retime_noise_median"] == 0.0 and f["retime_noise_p90"] == pytest.approx(abs(0.5 / 0.51 - 1))
    assert "1 / 1 of 2 tasks" in anytime.space_lines(f)[0]
    assert f["drain_decided"] is None and "drain" not in anytime.space_lines(f)[0]   # rows without the series


def test_space_facts_count_timings_the_drain_decided():
    rows = [dict(_row(0.5), kernel_event_ms=0.5, kernel_drain_ms=0.1),     # the events decided
            dict(_row(0.6), kernel_event_ms=0.4, kernel_drain_ms=0.6),     # the drain, 50% past them
            dict(_row(0.5), kernel_event_ms=0.49, kernel_drain_ms=0.5),    # within 5%: a tie
            dict(_row(None), kernel_event_ms=None, kernel_drain_ms=None)]  # not verified: left out
    f = anytime.space_facts([{"rows": rows}])
    assert f["drain_decided"] == pytest.approx(1 / 3)
    assert "33.3% of settings" in anytime.space_lines(f)[0]


def test_each_search_runs_on_the_gpu_its_table_was_measured_on(monkeypatch):
    """Memory learned from one device's tables and searched on another's (H100 -> H200): the train
    searches see the train tables' GPU, the test searches the test tables'."""
    from torch_htam.gpu import GpuInfo
    h100 = GpuInfo("H100", "sm_90a", 132, 50 << 20, 227 << 10, 3.35e12, 67e12, 989e12)
    h200 = GpuInfo("H200", "sm_90a", 132, 50 << 20, 227 << 10, 4.8e12, 67e12, 989e12)
    train = [dict(_table("ew_bias_gelu_bf16", 6), gpu=h100.to_json())]
    test = [dict(_table("rw_softmax_fp32", 6), gpu=h200.to_json())]
    seen, real = [], anytime.search_log

    def spy(task, by_key, memory, mode, budget, limit, gpu, seed=0):
        seen.append((task.name, gpu.name))
        return real(task, by_key, memory, mode, budget, limit, gpu, seed)
    monkeypatch.setattr(anytime, "search_log", spy)
    res = anytime.replay(test, budget=6, seeds=1, arms=("htg_warm", "none"), train=train)
    assert set(seen) == {("ew_bias_gelu_bf16", "H100"), ("rw_softmax_fp32", "H200")}
    assert res["devices"] == {"test": ["H200"], "train": ["H100"]}
    assert "memory learned on H100; tested on H200" in anytime.held_out_lines(res)


def test_a_table_keeps_the_last_of_its_passes():
    """measure() evaluates the whole space `passes` times and keeps the last pass's verdicts and
    timings (the first pass builds; its timings were the noisier ones on an H200 host)."""
    from torch_htam.evaluation import Evaluation

    class Passes:
        def __init__(self):
            self.calls = 0

        def evaluate_many(self, task, sources, policy=None):
            self.calls += 1
            ms = 0.1 * self.calls
            return [Evaluation(True, "ok", kernel_ms=ms, retime_ms=ms, ref_ms=0.1, speedup=0.1 / ms,
                               kernel_event_ms=ms, kernel_drain_ms=0.0) for _ in sources]

    ev = Passes()
    t = anytime.measure(anytime.HERE / "tasks" / "rw_softmax_fp32.py", ev, limit=4, passes=2)
    assert ev.calls == 2 and t["passes"] == 2 and len(t["rows"]) == 4
    assert [r["kernel_ms"] for r in t["rows"]] == pytest.approx([0.2] * 4)
    assert [r["kernel_event_ms"] for r in t["rows"]] == pytest.approx([0.2] * 4)
    one = Passes()
    assert anytime.measure(anytime.HERE / "tasks" / "rw_softmax_fp32.py", one, limit=4, passes=1)["passes"] == 1
    assert one.calls == 1


def test_resume_measures_only_the_tasks_not_yet_in_out(tmp_path, monkeypatch):
    """--resume with --out: a run cut by its time limit goes on where it stopped, keeping what it
    measured; without --out it says what it needs. --limit-kind sets one kind's limit."""
    import torch

    import torch_htam.evaluation as evaluation
    from torch_htam.evaluation import Evaluation
    seen = []

    class Fake:
        gpu = None

        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def evaluate_many(self, task, sources, policy=None):
            seen.append(task.name)
            return [Evaluation(True, "ok", kernel_ms=0.1, retime_ms=0.1, ref_ms=0.1, speedup=1.0,
                               kernel_event_ms=0.1, kernel_drain_ms=0.0) for _ in sources]
    monkeypatch.setattr(evaluation, "Evaluator", Fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a, b = (str(anytime.HERE / "tasks" / f"{n}.py") for n in ("rw_softmax_fp32", "ew_bias_gelu_bf16"))
    out = tmp_path / "t.json"
    kept = {"task": "rw_softmax_fp32", "rows": [], "marker": 1}
    out.write_text(json.dumps([kept]))
    argv = [a, b, "--table-only", "--limit", "2", "--passes", "1", "--no-record", "--out", str(out)]
    assert anytime.main(argv + ["--resume", "--limit-kind", "elementwise=3"]) == 0
    assert seen == ["ew_bias_gelu_bf16"]
    tables = json.loads(out.read_text())
    assert [t["task"] for t in tables] == ["rw_softmax_fp32", "ew_bias_gelu_bf16"] and tables[0] == kept
    assert tables[1]["limit"] == 3 and len(tables[1]["rows"]) == 3     # the kind's own limit
    with pytest.raises(SystemExit, match="--out"):
        anytime.main([a, "--table-only", "--no-record", "--resume"])
