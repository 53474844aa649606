"""bench/prior_transfer.py on hand-made tables: a setting that won on the train tables is walked
right after the defaults on a test table of the same kind, and only there."""
import math
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


def sized(kind: str, ms: dict[str, float], features: list[float], name: str = "t") -> dict:
    """table() with its task's log2 sizes given (as features() would read them from its task file)."""
    return {**table(kind, ms, name), "features": features}


def test_neighbours_rank_the_nearest_tasks_winner_first_not_the_kinds():
    # "big" wins on the two large GEMMs, "small" on the one small GEMM: over the kind, "big" leads
    train = [sized("gemm", {"d": 1.0, "big": 0.5, "small": 0.9}, [14, 12, 12], "l1"),
             sized("gemm", {"d": 1.0, "big": 0.5, "small": 0.9}, [13, 12, 12], "l2"),
             sized("gemm", {"d": 1.0, "big": 0.9, "small": 0.5}, [6, 8, 8], "s")]
    test = sized("gemm", {"d": 1.0, "a": 0.8, "big": 0.9, "c": 0.8, "small": 0.5, "e": 0.8}, [7, 8, 8])
    kind = pt.learn(train, "hit99")
    assert kind[("gemm", pt._key({"b": "big"}))] > kind[("gemm", pt._key({"b": "small"}))]
    near = pt.learn_near(test, train, "hit99")
    assert near[("gemm", pt._key({"b": "small"}))] > 0.9 > 0.1 > near[("gemm", pt._key({"b": "big"}))]
    assert pt.walk(test, near, seeds=10)[0] == 2                 # the defaults, then small
    assert pt.walk(test, kind, seeds=10)[0] == 3                 # big walked before it
    by_near = pt.measure([test], train, "hit99", 10, by="neighbours")
    assert by_near["saving"] > pt.measure([test], train, "hit99", 10, by="kind")["saving"]
    # a large test task keeps "big" first, and k=1 listens to the nearest table alone
    large = sized("gemm", {"d": 1.0, "small": 0.9, "big": 0.5}, [13, 12, 12])
    assert pt.walk(large, pt.learn_near(large, train, "hit99"), seeds=10)[0] == 2
    assert pt.learn_near(test, train, "mean", k=1) == pt.learn([train[2]], "mean")


def test_neighbours_weigh_by_nearness_and_skip_other_kinds_and_empty_tables():
    far = sized("gemm", {"d": 1.0}, [3, 0, 0], "far")
    near = sized("gemm", {"d": 1.0}, [1, 0, 0], "near")
    empty = {**sized("gemm", {"d": 1.0}, [0, 0, 0], "empty"), "rows": [{"params": {"b": "d"}, "correct": False}]}
    conv = sized("conv", {"d": 1.0}, [0, 0, 0], "conv")
    tables, weights = pt.neighbours(sized("gemm", {"d": 1.0}, [0, 0, 0]), [far, empty, conv, near])
    assert [t["path"] for t in tables] == ["/x/near.py", "/x/far.py"] and weights == [0.5, 0.125]
    assert pt.neighbours(sized("gemm", {"d": 1.0}, [0, 0, 0]), [far, near], k=1)[0] == [near]
    # a weighted mean: a share of 1 at weight 0.5 and 0.5 at weight 0.125 -> 0.9
    a, b = table("gemm", {"x": 1.0, "y": 2.0}), table("gemm", {"y": 1.0, "x": 2.0})
    assert abs(pt.learn([a, b], "mean", [0.5, 0.125])[("gemm", pt._key({"b": "x"}))] - 0.9) < 1e-12


TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, in0, in1, in2):
        v3 = torch.ops.aten.conv2d.default(in0, in1, in2, [2, 2], [1, 1], [1, 1], {groups})
        v4 = torch.ops.aten.cat.default([v3, v3], 1)
        return v4


def get_inputs():
    return [
        _rand((2, 8, 32, 32), (8192, 1024, 32, 1), torch.bfloat16),
        _rand(({out}, {cin}, 3, 3), ({cin9}, 9, 3, 1), torch.bfloat16),
        _rand(({out},), (1,), torch.bfloat16),
    ]
'''


def test_features_read_a_convs_sizes_from_its_task_file(tmp_path):
    def conv(groups, out, cin):
        f = tmp_path / f"conv_{groups}.py"
        f.write_text(TASK.format(groups=groups, out=out, cin=cin, cin9=9 * cin))
        return pt.features({"kind": "conv", "path": str(f)})
    # 3x3, stride 2, padding 1 on 32x32: 16x16 out, x2 images = 512 pixels; K = 8 x 9 = 72
    assert conv(1, 16, 8) == tuple(math.log2(n) for n in (512, 16, 72, 1))
    assert conv(8, 8, 1) == tuple(math.log2(n) for n in (512, 8, 9, 8))   # depthwise: K = 9, groups 8


def test_features_of_the_heldout_task_files():
    def of(name):
        return tuple(round(2 ** f) for f in pt.features({"kind": "?", "path": f"/gone/train/{name}.py"}))
    assert of("gemm_linear_37591b50d9acf5d9") == (16 * 28 * 28, 192, 768)           # M, N, K
    assert of("conv_conv2d_f028dd549e648993") == (16 * 56 * 56, 96, 3 * 4 * 4, 1)   # 4x4 stride 4
    assert of("rowwise_add_layer_norm_261630ca4b68d2d6") == (16 * 7 * 7, 768)       # rows, row length
    assert of("rowwise_group_norm_silu_365c2fc6518d30da") == (8 * 32, 1024 // 32 * 16 * 16)


def test_both_priors_in_one_run_with_each_protocols_kinds():
    models = {"a.py": "A", "b.py": "B", "b2.py": "B", "c.py": "C"}     # x wins on large tasks, y on small
    train = [sized("gemm", {"d": 1.0, "x": 0.5, "y": 0.9}, [10, 10, 10], "a"),
             sized("gemm", {"d": 1.0, "x": 0.9, "y": 0.5}, [5, 5, 5], "b"),
             sized("gemm", {"d": 1.0, "x": 0.9, "y": 0.5}, [5, 5, 4], "b2")]
    rows = pt.run([sized("gemm", {"d": 1.0, "x": 0.5, "y": 0.9}, [9, 10, 10], "c")], train, models, 5)
    assert sorted({(r["protocol"], r["prior"]) for r in rows}) == [
        ("held out", "kind"), ("held out", "neighbours"), ("train LOMO", "kind"), ("train LOMO", "neighbours")]
    assert len(rows) == 2 * 2 * len(pt.RULES)
    assert all(r["kinds"]["gemm"]["tasks"] == (1 if r["protocol"] == "held out" else 3) for r in rows)
    held = {r["prior"]: r for r in rows if r["protocol"] == "held out" and r["rule"] == "mean"}
    assert held["neighbours"]["kinds"]["gemm"]["prior_to99"] == 2 < held["kind"]["kinds"]["gemm"]["prior_to99"]
