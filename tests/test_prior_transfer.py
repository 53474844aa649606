"""bench/prior_transfer.py on hand-made tables: a setting that won on the train tables is walked
right after the defaults on a test table of the same kind, and only there."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import prior_transfer as pt  # noqa: E402


def table(kind: str, ms: dict[str, float], name: str = "t") -> dict:
    """A table of settings {"b": 1} .. with these kernel ms (ref 1 ms), the first the defaults."""
    rows = [{"params": {"b": b}, "correct": True, "ref_ms": 1.0, "retime_ms": m} for b, m in ms.items()]
    return {"kind": kind, "path": f"/x/{name}.py", "rows": rows}


def test_a_learned_winner_is_walked_first_after_the_defaults():
    train = [table("gemm", {"d": 1.0, "a": 0.9, "b": 0.5, "c": 0.8})]          # b won
    test = table("gemm", {"d": 1.0, "a": 0.95, "c": 0.9, "x": 0.7, "y": 0.9, "b": 0.5})
    prior = pt.learn(train, "mean")
    assert prior[("gemm", pt._key({"b": "b"}))] == 1.0
    got, rand = pt.walk(test, prior, seeds=10)
    assert got == 2 and rand > 2                     # the defaults, then b
    other = pt.walk(table("conv", {"d": 1.0, "a": 0.95, "c": 0.9, "x": 0.7, "y": 0.9, "b": 0.5}), prior, 10)
    assert other[0] == other[1]                      # another kind: the prior has nothing to say
    r = pt.measure([test], train, "hit99", seeds=10)
    assert r["tasks"] == 1 and r["saving"] > 0.5 and r["kinds"]["gemm"]["prior_to99"] == 2


def test_to99_counts_settings_until_one_is_within_a_percent_of_the_best():
    sh = {"a": 0.5, "b": 0.991, "c": 1.0}
    assert pt.to99(["a", "b", "c"], sh) == 2 and pt.to99(["a"], sh) == 2
    assert pt.shares(table("gemm", {"a": 2.0, "b": 1.0})) == {pt._key({"b": "a"}): 0.5, pt._key({"b": "b"}): 1.0}
