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
