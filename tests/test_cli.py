"""The torch-htam command line, end to end on the CPU (each subcommand's GPU work is tested in
its own module; here: dispatch, exit codes and messages a user sees)."""
import subprocess
import sys

import pytest
import torch

from torch_htam.cli import main


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "torch_htam.cli", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for cmd in ("plan", "optimize", "precompile", "bench", "cache"):
        assert cmd in out.stdout


def test_plan_prints_the_tasks(capsys):
    assert main(["plan", "examples/gpt_block.py", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "layer_norm" in out and "linear" in out


def test_plan_of_a_missing_file_says_so(capsys):
    assert main(["plan", "no/such/model.py"]) != 0
    captured = capsys.readouterr()
    assert "no/such/model.py" in captured.out + captured.err


def test_optimize_without_gpu_reports_the_original_path(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["optimize", "examples/gpt_block.py", "--steps", "1"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


def test_bench_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "examples/gpt_block.py"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_commands_load_the_model_on_cuda_when_there_is_one(monkeypatch):
    """examples' get_model() defaults to the CPU; optimize/precompile/bench must ask for cuda."""
    from torch_htam import cli
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: seen.append(device) or (_ for _ in ()).throw(SystemExit(0)))
    for cmd in (["optimize", "m.py"], ["precompile", "m.py", "--out", "b"], ["optimize", "m.py", "--device", "cuda:1"]):
        with pytest.raises(SystemExit):
            cli.main(cmd)
    assert seen == ["cuda", "cuda", "cuda:1"]


def test_cache_ls_on_an_empty_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    assert main(["cache", "ls", "--arch", "sm_90a"]) == 0


def test_bad_memory_mode_is_rejected_by_argparse():
    with pytest.raises(SystemExit):
        main(["optimize", "examples/gpt_block.py", "--memory", "graph"])
