"""bench/optimize_time.py's reading of trajectory files on the CPU: per task search, when it
started and ended relative to the first search, its summary, and its candidates' build seconds."""
import json
from pathlib import Path

from test_floor_bench import _load   # a bench/ script as a module (bench/ is no package)

ROOT = Path(__file__).resolve().parents[1]
ot = _load("optimize_time", ROOT / "bench" / "optimize_time.py")


def _write(path: Path, task: str, events: list[tuple[str, str, dict]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"event": e, "task": task, "time": t, **f}) + "\n" for e, t, f in events))


def test_searches_in_start_order_with_their_build_seconds(tmp_path):
    traj = tmp_path / "sm_90a" / "trajectories"
    _write(traj / "a.jsonl", "late", [
        ("start", "2026-11-27T02:00:10+00:00", {}),
        ("candidate", "2026-11-27T02:00:14+00:00", {"build_s": 2.5}),
        ("candidate", "2026-11-27T02:00:15+00:00", {"build_s": None}),     # a cache hit
        ("summary", "2026-11-27T02:00:16+00:00", {"stop": "steps", "candidates": 2, "correct": 1,
                                                  "best_speedup": 1.5, "wall_s": 6.0})])
    _write(traj / "b.jsonl", "early", [
        ("start", "2026-11-27T02:00:00+00:00", {}),
        ("candidate", "2026-11-27T02:00:09+00:00", {"build_s": 4.0})])     # cut before its summary
    rows = ot.searches(tmp_path)
    assert [r["task"] for r in rows] == ["early", "late"]
    assert (rows[0]["started"], rows[0]["ended"], rows[0]["build_s"], rows[0].get("stop")) == (0.0, 9.0, 4.0, None)
    assert (rows[1]["started"], rows[1]["ended"], rows[1]["build_s"]) == (10.0, 16.0, 2.5)
    assert rows[1]["stop"] == "steps" and rows[1]["best_speedup"] == 1.5


def test_prebuild_both_runs_each_model_cold_without_then_with(monkeypatch, tmp_path):
    seen = []

    def isolated(spec, budget_s=None, prebuild=True, memory="htg"):
        seen.append((spec, budget_s, prebuild))
        return {"model": spec, "prebuild": prebuild, "optimize_s": 1.0, "tasks": 2, "searched": 1,
                "candidates": 4, "swapped": 0, "rel_err": 0.0, "searches": []}

    monkeypatch.setattr(ot, "isolated", isolated)
    monkeypatch.setattr(ot.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ot.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr("sys.argv", ["optimize_time.py", "a:bf16", "b:bf16", "--budget", "9", "--prebuild", "both",
                                     "--no-record"])
    assert ot.main() == 0
    assert seen == [("a:bf16", 9.0, False), ("a:bf16", 9.0, True), ("b:bf16", 9.0, False), ("b:bf16", 9.0, True)]


def test_memory_runs_each_model_cold_once_per_value_and_a_file_becomes_the_arch_memory(monkeypatch, tmp_path):
    """--memory none FILE: two cold optimizes per model; the file is copied in as the GPU arch's
    HTG memory inside the fresh cache, which "none" runs without."""
    import torch_htam
    from torch_htam import gpu, paths
    warm = tmp_path / "warm.json"
    warm.write_text('{"format": "htg-memory"}')
    seen = []

    class _Gpu:
        arch = "sm_90a"

    def optimize(model, inputs, cfg):
        path = paths.memory_path("sm_90a", "expert")
        seen.append((cfg.memory, path.read_text() if path.exists() else None))
        raise RuntimeError("stop here")

    monkeypatch.setattr(gpu, "detect", lambda: _Gpu())
    monkeypatch.setattr(torch_htam, "optimize", optimize)
    monkeypatch.setattr(ot.model_zoo, "make", lambda spec: (ot.torch.nn.Identity(), (ot.torch.ones(2),)))
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path / "unused"))
    for memory in ("none", str(warm)):
        try:
            ot.one("tiny:bf16", 5.0, True, memory)
        except RuntimeError:
            pass
    assert seen == [("none", None), ("htg", '{"format": "htg-memory"}')]


def test_each_run_is_its_own_process_with_new_inductor_and_triton_caches(monkeypatch):
    """A second arm run in the first's process would find its compiled graph (a shorter compile,
    so a smaller reserve and a longer search): each run gets a child process and fresh caches."""
    calls = []

    def run(cmd, env, check):
        calls.append((cmd, env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]))
        arm = json.loads(cmd[cmd.index("--arm") + 1])
        Path(cmd[cmd.index("--arm-out") + 1]).write_text(json.dumps({"model": arm[0], "memory": arm[3]}))

    monkeypatch.setattr(ot.subprocess, "run", run)
    rows = [ot.isolated("gpt2:bf16", 9.0, True, m) for m in ("none", "warm.json")]
    assert rows == [{"model": "gpt2:bf16", "memory": "none"}, {"model": "gpt2:bf16", "memory": "warm.json"}]
    (_, ind1, tri1), (_, ind2, tri2) = calls
    assert len({ind1, ind2, tri1, tri2}) == 4 and not Path(ind1).parent.exists()


def test_memory_refuses_a_value_that_is_no_mode_and_no_file(monkeypatch):
    import pytest
    monkeypatch.setattr(ot.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("sys.argv", ["optimize_time.py", "a:bf16", "--memory", "warm_missing.json", "--no-record"])
    with pytest.raises(SystemExit):
        ot.main()


def test_the_child_runs_one_arm_and_writes_its_row(monkeypatch, tmp_path):
    out = tmp_path / "row.json"
    monkeypatch.setattr(ot, "one", lambda spec, budget_s, prebuild, memory: {"model": spec, "budget": budget_s,
                                                                            "prebuild": prebuild, "memory": memory})
    monkeypatch.setattr("sys.argv", ["optimize_time.py", "--arm", json.dumps(["gpt2:bf16", 9.0, True, "none"]),
                                     "--arm-out", str(out)])
    assert ot.main() == 0
    assert json.loads(out.read_text()) == {"model": "gpt2:bf16", "budget": 9.0, "prebuild": True, "memory": "none"}
