"""The Ray backend on a local Ray instance, CPU only: RayPool's job protocol with a stand-in runner
(order, hang -> timeout, death -> crash, deadline), builds as Ray tasks, the Evaluator through
RayPool, and two Ray workers writing one KernelCache. Skipped where Ray is not installed."""
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from torch_htam import build, paths  # noqa: E402
from torch_htam.cache import KernelCache  # noqa: E402
from torch_htam.evaluation import Evaluation, Evaluator  # noqa: E402
from torch_htam.ray_pool import RayPool  # noqa: E402
from torch_htam.task import Task, TensorSpec  # noqa: E402

RUNNER = "test_ray:job"
ARCH = "sm_90a"


# ------------------------------------------------------------------ runs in the Ray worker processes

def job(j: dict) -> dict:
    """The stand-in runner: what a job does is in its "do" field."""
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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(local_ray):
    """Two CPU actors (num_gpus=0), a 2 s job timeout."""
    with RayPool(n=2, runner=RUNNER, timeout=2.0, num_gpus=0, cpus_per_worker=0) as p:
        yield p


# ------------------------------------------------------------------------------- job protocol

def test_results_come_back_in_order(pool):
    res = pool.run_many([{"do": "echo", "value": i} for i in range(8)])
    assert [r["value"] for r in res] == list(range(8))
    assert all(r["reason"] == "ok" and r["worker_s"] >= 0 for r in res)


@pytest.mark.parametrize("do, reason, words", [
    ("sleep", "timeout", "no result after 2 s"),
    ("exit", "crash", "worker died"),
    ("raise", "crash", "boom in the worker"),
])
def test_bad_job_costs_one_result_and_the_pool_keeps_serving(pool, do, reason, words):
    bad = pool.submit({"do": do}).result()
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


def test_dead_cuda_context_result_replaces_the_actor(local_ray):
    with RayPool(n=1, runner=RUNNER, timeout=5.0, num_gpus=0, cpus_per_worker=0) as p:
        dead = p.submit({"do": "dead_context"}).result()
        after = p.submit({"do": "echo"}).result()
    assert dead["reason"] == "crash" and after["pid"] != dead["pid"]


def test_deadline_field(pool):
    gone = pool.submit({"do": "echo", "deadline": time.monotonic() - 1}).result()
    assert gone["reason"] == "deadline"
    t0 = time.monotonic()
    cut = pool.submit({"do": "sleep", "seconds": 30, "timeout": 20, "deadline": time.monotonic() + 1.0}).result()
    assert cut["reason"] == "timeout" and time.monotonic() - t0 < 6
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


def test_shipped_library_bytes_land_on_the_worker(local_ray, tmp_path):
    """ship_so (automatic on a multi-node cluster): the job carries the .so, the actor writes it
    under its content-hash name on its own disk and points so_path there."""
    so = tmp_path / "0123abcd.so"
    so.write_bytes(b"\x7fELF fake library")
    with RayPool(n=1, runner=RUNNER, timeout=10.0, num_gpus=0, cpus_per_worker=0, ship_so=True) as p:
        res = p.submit({"do": "read_so", "so_path": str(so)}).result()
    assert res["reason"] == "ok" and res["data"] == so.read_bytes() and not res["has_bytes"]
    assert res["so_path"] != str(so) and Path(res["so_path"]).name == so.name


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


def test_built_elsewhere_comes_back_as_bytes(local_ray, tmp_path):
    """With ship_so the build task returns the .so bytes and the driver writes them into its own
    build folder (on one host it is the same file, left as it is)."""
    src = honest_kernel("shipped")
    so = prebuilt(src, paths.arch_dir(ARCH) / "build")
    with RayPool(n=1, runner=RUNNER, num_gpus=0, cpus_per_worker=0, ship_so=True) as p:
        r = p.build_many([src], arch=ARCH)[0]
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


def test_evaluator_runs_through_ray_pool(local_ray):
    """Evaluator(pool=RayPool(...)) on a driver without a GPU: builds as Ray tasks, jobs to the
    actors (the pool's GPUs are elsewhere), verdicts back as Evaluations."""
    good = honest_kernel("evaluator")
    prebuilt(good, paths.arch_dir(ARCH) / "build")
    bad = "int main() { return 0; }"   # no htam_run: the static check refuses it
    pool = RayPool(n=1, runner="test_ray:evaluate_job", timeout=10.0, num_gpus=0, cpus_per_worker=0)
    with Evaluator(arch=ARCH, pool=pool) as ev:
        out = ev.evaluate_many(make_task("e" * 32), [good, bad])
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
