"""bench/heldout.py on tiny zoo models (CPU): the split rules hold on what it writes.

Train is small llama, test small t5 (they share RMSNorm and projection regions, so the train/test
rule has something to drop) and gpt2, which is made to fail (a family that cannot be captured is
skipped, not fatal). The exclude folder holds one bench/tasks file and one of t5's own tasks, so
the exclude rule has something to drop too.
"""
import json
import shutil
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import heldout     # noqa: E402
import model_zoo   # noqa: E402

from torch_htam.extract import extract, task_from_source   # noqa: E402
from torch_htam.task import export_tasks                    # noqa: E402

TRAIN, TEST, BROKEN = ["llama:bf16"], ["t5:bf16", "gpt2:bf16"], "gpt2:bf16"


def signatures(row: str) -> dict:
    """{signature: task} of a small row, extracted on its own."""
    model, inputs = model_zoo.make(row, small=True, device="cpu")
    return {t.signature: t for t in extract(model, inputs).tasks}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(manifest, out folder, excluded t5 signature): one small run for every test here."""
    tmp = tmp_path_factory.mktemp("heldout")
    exclude = tmp / "exclude"
    shutil.copy(BENCH / "tasks" / "rw_rmsnorm_bf16.py", exclude.mkdir() or exclude)
    t5 = signatures("t5:bf16")
    train_sigs = set(signatures("llama:bf16"))
    # a t5 task only t5 has, that anytime can prepare: only the exclude rule may drop it
    own = next(t for s, t in t5.items() if s not in train_sigs and heldout.prepare(t)["problem"] is None)
    export_tasks([own], exclude)
    (exclude / "tasks.json").unlink()
    make = model_zoo.make

    def failing(row, *a, **k):
        if row == BROKEN:
            raise RuntimeError("cannot capture this family on CPU")
        return make(row, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(heldout.model_zoo, "make", failing)
    try:
        out = tmp / "out"
        heldout.main(["--small", "--train", *TRAIN, "--test", *TEST, "--out", str(out),
                      "--exclude", str(exclude)])
    finally:
        mp.undo()
    return json.loads((out / "manifest.json").read_text()), out, own.signature, train_sigs, t5


def test_no_signature_in_both_sets(built):
    m, out, _, train_sigs, t5 = built
    test = {r["signature"] for r in m["sets"]["test"]} | {r["file_signature"] for r in m["sets"]["test"]}
    train = {r["signature"] for r in m["sets"]["train"]} | {r["file_signature"] for r in m["sets"]["train"]}
    assert m["sets"]["test"] and m["sets"]["train"]
    assert not test & train
    # t5 and llama do share regions: none of those is tested, though llama showed them
    assert set(t5) & train_sigs
    assert not test & train_sigs


def test_no_task_from_the_exclude_folder(built):
    m, out, own, _, _ = built
    excluded = {task_from_source(p.read_text(), p.stem).signature
                for p in (out.parent / "exclude").glob("*.py")}
    for rows in m["sets"].values():
        for r in rows:
            assert r["signature"] not in excluded and r["file_signature"] not in excluded
    assert m["excluded"] == 2
    # t5's own task is tested unless excluded: the exclude folder took it out
    assert own not in {r["signature"] for r in m["sets"]["test"]}


def test_files_load_as_anytime_loads_them(built):
    m, out, _, _, _ = built
    for name, rows in m["sets"].items():
        files = sorted((out / name).glob("*.py"))
        assert sorted(out / r["file"] for r in rows) == files   # no stale or missing file
        for r in rows:
            path = out / r["file"]
            task = task_from_source(path.read_text(), path.stem)
            assert task.signature == r["file_signature"] and task.kind == r["kind"]


def test_manifest_fields(built):
    m, _, _, _, _ = built
    for key in ("command", "train_rows", "test_rows", "models", "sets", "kinds", "dropped",
                "skipped", "seconds", "bytes"):
        assert key in m
    assert "--small" in m["command"]
    for name, rows in m["sets"].items():
        assert len({r["kind"] for r in rows}) >= 2   # a mix of region kinds
        assert m["kinds"][name] == {k: sum(r["kind"] == k for r in rows) for k in m["kinds"][name]}
        for r in rows:
            assert r["row"] in m[f"{name}_rows"]
            assert 1 <= r["count"] <= r["regions"] == m["models"][r["row"]]["regions"]


def test_a_failing_family_is_skipped(built):
    m, _, _, _, _ = built
    assert [s["row"] for s in m["skipped"]] == [BROKEN]
    assert "cannot capture" in m["skipped"][0]["why"]
    assert BROKEN not in m["models"]


def test_a_row_in_both_sets_is_refused(tmp_path):
    with pytest.raises(ValueError, match="both sets"):
        heldout.build(["t5:bf16"], ["t5:bf16"], tmp_path, tmp_path, small=True, command="")


def test_a_sample_keeps_every_kind_in_proportion_and_its_shards_partition_it():
    kinds = {"conv": 40, "gemm": 30, "rowwise": 20, "attention": 2, "elementwise": 8}
    manifest = {"sets": {"test": [{"file": f"test/{k}_{i}.py", "kind": k}
                                  for k, n in kinds.items() for i in range(n)]}}
    got = heldout.sample(manifest, "test", 25, seed=3)
    assert len(got) == len(set(got)) == 25
    drawn = {k: sum(f.startswith(f"test/{k}_") for f in got) for k in kinds}
    assert drawn == {"conv": 10, "gemm": 7, "rowwise": 5, "attention": 1, "elementwise": 2}
    assert got == heldout.sample(manifest, "test", 25, seed=3)
    assert got != heldout.sample(manifest, "test", 25, seed=4)
    parts = [heldout.shard(got, f"{i}/4") for i in range(4)]
    assert sorted(sum(parts, [])) == sorted(got)
    # kinds alternate, so each shard of four gets at least three kinds
    assert all(len({f.split("/")[1].split("_")[0] for f in p}) >= 3 for p in parts)
    assert len(heldout.sample(manifest, "test", 500)) == 100
    with pytest.raises(ValueError):
        heldout.shard(got, "4/4")
