"""bench/bench_memory.py's bookkeeping (CPU): re-timing every arm's winners together."""
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_memory as bm  # noqa: E402


class _Evaluator:
    """Same source -> same speedup; "bad" fails verification now."""
    def __init__(self):
        self.batches = []

    def evaluate_many(self, task, sources):
        self.batches.append((task.name, list(sources)))
        return [SimpleNamespace(correct=s != "bad", speedup={"fast": 1.5, "slow": 0.9}.get(s)) for s in sources]


def _row(arm, src_a, src_b, search_a):
    results = [SimpleNamespace(task="a", best=SimpleNamespace(speedup=search_a, source=src_a), candidates=3, correct=3,
                               stop="steps"),
               SimpleNamespace(task="b", best=SimpleNamespace(speedup=1.2, source=src_b), candidates=3, correct=3,
                               stop="steps")]
    return bm.metrics(arm, results, 1.0)


def test_retime_gives_equal_sources_equal_figures_in_one_batch_per_task():
    tasks = [SimpleNamespace(name="a"), SimpleNamespace(name="b")]
    rows = [_row("htg", "fast", "slow", 11.4), _row("flat", "fast", "bad", 1.4)]   # 11.4x: a lucky timing
    ev = _Evaluator()
    bm.retime(tasks, rows, ev)
    assert ev.batches == [("a", ["fast"]), ("b", ["bad", "slow"])]
    assert rows[0]["per_task_rt"] == {"a": 1.5, "b": 0.9} and rows[1]["per_task_rt"] == {"a": 1.5, "b": None}
    assert rows[0]["fast1_rt"] == 0.5 and abs(rows[0]["geomean_rt"] - (1.5 * 0.9) ** 0.5) < 1e-9
    assert rows[0]["geomean"] > 3           # the search's own figure kept the outlier
    assert "re-timed" in bm.table(rows)[0] and "1.50x" in bm.per_task_table(rows)[2]


def test_payload_keeps_the_figures_and_leaves_the_kernel_sources_out():
    import json
    rows = [_row("htg", "fast", "slow", 1.6)]
    bm.retime([SimpleNamespace(name="a"), SimpleNamespace(name="b")], rows, _Evaluator())
    args = SimpleNamespace(tasks=Path("bench/tasks"), limit=2, steps=6, candidates=4, warm_passes=1,
                           roofline_stop=None, task_time=None, seed=0)
    data = json.loads(json.dumps(bm.payload(rows, 2, args)))
    (r,) = data["rows"]
    assert "best_src" not in r and r["arm"] == "htg" and r["per_task"] == {"a": 1.6, "b": 1.2}
    assert r["per_task_rt"] == {"a": 1.5, "b": 0.9} and data["steps"] == 6 and data["tasks"] == 2
