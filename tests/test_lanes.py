"""bench/lanes.py on the CPU: rows measured at once, each in a lane of its own (one GPU, a share
of the cores, its own caches), in the names' order in the results, a failing row recorded while
the others go on."""
import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_floor as bf  # noqa: E402
import lanes  # noqa: E402


def test_lanes_share_the_cores_equally_each_with_its_gpu_and_caches(tmp_path):
    got = lanes.split(2, str(tmp_path), cpus=[5, 0, 1, 2, 3, 4, 6])
    assert [(x.gpu, x.cpus) for x in got] == [(0, (0, 1, 2)), (1, (3, 4, 5))]   # core 6 left over
    env = got[1].env({"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["PATH"] == "/bin"
    assert env["TORCHINDUCTOR_CACHE_DIR"] != got[0].env({})["TORCHINDUCTOR_CACHE_DIR"]
    assert env["HTAM_CACHE_DIR"].startswith(str(tmp_path))
    assert got[1].to_json() == {"gpu": 1, "cpus": "3-5"}
    with pytest.raises(ValueError, match="at least 3 CPU cores"):
        lanes.split(3, str(tmp_path), cpus=[0, 1])
    with pytest.raises(ValueError, match="at least 1"):
        lanes.split(0, str(tmp_path), cpus=[0, 1])


def test_more_lanes_than_gpus_end_the_run_before_any_row():
    """A lane is one GPU: --lanes 2 on a one-GPU host says so at once, not as each row's
    "No CUDA GPUs are available" minutes in."""
    from types import SimpleNamespace
    assert bf.lanes_of(SimpleNamespace(lanes=1), "suite", gpus=0) is None
    with pytest.raises(SystemExit, match="--lanes 2 needs 2 GPUs, one a lane, and this host shows 1"):
        bf.lanes_of(SimpleNamespace(lanes=2), "suite", gpus=1)


def test_rows_run_one_per_lane_at_once_and_keep_the_names_order(tmp_path):
    two = lanes.split(2, str(tmp_path), cpus=[0, 1])
    running, most, kept = set(), [0], []
    lock = threading.Lock()

    def run_one(name, lane):
        with lock:
            assert lane.gpu not in {g for _, g in running}, "two rows on one lane"
            running.add((name, lane.gpu))
            most[0] = max(most[0], len(running))
        time.sleep({"a": 0.4, "b": 0.1, "c": 0.1, "d": 0.1}[name])
        with lock:
            running.discard((name, lane.gpu))
        if name == "c":
            raise RuntimeError("row c broke")
        return {"model": name}

    rows = bf.run_rows(["a", "b", "c", "d"], bf.parse(["--device", "cpu"]), run_one,
                       keep=lambda rs: kept.append([r["model"] for r in rs]),
                       failed=lambda name, text: {"model": name, "error": text.strip().splitlines()[-1]},
                       fmt=lambda row: row["model"], lanes=two)
    assert [r["model"] for r in rows] == ["a", "b", "c", "d"] and most[0] == 2
    assert rows[2]["error"] == "RuntimeError: row c broke" and "error" not in rows[3]
    assert all(r["lane"]["gpu"] in (0, 1) for r in rows)
    # b, c and d finish on lane 1 while a holds lane 0; each file write keeps the names' order
    assert kept[0] == ["b"] and kept[-1] == ["a", "b", "c", "d"] and len(kept) == 4


def test_a_row_process_runs_on_its_lane(tmp_path):
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity and two cores")
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time
        time.sleep(0.5)                     # the parent pins this process right after its start
        json.dump({"model": sys.argv[2], "stage": "done", "gpu": os.environ["CUDA_VISIBLE_DEVICES"],
                   "cache": os.environ["TORCHINDUCTOR_CACHE_DIR"], "cpus": sorted(os.sched_getaffinity(0))},
                  open(sys.argv[1], "w"))
    """))
    lane = lanes.split(2, str(tmp_path / "caches"))[1]
    row = bf.run_child("a:fp32", bf.parse(["--device", "cpu"]), 20,
                       command=lambda name, opts, out: [sys.executable, str(script), str(out), name], lane=lane)
    assert row["gpu"] == "1" and row["cpus"] == list(lane.cpus)
    assert row["cache"].startswith(str(tmp_path / "caches" / "lane1"))
    json.dumps(row)
