"""The Ray backend on a local Ray instance, CPU only: RayPool's job protocol with a stand-in runner
(order, hang -> timeout, death -> crash, deadline), builds as Ray tasks, the Evaluator through
RayPool, two Ray workers writing one KernelCache and one HTG memory, and fleet precompile (tasks
shared by models searched once, progress, resume). Skipped where Ray is not installed."""
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from torch_htam import build, fleet, paths  # noqa: E402
from torch_htam.cache import KernelCache  # noqa: E402
from torch_htam.evaluation import Evaluation, Evaluator  # noqa: E402
from torch_htam.fleet import TaskOutcome, precompile_fleet  # noqa: E402
from torch_htam.ray_pool import RayPool  # noqa: E402
from torch_htam.task import Task, TensorSpec  # noqa: E402

RUNNER = "test_ray:job"
ARCH = "sm_90a"


# ------------------------------------------------------------------ runs in the Ray worker processes

def job(j: dict) -> dict:
    """The stand-in runner: what a job does is in its "do" field (Evaluator's jobs: evaluate_job)."""
    if j.get("kind") == "evaluate":
        return evaluate_job(j)
    do = j["do"]
    if do == "echo":
        return {"reason": "ok", "pid": os.getpid(), "value": j.get("value")}
    if do == "sleep":
        time.sleep(j.get("seconds", 3600))
        return {"reason": "ok", "pid": os.getpid()}
    if do == "exit":
        os._exit(3)
    if do == "raise":
        raise ValueError("boom in the worker")
    if do == "dead_context":
        return {"reason": "crash", "detail": "illegal address", "exit": True, "pid": os.getpid()}
    if do == "read_so":
        return {"reason": "ok", "so_path": j["so_path"], "data": Path(j["so_path"]).read_bytes(),
                "has_bytes": "so_bytes" in j, "has_deadline": "deadline" in j}
    if do == "read_example":
        ex = j["task"]["example"]
        return {"reason": "ok", "example": ex, "data": Path(ex).read_bytes(), "has_ref": "example_ref" in j}
    raise AssertionError(f"unknown job {do}")


def evaluate_job(j: dict) -> dict:
    """Stands in for evaluation.run_job: the library must be there; the verdict is made up."""
    assert j["kind"] == "evaluate" and Path(j["so_path"]).is_file(), j
    return {"correct": True, "reason": "ok", "ref_ms": 2.0, "kernel_ms": 1.0, "speedup": 2.0}


# ------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module. NOTE: the workers must import this module (its functions are
    pickled by reference) and write under the tests' temporary cache root, so both travel in
    runtime_env."""
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]),
           "HTAM_CACHE_DIR": os.environ["HTAM_CACHE_DIR"]}
    # NOTE: a new local cluster otherwise writes a token to ~/.ray/auth_token; tests write only
    # under temporary folders (Ray's own session files go to its temp dir, /tmp/ray)
    auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()
    if auth is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = auth


@pytest.fixture(scope="module")
def pool(local_ray):
    """Two CPU actors (num_gpus=0), a 2 s job timeout."""
    with RayPool(n=2, runner=RUNNER, timeout=2.0, num_gpus=0, cpus_per_worker=0) as p:
        yield p


@pytest.fixture(scope="module")
def ship_pool(local_ray):
    """One CPU actor with ship_so (what a multi-node cluster gets by default)."""
    with RayPool(n=1, runner=RUNNER, timeout=10.0, num_gpus=0, cpus_per_worker=0, ship_so=True) as p:
        yield p


# ------------------------------------------------------------------------------- job protocol

def test_results_come_back_in_order(pool):
    res = pool.run_many([{"do": "echo", "value": i} for i in range(8)])
    assert [r["value"] for r in res] == list(range(8))
    assert all(r["reason"] == "ok" and r["worker_s"] >= 0 for r in res)


@pytest.mark.parametrize("do, reason, words", [
    ("sleep", "timeout", "no result after 1 s"),
    ("exit", "crash", "worker died"),
    ("raise", "crash", "boom in the worker"),
])
def test_bad_job_costs_one_result_and_the_pool_keeps_serving(pool, do, reason, words):
    bad = pool.submit({"do": do, "timeout": 1.0}).result()
    assert bad["reason"] == reason and words in bad["detail"], bad
    after = pool.run_many([{"do": "echo", "value": v} for v in range(4)])   # both slots serve again
    assert [r["value"] for r in after] == list(range(4)) and {r["reason"] for r in after} == {"ok"}


def test_killed_actor_mid_job_is_a_crash_and_is_replaced(pool):
    fut = pool.submit({"do": "sleep", "seconds": 30, "timeout": 20})
    deadline = time.monotonic() + 10
    while not fut.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)   # the job is in the actor now
    victims = [s for s in pool._slots if s.actor is not None]
    for s in victims:   # one of them runs the sleep; killing both is the harsher case
        ray.kill(s.actor)
    t0 = time.monotonic()
    res = fut.result(timeout=15)
    assert res["reason"] == "crash" and "worker died" in res["detail"] and time.monotonic() - t0 < 10
    assert pool.submit({"do": "echo", "value": 1}).result()["value"] == 1


def test_dead_cuda_context_result_replaces_the_actor(ship_pool):
    dead = ship_pool.submit({"do": "dead_context"}).result()
    after = ship_pool.submit({"do": "echo"}).result()
    assert dead["reason"] == "crash" and after["pid"] != dead["pid"]


def test_deadline_field(pool):
    gone = pool.submit({"do": "echo", "deadline": time.monotonic() - 1}).result()
    assert gone["reason"] == "deadline"
    t0 = time.monotonic()
    cut = pool.submit({"do": "sleep", "seconds": 30, "timeout": 20, "deadline": time.monotonic() + 1.0}).result()
    assert cut["reason"] == "deadline" and time.monotonic() - t0 < 6   # the budget's cut, not a hang
    # the deadline is this host's clock: enforced here, never sent to a worker
    ok = pool.submit({"do": "read_so", "so_path": __file__, "deadline": time.monotonic() + 60}).result()
    assert ok["reason"] == "ok" and not ok["has_deadline"]


def test_close_cuts_running_and_queued_jobs(local_ray):
    p = RayPool(n=1, runner=RUNNER, timeout=60.0, num_gpus=0, cpus_per_worker=0)
    running = p.submit({"do": "sleep", "seconds": 60})
    queued = p.submit({"do": "echo"})
    while not running.running():
        time.sleep(0.05)
    t0 = time.monotonic()
    p.close()
    assert time.monotonic() - t0 < 15
    assert running.result(timeout=1)["reason"] == "crash" and queued.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit({"do": "echo"})


def test_shipped_library_bytes_land_on_the_worker(ship_pool, tmp_path):
    """ship_so (automatic on a multi-node cluster): the job carries the .so, the actor writes it
    under its content-hash name on its own disk and points so_path there."""
    so = tmp_path / "0123abcd.so"
    so.write_bytes(b"\x7fELF fake library")
    res = ship_pool.submit({"do": "read_so", "so_path": str(so)}).result()
    assert res["reason"] == "ok" and res["data"] == so.read_bytes() and not res["has_bytes"]
    assert res["so_path"] != str(so) and Path(res["so_path"]).name == so.name


def test_shipped_example_inputs_land_on_the_worker(ship_pool, tmp_path):
    """The task's real inputs (a file in the driver's temp dir) reach a worker on another host."""
    ex = tmp_path / "sig.safetensors"
    ex.write_bytes(b"weights" * 1000)
    a, b = ship_pool.run_many([{"do": "read_example", "task": {"example": str(ex)}}] * 2)
    assert a["data"] == ex.read_bytes() and a["example"] != str(ex) and not a["has_ref"]
    assert b["example"] == a["example"] and str(ex) in ship_pool._examples   # put into Ray once


def test_gpu_pool_on_a_cluster_without_gpus_is_a_clear_error(local_ray):
    with pytest.raises(RuntimeError, match="has no GPU"):
        RayPool(runner=RUNNER)
    with pytest.raises(RuntimeError, match="arch sm_90a"):
        RayPool(runner=RUNNER, arch="sm_90a")


def test_without_ray_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    with pytest.raises(ImportError, match=r"pip install torch_htam\[ray\]"):
        RayPool(n=1, num_gpus=0)


# ------------------------------------------------------------------------------------- builds

def honest_kernel(tag: str) -> str:
    return f"""#include "htam_abi.h"
// {tag}
__global__ void k(float* y) {{ y[threadIdx.x] = 1.0f; }}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  k<<<1, 32, 0, stream>>>((float*)out[0].data);
  return HTAM_OK;
}}
"""


def prebuilt(src: str, out_dir: Path) -> Path:
    """A stand-in library where build_many looks first (content hash): no nvcc needed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    so = out_dir / f"{build.source_hash(src, ARCH)}.so"
    so.write_bytes(b"\x7fELF " + src.encode())
    return so


def test_builds_run_as_ray_tasks(pool, tmp_path):
    good = honest_kernel("cached")
    so = prebuilt(good, tmp_path)
    bad = honest_kernel("bad").replace("HTAM_OK;", "HTAM_OK; }\nvoid f() { cudaDeviceSynchronize();")
    res = pool.build_many([good, bad, good], arch=ARCH, out_dir=tmp_path)
    assert [r.ok for r in res] == [True, False, True]
    assert res[0].cached and res[0].so_path == str(so) and res[2].source_hash == res[0].source_hash
    assert res[1].error.startswith("static check:")


def test_built_elsewhere_comes_back_as_bytes(ship_pool):
    """With ship_so the build task returns the .so bytes and the driver writes them into its own
    build folder (on one host it is the same file, left as it is)."""
    src = honest_kernel("shipped")
    so = prebuilt(src, paths.arch_dir(ARCH) / "build")
    r = ship_pool.build_many([src], arch=ARCH)[0]
    assert r.ok and Path(r.so_path) == so and so.read_bytes() == b"\x7fELF " + src.encode()


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_a_real_nvcc_build_on_a_ray_task(pool, tmp_path):
    res = pool.build_many([honest_kernel(f"real {time.time()}")], arch="sm_80", out_dir=tmp_path)[0]
    assert res.ok and not res.cached and Path(res.so_path).is_file(), res.error


# ---------------------------------------------------------------------------------- Evaluator

def make_task(sig: str) -> Task:
    spec = TensorSpec((8, 64), "float32", (64, 1))
    return Task("gelu_bias", "elementwise", "class Model: ...", [spec], [spec], sig, ["aten.gelu.default"])


def test_evaluator_runs_through_ray_pool(ship_pool):
    """Evaluator(pool=RayPool(...)) on a driver without a GPU: builds as Ray tasks, jobs to the
    actors (the pool's GPUs are elsewhere), verdicts back as Evaluations. (The fixture owns the
    pool: Evaluator.close() would close it.)"""
    good = honest_kernel("evaluator")
    prebuilt(good, paths.arch_dir(ARCH) / "build")
    bad = "int main() { return 0; }"   # no htam_run: the static check refuses it
    out = Evaluator(arch=ARCH, pool=ship_pool).evaluate_many(make_task("e" * 32), [good, bad])
    assert out[0].correct and out[0].reason == "ok" and out[0].speedup == 2.0 and out[0].so_path
    assert out[1].reason == "static_check" and not out[1].correct


# ------------------------------------------------------------------------------- cache writes

SO = b"\x7fELF" + bytes(range(256)) * 16


def put_many(root: str, tmp: str, writer: str, n: int) -> int:
    """Runs as a Ray task: n entries of its own plus n replacements of one shared signature, each
    with a source and a library that name the writer (so a torn mix would show)."""
    cache = KernelCache("sm_test", root=root)
    for i in range(n):
        for sig in (f"{writer}{i:031d}", "s" * 32):
            so = Path(tmp) / f"{writer}-{sig}.so"
            so.write_bytes(SO + f"{writer}:{sig}".encode())
            cache.put(make_task(sig), f"// {writer}:{sig}\n", so,
                      Evaluation(True, "ok", policy={"name": "fp32"}, speedup=1.5), {"writer": writer})
    return n


def die_mid_put(root: str, tmp: str) -> None:
    """Runs as a Ray task: the worker dies after writing half an entry (as ray.kill would)."""
    from torch_htam import cache as cache_mod
    def half(d, source, so_path, record):
        (d / "kernel.cu").write_text(source)
        os._exit(1)
    cache_mod.write_entry_files = half
    so = Path(tmp) / "dead.so"
    so.write_bytes(SO)
    cache_mod.KernelCache("sm_test", root=root).put(
        make_task("d" * 32), "// dead\n", so, Evaluation(True, "ok", speedup=1.5), {})


def check_consistent(cache: KernelCache) -> None:
    """Every entry intact (manifest sha256 of each file matches), source and library from the
    same writer, no temporary or set-aside folder left."""
    for e in cache.ls():
        assert e.problem is None, (e.signature, e.problem)
        writer = e.record["provenance"]["writer"]
        assert e.source == f"// {writer}:{e.signature}\n"
        assert (e.path / "kernel.so").read_bytes() == SO + f"{writer}:{e.signature}".encode()
    assert [p.name for p in cache.kernels.iterdir() if p.name.startswith(".")] == []


def test_two_ray_workers_write_one_cache(local_ray, tmp_path):
    cache = KernelCache("sm_test", root=tmp_path / "cache")
    put = ray.remote(put_many)
    assert ray.get([put.remote(str(cache.root), str(tmp_path), w, 8) for w in "xy"]) == [8, 8]
    assert len(cache.signatures()) == 17 and "s" * 32 in cache.signatures()   # no lost entry
    check_consistent(cache)


def test_a_writer_killed_mid_put_leaves_nothing_behind(local_ray, tmp_path):
    cache = KernelCache("sm_test", root=tmp_path / "cache")
    ray.get(ray.remote(put_many).remote(str(cache.root), str(tmp_path), "x", 1))
    with pytest.raises(ray.exceptions.RayError):
        ray.get(ray.remote(max_retries=0)(die_mid_put).remote(str(cache.root), str(tmp_path)))
    assert cache.get("d" * 32) is None and len(cache.signatures()) == 2   # readers never see it
    ray.get(ray.remote(put_many).remote(str(cache.root), str(tmp_path), "y", 1))
    check_consistent(cache)   # the next writer cleared the dead one's temporary folder


def test_an_entry_set_aside_by_a_dead_writer_comes_back(tmp_path):
    """A writer that died between moving the old entry aside and moving the new one in: the next
    writer puts the old one back (no lost entry) and clears the temporary."""
    cache = KernelCache("sm_test", root=tmp_path / "cache")
    ray.get(ray.remote(put_many).remote(str(cache.root), str(tmp_path), "x", 1))
    sig = "x" + "0" * 31
    os.replace(cache.kernels / sig, cache.kernels / f".old-{sig}-12345")
    (cache.kernels / f".tmp-{sig[:16]}-dead").mkdir()
    assert cache.get(sig) is None
    ray.get(ray.remote(put_many).remote(str(cache.root), str(tmp_path), "y", 1))
    assert cache.get(sig) is not None and len(cache.signatures()) == 3
    check_consistent(cache)


# ------------------------------------------------------------------------------ fleet precompile


def tasks(*sigs: str) -> list[Task]:
    return [make_task(s * 32) for s in sigs]


class Recorder:
    """A stand-in search: records what it searched and how many ran at once."""

    def __init__(self, fail: set[str] = frozenset(), sleep: float = 0.0, stop_after: int | None = None):
        self.searched, self.fail, self.sleep, self.stop_after = [], set(fail), sleep, stop_after
        self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, task) -> TaskOutcome:
        with self.lock:
            if self.stop_after is not None and len(self.searched) >= self.stop_after:
                raise KeyboardInterrupt   # the run is cut here, this task in flight
            self.searched.append(task.signature[0])
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.sleep)
        with self.lock:
            self.running -= 1
        if task.signature[0] in self.fail:
            raise RuntimeError("search blew up")
        return TaskOutcome(kept=task.signature[0] in "ac", speedup=1.5, stop="steps")


def bundles(out: dict):
    def bundle(model: str, kept: list[str]) -> str:
        out[model] = sorted(s[0] for s in kept)
        return f"/bundles/{model}"
    return bundle


def test_fleet_searches_each_shared_task_once_and_bundles_every_model(tmp_path):
    search, made = Recorder(sleep=0.2), {}
    prog = precompile_fleet({"m1": tasks("a", "b", "c"), "m2": tasks("b", "c", "d"), "m3": tasks("a")},
                            search, bundles(made), tmp_path / "p.json", parallel=2, arch="sm_90a")
    assert sorted(search.searched) == ["a", "b", "c", "d"] and search.most == 2
    assert made == {"m1": ["a", "c"], "m2": ["c"], "m3": ["a"]}
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["counts"] == {"total": 4, "done": 4, "in_flight": 0, "left": 0, "error": 0, "kept": 2}
    assert saved["tasks"]["b" * 32]["models"] == ["m1", "m2"]
    assert set(saved["phases"]) == {"plan", "search", "bundle"} and saved["phases"]["search"] >= 0.4
    assert saved["bundles"]["m2"] == {"path": "/bundles/m2"}
    assert prog.line().startswith("fleet: 4/4 tasks done, 0 in flight, 0 left, 2 kernels kept; plan ")


@pytest.mark.parametrize("parallel", [1, 2])
def test_fleet_resumes_without_redoing_finished_tasks(tmp_path, parallel):
    models = {"m1": tasks("a", "b", "c"), "m2": tasks("d", "e")}
    first = Recorder(fail={"b"}, stop_after=3, sleep=0.1)
    with pytest.raises(KeyboardInterrupt):
        precompile_fleet(models, first, bundles({}), tmp_path / "p.json", parallel=parallel)
    cut = json.loads((tmp_path / "p.json").read_text())
    finished = {s[0] for s, r in cut["tasks"].items() if r["state"] == "done"}
    assert len(finished) >= 1 and cut["counts"]["done"] + cut["counts"]["error"] <= 3
    if parallel == 1:   # in order: a and c done, b failed, d in flight when the run was cut
        assert cut["counts"] == {"total": 5, "done": 2, "in_flight": 1, "left": 1, "error": 1, "kept": 2}
    again, made = Recorder(), {}
    precompile_fleet(models, again, bundles(made), tmp_path / "p.json", parallel=parallel)
    assert sorted(again.searched) == sorted(set("abcde") - finished)   # failed and unfinished ones
    done = json.loads((tmp_path / "p.json").read_text())
    assert done["counts"]["done"] == 5 and done["phases"]["search"] >= cut["phases"]["search"]
    assert made == {"m1": ["a", "c"], "m2": []}


def test_one_progress_file_one_fleet(tmp_path):
    path = tmp_path / "p.json"
    with fleet._file_lock(path):
        with pytest.raises(RuntimeError, match="another fleet precompile"):
            precompile_fleet({"m": tasks("a")}, Recorder(), bundles({}), path)
    precompile_fleet({"m": tasks("a")}, Recorder(), bundles({}), path, arch="sm_90a")
    with pytest.raises(ValueError, match="for sm_90a, not sm_80"):
        precompile_fleet({"m": tasks("a")}, Recorder(), bundles({}), path, arch="sm_80")


def test_fleet_over_a_ray_pool(pool, tmp_path):
    """The searches' candidates go to the Ray actors: each stand-in search submits its jobs to
    the shared pool, two searches at once."""
    def search(task) -> TaskOutcome:
        res = pool.run_many([{"do": "echo", "value": task.signature[0]}] * 2)
        return TaskOutcome(kept=all(r["reason"] == "ok" for r in res), stop="steps")
    made = {}
    prog = precompile_fleet({"m1": tasks("a", "b"), "m2": tasks("b", "c")}, search, bundles(made),
                            tmp_path / "p.json", parallel=2)
    assert prog.counts()["kept"] == 3 and made == {"m1": ["a", "b"], "m2": ["b", "c"]}


def merge_many(path: str, writer: int, n: int) -> int:
    """Runs as a Ray task: n searches' deltas merged one by one into one HTG memory file."""
    stats = {"attempts": 0, "correct": 0, "successes": 0, "reward": 0.0, "log_gain": 0.0, "failures": {}}
    before = {"format": "x", "edges": {}, "strategies": {}}
    for i in range(n):
        after = json.loads(json.dumps(before))
        s = after["strategies"].setdefault("vec4", {}).setdefault("all", dict(stats))
        s.update(attempts=s["attempts"] + 2, correct=s["correct"] + 1, failures={"mismatch": i + 1})
        after["edges"].setdefault(f"w{writer}->x", {})["all"] = {**stats, "attempts": i + 1}
        fleet.merge_experience(path, before, after)
        before = after
    return n


def test_two_ray_workers_merge_htg_experience_without_losing_updates(tmp_path):
    path = tmp_path / "htg" / "expert.json"
    merge = ray.remote(merge_many)
    assert ray.get([merge.remote(str(path), w, 10) for w in (1, 2)]) == [10, 10]
    data = json.loads(path.read_text())
    vec4 = data["strategies"]["vec4"]["all"]
    assert vec4["attempts"] == 40 and vec4["correct"] == 20 and vec4["failures"] == {"mismatch": 20}
    assert data["edges"]["w1->x"]["all"]["attempts"] == 10 == data["edges"]["w2->x"]["all"]["attempts"]


def test_merged_experience_reads_back_into_the_htg(tmp_path):
    from torch_htam.htg import ALL, HTG, Stats
    htg = HTG.from_prior()
    before = htg.experience_json()
    sid = next(iter(htg.strategies))
    htg.graph.nodes[sid]["exp"] = {ALL: Stats(3, 2, 1, 0.5, 0.2)}
    path = tmp_path / "expert.json"
    fleet.merge_experience(path, before, htg.experience_json())
    fleet.merge_experience(path, before, htg.experience_json())   # a second search, same learning
    assert HTG.load(path).strategy_stats(sid).attempts == 6
    old = json.loads(path.read_text()) | {"version": -1}          # another HTG version's file
    path.write_text(json.dumps(old))
    fleet.merge_experience(path, before, htg.experience_json())
    assert HTG.load(path).strategy_stats(sid).attempts == 3       # this search's view, not a mix


def tiny_mlp():
    """A model spec ("test_ray:tiny_mlp") for precompile_specs."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()
    return model, (torch.randn(4, 16),)


def test_precompile_specs_dedupes_the_models_tasks(tmp_path):
    """Two specs of the same model: their tasks are searched once; a bundle with no kernel cached
    is recorded as that model's error (EmptyBundleError), not the fleet's end."""
    search = Recorder()
    prog = fleet.precompile_specs(["test_ray:tiny_mlp", "test_ray:tiny_mlp"], tmp_path / "out", ARCH,
                                  pool=object(), search=search, parallel=1)
    models = prog.data["models"]
    assert list(models) == ["test_ray-tiny_mlp", "test_ray-tiny_mlp-2"] and models["test_ray-tiny_mlp"]
    assert len(search.searched) == len(set(models["test_ray-tiny_mlp"])) == prog.counts()["done"]
    assert all("EmptyBundleError" in b.get("error", "") for b in prog.data["bundles"].values())
    assert (tmp_path / "out" / "fleet-progress.json").is_file()


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_the_real_search_runs_over_a_ray_pool(ship_pool, tmp_path):
    """fleet.searcher on CPU: the expert's candidates for one real task built by nvcc in a Ray task,
    "verified" by the stand-in runner (2x, correct) on the actor, the winner confirmed and cached,
    the HTG memory merged; a second call finds it cached."""
    from torch_htam.config import OptimizeConfig
    from torch_htam.extract import extract
    from torch_htam.gpu import GpuInfo
    import torch

    class Ew(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x) * 2.0 + 1.0
    task = next(t for t in extract(Ew(), (torch.randn(64, 256),)).tasks if t.kind == "elementwise")
    gpu = GpuInfo("stand-in H100", ARCH, 132, 50 << 20, 227 << 10, 3.35e12, 67e12, 989e12)
    search = fleet.searcher(ARCH, OptimizeConfig(steps=0, candidates_per_step=2), ship_pool, gpu=gpu,
                            trajectory_dir=tmp_path)
    out = search(task)
    assert out.kept and out.speedup == 2.0, out
    assert KernelCache(ARCH).get(task.signature).usable()
    assert paths.memory_path(ARCH, "expert").is_file()
    assert search(task).stop == "cached"
