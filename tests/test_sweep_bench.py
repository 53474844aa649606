"""bench/sweep.py: the report on fabricated rows, task discovery, and the no-GPU exit."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sweep_bench", ROOT / "bench" / "sweep.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def _res():
    base = {"tpr": 256, "vec": 8, "nv": 2, "packed": False, "occ": 0}
    rows = [
        {"params": base, "default": True, "reason": "ok", "kernel_ms": 0.04, "ref_ms": 0.03,
         "speedup": 0.75, "bw": 0.5},
        {"params": dict(base, packed=True), "default": False, "reason": "ok", "kernel_ms": 0.02,
         "ref_ms": 0.03, "speedup": 1.5, "bw": 0.9},
        {"params": dict(base, occ=2048), "default": False, "reason": "mismatch", "kernel_ms": None,
         "ref_ms": None, "speedup": None, "bw": None},
    ]
    return {"task": "t", "kind": "rowwise", "policy": "bf16", "settings": 3, "seconds": 1.0, "rows": rows}


def test_report_ranks_by_time_and_names_what_differs_from_the_defaults():
    lines = sweep.report(_res(), top=1)
    assert lines[0].startswith("### t (rowwise, bf16): 2/3 verified, defaults rank 2")
    assert "rejected: mismatch" in lines[0]
    body = [ln for ln in lines if ln.startswith("| ") and "setting" not in ln]
    assert body[0].startswith("| packed=1 | 0.0200 |") and "90%" in body[0]
    assert body[1].startswith("| (defaults) tpr=256 vec=8 nv=2 packed=0 occ=0 | 0.0400")   # shown beyond top


def test_task_files_takes_files_and_folders():
    files = sweep.task_files([str(ROOT / "bench" / "tasks"), str(ROOT / "examples" / "gpt_block.py")])
    assert len(files) > 20 and files[-1].name == "gpt_block.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_gpu_exits_with_a_message(capsys):
    assert sweep.main([str(ROOT / "bench" / "tasks" / "rw_rmsnorm_bf16.py")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
