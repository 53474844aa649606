"""Recall (torch_htam/recall.py): which settings won on tasks of similar size, kept in the HTG's
memory file, and tried first, after the defaults, by a search on another task of the kind."""
import importlib.util
import json
from pathlib import Path

import pytest

from torch_htam import fleet, recall
from torch_htam.htg import HTG
from torch_htam.recall import Recall

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("anytime_recall", ROOT / "bench" / "anytime.py")
anytime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(anytime)


def test_a_nearer_task_counts_more():
    r = Recall()
    r.record("conv", "small", (10.0, 10.0), {"a": 1.0, "b": 0.5})     # a won on the small task
    r.record("conv", "large", (20.0, 20.0), {"a": 0.5, "b": 1.0})     # b on the large one
    assert [k for k, _ in r.ranked("conv", (11.0, 11.0))] == ["a", "b"]
    assert [k for k, _ in r.ranked("conv", (19.0, 19.0))] == ["b", "a"]
    assert r.ranked("gemm", (11.0, 11.0)) == []                       # another kind knows nothing


def test_shares_are_against_the_task_best_and_a_task_searched_again_replaces_its_record():
    r = Recall()
    r.record("gemm", "t", (1.0,), {"a": 3.0, "b": 1.5, "c": 0.0})     # c: no speedup, left out
    assert r.ranked("gemm", (1.0,)) == [("a", 1.0), ("b", 0.5)]
    r.record("gemm", "t", (1.0,), {"b": 2.0})
    assert r.ranked("gemm", (1.0,)) == [("b", 1.0)]


def test_records_per_kind_are_capped_oldest_first(monkeypatch):
    monkeypatch.setattr(recall, "MAX_RECORDS", 2)
    r = Recall()
    for i in range(3):
        r.record("ew", f"t{i}", (0.0,), {f"s{i}": 1.0})
    assert [x.signature for x in r.kinds["ew"]] == ["t1", "t2"]


def test_a_change_names_what_a_setting_sets_otherwise_than_the_defaults_and_applies_back():
    defaults = {"cutlass": True, "cg_tile": 2, "algo": 0}
    setting = {"cutlass": False, "algo": 3}               # cuBLASLt's path reads no tile
    delta = recall.change(setting, defaults)
    assert delta == {"cutlass": False, "algo": 3, "cg_tile": None}
    assert recall.applied(delta, defaults) == setting
    assert recall.applied({}, defaults) == defaults
    assert recall.change_id({"b": 1, "a": True}) == '{"a": true, "b": 1}'
    assert recall.change_id({"tile": [128, 64]}) is None


def test_features_are_log2_sizes_of_the_task():
    from torch_htam.extract import task_from_source
    path = ROOT / "bench" / "tasks" / "rw_softmax_fp32.py"
    task = task_from_source(path.read_text(), path.stem)
    f = recall.features(task)
    out = task.outputs[0].shape
    assert len(f) == 4 and f[2] == pytest.approx(__import__("math").log2(out[-1]))
    assert all(x >= 0 for x in f)


def test_recall_is_saved_with_the_htg_and_an_older_file_loads_without_it(tmp_path):
    htg = HTG.from_prior()
    htg.recall.record("rowwise", "sig", (3.0, 4.0), {'{"tpr": 32}': 2.0})
    path = htg.save(tmp_path / "m.json")
    assert HTG.load(path).recall.ranked("rowwise", (3.0, 4.0)) == [('{"tpr": 32}', 1.0)]
    data = json.loads(path.read_text())
    del data["recall"]
    path.write_text(json.dumps(data))
    assert HTG.load(path).recall.kinds == {}


def test_merged_experience_keeps_each_search_recall(tmp_path):
    """Two searches' deltas merged into one file (fleet): both tasks' records are kept, a task's
    newer record replaces its older one."""
    path = tmp_path / "expert.json"
    base = HTG.from_prior()
    before = base.experience_json()
    for sig, speed in (("a", 2.0), ("b", 3.0), ("a", 5.0)):
        h = HTG.from_prior()
        h.recall.record("gemm", sig, (1.0,), {f'{{"algo": {int(speed)}}}': speed})
        fleet.merge_experience(path, before, h.experience_json())
    got = HTG.load(path).recall
    assert sorted(r.signature for r in got.kinds["gemm"]) == ["a", "b"]
    assert {k for k, _ in got.ranked("gemm", (1.0,))} == {'{"algo": 5}', '{"algo": 3}'}


def _table(stem: str, fast: dict | None, limit: int = 12) -> dict:
    """A bench task's first `limit` settings, all verified at 1.0x except `fast` at 3.0x."""
    from torch_htam.extract import task_from_source
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert.proposer import tuning_grid
    path = ROOT / "bench" / "tasks" / f"{stem}.py"
    task = task_from_source(path.read_text(), stem)
    rows = [{"params": p, "correct": True, "reason": "ok", "speedup": 3.0 if p == fast else 1.0,
             "kernel_ms": 0.1 / (3.0 if p == fast else 1.0), "retime_ms": None, "ref_ms": 0.1,
             "roofline_fraction": 0.3} for p in tuning_grid(task, policy_for(task), limit)]
    return {"task": stem, "path": str(path), "kind": "?", "policy": "?", "limit": limit, "seconds": 0, "rows": rows}


def _search(table: dict, memory: HTG, mode: str, budget: int = 6) -> list[dict]:
    task = anytime._task(table)
    return anytime.search_log(task, anytime.table_keys(task, table), memory, mode, budget, table["limit"], None)


def test_a_search_tries_what_won_on_another_task_of_the_kind_right_after_the_defaults():
    """fp32 and bf16 RMSNorm have other defaults (vector width, packing) and share moves: the move
    that won on the fp32 task is the bf16 task's second candidate once memory holds the first
    search, and not where memory is off."""
    first, other = _table("rw_rmsnorm_fp32", None), _table("rw_rmsnorm_bf16", None)
    d1, d2 = first["rows"][0]["params"], other["rows"][0]["params"]
    moves = {recall.change_id(recall.change(r["params"], d2)): r["params"] for r in other["rows"][1:]}
    shared = [r["params"] for r in first["rows"][1:] if recall.change_id(recall.change(r["params"], d1)) in moves]
    assert shared, "the two tasks' spaces share no move"
    winner = shared[-1]                       # the last one the plain order would reach
    want = moves[recall.change_id(recall.change(winner, d1))]
    first = _table("rw_rmsnorm_fp32", winner)
    memory = HTG.from_prior()
    _search(first, memory, "htg", budget=len(first["rows"]))
    top = memory.recall.ranked("rowwise", recall.features(anytime._task(first)))[0][0]
    assert top == recall.change_id(recall.change(winner, d1))
    log = _search(other, memory, "htg")
    assert log[0]["params"] == d2 and log[1]["params"] == want
    cold = HTG.from_prior()
    _search(first, cold, "none", budget=len(first["rows"]))
    assert cold.recall.kinds == {}            # memory "none" learns nothing
    assert _search(other, cold, "htg")[1]["params"] != want
