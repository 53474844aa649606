"""Candidate kernels → small .so files: static check, then nvcc driven by one ninja file.

A candidate is ONE CUDA C++ source implementing the kernel ABI in csrc/htam_abi.h (no torch
headers, so nvcc takes ~2 s instead of ~56 s for load_inline). `build_many` checks every source
statically, reuses .so files already built (named by content hash), and compiles the rest in
parallel through a generated build.ninja, one nvcc per source with its own log.

    >>> res = build.build_many([src_a, src_b])
    >>> [(r.ok, r.cached, r.so_path) for r in res]
    [(True, False, '/root/.cache/torch_htam/sm_90a-.../build/3f2a....so'), (False, False, None)]
    >>> res[1].error            # short, for the proposer
    'line 14: error: identifier "blockDimx" is undefined\\n   14 |   int i = blockIdx.x * blockDimx ...'
"""
from __future__ import annotations

import contextlib
import enum
import functools
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torch_htam import paths
from torch_htam.timing import usable_cpus

CSRC = Path(__file__).resolve().parent / "csrc"
ABI_HEADER = CSRC / "htam_abi.h"
DEFAULT_ARCH = "sm_90a"   # H100: the machine the project is measured on

# The static check lives in static_check.py; its names stay reachable here (build.check_source).
from torch_htam.static_check import LIBRARIES, RULES, Rule, check_source  # noqa: E402,F401

# --------------------------------------------------------------------------------------------
# Toolchain: arch flags, cuBLAS/cuDNN discovery, content hash.
# --------------------------------------------------------------------------------------------

BASE_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
              "-lineinfo")
# Flags that change what nvcc prints, not the binary (so not hashed): ptxas's resource usage per
# kernel, which the build log keeps and parse_ptxas reads (registers, spills, shared memory).
REPORT_FLAGS = ("-Xptxas", "-v")


@dataclass(frozen=True)
class Library:
    """A discovered CUDA library: where its headers are and how to link it.
    link: linker args, e.g. ['-lcublasLt', '-lcublas'] or ['-l:libcublas.so.13'] (pip wheels ship
    only the versioned file)."""
    include_dirs: tuple[str, ...]
    lib_dirs: tuple[str, ...]
    link: tuple[str, ...]

    def flags(self) -> list[str]:
        out = [f"-I{d}" for d in self.include_dirs]
        for d in self.lib_dirs:
            out += [f"-L{d}", "-Xlinker", f"-rpath={d}"]
        return out + list(self.link)


def _cuda_home() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = paths.nvcc_path()
    return str(Path(nvcc).resolve().parent.parent) if nvcc else None


def _candidate_roots(modules: tuple[str, ...]) -> list[Path]:
    """$CUDA_HOME, then the directories of pip packages such as nvidia.cublas (namespace
    packages: no __file__, so read their search locations without importing them)."""
    roots = [Path(h) for h in [_cuda_home()] if h]
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            roots += [Path(p) for p in (spec.submodule_search_locations or [])]
            if spec.origin and spec.origin not in ("namespace", None):
                roots.append(Path(spec.origin).parent)
    return roots


def _layouts(modules: tuple[str, ...]) -> list[tuple[Path, list[Path]]]:
    """(include dir, lib dirs) to try: each root's include/ + lib64/lib, then the Debian/Ubuntu
    multiarch system dirs (the GPU image keeps cuDNN in /usr/include/x86_64-linux-gnu)."""
    out = [(r / "include", [r / "lib64", r / "lib", r / "lib" / "x64"]) for r in _candidate_roots(modules)]
    for inc in (Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include")):
        out.append((inc, [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64")]))
    return out


def _find_library(header: str, libs: tuple[str, ...], modules: tuple[str, ...]) -> Library | None:
    for inc, dirs in _layouts(modules):
        if not (inc / header).exists():
            continue
        lib_dirs, link = [], []
        for lib in libs:
            for d in dirs:
                files = sorted(glob.glob(str(d / f"lib{lib}.so*")), key=len)
                if files:
                    # -lfoo needs the unversioned libfoo.so; otherwise name the file itself.
                    name = Path(files[0]).name
                    link.append(f"-l{lib}" if name == f"lib{lib}.so" else f"-l:{name}")
                    if str(d) not in lib_dirs:
                        lib_dirs.append(str(d))
                    break
            else:
                break
        else:
            return Library((str(inc),), tuple(lib_dirs), tuple(link))
    return None


def find_cublas() -> Library | None:
    """cuBLAS + cuBLASLt headers and libraries, or None (e.g. a toolkit without cuBLAS).

        >>> build.find_cublas()
        Library(include_dirs=('/usr/local/cuda/include',), lib_dirs=(...), link=('-lcublasLt', '-lcublas'))
    """
    return _find_library("cublasLt.h", ("cublasLt", "cublas"), ("nvidia.cublas", "nvidia.cu13"))


def find_cudnn() -> Library | None:
    """cuDNN headers and library, or None."""
    return _find_library("cudnn.h", ("cudnn",), ("nvidia.cudnn", "nvidia.cu13"))


def _include_dir(header: str, env: str, modules: tuple[str, ...], parent: bool = False) -> Path | None:
    """The directory holding `header`: $env/include, $CUDA_HOME/include, or the include/ of a pip
    package's root (parent: of its parent, where a wheel installs include/ beside the package, as
    nvidia-cudnn-frontend does into site-packages/include)."""
    roots = [Path(os.environ[env])] if os.environ.get(env) else []
    for r in _candidate_roots(modules):
        roots += [r.parent, r] if parent else [r]
    return next((r / "include" for r in roots if (r / "include" / header).exists()), None)


@functools.lru_cache(maxsize=None)
def find_cudnn_frontend() -> list[str] | None:
    """Flags for cuDNN's frontend (cudnn_frontend.h: pip install nvidia-cudnn-frontend, or
    $CUDNN_FRONTEND_PATH) and NVRTC, which it includes and calls (a library built without
    linking it fails to load: undefined nvrtc symbols); None where either is missing."""
    fe = _include_dir("cudnn_frontend.h", "CUDNN_FRONTEND_PATH", ("cudnn",), parent=True)
    rtc = _find_library("nvrtc.h", ("nvrtc",), ("nvidia.cu13", "nvidia.cuda_nvrtc"))
    return None if fe is None or rtc is None else [f"-I{fe}", *rtc.flags()]


def _uses(source: str, headers: str) -> bool:
    return re.search(rf"^[ \t]*#[ \t]*include[ \t]*[<\"](?:{headers})\.h[>\"]", source, re.M) is not None


def _uses_cublas(source: str) -> bool:
    return _uses(source, r"cublas|cublas_v2|cublasLt|cublas_api")


def _uses_cudnn(source: str) -> bool:
    return _uses(source, r"cudnn")


def arch_flags(arch: str) -> list[str]:
    """'sm_90a' -> ['-gencode=arch=compute_90a,code=sm_90a']; 'sm_80' -> ['-arch=sm_80'].
    The a/f variants need -gencode: -arch=sm_90a would also embed PTX that cannot be JIT-ed."""
    if arch[-1] in "af":
        return [f"-gencode=arch=compute_{arch[3:]},code={arch}"]
    return [f"-arch={arch}"]


def _flags(source: str, arch: str) -> list[str]:
    """The flags that define the binary (hashed); search paths are added at build time. A library
    of ours the source links (LIBRARIES) is named with its hash: a new build of it is a new binary."""
    # NOTE: no bare -lcublas/-lcudnn here: pip wheels ship only versioned files (libcudnn.so.9),
    # so Library.link names the right file at build time; the source (hashed) says which is used.
    ours = [f"-DHTAM_LIB_{name.upper()}={library_hash(name, arch)}" for name in libraries_used(source)]
    return [*BASE_FLAGS, *arch_flags(arch), *ours]


def _search_flags(source: str, arch: str) -> tuple[list[str], str]:
    """Include/link flags of the libraries a source uses, or an error if one is missing (a library
    of ours is built here the first time: minutes)."""
    flags = [f"-I{CSRC}"]
    for name in libraries_used(source):
        so, err = library(name, arch)
        if so is None:
            return flags, err
        flags += [f"-L{so.parent}", "-Xlinker", f"-rpath={so.parent}", f"-l:{so.name}"]
    for used, find, what in ((_uses_cublas, find_cublas, "cuBLAS"), (_uses_cudnn, find_cudnn, "cuDNN")):
        if used(source):
            lib = find()
            if lib is None:
                return flags, (f"{what} headers/libraries not found (looked in $CUDA_HOME and the "
                               f"nvidia pip packages): install them or write the kernel without {what}")
            flags += lib.flags()
    return flags, ""


# ---- libraries of ours that candidates link ------------------------------------------------------
# A candidate that includes csrc/<name>.h (<name> in LIBRARIES) links the library built once per
# arch from csrc/<name>.cu.
# NOTE: cuDNN's frontend headers take minutes to compile (cudnn_sdpa.cu: 232 s on the 2-core CPU
# machine, beside a CI run); a candidate that calls them compiles in seconds.
LIBRARY_TIMEOUT_S = 900.0
# Cores a library build is given: each runs up to OurLibrary.parts nvcc processes, of about 2-3 GB
# each for CUTLASS's templates, so as many libraries build at once as there are such shares.
CORES_PER_LIBRARY = 4
_LIBRARY_LOCKS: dict[tuple[str, str], threading.Lock] = {}   # one build of a library per process
_LOCKS_LOCK = threading.Lock()
_BACKGROUND: dict[tuple[str, str], threading.Thread] = {}


def _library_lock(name: str, arch: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LIBRARY_LOCKS.setdefault((name, arch), threading.Lock())


@functools.lru_cache(maxsize=None)
def _library_slots() -> threading.BoundedSemaphore:
    """How many of our libraries build at once in this process: one per CORES_PER_LIBRARY cores
    (at least one). NOTE: one lock for every library made a model with attention and GELU MLPs
    wait for cuDNN's attention library (minutes) before CUTLASS's GEMM library began."""
    return threading.BoundedSemaphore(max(1, len(usable_cpus()) // CORES_PER_LIBRARY))


def libraries_used(source: str) -> list[str]:
    """The libraries of ours (LIBRARIES) a candidate source links: those whose header it includes."""
    return [name for name in LIBRARIES if _uses(source, re.escape(name))]


def find_cutlass() -> Path | None:
    """CUTLASS's source tree (include/ and tools/util/include/ under it): $CUTLASS_PATH, else the
    nvidia-cutlass wheel's cutlass_library/source (pip install --no-deps nvidia-cutlass: headers
    only; found without importing it, whose Python deps are not needed), else None."""
    roots = [Path(os.environ["CUTLASS_PATH"])] if os.environ.get("CUTLASS_PATH") else []
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent / "source")
    return next((r for r in roots if (r / "include" / "cutlass" / "cutlass.h").exists()), None)


@dataclass(frozen=True)
class OurLibrary:
    """What one csrc library's own build needs: flags() -> its include/link flags, or None where a
    dependency is missing (`missing` says what to install); version() -> a file whose bytes name
    the dependency's version (hashed with the library), or None; archs: the archs it builds for
    (empty: any)."""
    flags: Callable[[], list[str] | None]
    version: Callable[[], Path | None]
    missing: str
    archs: tuple[str, ...] = ()
    # translation units: the source compiled once per part (-DHTAM_PART=p -DHTAM_PARTS=n), on as
    # many cores, each part defining its share of the kernels (the source says which), then linked
    parts: int = 1


def _cudnn_sdpa_flags() -> list[str] | None:
    fe, dnn = find_cudnn_frontend(), find_cudnn()
    return None if fe is None or dnn is None else [*fe, *dnn.flags()]


def _cutlass_flags() -> list[str] | None:
    root = find_cutlass()
    return None if root is None else [f"-I{root / 'include'}", f"-I{root / 'tools' / 'util' / 'include'}"]


def _cudnn_frontend_version() -> Path | None:
    fe = find_cudnn_frontend()
    return Path(fe[0][2:]) / "cudnn_frontend_version.h" if fe else None


def _cutlass_version() -> Path | None:
    root = find_cutlass()
    return root / "include" / "cutlass" / "version.h" if root else None


OUR_LIBRARIES = {
    "cudnn_sdpa": OurLibrary(_cudnn_sdpa_flags, _cudnn_frontend_version,
                             "cuDNN and its frontend's headers: pip install nvidia-cudnn-frontend "
                             "(or set CUDNN_FRONTEND_PATH)"),
    # CUTLASS 3's sm90 collectives (wgmma, TMA): Hopper only
    "cutlass_conv": OurLibrary(_cutlass_flags, _cutlass_version,
                               "CUTLASS's headers: pip install --no-deps nvidia-cutlass (or set CUTLASS_PATH)",
                               archs=("sm_90a",), parts=3),
    # NOTE: in parts: one translation unit took 70-85 s on the 2-core CPU machine and was not built
    # yet after a minute of the search on an H200 host beside torch.compile (zoo-20261130-090205)
    "cutlass_gemm": OurLibrary(_cutlass_flags, _cutlass_version,
                               "CUTLASS's headers: pip install --no-deps nvidia-cutlass (or set CUTLASS_PATH)",
                               archs=("sm_90a",), parts=3),
}


def _csrc_headers(name: str) -> list[Path]:
    """The headers of csrc/ that the library's source includes by quotes, and those they include
    (its own, htam_library.h, gelu_erf_cutlass.h and its gelu_erf.h, ...): a change to any of them
    is a change to the library."""
    found, todo = [], [CSRC / f"{name}.cu"]
    while todo:
        for h in re.findall(r'^#include "([^"]+)"', todo.pop().read_text(), re.M):
            header = CSRC / h
            if header.exists() and header not in found:
                found.append(header)
                todo.append(header)
    return found


@functools.lru_cache(maxsize=None)
def library_hash(name: str, arch: str) -> str:
    """Content hash of a library of ours: its sources, the ABI header, arch, nvcc and its
    dependency's version header. 20 hex chars. NOTE: cached: the expert asks on every match
    (library_ready), and the search finds its inputs the same for the process."""
    h = hashlib.sha256()
    for part in (CSRC / f"{name}.cu", *_csrc_headers(name), ABI_HEADER, OUR_LIBRARIES[name].version()):
        h.update(part.read_bytes() if part is not None and part.exists() else b"-")
    h.update(f"{arch}\0{paths.nvcc_version()}\0{' '.join(_soname('<hash>.so'))}".encode())
    return h.hexdigest()[:20]


def _soname(file: str) -> list[str]:
    """A library's soname is its file name: a kernel that links it records that name (DT_NEEDED),
    so a copy loaded first from anywhere (a bundle's, bundle.preload_libraries) satisfies it, where
    the kernel's rpath (the build machine's cache) does not exist."""
    return ["-Xlinker", f"-soname={file}"]


def library_path(name: str, arch: str) -> Path:
    return paths.arch_dir(arch) / "lib" / name / f"{library_hash(name, arch)}.so"


def library_ready(name: str, arch: str) -> bool:
    """Whether the library is built: the expert proposes candidates that link it only then."""
    return library_path(name, arch).exists()


class LibraryState(enum.Enum):
    """Where one library of ours stands for one arch (library_state)."""
    BUILT = "built"
    NOT_BUILT = "not built"                # buildable here: library() builds it
    OTHER_ARCH = "not for this arch"
    MISSING = "missing a dependency"
    NO_NVCC = "no nvcc"


def library_state(name: str, arch: str) -> tuple[LibraryState, str]:
    """(where library `name` stands for arch, what stops its build: "" where nothing does)."""
    lib = OUR_LIBRARIES[name]
    if library_path(name, arch).exists():
        return LibraryState.BUILT, ""
    if lib.archs and arch not in lib.archs:
        return LibraryState.OTHER_ARCH, f"the {name} library builds for {', '.join(lib.archs)} only, not {arch}"
    if lib.flags() is None:
        return LibraryState.MISSING, f"the {name} library needs {lib.missing}"
    if paths.nvcc_path() is None:
        return LibraryState.NO_NVCC, "nvcc not found: install the CUDA toolkit or set CUDA_HOME"
    return LibraryState.NOT_BUILT, ""


def library(name: str, arch: str, timeout_s: float = LIBRARY_TIMEOUT_S, nice: int = 0) -> tuple[Path | None, str]:
    """(the library's .so, "") built once per arch (minutes the first time), or (None, why)."""
    so, lib = library_path(name, arch), OUR_LIBRARIES[name]
    state, why = library_state(name, arch)
    if state is LibraryState.BUILT:
        return so, ""
    if state is not LibraryState.NOT_BUILT:
        return None, why
    extra, nvcc = lib.flags(), paths.nvcc_path()
    with _library_lock(name, arch), _library_slots():
        if not so.exists():
            src = (CSRC / f"{name}.cu").read_text()
            flags = [*_flags(src, arch), f"-I{CSRC}", *extra]
            # NOTE: no more parts than cores: each part pays CUTLASS's front end again (cutlass_gemm
            # on 2 cores: 2 parts 75 s, 3 parts 99 s; on an H200 host's 16: 3 parts 58 s, 6 parts 66 s)
            parts = min(lib.parts, len(usable_cpus()) or 1)
            if parts > 1:
                err = _compile_parts(src, so, flags, parts, nvcc, timeout_s, nice)
            else:
                res = _compile([_Job(0, src, so.stem, [*flags, *_soname(so.name)])], so.parent, nvcc, 1,
                               timeout_s, nice=nice)[so.stem]
                err = res.error if not res.ok else ""
            if err:
                return None, f"building the {name} library failed: {err}"
    return so, ""


def _compile_parts(src: str, so: Path, flags: list[str], parts: int, nvcc: str, timeout_s: float,
                   nice: int) -> str:
    """so built from src in `parts` objects compiled at once (-DHTAM_PART=p -DHTAM_PARTS=parts),
    then linked; "" or why not (the failing part's log)."""
    ninja = _ninja()
    if ninja is None:
        return "ninja not found: pip install ninja"
    tmp = so.parent / f".parts-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        (tmp / "lib.cu").write_text(src)
        (tmp / "build.ninja").write_text(_parts_ninja(nvcc, flags, parts, so.name))
        stopped, out = _run_ninja(ninja, tmp / "build.ninja", min(parts, os.cpu_count() or 1), timeout_s, nice=nice)
        if (tmp / so.name).exists() and not stopped:
            os.replace(tmp / so.name, so)
            return ""
        logs = [f for f in sorted(tmp.glob("*.log")) if f.stat().st_size]
        detail = "\n".join(f.read_text(errors="replace")[-4000:] for f in logs) or out[-4000:]
        return (f"timed out after {timeout_s:g} s" if stopped else "nvcc failed") + f": {detail}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _parts_ninja(nvcc: str, flags: list[str], parts: int, so_name: str) -> str:
    """One compile edge a part (-c, its own log), one link edge: the library's build.ninja."""
    q = lambda fs: _ninja_value(" ".join(_shell_quote(f) for f in fs))     # noqa: E731
    compile_flags = [f for f in flags if f != "-shared"]
    lines = ["ninja_required_version = 1.3", f"nvcc = {_ninja_value(_shell_quote(nvcc))}", "",
             "rule obj", "  command = $nvcc $flags -c $in -o $out > $log 2>&1", "",
             "rule link", "  command = $nvcc $flags $in -o $out > $log 2>&1", ""]
    for p in range(parts):
        part = [*compile_flags, f"-DHTAM_PART={p}", f"-DHTAM_PARTS={parts}"]
        lines += [f"build part{p}.o: obj lib.cu", f"  flags = {q(part)}", f"  log = part{p}.log"]
    objs = " ".join(f"part{p}.o" for p in range(parts))
    lines += [f"build {so_name}: link {objs}", f"  flags = {q([*flags, *_soname(so_name)])}", "  log = link.log"]
    return "\n".join(lines) + "\n"


def library_in_background(name: str, arch: str) -> None:
    """Build the library on a thread of its own, niced, once per process, where it is not built."""
    key = (name, arch)
    if library_ready(name, arch) or (key in _BACKGROUND and _BACKGROUND[key].is_alive()):
        return
    t = threading.Thread(target=library, args=(name, arch), kwargs={"nice": BACKGROUND_NICE},
                         name=f"htam-library-{name}", daemon=True)
    _BACKGROUND[key] = t
    t.start()


def library_here(name: str) -> bool:
    """Whether our library `name` is built for this machine's GPU (without a GPU: for
    default_arch()). NOTE: on a GPU machine whose arch it builds for, asking starts its build in
    the background (minutes) where it is not built: the expert proposes its candidates once it is."""
    from torch_htam import gpu
    info = gpu.detect()
    if info is None:
        return library_ready(name, default_arch())
    if library_state(name, info.arch)[0] is LibraryState.NOT_BUILT:
        library_in_background(name, info.arch)
    return library_ready(name, info.arch)


def libraries_ready(arch: str) -> list[str]:
    """The names of our libraries built for arch."""
    return sorted(name for name in OUR_LIBRARIES if library_ready(name, arch))


def libraries_building() -> list[str]:
    """The names of our libraries whose background build (library_in_background) still runs."""
    return sorted({name for (name, _), t in _BACKGROUND.items() if t.is_alive()})


def wait_for_libraries(max_s: float, clock=time.monotonic) -> list[str]:
    """Wait up to max_s seconds for the background builds in flight; the names still building."""
    end = clock() + max(max_s, 0.0)
    for t in [t for t in _BACKGROUND.values() if t.is_alive()]:
        t.join(max(end - clock(), 0.0))
    return libraries_building()


def source_hash(source: str, arch: str) -> str:
    """Content hash of everything that determines the binary: source, arch, nvcc version, flags and
    the ABI header. 20 hex chars.

        >>> build.source_hash(src, "sm_90a")
        '3f2a9c0d81e4b7a6c2d1'
    """
    h = hashlib.sha256()
    for part in (source, arch, paths.nvcc_version(), " ".join(_flags(source, arch)),
                 ABI_HEADER.read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def default_arch() -> str:
    """The GPU's arch, else $HTAM_ARCH, else sm_90a (the H100 this project is measured on)."""
    from torch_htam import gpu
    info = gpu.detect()
    return info.arch if info else os.environ.get("HTAM_ARCH") or DEFAULT_ARCH


# --------------------------------------------------------------------------------------------
# Builds
# --------------------------------------------------------------------------------------------


@dataclass
class BuildResult:
    """ok: the .so exists at so_path. error: short feedback for the proposer ("" when ok);
    log: the full compiler output; seconds: this source's compile time (0 when cached);
    resources: ptxas's account of the kernels (None where the log has none); timed_out: the build
    was stopped at its timeout, the compiler having reported no error by then."""
    ok: bool
    so_path: str | None
    source_hash: str
    error: str = ""
    log: str = ""
    seconds: float = 0.0
    cached: bool = False
    resources: "Resources | None" = None
    timed_out: bool = False


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for a library's kernels (-Xptxas -v), summed up over its entry
    functions: the most registers a thread of one of them uses, the bytes all of them spill to
    local memory (stores + loads), the most static shared memory and stack a block or thread of
    one of them takes. Spills and a register count that caps occupancy are what a next candidate
    can act on (smaller tiles, fewer live values, __launch_bounds__)."""
    kernels: int
    registers: int
    spill_bytes: int
    smem_bytes: int
    stack_bytes: int


_PTXAS_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"ptxas info\s*: Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> Resources | None:
    """Resources from ptxas -v lines in a build log, None if it has none. Per entry function
    ptxas prints, in this order:
        ptxas info    : Compiling entry function '_Z3addPfPKfi' for 'sm_90a'
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 10 registers, used 0 barriers, 4096 bytes smem
    """
    kernels, regs, spill, smem, stack = 0, 0, 0, 0, 0
    for line in log.splitlines():
        if _PTXAS_ENTRY.search(line):
            kernels += 1
        elif m := _PTXAS_FRAME.search(line):
            stack, spill = max(stack, int(m[1])), spill + int(m[2]) + int(m[3])
        elif m := _PTXAS_USED.search(line):
            regs, smem = max(regs, int(m[1])), max(smem, int(m[2] or 0))
    return Resources(kernels, regs, spill, smem, stack) if kernels else None


@dataclass
class _Job:
    index: int
    source: str
    hash: str
    flags: list[str] = field(default_factory=list)


def _ninja() -> str | None:
    try:
        import ninja
        exe = Path(ninja.BIN_DIR) / "ninja"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    return shutil.which("ninja")


def _ninja_file(jobs: list[_Job], nvcc: str) -> str:
    """One nvcc edge per source, paths relative to the batch directory (ninja runs with -C there);
    each edge writes its own log so each failure gets its own error."""
    lines = ["ninja_required_version = 1.3", f"nvcc = {_ninja_value(_shell_quote(nvcc))}", "",
             "rule nvcc",
             "  command = $nvcc $flags $in -o $out > $log 2>&1",
             "  description = nvcc $in", ""]
    for j in jobs:
        flags = " ".join(_shell_quote(f) for f in j.flags)
        lines += [f"build {j.hash}.so: nvcc {j.hash}.cu", f"  flags = {_ninja_value(flags)}",
                  f"  log = {j.hash}.log"]
    return "\n".join(lines) + "\n"


def _ninja_value(s: str) -> str:
    return s.replace("$", "$$")


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def _edge_seconds(ninja_log: Path) -> dict[str, float]:
    """Per-output compile time from .ninja_log (v5+: start_ms, end_ms, mtime, output, hash)."""
    out = {}
    if ninja_log.exists():
        for row in ninja_log.read_text().splitlines()[1:]:
            parts = row.split("\t")
            if len(parts) >= 4 and parts[0].isdigit():
                out[Path(parts[3]).stem] = (int(parts[1]) - int(parts[0])) / 1000
    return out


# How often a build that can be cancelled looks at its cancel event, seconds.
CANCEL_POLL_S = 0.25
# The niceness of background builds (build_many(background=True)): their nvcc take only the cores
# the search's own builds, its GPU worker and the host's timing leave idle.
BACKGROUND_NICE = 15


# The background builds' ninja processes running now (nice > 0): background_paused() stops them.
_BACKGROUND_NINJAS: set[subprocess.Popen] = set()
_BACKGROUND_LOCK = threading.Lock()


def _process_tree(pid: int) -> list[int]:
    """pid and its descendants, parents first, from /proc (empty without /proc or once pid is gone).
    NOTE: ninja starts each command in a process group of its own, so a signal to ninja's group
    would miss its nvcc (and their cicc, cc1plus, ptxas): the tree is walked by parent pid."""
    children: dict[int, list[int]] = {}
    try:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(d))
    except OSError:
        return []
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            continue


def _until_stopped(pids: list[int], max_s: float = 1.0) -> None:
    """Wait (at most max_s) until each of pids is stopped or gone: a signal is delivered
    asynchronously, and a process read as running right after SIGSTOP still takes a core."""
    end = time.monotonic() + max_s
    for p in pids:
        while time.monotonic() < end:
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in "TtZX":
                        break
            except (OSError, IndexError):
                break
            time.sleep(0.005)


@contextlib.contextmanager
def background_paused():
    """Background builds (a library's, a prebuild's: niced ninja) stopped for the block, resumed
    after it, so that a host-bound model is timed on cores they leave alone. NOTE: nice does not
    keep them off a core the timing's Python thread wants, and optimize's decision waits up to
    timing.QUIET_MAX_S for other processes' load to fall: on a fresh H100 host a gpt2 bf16 optimize
    (budget 110 s) waited 20.3 s of it while the cudnn_sdpa library built in the background
    (optimize_time-20261202-190425). A build's timeout keeps running while it is stopped."""
    with _BACKGROUND_LOCK:
        trees = [_process_tree(p.pid) for p in _BACKGROUND_NINJAS if p.poll() is None]
    stopped = [pid for tree in trees for pid in tree]
    _signal_all(stopped, signal.SIGSTOP)      # parents first: a stopped ninja starts no new nvcc
    _until_stopped(stopped)
    try:
        yield len(trees)
    finally:
        _signal_all(stopped[::-1], signal.SIGCONT)


def _run_ninja(ninja: str, build_file: Path, jobs: int, timeout_s: float,
               cancel: threading.Event | None = None, nice: int = 0) -> tuple[bool, str]:
    """Runs ninja -k 0 (under `nice -n NICE` where nice > 0); returns (stopped, ninja's own
    output): stopped when timeout_s passed or `cancel` was set first. On a stop (or an interrupt)
    no nvcc outlives the call: see _stop_ninja."""
    cmd = [ninja, "-C", str(build_file.parent), "-f", build_file.name, "-k", "0", "-j", str(jobs)]
    if nice > 0 and (nice_exe := shutil.which("nice")):
        cmd = [nice_exe, "-n", str(nice), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if nice > 0:
        with _BACKGROUND_LOCK:
            _BACKGROUND_NINJAS.add(proc)
    end = time.monotonic() + timeout_s
    try:
        while True:
            wait = end - time.monotonic()
            if cancel is not None:
                wait = min(wait, CANCEL_POLL_S)
            try:
                out, _ = proc.communicate(timeout=max(wait, 0.0))
                return False, out
            except subprocess.TimeoutExpired:
                if time.monotonic() >= end or (cancel is not None and cancel.is_set()):
                    break
        _stop_ninja(proc)
        out, _ = proc.communicate()
        return True, out
    except BaseException:
        _stop_ninja(proc)
        raise
    finally:
        with _BACKGROUND_LOCK:
            _BACKGROUND_NINJAS.discard(proc)


# Seconds ninja gets to stop its commands after SIGTERM before it is killed outright.
NINJA_STOP_S = 5.0


def _stop_ninja(proc: subprocess.Popen) -> None:
    """SIGTERM to ninja, which kills each running command's process group, then SIGKILL.
    NOTE: ninja starts every command in a process group of its own, so killing ninja's group
    leaves its nvcc (and their cicc, cc1plus, ptxas) running as orphans: a search cut at its
    deadline left nvcc compiling through optimize's decision timing, where a host-bound model's
    torch.compile (ResNet-50 bf16, b32, H100) measured 3.6-3.7 ms against 3.0 ms on a quiet host."""
    if proc.poll() is not None:
        return
    _signal_all(_process_tree(proc.pid), signal.SIGCONT)    # one background_paused() stopped acts on it
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=NINJA_STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# .so paths a build_many of this process is compiling now -> set when that call is done with them.
# A second call asked for one waits for the first instead of running a second nvcc on it (the
# search's builds and a Prebuild's background builds of the same candidates).
_BUILDING: dict[Path, threading.Event] = {}
_BUILDING_LOCK = threading.Lock()


def _claim(sos: list[Path]) -> tuple[list[Path], dict[Path, threading.Event]]:
    """(the .so paths this call compiles, {path: event} of those another call compiles now). A
    path another call finished since the caller looked for it is in neither: it exists now.
    NOTE: without that look under the lock, a search that looked just before a background build
    released its claim compiled the same source again (tests/test_prebuild.py, a loaded CI host)."""
    mine, theirs = [], {}
    with _BUILDING_LOCK:
        for so in sos:
            if so in _BUILDING:
                theirs[so] = _BUILDING[so]
            elif not so.exists():
                _BUILDING[so] = threading.Event()
                mine.append(so)
    return mine, theirs


def _release(sos: list[Path]) -> None:
    with _BUILDING_LOCK:
        for so in sos:
            event = _BUILDING.pop(so, None)
            if event is not None:
                event.set()


def build_many(sources: list[str], arch: str | None = None, out_dir: str | Path | None = None,
               jobs: int | None = None, timeout_s: float = 300, background: bool = False,
               cancel: threading.Event | None = None) -> list[BuildResult]:
    """Build candidates to .so files in parallel; results in the order of `sources`.

    Static-check failures never compile (error "static check: ..."); sources already built (same
    content hash in out_dir) come back cached=True, and so do those another call of this process
    was compiling, once it has (a source that call failed on is compiled here again).
    background: run nvcc niced (BACKGROUND_NICE); cancel: an event that stops the build when set
    (its unfinished sources fail as timed out).

        >>> results = build.build_many([src_a, src_b], jobs=16)
        >>> [r.ok for r in results], results[1].error
    """
    arch = arch or default_arch()
    out_dir = Path(out_dir) if out_dir is not None else paths.arch_dir(arch) / "build"
    results: list[BuildResult | None] = [None] * len(sources)
    todo: dict[str, _Job] = {}                    # hash -> job; duplicates build once
    waiting: dict[str, list[int]] = {}
    nvcc = paths.nvcc_path()
    for i, src in enumerate(sources):
        h = source_hash(src, arch)
        problems = check_source(src)
        so = out_dir / f"{h}.so"
        if problems:
            results[i] = BuildResult(False, None, h, "static check: " + "; ".join(problems))
        elif so.exists():
            results[i] = _cached(so)
        elif nvcc is None:
            results[i] = BuildResult(False, None, h, "nvcc not found: install the CUDA toolkit or set CUDA_HOME")
        else:
            search, err = _search_flags(src, arch)
            if err:
                results[i] = BuildResult(False, None, h, err)
                continue
            todo.setdefault(h, _Job(i, src, h, _flags(src, arch) + search + list(REPORT_FLAGS)))
            waiting.setdefault(h, []).append(i)
    if not todo:
        return results  # type: ignore[return-value]
    t0, n_jobs, nice = time.monotonic(), jobs or len(usable_cpus()), BACKGROUND_NICE if background else 0
    mine, theirs = _claim([out_dir / f"{h}.so" for h in todo])
    try:
        built = _compile([todo[so.stem] for so in mine], out_dir, nvcc, n_jobs, timeout_s, cancel, nice) if mine else {}
    finally:
        _release(mine)
    for so, event in theirs.items():
        event.wait(max(timeout_s - (time.monotonic() - t0), 0.0))
    for so in (out_dir / f"{h}.so" for h in todo):
        if so.stem not in built and so.exists():   # another call's: waited for, or done before the claim
            built[so.stem] = _cached(so)
    if again := [todo[so.stem] for so in theirs if so.stem not in built]:
        left = max(timeout_s - (time.monotonic() - t0), 1.0)
        built.update(_compile(again, out_dir, nvcc, n_jobs, left, cancel, nice))
    for h, res in built.items():
        for i in waiting[h]:
            results[i] = res
    return results  # type: ignore[return-value]


def _cached(so: Path) -> BuildResult:
    """A library already built (<hash>.so): its ptxas report from the log kept beside it."""
    log = so.with_suffix(".log")
    return BuildResult(True, str(so), so.stem, cached=True,
                       resources=parse_ptxas(log.read_text(errors="replace")) if log.exists() else None)


def build(source: str, **kw) -> BuildResult:
    """One candidate: build_many([source], **kw)[0].

        >>> r = build.build(src, arch="sm_90a")
        >>> r.ok, r.so_path, r.seconds
    """
    return build_many([source], **kw)[0]


def _compile(jobs: list[_Job], out_dir: Path, nvcc: str, n_jobs: int, timeout_s: float,
             cancel: threading.Event | None = None, nice: int = 0) -> dict[str, BuildResult]:
    ninja = _ninja()
    if ninja is None:
        return {j.hash: BuildResult(False, None, j.hash, "ninja not found: pip install ninja") for j in jobs}
    out_dir.mkdir(parents=True, exist_ok=True)
    # NOTE: a private directory per call, so concurrent build_many calls (several workers, one
    # cache) never share a build.ninja, a .ninja_log or a half-written .so.
    tmp = out_dir / f".batch-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for j in jobs:
            (tmp / f"{j.hash}.cu").write_text(j.source)
        build_file = tmp / "build.ninja"
        build_file.write_text(_ninja_file(jobs, nvcc))
        t0 = time.perf_counter()
        timed_out, ninja_out = _run_ninja(ninja, build_file, n_jobs, timeout_s, cancel, nice)
        wall = time.perf_counter() - t0
        seconds = _edge_seconds(tmp / ".ninja_log")
        return {j.hash: _collect(j, tmp, out_dir, seconds, wall, timed_out, timeout_s, ninja_out)
                for j in jobs}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _collect(job: _Job, tmp: Path, out_dir: Path, finished: dict[str, float], wall: float,
             timed_out: bool, timeout_s: float, ninja_out: str) -> BuildResult:
    log_file = tmp / f"{job.hash}.log"
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    built = tmp / f"{job.hash}.so"
    # NOTE: ninja records an edge in .ninja_log only when its command succeeded, so a .so left
    # behind by a killed or failed nvcc is never taken.
    if job.hash in finished and built.exists():
        final = out_dir / f"{job.hash}.so"
        os.replace(built, final)              # atomic: readers see no .so or a whole one
        (out_dir / f"{job.hash}.log").write_text(log)
        return BuildResult(True, str(final), job.hash, "", log, finished[job.hash], resources=parse_ptxas(log))
    (out_dir / f"{job.hash}.cu").write_text(job.source)     # kept next to its log for debugging
    if timed_out and not _LOCATED.search(log):
        err = f"build timed out after {timeout_s:g} s"
        (out_dir / f"{job.hash}.log").write_text(log + "\n" + ninja_out)
        return BuildResult(False, None, job.hash, err, log + ninja_out, wall, timed_out=True)
    log = log or ninja_out
    (out_dir / f"{job.hash}.log").write_text(log)
    return BuildResult(False, None, job.hash, compile_feedback(log, job.source), log, wall)


# --------------------------------------------------------------------------------------------
# Compiler output → feedback a proposer can act on
# --------------------------------------------------------------------------------------------

# nvcc front end: "file.cu(12): error: msg";  gcc/clang host pass: "file.cu:12:5: error: msg";
# ptxas/nvlink/ld: "ptxas error   : msg", "/usr/bin/ld: cannot find -lfoo".
_LOCATED = re.compile(r"^\s*(?P<file>[^\s:(]+)(?:\((?P<l1>\d+)\)|:(?P<l2>\d+)(?::\d+)?):\s*"
                      r"(?:(?:catastrophic|fatal)\s+)?error(?:\s*#\S+)?:\s*(?P<msg>.*)$", re.M)
_UNLOCATED = re.compile(r"^(?:ptxas|nvlink)\b.*\berror\b|\bundefined reference\b|\bld: cannot find\b"
                        r"|^nvcc (?:fatal|error)", re.I)


def compile_feedback(log: str, source: str, limit: int = 1500) -> str:
    """The compiler's errors, deduplicated, each with its line number and the offending source
    line; the first error in full (with the compiler's own context: caret, instantiation trace).
    Trimmed to `limit` characters.

        >>> print(build.compile_feedback(res.log, src))
        line 14: error: identifier "blockDimx" is undefined
                int i = blockIdx.x * blockDimx + threadIdx.x;
                                     ^
    """
    src_lines, lines = source.splitlines(), log.splitlines()
    items, seen = [], set()
    for k, raw in enumerate(lines):
        m = _LOCATED.match(raw)
        if m:
            lineno, fname = int(m.group("l1") or m.group("l2")), Path(m.group("file")).name
            key = (fname, lineno, m.group("msg"))
            if key in seen:
                continue
            seen.add(key)
            own = fname.endswith(".cu")        # the candidate; headers are .h/.cuh
            text = f"{'line' if own else fname + ':'}{' ' if own else ''}{lineno}: error: {m.group('msg')}"
            context = _context(lines[k + 1:k + 12]) if not items else []
            if context:
                text += "\n" + "\n".join(context)
            elif own and 0 < lineno <= len(src_lines):
                text += f"\n  {lineno:>4} | {src_lines[lineno - 1].strip()}"
            items.append(text)
        elif _UNLOCATED.search(raw) and raw.strip() not in seen:
            seen.add(raw.strip())
            items.append(re.sub(r"(?:/[^\s/]+)+/", "", raw.strip()))   # drop directories
    if not items:
        tail = [ln for ln in lines if ln.strip() and "errors detected" not in ln and not _ptxas_info(ln)][-10:]
        items = ["\n".join(tail)] if tail else ["build failed with no compiler output"]
    out, used = [], 0
    for n, item in enumerate(items):
        if out and used + len(item) > limit:
            out.append(f"... ({len(items) - n} more errors)")
            break
        out.append(item[:limit])
        used += len(item) + 1
    return "\n".join(out)


def _ptxas_info(line: str) -> bool:
    """A line of ptxas -v's resource report (REPORT_FLAGS), not a diagnostic."""
    return line.startswith("ptxas info") or bool(_PTXAS_FRAME.search(line))


def _context(following: list[str]) -> list[str]:
    """The indented lines nvcc prints after an error (source echo, caret, instantiation trace)."""
    out = []
    for ln in following:
        if not ln.strip() or not ln[0].isspace() or _LOCATED.match(ln):
            break
        out.append(ln.rstrip())
    return out
