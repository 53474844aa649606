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
    assert got.correct == table["rows"][1]["correct"] and ev.log == [table["rows"][1]]
    with pytest.raises(KeyError, match="outside the measured table"):
        ev.evaluate_many(task, ["// not a setting of this table"])


def test_every_arm_walks_only_the_table_and_random_order_reaches_the_oracle():
    tables = [_table("ew_bias_gelu_bf16"), _table("rw_softmax_fp32")]
    res = anytime.replay(tables, budget=12, perms=3)
    assert set(res["arms"]) == set(anytime.ARMS)
    for arm in anytime.ARMS:
        a = res["arms"][arm]
        assert set(a["curves"]) == {"ew_bias_gelu_bf16", "rw_softmax_fp32"}
        assert all(len(c) == 12 for c in a["curves"].values())
        for t, c in a["curves"].items():    # nothing beats the oracle of the same table
            assert all(v is None or v <= res["oracle"][t] + 1e-12 for v in c)
    # the whole space in any order ends at the oracle
    for t, c in res["arms"]["none"]["curves"].items():
        assert c[-1] == pytest.approx(res["oracle"][t])
