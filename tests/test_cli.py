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


def test_bench_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "examples/gpt_block.py"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_commands_load_the_model_on_cuda_when_there_is_one(monkeypatch):
    """examples' get_model() defaults to the CPU; optimize/precompile/bench must ask for cuda."""
    from torch_htam import cli
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: object())
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: seen.append(device) or (_ for _ in ()).throw(SystemExit(0)))
    for cmd in (["optimize", "m.py"], ["precompile", "m.py", "--out", "b"], ["optimize", "m.py", "--device", "cuda:1"]):
        with pytest.raises(SystemExit):
            cli.main(cmd)
    assert seen == ["cuda", "cuda", "cuda:1"]


def test_bad_memory_mode_is_rejected_by_argparse():
    with pytest.raises(SystemExit):
        main(["optimize", "examples/gpt_block.py", "--memory", "graph"])


# ---- every command that loads a model: one helper, clean errors, no traceback -------------------

def _no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("HTAM_ARCH", raising=False)


@pytest.mark.parametrize("cmd", [["plan"], ["optimize"], ["precompile", "--out", "b", "--arch", "sm_90a"],
                                 ["bench"]])
def test_device_cuda_without_a_gpu_is_a_clean_error(monkeypatch, capsys, cmd):
    _no_gpu(monkeypatch)
    code = main([cmd[0], "examples/gpt_block.py", "--device", "cuda", *cmd[1:]])
    captured = capsys.readouterr()
    assert code == 1
    assert "error: --device cuda: no CUDA device is available here" in captured.err
    assert "use --device cpu" in captured.err and "Traceback" not in captured.out + captured.err


def test_device_index_past_the_last_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["optimize", "examples/gpt_block.py", "--device", "cuda:3"]) == 1
    assert "--device cuda:3" in capsys.readouterr().err


def test_unknown_device_string(capsys):
    assert main(["plan", "examples/gpt_block.py", "--device", "gpu0"]) == 1
    assert "error: --device gpu0" in capsys.readouterr().err


def test_syntax_error_in_the_model_file(tmp_path, capsys):
    bad = tmp_path / "x.py"
    bad.write_text("import torch\n\ndef get_model(:\n    pass\n")
    for cmd in ("plan", "optimize"):
        assert main([cmd, str(bad), "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert f"error: {bad}:3: " in err and "(could not import the model file)" in err
        assert "get_model() raised" not in err and "Traceback" not in err


def test_import_error_in_the_model_file(tmp_path, capsys):
    bad = tmp_path / "x.py"
    bad.write_text("import torch\nimport no_such_module_xyz\n")
    assert main(["plan", str(bad), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"could not import {bad}: " in err and "no_such_module_xyz" in err
    assert "get_model() raised" not in err


def test_get_model_raising_is_reported_as_such(tmp_path, capsys):
    bad = tmp_path / "x.py"
    bad.write_text("def get_model():\n    raise ValueError('bad config')\n")
    assert main(["optimize", str(bad), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "get_model() raised ValueError: bad config" in err and "Traceback" not in err


# ---- optimize: exit 3 when nothing was swapped ----------------------------------------------------

def test_optimize_that_swapped_nothing_exits_3(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    _no_gpu(monkeypatch)
    assert main(["optimize", "examples/gpt_block.py", "--steps", "1"]) == 3
    out = capsys.readouterr().out
    assert "0 region(s) swapped" in out and "no CUDA GPU" in out   # the report, with its reason


def test_optimize_that_swapped_exits_0(monkeypatch, capsys):
    from torch_htam.runtime import Report
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: object())
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: (torch.nn.Linear(2, 2), (torch.randn(1, 2),)))

    def fake_optimize(model, inputs, cfg):
        model.htam_report = Report(method="export", swapped=2)
        return model
    monkeypatch.setattr("torch_htam.pipeline.optimize", fake_optimize)
    assert main(["optimize", "m.py"]) == 0
    assert "2 region(s) swapped" in capsys.readouterr().out


# ---- precompile: --arch, an empty bundle, no GPU ---------------------------------------------------

def _fake_model(monkeypatch):
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: (torch.nn.Linear(2, 2), (torch.randn(1, 2),)))


def test_precompile_passes_arch(monkeypatch, capsys, tmp_path):
    _no_gpu(monkeypatch)
    _fake_model(monkeypatch)
    seen = {}

    def fake_precompile(model, inputs, out_dir, config=None, arch=None):
        seen.update(out_dir=out_dir, arch=arch)
        return tmp_path / "b"
    monkeypatch.setattr("torch_htam.pipeline.precompile", fake_precompile)
    assert main(["precompile", "m.py", "--out", "b", "--arch", "sm_90a"]) == 0
    assert seen == {"out_dir": "b", "arch": "sm_90a"}
    assert "bundle written to" in capsys.readouterr().out


def test_precompile_of_an_empty_bundle_is_an_error(monkeypatch, capsys):
    from torch_htam.errors import EmptyBundleError
    _no_gpu(monkeypatch)
    _fake_model(monkeypatch)

    def fake_precompile(model, inputs, out_dir, config=None, arch=None):
        raise EmptyBundleError("no kernel cached for sm_90a: run `torch-htam optimize` on that GPU")
    monkeypatch.setattr("torch_htam.pipeline.precompile", fake_precompile)
    assert main(["precompile", "m.py", "--out", "b", "--arch", "sm_90a"]) == 1
    captured = capsys.readouterr()
    assert "error: no kernel cached for sm_90a" in captured.err
    assert "bundle written" not in captured.out


def test_precompile_without_gpu_or_arch(monkeypatch, capsys):
    _no_gpu(monkeypatch)
    called = []
    monkeypatch.setattr("torch_htam.pipeline.precompile", lambda *a, **k: called.append(a))
    assert main(["precompile", "examples/gpt_block.py", "--out", "b"]) == 1
    assert ("error: no CUDA GPU detected: pass --arch (e.g. sm_90a) to bundle kernels already "
            "cached for that arch") in capsys.readouterr().err
    assert called == []


# ---- help: exit codes listed, cache subcommands real, no torch import -----------------------------

def test_help_lists_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes" in out and "3 " in out and "130" in out


def test_cache_help_lists_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    out = capsys.readouterr().out
    for cmd in ("ls", "show", "rm", "clear", "verify"):
        assert cmd in out
    assert "rest" not in out


def test_cli_help_imports_no_torch():
    # NOTE: a bare package module stands in for torch_htam/__init__.py (which imports torch for
    # Precision/Task): what is tested here is that cli.py itself keeps its imports lazy.
    code = ("import sys, types, importlib.util\n"
            "spec = importlib.util.find_spec('torch_htam')\n"
            "pkg = types.ModuleType('torch_htam'); pkg.__path__ = list(spec.submodule_search_locations)\n"
            "sys.modules['torch_htam'] = pkg\n"
            "import torch_htam.cli as cli\n"
            "for argv in (['--help'], ['cache', '--help'], ['optimize', '--help']):\n"
            "    try: cli.main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# ---- cache ------------------------------------------------------------------------------------------

def test_cache_ls_on_an_empty_cache_says_where_and_how_to_fill_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    assert main(["cache", "ls", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    from torch_htam import paths
    assert str(paths.arch_dir("sm_90a")) in out and "empty" in out
    assert "torch-htam optimize MODEL" in out


def test_cache_without_gpu_or_arch_asks_for_arch(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    _no_gpu(monkeypatch)
    assert main(["cache", "ls"]) == 1
    assert "--arch" in capsys.readouterr().err
    monkeypatch.setenv("HTAM_ARCH", "sm_80")
    assert main(["cache", "ls"]) == 0
    assert "sm_80-" in capsys.readouterr().out


# ---- option values: OptimizeConfig's validation, one line, exit 1, before the model loads ---------

@pytest.mark.parametrize("flags,named", [
    (["--steps", "-1"], "--steps -1: must be an int >= 0"),
    (["--candidates", "0"], "--candidates 0: must be an int >= 1"),
    (["--time-budget", "-5"], "--time-budget -5.0: must be a finite number of seconds > 0"),
    (["--time-budget", "nan"], "--time-budget nan: "),
    (["--max-tasks", "-3"], "--max-tasks -3: must be an int >= 1"),
    (["--llm-timeout", "-1"], "--llm-timeout -1.0: must be a finite number of seconds > 0"),
    (["--llm-timeout", "inf"], "--llm-timeout inf: "),
    (["--dynamic", "0:0=64"], "--dynamic 0:0=64: must be IN:DIM=LOW-HIGH"),
    (["--dynamic", "0:0=9-4"], "--dynamic {0: {0: (9, 4)}}: must be a dict"),
])
@pytest.mark.parametrize("cmd", [["optimize"], ["precompile", "--out", "b", "--arch", "sm_90a"], ["bench"]])
def test_bad_option_values_are_one_line_and_exit_1(monkeypatch, capsys, cmd, flags, named):
    loaded = []
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec", lambda *a, **k: loaded.append(a))
    assert main([cmd[0], "examples/gpt_block.py", *flags, *cmd[1:]]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}") and err.count("\n") == 1
    assert loaded == []   # said before the model is loaded


def test_good_option_values_reach_the_config(monkeypatch):
    from torch_htam import cli
    seen = {}
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: (torch.nn.Linear(2, 2), (torch.randn(1, 2),)))
    monkeypatch.setattr("torch_htam.pipeline.optimize", lambda m, x, cfg: seen.update(cfg=cfg) or (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        cli.main(["optimize", "m.py", "--steps", "0", "--candidates", "2", "--time-budget", "30",
                  "--max-tasks", "1", "--llm-timeout", "300", "--device", "cpu",
                  "--dynamic", "0:0=1-64", "--dynamic", "0:1=2-8"])
    cfg = seen["cfg"]
    assert (cfg.steps, cfg.candidates_per_step, cfg.time_budget_s, cfg.max_tasks) == (0, 2, 30.0, 1)
    assert cfg.dynamic == {0: {0: (1, 64), 1: (2, 8)}}
    assert cfg.llm.timeout_s == 300.0


def test_the_time_budget_is_bounded_unless_the_user_says_0(monkeypatch):
    """No --time-budget: optimize's default deadline (a model of 40 tasks would otherwise search
    for most of an hour); --time-budget 0: only the steps bound it."""
    from torch_htam import cli
    from torch_htam.config import DEFAULT_TIME_BUDGET_S, OptimizeConfig
    seen = []
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec",
                        lambda spec, device=None, dtype=None: (torch.nn.Linear(2, 2), (torch.randn(1, 2),)))
    monkeypatch.setattr("torch_htam.pipeline.optimize",
                        lambda m, x, cfg: seen.append(cfg.time_budget_s) or (_ for _ in ()).throw(SystemExit(0)))
    for extra in ([], ["--time-budget", "0"]):
        with pytest.raises(SystemExit):
            cli.main(["optimize", "m.py", "--device", "cpu", *extra])
    assert seen == [DEFAULT_TIME_BUDGET_S, None]
    assert OptimizeConfig().time_budget_s == DEFAULT_TIME_BUDGET_S


# ---- exit codes: the README and --help say what the code does --------------------------------------

def _readme_exit_codes() -> dict[int, str]:
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    para = " ".join(text.split("Exit codes:", 1)[1].split("\n\n", 1)[0].split())
    return {int(m[0]): m[1] for m in re.findall(r"(?:^|; )(\d+) (.*?)(?=; \d+ |$)", para)}


def test_readme_exit_codes_match_the_cli(capsys):
    import re
    from torch_htam.cli import EXIT_CODES
    codes = _readme_exit_codes()
    with pytest.raises(SystemExit) as usage:                      # argparse: unknown option
        main(["plan", "examples/gpt_block.py", "--no-such-option"])
    assert "command line" in codes[usage.value.code] and "argparse" in codes[usage.value.code]
    assert main(["optimize", "examples/gpt_block.py", "--steps", "-1"]) == 1   # a bad value
    assert "value" in codes[1] and "--steps" in codes[1]
    assert main(["cache", "ls", "--arch", "banana"]) == 1
    assert "--arch" in codes[1]
    parts = re.split(r"\n  (\d+) +", EXIT_CODES)                 # --help's table: code, text, ...
    help_codes = {int(c): " ".join(t.split()) for c, t in zip(parts[1::2], parts[2::2])}
    assert "argparse" in help_codes[usage.value.code] and "bad option value" in help_codes[1]


# ---- plan --export to a path that is not a writable folder --------------------------------------

def test_plan_export_to_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "tasks.txt"
    f.write_text("mine")
    for target in (f, f / "sub"):
        assert main(["plan", "examples/gpt_block.py", "--device", "cpu", "--export", str(target)]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(f"error: --export {target}: ") and captured.err.count("\n") == 1
        assert captured.out == ""   # said before the capture, no table
    assert f.read_text() == "mine"


def test_plan_export_that_fails_to_write_is_one_line(tmp_path, capsys, monkeypatch):
    def denied(tasks, directory):
        raise PermissionError(13, "Permission denied", str(directory))
    monkeypatch.setattr("torch_htam.plan.export_tasks", denied)
    assert main(["plan", "examples/gpt_block.py", "--device", "cpu", "--export", str(tmp_path / "kb")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --export {tmp_path / 'kb'}: ") and "Permission denied" in err
    assert err.count("\n") == 1


# ---- module:function specs import from the current directory, as `python -m` does ----------------

def test_module_spec_imports_from_the_current_directory(tmp_path, monkeypatch, capsys):
    import os
    pkg = tmp_path / "htam_cwd_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text("import torch\n\ndef get_model():\n"
                                "    return torch.nn.Linear(8, 8).eval(), (torch.randn(2, 8),)\n")
    monkeypatch.chdir(tmp_path)
    # the `torch-htam` script's sys.path: its own folder first, not the current directory
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    before = list(sys.path)
    assert main(["plan", "htam_cwd_models.net:get_model", "--device", "cpu"]) == 0
    assert "linear" in capsys.readouterr().out
    assert sys.path == before                       # the current directory was not left on it
    for name in ("htam_cwd_models.net", "htam_cwd_models"):
        sys.modules.pop(name, None)


def test_readme_quick_start_spec_runs_from_the_repository_root():
    """`torch-htam plan examples.gpt_block:get_model`, as the installed script runs it."""
    import shutil
    from pathlib import Path
    script = shutil.which("torch-htam")
    if script is None:
        pytest.skip("torch-htam is not installed as a script")
    out = subprocess.run([script, "plan", "examples.gpt_block:get_model", "--device", "cpu"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "9 tasks" in out.stdout


# ---- read-only commands write nothing; a failed precompile leaves no folder ----------------------

def test_plan_creates_no_folder_or_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    from pathlib import Path
    model = str(Path(__file__).resolve().parents[1] / "examples" / "gpt_block.py")
    assert main(["plan", model, "--device", "cpu"]) == 0
    assert main(["plan", model, "--device", "cpu", "--json"]) == 0
    assert not (tmp_path / "cache").exists() and list(work.iterdir()) == []


def test_precompile_rejects_an_unknown_arch(monkeypatch, capsys, tmp_path):
    _no_gpu(monkeypatch)
    called = []
    monkeypatch.setattr("torch_htam.pipeline.precompile", lambda *a, **k: called.append(a))
    assert main(["precompile", "examples/gpt_block.py", "--out", str(tmp_path / "b"), "--arch", "banana"]) == 1
    assert "error: --arch 'banana': not a GPU arch" in capsys.readouterr().err
    monkeypatch.setenv("HTAM_ARCH", "hopper")
    assert main(["precompile", "examples/gpt_block.py", "--out", str(tmp_path / "b")]) == 1
    assert "error: $HTAM_ARCH 'hopper': not a GPU arch" in capsys.readouterr().err
    assert called == [] and not (tmp_path / "b").exists()


def _cached_model_on_cpu(tmp_path, monkeypatch):
    """A model on the CPU whose every task has a (fake) verified kernel cached for sm_90a."""
    from torch_htam.cache import KernelCache
    from torch_htam.evaluation import Evaluation
    from torch_htam.extract import extract_tasks
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "cache"))
    _no_gpu(monkeypatch)
    model, x = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).eval(), torch.randn(4, 32)
    cache = KernelCache("sm_90a")
    for t in extract_tasks(model, (x,)):
        so = tmp_path / f"{t.signature}.so"
        so.write_bytes(b"\x7fELF fake")
        ev = Evaluation(True, "ok", policy={"name": "fp32"}, ref_ms=0.02, kernel_ms=0.01, speedup=2.0)
        cache.put(t, "// kernel\n", so, ev, {"proposer": "expert"})
    monkeypatch.setattr("torch_htam.modelspec.load_model_spec", lambda spec, device=None, dtype=None: (model, (x,)))


@pytest.mark.parametrize("out", ["b", "new/deeper/b"])
def test_a_failed_precompile_removes_the_folder_it_made(tmp_path, monkeypatch, capsys, out):
    _cached_model_on_cpu(tmp_path, monkeypatch)

    def broken(*a, **k):
        raise RuntimeError("no golden record today")
    monkeypatch.setattr("torch_htam.golden.record", broken)
    assert main(["precompile", "m.py", "--out", str(tmp_path / out), "--arch", "sm_90a"]) == 1
    assert "golden record of every kernel failed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["cache", *(p.name for p in tmp_path.glob("*.so"))])


def test_a_failed_precompile_keeps_a_folder_that_was_there(tmp_path, monkeypatch, capsys):
    _cached_model_on_cpu(tmp_path, monkeypatch)
    monkeypatch.setattr("torch_htam.golden.record", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    (tmp_path / "b").mkdir()
    assert main(["precompile", "m.py", "--out", str(tmp_path / "b"), "--arch", "sm_90a"]) == 1
    assert (tmp_path / "b").is_dir()


def test_precompile_on_cpu_writes_a_bundle(tmp_path, monkeypatch, capsys):
    """The counterpart of the failures above: the same setup with golden records works."""
    _cached_model_on_cpu(tmp_path, monkeypatch)
    assert main(["precompile", "m.py", "--out", str(tmp_path / "b"), "--arch", "sm_90a"]) == 0
    assert (tmp_path / "b" / "manifest.json").is_file()


def test_precompile_of_several_models_runs_the_fleet(monkeypatch, capsys):
    # several specs (or --ray): fleet.precompile_specs, one bundle per model; a model whose bundle
    # failed makes the exit code 1 and says why
    from types import SimpleNamespace
    _no_gpu(monkeypatch)
    seen, closed = {}, []

    class Pool:
        def close(self):
            closed.append(True)

    def fake_fleet(specs, out_dir, arch, cfg=None, address=None, pool=None, device=None, search=None):
        seen.update(specs=specs, out_dir=out_dir, arch=arch, address=address, pool=pool, search=search)
        return SimpleNamespace(line=lambda: "fleet: 3/3 tasks done",
                               data={"bundles": {"a": {"path": "b/a"}, "b": {"error": "no kernel"}}})
    monkeypatch.setattr("torch_htam.worker.WorkerPool", Pool)
    monkeypatch.setattr("torch_htam.fleet.precompile_specs", fake_fleet)
    # no GPU here: nothing is searched, what the cache holds for the arch is bundled
    assert main(["precompile", "a.py", "b.py", "--out", "b", "--arch", "sm_90a"]) == 1
    assert seen["pool"] is None and seen["search"] is not None
    capsys.readouterr()
    monkeypatch.setattr("torch_htam.gpu.detect", lambda device=0: SimpleNamespace(arch="sm_90a"))
    assert main(["precompile", "a.py", "b.py", "--out", "b", "--arch", "sm_90a"]) == 1
    assert seen["specs"] == ["a.py", "b.py"] and seen["arch"] == "sm_90a" and seen["address"] is None
    assert isinstance(seen["pool"], Pool) and closed == [True]    # this host's GPUs, pool closed
    assert seen["search"] is None
    out = capsys.readouterr().out
    assert "fleet: 3/3 tasks done" in out and "b/a" in out and "no bundle: no kernel" in out

    monkeypatch.setattr("torch_htam.ray_pool.import_ray", lambda: None)
    assert main(["precompile", "a.py", "--out", "b", "--arch", "sm_90a", "--ray", "auto"]) == 1
    assert seen["address"] == "auto" and seen["pool"] is None     # the fleet makes the Ray pool


# ---- torch-htam libraries ------------------------------------------------------------------------

@pytest.fixture
def fake_builds(monkeypatch, tmp_path):
    """Every library counts as buildable here; build.library records the names it was asked to
    build and writes a file where the library goes (fail: names whose build fails)."""
    from torch_htam import build
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build.paths, "nvcc_path", lambda: "/usr/bin/nvcc")
    for name, lib in build.OUR_LIBRARIES.items():
        monkeypatch.setitem(build.OUR_LIBRARIES, name, type(lib)(lambda: [], lib.version, lib.missing, lib.archs))
    asked, fail = [], set()

    def library(name, arch):
        asked.append(name)
        if name in fail:
            return None, f"building the {name} library failed: nvcc failed"
        so = build.library_path(name, arch)
        so.parent.mkdir(parents=True, exist_ok=True)
        so.write_bytes(b"")
        return so, ""
    monkeypatch.setattr(build, "library", library)
    return asked, fail


def test_libraries_build_builds_what_the_arch_can_have_once(fake_builds, capsys):
    asked, _ = fake_builds
    assert main(["libraries", "ls", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert out.count("not built") == 3 and "torch-htam libraries build cutlass_gemm --arch sm_90a" in out
    assert main(["libraries", "build", "--arch", "sm_90a"]) == 0
    assert sorted(asked) == ["cudnn_sdpa", "cutlass_conv", "cutlass_gemm"]
    assert main(["libraries", "build", "--arch", "sm_90a"]) == 0 and len(asked) == 3   # built: not again
    assert main(["libraries", "ls", "--arch", "sm_90a"]) == 0
    assert capsys.readouterr().out.count(" built ") == 3


def test_libraries_build_skips_another_archs_unless_named(fake_builds, capsys):
    asked, _ = fake_builds
    assert main(["libraries", "build", "--arch", "sm_80"]) == 0 and asked == ["cudnn_sdpa"]
    assert "cutlass_gemm: not for this arch: the cutlass_gemm library builds for sm_90a only" in capsys.readouterr().err
    assert main(["libraries", "build", "cutlass_gemm", "--arch", "sm_80"]) == 1


def test_libraries_build_failures_and_unknown_names_exit_1(fake_builds, capsys):
    asked, fail = fake_builds
    fail.add("cutlass_conv")
    assert main(["libraries", "build", "cutlass_conv", "cutlass_gemm", "--arch", "sm_90a"]) == 1
    err = capsys.readouterr().err
    assert "cutlass_conv library failed: nvcc failed" in err and "cutlass_gemm: built at" in err
    assert main(["libraries", "build", "cutlas_gemm", "--arch", "sm_90a"]) == 1
    assert "no library named cutlas_gemm" in capsys.readouterr().err


def test_libraries_without_gpu_or_arch_asks_for_arch(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    _no_gpu(monkeypatch)
    assert main(["libraries", "ls"]) == 1
    assert "--arch" in capsys.readouterr().err
    assert main(["libraries", "ls", "--arch", "sm90"]) == 1
    assert "not a GPU arch" in capsys.readouterr().err
