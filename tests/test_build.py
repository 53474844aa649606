"""build.py: the static check, real nvcc builds (skipped without nvcc), caching and feedback."""
import ctypes
import os
from pathlib import Path

import pytest

from torch_htam import build, paths

KERNELS = Path(__file__).parent / "kernels"
needs_nvcc = pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")


def sample(name: str) -> str:
    return (KERNELS / name).read_text()


def with_body(body: str, head: str = "") -> str:
    """An honest kernel with `body` inserted in htam_run and `head` at file scope."""
    return f"""#include "htam_abi.h"
{head}
__global__ void k(float* y) {{ y[threadIdx.x] = 1.0f; }}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  {body}
  k<<<1, 32, 0, stream>>>((float*)out[0].data);
  return HTAM_OK;
}}
"""


# One example per rule in build.RULES (a test below checks that none is missing).
RULE_EXAMPLES = {
    "torch_headers": ("", "#include <torch/extension.h>"),
    "python_header": ("", "#include <Python.h>"),
    "local_include": ("", '#include "../../secret.h"'),
    "other_streams": ("cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);", ""),
    "host_sync": ("cudaDeviceSynchronize();", ""),
    "events": ("cudaEvent_t e; cudaEventCreate(&e); cudaEventRecord(e, stream);", ""),
    "threads": ("std::thread t([]{}); t.join();", "#include <thread>"),
    "dynamic_loading": ('void* h = dlopen("libcuda.so", 2);', ""),
    "environment": ('const char* v = getenv("HTAM_FAST");', ""),
    "processes": ('system("nvidia-smi");', ""),
    "sleep": ("usleep(100);", ""),
    "host_timers": ("auto t0 = std::chrono::steady_clock::now();", "#include <chrono>"),
    "sync_copies": ("cudaMemcpy(out[0].data, in[0].data, 4, cudaMemcpyDeviceToDevice);", ""),
    "managed_memory": ("float* p; cudaMallocManaged(&p, 4);", ""),
    "free": ("cudaFree(in[0].data);", ""),
    "files": ('FILE* f = fopen("/tmp/t", "w");', ""),
}


def test_every_rule_has_an_example_and_a_reason():
    assert set(RULE_EXAMPLES) == {r.name for r in build.RULES}
    assert all(r.reason and r.message for r in build.RULES)


@pytest.mark.parametrize("name", sorted(RULE_EXAMPLES))
def test_each_rule_rejects_its_example(name):
    body, head = RULE_EXAMPLES[name]
    rule = next(r for r in build.RULES if r.name == name)
    problems = build.check_source(with_body(body, head))
    assert any(rule.message in p for p in problems), problems
    assert all(p.startswith(("line ", "no entry")) for p in problems)


@pytest.mark.parametrize("name", ["add_f32.cu", "scale_extern_c.cu", "abi_probe.cu", "launch_error.cu",
                                  "gemm_cublas.cu", "syntax_error.cu"])
def test_honest_samples_pass(name):
    assert build.check_source(sample(name)) == []


def test_comments_and_strings_do_not_trigger():
    body = ('// cudaDeviceSynchronize(); k<<<1, 1>>>(); std::thread\n'
            '  /* getenv("X"); fopen("f", "w");\n cudaStreamCreate(&s); */\n'
            '  const char* msg = "cudaMemcpy(a, b, n, k); usleep(1); <<<1, 1>>>"; (void)msg;\n'
            "  char c = '\"'; (void)c;")
    assert build.check_source(with_body(body)) == []
    # ...and a rule after a tricky string still fires, on the right line.
    problems = build.check_source(with_body(body + "\n  cudaDeviceSynchronize();"))
    assert len(problems) == 1 and problems[0].startswith("line 10:"), problems


@pytest.mark.parametrize("config", ["1, 32", "1, 32, 0", "1, 32, 0, 0", "1, 32, 0, nullptr",
                                    "1, 32, 0, cudaStreamLegacy", "1, 32, 0, cudaStreamPerThread",
                                    "1, 32, 0, (cudaStream_t)0", "1, 32, smem, NULL"])
def test_launch_without_the_stream_is_rejected(config):
    problems = build.check_source(with_body(f"k<<<{config}>>>((float*)out[0].data);"))
    assert len(problems) == 1 and "stream" in problems[0] and problems[0].startswith("line 5:")


def test_launch_config_with_nested_commas_passes():
    body = "k<<<dim3(max(1, 2), 3), dim3(32, 1), 2 * sizeof(float), stream>>>((float*)out[0].data);"
    assert build.check_source(with_body(body)) == []


@pytest.mark.parametrize("call, ok", [
    ("cudaLaunchKernel((void*)k, dim3(1), dim3(32), args, 0, stream);", True),
    ("cudaLaunchKernel((void*)k, dim3(1), dim3(32), args);", False),
    ("cudaLaunchKernel((void*)k, dim3(1), dim3(32), args, 0, 0);", False),
    ("cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, (CUstream)stream, args, nullptr);", True),
    ("cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, args, nullptr);", False),
    ("cudaMemcpyAsync(out[0].data, in[0].data, 4, cudaMemcpyDeviceToDevice, stream);", True),
    ("cudaMemcpyAsync(out[0].data, in[0].data, 4, cudaMemcpyDeviceToDevice);", False),
    ("cudaMemsetAsync(out[0].data, 0, 4, stream);", True),
    ("cudaMemsetAsync(out[0].data, 0, 4);", False),
    ("cudaLaunchConfig_t cfg = {}; cfg.stream = stream; cudaLaunchKernelEx(&cfg, k, p);", True),
    ("cudaLaunchConfig_t cfg = {}; cudaLaunchKernelEx(&cfg, k, p);", False),
])
def test_stream_argument_of_api_calls(call, ok):
    assert (build.check_source(with_body(call)) == []) == ok


def test_library_handles_need_their_stream_set():
    head = "#include <cublas_v2.h>"
    body = "static cublasHandle_t h; cublasCreate(&h);"
    assert "cublasSetStream" in " ".join(build.check_source(with_body(body, head)))
    assert build.check_source(with_body(body + " cublasSetStream(h, stream);", head)) == []


def test_entry_point_is_required():
    no_entry = sample("add_f32.cu").replace("htam_run", "my_run")
    assert build.check_source(no_entry)[0].startswith("no entry point")
    not_extern_c = sample("add_f32.cu").replace("HTAM_ENTRY htam_run", "int htam_run")
    assert build.check_source(not_extern_c)[0].startswith("no entry point")


def test_arch_flags_and_hash():
    assert build.arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert build.arch_flags("sm_80") == ["-arch=sm_80"]
    src = sample("add_f32.cu")
    h = build.source_hash(src, "sm_90a")
    assert len(h) == 20 and h == build.source_hash(src, "sm_90a")
    assert h != build.source_hash(src, "sm_90")
    assert h != build.source_hash(src + "\n", "sm_90a")
    cublas = sample("gemm_cublas.cu")
    # Link args come from the discovered Library at build time (pip wheels need -l:libfoo.so.N),
    # never as bare -lfoo in the hashed flags: a bare -lcudnn failed to link against a wheel.
    assert not [f for f in build._flags(cublas, "sm_90a") if f.startswith("-l") and f != "-lineinfo"]


def test_library_discovery_links_versioned_pip_libraries(tmp_path, monkeypatch):
    # pip wheels (nvidia-cublas, nvidia/cu13) ship libcublas.so.13 but no libcublas.so.
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cublasLt.h").write_text("")
    (tmp_path / "lib").mkdir()
    for name in ("libcublasLt.so.13", "libcublas.so.13", "libcublas.so.13.1.0"):
        (tmp_path / "lib" / name).write_text("")
    monkeypatch.setattr(build, "_candidate_roots", lambda modules: [tmp_path / "nothing", tmp_path])
    lib = build.find_cublas()
    assert lib is not None and lib.link == ("-l:libcublasLt.so.13", "-l:libcublas.so.13")
    flags = lib.flags()
    assert f"-I{tmp_path / 'include'}" in flags and f"-rpath={tmp_path / 'lib'}" in flags


def test_missing_cublas_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "find_cublas", lambda: None)
    res = build.build(sample("gemm_cublas.cu"), arch="sm_90a", out_dir=tmp_path)
    assert not res.ok and res.error.startswith("cuBLAS headers/libraries not found")


def test_missing_nvcc_fails_every_uncached_source(tmp_path, monkeypatch):
    monkeypatch.setattr(build.paths, "nvcc_path", lambda: None)
    results = build.build_many([sample("add_f32.cu"), sample("scale_extern_c.cu"), sample("no_stream.cu")],
                               arch="sm_90a", out_dir=tmp_path)
    assert [r.ok for r in results] == [False, False, False]
    assert results[0].error == results[1].error == "nvcc not found: install the CUDA toolkit or set CUDA_HOME"
    assert results[2].error.startswith("static check: ")


def test_compile_feedback_on_canned_logs():
    src = "int a;\nint b = x;\nint c = y;\n"
    log = ("/tmp/b/3f2a.cu(2): error: identifier \"x\" is undefined\n  int b = x;\n          ^\n\n"
           "/tmp/b/3f2a.cu(2): error: identifier \"x\" is undefined\n"
           "/tmp/b/3f2a.cu:3:9: error: 'y' was not declared in this scope\n"
           "ptxas error   : Entry function '_Z1kPf' uses too much shared data (0x20000 bytes, 0xc000 max)\n"
           "/usr/bin/ld: cannot find -lcublas: No such file or directory\n"
           "2 errors detected in the compilation of \"/tmp/b/3f2a.cu\".\n")
    fb = build.compile_feedback(log, src)
    assert fb.splitlines()[:3] == ['line 2: error: identifier "x" is undefined', "  int b = x;", "          ^"]
    assert fb.count('identifier "x"') == 1                      # deduplicated
    assert "line 3: error: 'y' was not declared in this scope\n     3 | int c = y;" in fb
    assert "uses too much shared data" in fb and "ld: cannot find -lcublas" in fb and "/usr/bin" not in fb
    short = build.compile_feedback(log, src, limit=80)
    assert short.startswith("line 2:") and "more errors)" in short and len(short) < 200


# ---- real nvcc builds (a few seconds each on 2 cores) ----

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """6 sources built in one ninja run: 4 honest variants, a syntax error, a static-check failure."""
    out = tmp_path_factory.mktemp("build")
    honest = [sample("add_f32.cu").replace("256", str(bs)) for bs in (128, 256, 512)] + [sample("scale_extern_c.cu")]
    sources = honest + [sample("syntax_error.cu"), sample("no_stream.cu")]
    return out, sources, build.build_many(sources, arch="sm_90a", out_dir=out, jobs=2)


@needs_nvcc
def test_parallel_build_reports_per_source(batch):
    out, sources, results = batch
    assert [r.ok for r in results] == [True, True, True, True, False, False]
    assert [r.source_hash for r in results] == [build.source_hash(s, "sm_90a") for s in sources]
    for r in results[:4]:
        assert Path(r.so_path).exists() and r.so_path.endswith(r.source_hash + ".so") and r.seconds > 0
        assert not r.cached and r.error == ""
    assert results[4].error.startswith('line 8: error: identifier "blockDimx" is undefined')
    assert "blockDimx" in results[4].log and results[4].so_path is None
    assert results[5].error.startswith("static check: line 12: kernel launch")
    assert not list(out.glob(".batch-*")), "the batch directory is removed"
    assert (out / f"{results[4].source_hash}.cu").exists(), "failed sources are kept beside their log"


@needs_nvcc
def test_built_library_exports_htam_run(batch):
    _, _, results = batch
    lib = ctypes.CDLL(results[0].so_path)     # static cudart: loads without a GPU
    assert hasattr(lib, "htam_run")


@needs_nvcc
def test_content_hash_cache_reuses_the_library(batch):
    out, sources, first = batch
    mtime = os.path.getmtime(first[0].so_path)
    again = build.build_many(sources[:2] + sources[:1], arch="sm_90a", out_dir=out)
    assert all(r.cached and r.ok and r.seconds == 0 for r in again)
    assert again[0].so_path == again[2].so_path == first[0].so_path
    assert os.path.getmtime(first[0].so_path) == mtime


@needs_nvcc
def test_timeout_kills_the_build(tmp_path):
    res = build.build(sample("add_f32.cu").replace("256", "64"), arch="sm_90a", out_dir=tmp_path, timeout_s=0.2)
    assert not res.ok and res.error == "build timed out after 0.2 s"
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob(".batch-*"))


@needs_nvcc
def test_cublas_source_builds_when_cublas_is_installed(tmp_path):
    if build.find_cublas() is None:
        pytest.skip("no cuBLAS headers/libraries here ($CUDA_HOME or nvidia pip packages)")
    res = build.build(sample("gemm_cublas.cu"), arch="sm_90a", out_dir=tmp_path)
    assert res.ok, res.log


def _running(marker: str, pids: bool = False) -> list:
    """Command lines (pids: process ids) of live processes that contain marker."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmd and state != "Z":
            out.append(int(d.name) if pids else cmd)
    return out


@pytest.mark.skipif(build._ninja() is None or not Path("/proc").is_dir(), reason="needs ninja and /proc")
def test_a_timed_out_build_leaves_no_command_running(tmp_path):
    # ninja runs each command in a process group of its own: its compilers must not outlive the timeout
    marker = f"{os.getpid()}.{tmp_path.name[-6:].replace('-', '')}"
    (tmp_path / "build.ninja").write_text(
        f"rule s\n  command = sleep 30 # {marker}\nbuild a: s\nbuild b: s\n")
    timed_out, _ = build._run_ninja(build._ninja(), tmp_path / "build.ninja", 2, 1.0)
    assert timed_out
    assert _running(marker) == []


@pytest.mark.skipif(build._ninja() is None or not Path("/proc").is_dir(), reason="needs ninja and /proc")
def test_a_cancelled_background_build_stops_at_once_and_runs_niced(tmp_path):
    import threading
    import time
    marker = f"{os.getpid()}.c{tmp_path.name[-6:].replace('-', '')}"
    # each command prints its niceness, then sleeps: a background build's commands run niced
    (tmp_path / "build.ninja").write_text(
        f"rule s\n  command = nice > $out.nice; sleep 30 # {marker}\nbuild a: s\n")
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    t0 = time.monotonic()
    stopped, _ = build._run_ninja(build._ninja(), tmp_path / "build.ninja", 1, 60.0, cancel, nice=build.BACKGROUND_NICE)
    assert stopped and time.monotonic() - t0 < 10.0
    assert _running(marker) == []
    base = os.nice(0)
    assert int((tmp_path / "a.nice").read_text()) == min(base + build.BACKGROUND_NICE, 19)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(build._ninja() is None or not Path("/proc").is_dir(), reason="needs ninja and /proc")
def test_background_builds_stop_while_paused_and_go_on_after(tmp_path):
    """The decision times a model with our background builds stopped: ninja and the commands it
    runs (each in a process group of its own) are all stopped inside background_paused() and run
    again after it; a foreground build is left alone."""
    import threading
    import time
    marker = f"{os.getpid()}.p{tmp_path.name[-6:].replace('-', '')}"
    (tmp_path / "bg").mkdir()
    (tmp_path / "fg").mkdir()
    for d in ("bg", "fg"):
        # a compound command: the shell (its command line holds the marker) stays, sleep its child
        (tmp_path / d / "build.ninja").write_text(f"rule s\n  command = sleep 30; true # {marker}.{d}\nbuild a: s\n")
    cancel = threading.Event()
    runs = [threading.Thread(target=build._run_ninja, args=(build._ninja(), tmp_path / d / "build.ninja", 1, 60.0,
                                                            cancel), kwargs={"nice": n})
            for d, n in (("bg", build.BACKGROUND_NICE), ("fg", 0))]
    for t in runs:
        t.start()
    try:
        t0 = time.monotonic()
        while not (_running(f"{marker}.bg") and _running(f"{marker}.fg")) and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        (bg,), (fg,) = _running(f"{marker}.bg", pids=True), _running(f"{marker}.fg", pids=True)
        with build.background_paused() as n:
            assert n == 1
            assert _state(bg) == "T" and _state(fg) != "T"
        assert _state(bg) != "T"
    finally:
        cancel.set()
        for t in runs:
            t.join(15)
    assert _running(marker) == []


@pytest.mark.skipif(build._ninja() is None or not Path("/proc").is_dir(), reason="needs ninja and /proc")
def test_a_background_build_cancelled_while_paused_stops_and_leaves_nothing(tmp_path):
    import threading
    import time
    marker = f"{os.getpid()}.q{tmp_path.name[-6:].replace('-', '')}"
    (tmp_path / "build.ninja").write_text(f"rule s\n  command = sleep 30; true # {marker}\nbuild a: s\n")
    cancel, out = threading.Event(), []
    t = threading.Thread(target=lambda: out.append(build._run_ninja(build._ninja(), tmp_path / "build.ninja", 1, 60.0,
                                                                     cancel, nice=build.BACKGROUND_NICE)))
    t.start()
    t0 = time.monotonic()
    while not _running(marker) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    with build.background_paused():
        cancel.set()
        t.join(15)
        assert not t.is_alive() and out[0][0]      # stopped, inside the pause
    assert _running(marker) == []


def test_a_source_another_call_is_building_is_waited_for_not_built_twice(tmp_path, monkeypatch):
    import threading
    import time
    monkeypatch.setattr(build.paths, "nvcc_path", lambda: "/usr/bin/nvcc-stand-in")
    monkeypatch.setattr(build.paths, "nvcc_version", lambda: "13.0")
    compiled, started = [], threading.Event()

    def fake_compile(jobs, out_dir, nvcc, n_jobs, timeout_s, cancel=None, nice=0):
        compiled.append(sorted(j.hash for j in jobs))
        started.set()
        time.sleep(0.3)                        # the other call asks for the same source meanwhile
        out = {}
        for j in jobs:
            so = out_dir / f"{j.hash}.so"
            so.write_bytes(b"lib")
            out[j.hash] = build.BuildResult(True, str(so), j.hash, seconds=0.3)
        return out

    monkeypatch.setattr(build, "_compile", fake_compile)
    monkeypatch.setattr(build, "_search_flags", lambda src, arch: ([], ""))
    a, b = sample("add_f32.cu"), sample("scale_extern_c.cu")
    first = []
    t = threading.Thread(target=lambda: first.extend(build.build_many([a], arch="sm_90a", out_dir=tmp_path)))
    t.start()
    started.wait(5)
    second = build.build_many([a, b], arch="sm_90a", out_dir=tmp_path)
    t.join()
    ha, hb = build.source_hash(a, "sm_90a"), build.source_hash(b, "sm_90a")
    assert compiled == [[ha], [hb]]                         # a once, by the first call
    assert first[0].ok and not first[0].cached
    assert second[0].ok and second[0].cached and second[0].so_path == first[0].so_path
    assert second[1].ok and not second[1].cached
    assert build._BUILDING == {}


def test_a_library_another_call_finished_after_this_one_looked_is_not_built_again(tmp_path, monkeypatch):
    """Another call (a background build) finishes a library between this call's look for it and
    its claim: this call takes it as built instead of compiling the source again."""
    monkeypatch.setattr(build.paths, "nvcc_path", lambda: "/usr/bin/nvcc-stand-in")
    monkeypatch.setattr(build.paths, "nvcc_version", lambda: "13.0")
    compiled = []
    monkeypatch.setattr(build, "_compile", lambda jobs, *a, **k: compiled.extend(jobs) or {})
    a = sample("add_f32.cu")
    so = tmp_path / f"{build.source_hash(a, 'sm_90a')}.so"

    def search_flags(src, arch):       # runs after the look: the other call's library lands now
        so.write_bytes(b"lib")
        return [], ""
    monkeypatch.setattr(build, "_search_flags", search_flags)
    res = build.build_many([a], arch="sm_90a", out_dir=tmp_path)
    assert not compiled and res[0].ok and res[0].cached and res[0].so_path == str(so)
    assert build._BUILDING == {}


PARTS_SRC = """#include <cuda_runtime.h>
#include "htam_library.h"
static __device__ float half_of(float x) { return 0.5f * x; }    // in every part: internal linkage
#if HTAM_MINE(0)
__global__ void halve(float* x) { x[threadIdx.x] = half_of(x[threadIdx.x]); }
extern "C" int first() { return 10; }
#endif
#if HTAM_MINE(1)
extern "C" int second() { BROKEN }
#endif
#if HTAM_ENTRY_PART
extern "C" int entry() { return 1; }
#endif
"""


@pytest.mark.build
@needs_nvcc
def test_a_library_in_parts_links_every_part_and_a_failing_part_says_why(tmp_path):
    """A library source compiled in parts (OurLibrary.parts, htam_library.h): each part defines its
    share, the .so has them all; where a part fails, the error is that part's nvcc message and no
    .so is left."""
    flags = [*build.BASE_FLAGS, *build.arch_flags("sm_90a"), f"-I{build.CSRC}"]
    nvcc = str(paths.nvcc_path())
    so = tmp_path / "parts.so"
    assert build._compile_parts(PARTS_SRC.replace("BROKEN", "return 20;"), so, flags, 2, nvcc, 300.0, 0) == ""
    lib = ctypes.CDLL(str(so))
    assert (lib.first(), lib.second(), lib.entry()) == (10, 20, 1)
    bad = tmp_path / "bad.so"
    err = build._compile_parts(PARTS_SRC, bad, flags, 2, nvcc, 300.0, 0)
    assert err.startswith("nvcc failed") and "BROKEN" in err and not bad.exists()
    assert list(tmp_path.glob(".parts-*")) == []


def test_a_library_is_rebuilt_when_a_header_its_source_includes_changes(monkeypatch, tmp_path):
    """library_hash covers the csrc headers the source includes by quotes, and those they include
    (gelu_erf.h, through gelu_erf_cutlass.h in cutlass_gemm.cu), not only the library's own: an
    edit to one names a new .so."""
    import shutil
    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "ABI_HEADER", csrc / "htam_abi.h")
    monkeypatch.setattr(build.paths, "nvcc_version", lambda: "13.0")

    def fresh(name):
        build.library_hash.cache_clear()
        return build.library_hash(name, "sm_90a")
    before = {n: fresh(n) for n in ("cutlass_gemm", "cutlass_conv")}
    src = (csrc / "cutlass_gemm.cu").read_text()
    assert '#include "gelu_erf.h"' not in src and '#include "gelu_erf_cutlass.h"' in src   # one header down
    (csrc / "gelu_erf.h").write_text((csrc / "gelu_erf.h").read_text() + "\n// edited\n")
    after = {n: fresh(n) for n in before}
    build.library_hash.cache_clear()
    assert after["cutlass_gemm"] != before["cutlass_gemm"]
    assert after["cutlass_conv"] == before["cutlass_conv"]       # it does not include gelu_erf.h


@pytest.fixture
def fake_library_builds(monkeypatch, tmp_path):
    """build.library with a stand-in compile that takes 0.2 s, writes the .so and records how many
    ran at once and in how many parts; cores(n) sets the process's usable CPUs."""
    import threading
    import time
    monkeypatch.setenv("HTAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build.paths, "nvcc_path", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(build.paths, "nvcc_version", lambda: "13.0")
    build.library_hash.cache_clear()
    for name in ("cutlass_conv", "cutlass_gemm"):
        lib = build.OUR_LIBRARIES[name]
        monkeypatch.setitem(build.OUR_LIBRARIES, name, type(lib)(lambda: [], lib.version, lib.missing, lib.archs, 3))
    seen = {"now": 0, "most": 0, "parts": [], "lock": threading.Lock()}

    def compile_(so, parts):
        with seen["lock"]:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["parts"].append(parts)
        time.sleep(0.2)
        so.parent.mkdir(parents=True, exist_ok=True)
        so.write_bytes(b"")
        with seen["lock"]:
            seen["now"] -= 1
        return ""
    monkeypatch.setattr(build, "_compile_parts", lambda src, so, flags, parts, *a: compile_(so, parts))
    monkeypatch.setattr(build, "_compile", lambda jobs, out_dir, *a, **k: {
        jobs[0].hash: type("R", (), {"ok": compile_(out_dir / f"{jobs[0].hash}.so", 1) == "", "error": ""})()})

    def cores(n: int):
        monkeypatch.setattr(build, "usable_cpus", lambda: list(range(n)))
        build._library_slots.cache_clear()
    yield seen, cores
    build._library_slots.cache_clear()
    build.library_hash.cache_clear()


def _build_at_once(names):
    import threading
    out = {}
    threads = [threading.Thread(target=lambda i=i, n=n: out.__setitem__(i, build.library(n, "sm_90a")))
               for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[i] for i in range(len(names))]


def test_libraries_build_at_once_where_cores_allow_and_each_once(fake_library_builds):
    seen, cores = fake_library_builds
    cores(8)                          # two shares of CORES_PER_LIBRARY: both libraries at once
    results = _build_at_once(["cutlass_conv", "cutlass_gemm", "cutlass_gemm"])
    assert all(so is not None for so, _ in results) and results[1][0] == results[2][0]
    assert seen["most"] == 2 and seen["parts"] == [3, 3]     # cutlass_gemm built once


def test_a_small_machine_builds_one_library_at_a_time_in_no_more_parts_than_cores(fake_library_builds):
    seen, cores = fake_library_builds
    cores(2)
    _build_at_once(["cutlass_conv", "cutlass_gemm"])
    assert seen["most"] == 1 and seen["parts"] == [2, 2]
    for name in ("cutlass_conv", "cutlass_gemm"):
        build.library_path(name, "sm_90a").unlink()
    cores(1)                          # one core: one object, no parts
    _build_at_once(["cutlass_gemm"])
    assert seen["parts"][-1] == 1


# nvcc 13's ptxas -v report for two kernels (build.REPORT_FLAGS), as a build log keeps it
PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3bigILi300EEvPf' for 'sm_90a'
ptxas info    : Function properties for _Z3bigILi300EEvPf
    1200 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 1200 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 31.373 ms
ptxas info    : Compiling entry function '_Z3addPfPKfi' for 'sm_90a'
ptxas info    : Function properties for _Z3addPfPKfi
    0 bytes stack frame, 848 bytes spill stores, 852 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""


def test_parse_ptxas_sums_up_the_kernels_resources():
    r = build.parse_ptxas(PTXAS_LOG)
    assert (r.kernels, r.registers, r.spill_bytes, r.smem_bytes, r.stack_bytes) == (2, 32, 1700, 4096, 1200)
    assert build.parse_ptxas("nvcc warning : something") is None


def test_the_ptxas_report_is_not_taken_for_an_error():
    log = PTXAS_LOG + "/usr/bin/ld: cannot find -lfoo\n"
    assert build.compile_feedback(log, "") == "ld: cannot find -lfoo"
    assert "ptxas info" not in build.compile_feedback(PTXAS_LOG.replace("Compile time", "x"), "")


SPILLS = """
// 96 live accumulators in a thread that __launch_bounds__ holds to 32 registers: ptxas spills
__global__ void __launch_bounds__(1024, 2) spill(const float* __restrict__ a, float* out, int n) {
  float acc[96];
#pragma unroll
  for (int j = 0; j < 96; ++j) acc[j] = a[threadIdx.x + j * n];
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int j = 0; j < 96; ++j) acc[j] = acc[j] * acc[(j + 1) % 96] + a[i * 96 + j];
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 96; ++j) s += acc[j];
  out[threadIdx.x] = s;
}
"""


@needs_nvcc
def test_a_build_reports_its_kernels_registers_and_spills_built_or_cached(tmp_path):
    src = sample("add_f32.cu") + SPILLS
    first = build.build(src, arch="sm_90a", out_dir=tmp_path)
    assert first.ok and first.resources is not None, first.log
    assert first.resources.kernels == 2 and first.resources.spill_bytes > 0 and first.resources.registers <= 32
    again = build.build(src, arch="sm_90a", out_dir=tmp_path)
    assert again.cached and again.resources == first.resources


@needs_nvcc
def test_an_evaluation_carries_the_registers_and_spills_of_its_build():
    import torch
    from test_search import make_task
    from torch_htam.evaluation import Evaluator
    if torch.cuda.is_available():
        pytest.skip("on a GPU the candidate would be verified against a task it does not implement")
    with Evaluator(arch="sm_90a") as ev:
        (res,) = ev.evaluate_many(make_task(), [sample("add_f32.cu") + SPILLS])
    assert res.reason == "no_gpu" and res.registers is not None and res.registers <= 32 and res.spill_bytes > 0
    assert "bytes spilled" in res.ptxas()


def test_a_build_the_deadline_stopped_is_no_compile_error():
    """A build stopped at its timeout when optimize's deadline capped it says "deadline" (the search
    learns nothing from it); the same stop before the deadline stays a compile_error."""
    import time
    from test_search import make_task
    from torch_htam.deadline import Deadline
    from torch_htam.evaluation import Evaluator

    class Builds:   # a pool that builds (as ray_pool.RayPool does): every build stopped at its timeout
        def build_many(self, sources, arch=None, timeout_s=300.0):
            return [build.BuildResult(False, None, f"h{i}", f"build timed out after {timeout_s:g} s", timed_out=True)
                    for i, _ in enumerate(sources)]

    spent = Deadline(0.01)
    time.sleep(0.05)
    (cut,) = Evaluator(arch="sm_90a", pool=Builds(), deadline=spent).evaluate_many(make_task(), ["// a"])
    (slow,) = Evaluator(arch="sm_90a", pool=Builds(), deadline=Deadline(600.0)).evaluate_many(make_task(), ["// a"])
    assert (cut.reason, slow.reason) == ("deadline", "compile_error")
    assert "timed out" in cut.detail


def test_a_ranged_batch_is_verified_over_its_range_for_its_fastest_only():
    """A ranged task's candidates are verified and timed at the example's sizes, then the fastest
    over the whole range, and the next while that fails: every candidate faster than the one kept
    was checked over the range; the rest say range_checked False. A static task: one full round."""
    from concurrent.futures import Future
    from test_search import make_task
    from torch_htam.evaluation import Evaluator
    from torch_htam.task import Task, TensorSpec

    ms = {"a": 3.0, "b": 1.0, "c": 2.0}            # each candidate's time at the example's sizes
    wrong_over_range = {"b"}                        # right at the example, wrong at size 1

    class Pool:
        remote_gpus = True

        def __init__(self):
            self.jobs = []

        def build_many(self, sources, arch=None, timeout_s=300.0):
            return [build.BuildResult(True, s, s) for s in sources]

        def submit(self, job):
            self.jobs.append((job["so_path"], job["range"]))
            bad = job["range"] and job["so_path"] in wrong_over_range
            fut = Future()
            fut.set_result({"reason": "mismatch", "detail": "size 1", "job_s": {"verify": 5.0}} if bad else
                           {"reason": "ok", "kernel_ms": ms[job["so_path"]], "ref_ms": 4.0,
                            "speedup": 4.0 / ms[job["so_path"]], "range_checked": job["range"],
                            "job_s": {"verify": 5.0 if job["range"] else 1.0, "time": 0.5}})
            return fut

    x = TensorSpec((64, 32), "float32", (32, 1), dynamic=(0,), ranges=((1, 64),))
    ranged = Task("r", "rowwise", "class Model: ...", [x], [x], "sig-r", ["aten.relu.default"])
    pool = Pool()
    out = Evaluator(arch="sm_90a", pool=pool).evaluate_many(ranged, ["a", "b", "c"])
    assert pool.jobs == [("a", False), ("b", False), ("c", False), ("b", True), ("c", True)]
    assert [(e.reason, e.range_checked) for e in out] == [("ok", False), ("mismatch", True), ("ok", True)]
    assert [e.job_s for e in out] == [{"verify": 1.0, "time": 0.5}, {"verify": 6.0, "time": 0.5},
                                      {"verify": 6.0, "time": 1.0}]   # a rechecked one: both jobs' seconds
    pool.jobs.clear()
    Evaluator(arch="sm_90a", pool=pool).evaluate_many(make_task(), ["a", "b"])   # no declared range
    assert pool.jobs == [("a", True), ("b", True)]


INDUCTOR_GPU_MODULE = """
triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', '''
import triton
import triton.language as tl

@triton.jit
def triton_poi_fused_add_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    tmp0 = tl.load(in_ptr0 + tl.program_id(0) * XBLOCK)
    tl.store(out_ptr0 + tl.program_id(0) * XBLOCK, tmp0)
''', device_str='cuda')


class Runner:
    def call(self, args):
        arg0_1, arg1_1 = args
        buf0 = extern_kernels.mm(arg0_1, arg1_1)
        triton_poi_fused_add_relu_0.run(buf0, buf0, 1024, grid=grid(1024))
        return (buf0, )

runner = Runner()
"""


def test_inductor_s_module_gives_a_proposer_its_kernels_and_call():
    from torch_htam.evaluation import inductor_kernels
    got = inductor_kernels(INDUCTOR_GPU_MODULE)
    assert got.startswith("def triton_poi_fused_add_relu_0(") and "tl.store(" in got
    assert "def call(self, args):\n    arg0_1, arg1_1 = args" in got and "extern_kernels.mm" in got
    assert "runner = Runner()" not in got and "import triton" not in got
    assert inductor_kernels("x = 1") == "" and inductor_kernels(INDUCTOR_GPU_MODULE, limit=40).endswith("# ... cut")


@pytest.mark.build
def test_the_code_inductor_writes_at_a_first_call_is_captured(tmp_path, monkeypatch):
    """evaluation._first_call_code: the module Inductor writes at a compiled function's first call
    (here on the CPU, with its own cache folder so the graph is compiled, not loaded), cut to its
    call; and the hook it borrows is put back."""
    import torch
    from torch._inductor.graph import GraphLowering
    from torch_htam.evaluation import _first_call_code
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    before = GraphLowering.save_output_code
    code = _first_call_code(torch.compile(lambda x, y: torch.relu(x @ y + 1)), (torch.randn(8, 8), torch.randn(8, 8)))
    assert "def call(" in code and "extern_kernels.mm" in code
    assert GraphLowering.save_output_code is before
