"""Calling kernel .so files from PyTorch with a few µs of host overhead.

csrc/launcher.cpp is a small torch C++ extension, built once per torch version, that registers
three operators: htam::load (dlopen a kernel .so), htam::run (call it on given tensors, raw return
code) and htam::launch (allocate outputs, call it on the current stream, raise on a nonzero code).
A fake impl makes the ops work under torch.compile / torch.export, and launches on the current
stream make them work inside CUDA-graph capture.

The runtime's swapped nodes call fast_launch: in plain eager it calls the extension's own Python
binding of the same C++ launch (no dispatcher: a torch.ops call from Python costs ~15 us more than
a native op, H100 measurement in csrc/launcher.cpp); anything traced gets torch.ops.htam.launch.

    >>> k = launcher.Kernel(build.build(src).so_path)
    >>> y, = k.launch([a, b], launcher.encode_out_meta([TensorSpec.of(a)]))
    >>> launcher.fast_launch(k.handle, [a, b], meta)        # the same, what the runtime calls

out_meta ([dtype_code, ndim, d0, ..., dn-1] per output) may name an output size by an input's:
size_ref(i, d, k) is a negative int meaning k * inputs[i].shape[d] (a ranged task's batch dim), so
one graph serves every size without a recompile; the fake impl and the C++ launch resolve it.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from torch_htam import paths
from torch_htam.task import DTYPES, TensorSpec

CSRC = Path(__file__).resolve().parent / "csrc"
log = logging.getLogger("torch_htam")

# HtamDtype codes (csrc/htam_abi.h) by dtype name; tests check them against the header.
DTYPE_CODES: dict[str, int] = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int64": 4,
                               "int32": 5, "bool": 6, "int8": 7, "uint8": 8}
CODE_DTYPES: dict[int, torch.dtype] = {code: DTYPES[name] for name, code in DTYPE_CODES.items()}


def build_dir() -> Path:
    """<cache root>/launcher/<torch version>-<cuda version>: one build per torch binary."""
    tag = re.sub(r"[^\w.+-]", "_", f"torch{torch.__version__}-cuda{torch.version.cuda}")
    return paths.cache_root() / "launcher" / tag


def get():
    """Build (first time, ~20-60 s) or load the launcher; returns the torch.ops.htam namespace with
    .load(path) -> handle, .run(handle, inputs, outputs) -> code, .launch(handle, inputs, out_meta).

        >>> ops = launcher.get()
        >>> h = ops.load("/path/to/3f2a....so")
    """
    extension()
    return torch.ops.htam


@functools.lru_cache(maxsize=None)
def extension():
    """The built launcher as a Python module (importing it registers the torch.ops.htam ops); its
    .launch(handle, inputs, out_meta) is htam::launch without the dispatcher: use fast_launch.

        >>> launcher.extension().launch(h, [x], [0, 1, 1024])     # plain eager CUDA tensors only
    """
    if torch.version.cuda is None:
        raise RuntimeError(f"the htam launcher needs a CUDA build of torch (this is {torch.__version__}); "
                           "install a CUDA wheel of torch, or keep running the original PyTorch model")
    compiler = os.environ.get("CXX", "c++")
    out = build_dir()
    prebuilt = _prebuilt()
    if prebuilt is not None:
        # Shipped in a bundle for this torch and this launcher source: no compiler, no 20-60 s build.
        module = _import_library(prebuilt)
    elif shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler!r}) to build the htam launcher and no prebuilt "
                           f"one in {out}: install g++ (e.g. apt-get install g++), set $CXX, or load "
                           "a bundle precompiled with this torch version (it carries the launcher)")
    else:
        _put_ninja_on_path()
        from torch.utils import cpp_extension
        _fix_cuda_home(cpp_extension)
        out.mkdir(parents=True, exist_ok=True)
        try:
            with build_lock(out):
                module = cpp_extension.load(name="htam_launcher", sources=[str(CSRC / "launcher.cpp")],
                                            extra_include_paths=[str(CSRC)],
                                            extra_ldflags=["-ldl", f"-Wl,--version-script={CSRC / 'launcher.map'}"],
                                            build_directory=str(out), with_cuda=True, is_python_module=True,
                                            verbose=False)
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"building the htam launcher in {out} failed: {e}\nIt needs the CUDA "
                               "toolkit matching torch.version.cuda (set CUDA_HOME) and a C++17 compiler."
                               ) from e
    torch.library.register_fake("htam::launch")(_launch_fake)
    for n in range(1, STABLE_OUTPUTS + 1):
        torch.library.register_fake(f"htam::launch_o{n}")(_stable_fake(n))
    export_shims(module)
    return module


class ShimKey:
    """A key of Inductor's config.aot_inductor.custom_ops_to_c_shims that stands for
    htam::launch_o<n>.default: equal to that op and hashed like it, which is all Inductor asks of
    a key (ir.FallbackKernel: `op in custom_ops_to_c_shims`).

    NOTE: not the op itself: an OpOverload does not pickle, and Inductor pickles its whole config
    into each graph's cache key; this pickles as the op's name, so graphs with our launches stay
    cached (a bundle's Inductor artifacts are found by that key on the server)."""

    def __init__(self, n: int):
        self.n = n
        self.op = stable_op(n)

    def __hash__(self) -> int:
        return hash(self.op)

    def __eq__(self, other) -> bool:
        return other is self.op or (isinstance(other, ShimKey) and other.n == self.n)

    def __reduce__(self):
        return ShimKey, (self.n,)

    def __repr__(self) -> str:
        return f"ShimKey(htam::launch_o{self.n})"


def export_shims(module) -> None:
    """Have Inductor's C++ wrapper call launch_o<N> as a C function, not through the dispatcher
    (csrc/launcher.cpp, the C shims): declare each in Inductor's config, and make the launcher's
    symbols global so the wrapper's library finds them when it is loaded.

    NOTE: measured as bench/launch_cost.py's "ours" against "ours_dispatcher" rows (C++ wrapper).
    The wrapper's library is linked without our launcher and resolves the shims at load time, from
    the process's global symbols: the launcher was loaded as a Python module (RTLD_LOCAL), so it is
    reopened here with RTLD_GLOBAL (RTLD_NOLOAD: the same copy, never a second one)."""
    import ctypes

    import torch._inductor.config as inductor_config
    aoti = inductor_config.aot_inductor
    if not hasattr(aoti, "custom_ops_to_c_shims"):   # a torch without it: the dispatcher's path
        return
    try:
        ctypes.CDLL(module.__file__, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError as e:   # shims declared but not found would fail the wrapper's library at load
        log.warning("htam: launches in Inductor's C++ wrapper go through the dispatcher (%s), "
                    "about 10 us more host time each", e)
        return
    ours = {ShimKey(n): [declaration] for n, declaration in enumerate(module.shim_declarations(), start=1)}
    aoti.custom_ops_to_c_shims = {**aoti.custom_ops_to_c_shims, **ours}


@contextlib.contextmanager
def build_lock(out: Path):
    """One launcher build at a time in `out`, under an flock that the kernel drops with its holder.
    NOTE: torch's cpp_extension.load guards its build with a lock file (FileBaton on some
    versions) whose mere existence makes every later load wait, without limit. A worker killed
    while it built the launcher (optimize's deadline kills its workers) leaves it behind. Under
    this flock no load of ours runs in `out`, so a lock file found here is stale: removed."""
    with open(out / "htam-build.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            (out / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def source_hash() -> str:
    """sha256 of the launcher's sources: a prebuilt library is used only for the same sources."""
    h = hashlib.sha256()
    for f in ("launcher.cpp", "htam_abi.h", "launcher.map"):
        h.update((CSRC / f).read_bytes())
    return h.hexdigest()


def built_library() -> Path | None:
    """The launcher library this process can ship: the newest one built in build_dir()
    (htam_launcher.so, or htam_launcher_v<N>.so after a source change), else an adopted one.

        >>> launcher.built_library()
        PosixPath('/root/.cache/torch_htam/launcher/torch2.11.0+cu130-cuda13.0/htam_launcher.so')
    """
    libs = sorted(build_dir().glob("htam_launcher*.so"), key=lambda f: f.stat().st_mtime)
    return libs[-1] if libs else _prebuilt()


def ship(dst_dir: Path) -> bool:
    """Copy the built launcher into dst_dir/<torch tag>/ with its source hash (for a bundle);
    False when there is none to copy.

        >>> launcher.ship(Path("bundle/launcher"))
        True
    """
    lib = built_library()
    if lib is None:
        return False
    dst = Path(dst_dir) / build_dir().name
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lib, dst / lib.name)
    (dst / "source.sha256").write_text(source_hash())
    return True


def adopt(shipped_dir: Path) -> bool:
    """Take a launcher that ship() wrote, when it is for this torch and these launcher sources;
    True if this process can now import a prebuilt launcher. extension() prefers it to building.

        >>> launcher.adopt(Path("bundle/launcher"))
        True
    """
    src = Path(shipped_dir) / build_dir().name
    libs = sorted(src.glob("htam_launcher*.so"))
    ok = libs and (src / "source.sha256").is_file() and (src / "source.sha256").read_text() == source_hash()
    if ok and _prebuilt() is None:
        dst = build_dir() / "prebuilt"
        dst.mkdir(parents=True, exist_ok=True)
        tmp = dst / (libs[-1].name + ".tmp")
        shutil.copyfile(libs[-1], tmp)
        tmp.replace(dst / libs[-1].name)   # atomic: another process never imports half a file
        (dst / "source.sha256").write_text(source_hash())
    return _prebuilt() is not None


def _prebuilt() -> Path | None:
    d = build_dir() / "prebuilt"
    stamp = d / "source.sha256"
    libs = sorted(d.glob("htam_launcher*.so"))
    if libs and stamp.is_file() and stamp.read_text() == source_hash():
        return libs[-1]
    return None


def _import_library(path: Path):
    import importlib.util
    # NOTE: the module name must be the file's stem: its init function is PyInit_<stem>.
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fix_cuda_home(cpp_extension) -> None:
    """Point cpp_extension at a toolkit that has the CUDA headers.

    NOTE: cpp_extension guesses CUDA_HOME at import as the parent of the `nvcc` on PATH; where that
    nvcc is a wrapper script (this project's CI image: /usr/local/bin/nvcc) the guess is /usr/local
    and the build stops at `cuda_runtime.h: No such file`. An explicit $CUDA_HOME is left alone.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or _has_headers(cpp_extension.CUDA_HOME):
        return
    root = _cuda_toolkit()
    if root is not None:
        cpp_extension.CUDA_HOME = str(root)


def _cuda_toolkit() -> Path | None:
    """The CUDA toolkit with the runtime headers: $CUDA_HOME / $CUDA_PATH or the nvcc on PATH's
    parent (build._cuda_home), else /usr/local/cuda; None if neither has them."""
    from torch_htam import build
    for root in (build._cuda_home(), "/usr/local/cuda"):
        if _has_headers(root):
            return Path(root)
    return None


def _has_headers(root) -> bool:
    return bool(root) and (Path(root) / "include" / "cuda_runtime.h").is_file()


def _put_ninja_on_path() -> None:
    # cpp_extension runs `ninja` from PATH; the pip package may be installed without its bin dir
    # on PATH (e.g. pip install --target).
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        raise RuntimeError("ninja is needed to build the htam launcher: pip install ninja") from None
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


# out_meta's dtype code carries the output's layout: dtype code + DIM_ORDER * order_code(order),
# order the dims outermost to innermost in memory (TensorSpec.dim_order), so the launcher can
# allocate a transposed output as dense as a contiguous one (csrc/launcher.cpp decodes the same).
DIM_ORDER = 256
ORDER_BITS = 3   # per dim: dims 0..7 (HTAM_MAX_DIMS 8)


def order_code(order: tuple[int, ...]) -> int:
    """order (a permutation, outermost dim first) as out_meta's layout code: 0 for row-major,
    else dim order[i] in bits [3i, 3i + 3). Only row-major codes to 0, as a permutation of two or
    more dims has a nonzero digit.

        >>> launcher.order_code((0, 1, 2, 3)), launcher.order_code((0, 2, 3, 1))
        (0, 720)
    """
    if tuple(order) == tuple(range(len(order))):
        return 0
    if sorted(order) != list(range(len(order))) or len(order) > 1 << ORDER_BITS:
        raise ValueError(f"order_code: {order} is not a permutation of at most {1 << ORDER_BITS} dims")
    return sum(d << (ORDER_BITS * i) for i, d in enumerate(order))


def order_of_code(code: int, ndim: int) -> tuple[int, ...]:
    """Inverse of order_code for an ndim-dim output."""
    if code == 0:
        return tuple(range(ndim))
    order = tuple((code >> (ORDER_BITS * i)) & ((1 << ORDER_BITS) - 1) for i in range(ndim))
    if sorted(order) != list(range(ndim)) or code >> (ORDER_BITS * ndim):
        raise ValueError(f"out_meta: layout code {code} is no order of {ndim} dims")
    return order


class OutMeta(NamedTuple):
    """One output as out_meta describes it: dtype, shape (size references resolved) and the dims'
    order in memory, outermost first."""
    dtype: torch.dtype
    shape: tuple
    order: tuple[int, ...]

    def empty(self, device) -> torch.Tensor:
        """A fresh tensor laid out as the launcher allocates this output (symbolic sizes too)."""
        return torch.empty_permuted(self.shape, self.order, dtype=self.dtype, device=device)


# ---- out_meta size references ------------------------------------------------------------------
# A size entry of out_meta (never a dtype code or ndim) may be a reference instead of a size:
#     size_ref(i, d, k) = -1 - ((k - 1) << 16 | d << 10 | i)        (always < 0)
# meaning k * inputs[i].shape[d]: input index i < 1024 (10 bits), dim d < 64 (6 bits), factor k >= 1
# in the bits above. Real sizes are >= 0, so the two never clash. csrc/launcher.cpp (resolve_size)
# decodes the same bits; tests/test_launcher.py checks that the two agree.
REF_INPUT_BITS, REF_DIM_BITS = 10, 6


class SizeRef(NamedTuple):
    """An output size that is k * inputs[input].shape[dim] (k >= 1)."""
    input: int
    dim: int
    k: int = 1


def size_ref(i: int, d: int, k: int = 1) -> int:
    """The out_meta size entry meaning k * inputs[i].shape[d].

        >>> launcher.size_ref(0, 0), launcher.size_ref(2, 1, 8)
        (-1, -459779)
    """
    if not (0 <= i < 1 << REF_INPUT_BITS and 0 <= d < 1 << REF_DIM_BITS and k >= 1):
        raise ValueError(f"size_ref({i}, {d}, {k}): needs 0 <= input < {1 << REF_INPUT_BITS}, "
                         f"0 <= dim < {1 << REF_DIM_BITS} and k >= 1")
    return -1 - ((k - 1) << (REF_INPUT_BITS + REF_DIM_BITS) | d << REF_INPUT_BITS | i)


def size_ref_of(entry: int) -> SizeRef | None:
    """Inverse of size_ref: the SizeRef an out_meta size entry stands for, None for a plain size."""
    if entry >= 0:
        return None
    v = -1 - entry
    return SizeRef(v & ((1 << REF_INPUT_BITS) - 1), (v >> REF_INPUT_BITS) & ((1 << REF_DIM_BITS) - 1),
                   (v >> (REF_INPUT_BITS + REF_DIM_BITS)) + 1)


def encode_out_meta(specs: list[TensorSpec], refs: list[dict[int, tuple[int, int, int]] | None] | None = None
                    ) -> list[int]:
    """Output specs -> htam::launch's out_meta: [dtype_code, ndim, d0, ..., dn-1] per output, the
    shape the kernel writes (TensorSpec.kernel_shape: an expanded output without its expand, which
    task_outputs puts back). A dense output in another dim order (channels-last, a transpose's
    result: TensorSpec.dim_order) adds DIM_ORDER * order_code to its dtype code: the launcher
    allocates it in that order. refs: per output, None or
    {dim: (input index, input dim, k)}; those dims are written as size_ref (k * that input's size),
    for a graph whose sizes vary (out_refs(task) derives them from a ranged task).

        >>> launcher.encode_out_meta([TensorSpec((4, 8), "float32", (8, 1))])
        [0, 2, 4, 8]
        >>> launcher.encode_out_meta([TensorSpec((4, 8), "float32", (8, 1))], [{0: (0, 0, 1)}])
        [0, 2, -1, 8]
    """
    if refs is not None and len(refs) != len(specs):
        raise ValueError(f"encode_out_meta: {len(refs)} refs for {len(specs)} outputs (one per output)")
    why = unallocatable(specs)
    if why:
        raise ValueError(f"{why}: preallocate it and call Kernel(...)(inputs, outputs)")
    meta = []
    for j, s in enumerate(specs):
        order = tuple(range(len(s.shape))) if s.broadcast_dims else s.dim_order
        meta += [DTYPE_CODES[s.dtype] + DIM_ORDER * order_code(order), len(s.shape),
                 *_sizes(s, refs[j] if refs else None)]
    return meta


def unallocatable(specs: list[TensorSpec]) -> str | None:
    """Why htam::launch cannot allocate these outputs (None: it can): it allocates dense ones in any
    dim order (TensorSpec.dim_order) and an expanded output's contiguous tensor before its expand,
    so a region whose output is a view into more memory (a slice) cannot be swapped in."""
    for s in specs:
        if (s.broadcast_dims and not _dense_but_broadcast(s)) or (not s.broadcast_dims and s.dim_order is None):
            return (f"htam::launch allocates dense outputs, but an output has strides {s.stride} for shape "
                    f"{s.shape}")
    return None


def _sizes(spec: TensorSpec, refs: dict[int, tuple[int, int, int]] | None) -> list[int]:
    """spec.kernel_shape() with the dims in refs written as size_ref."""
    shape = list(spec.kernel_shape())
    for d, ref in (refs or {}).items():
        if not 0 <= d < len(shape):
            raise ValueError(f"encode_out_meta: a reference for dim {d} of a {len(shape)}-D output")
        shape[d] = size_ref(*ref)
    return shape


def out_refs(task) -> list[dict[int, SizeRef]]:
    """encode_out_meta's refs for a task whose sizes vary: each dynamic dim of each output as the
    input dynamic dim it is a multiple of (smallest k). Every dynamic dim scales by one factor
    (verify._sized), so an output dim of example size n is k * an input dim of example size n / k.

        >>> launcher.out_refs(task)          # x [B*8, 4] -> out [B*8, 4]
        [{0: SizeRef(input=0, dim=0, k=1)}]
    """
    dyn = [(s.shape[d], i, d) for i, s in enumerate(task.inputs) for d in s.dynamic if s.shape[d] > 0]
    out = []
    for j, o in enumerate(task.outputs):
        refs = {}
        for d in o.dynamic:
            if d in o.broadcast_dims:   # the kernel writes size 1 there (kernel_shape)
                continue
            n = o.shape[d]
            k, i, dd = min(((n // m, i, dd) for m, i, dd in dyn if n % m == 0), default=(0, -1, -1))
            if not k:
                raise ValueError(f"{task.name} output {j} dim {d} (size {n}) is no multiple of a dynamic "
                                 "input dim: its size cannot follow the inputs'")
            refs[d] = SizeRef(i, dd, k)
        out.append(refs)
    return out


def _dense_but_broadcast(s: TensorSpec) -> bool:
    """Contiguous, or the expand of a contiguous tensor (contiguous over its other dims)."""
    if s.contiguous or not s.broadcast_dims:
        return s.contiguous
    acc = 1
    for n, st in reversed(list(zip(s.kernel_shape(), s.stride))):
        if n != 1 and st != acc:
            return False
        acc *= n
    return True


def task_outputs(outs: list[torch.Tensor], specs: list[TensorSpec],
                 shapes: list[tuple[int, ...]] | None = None) -> list[torch.Tensor]:
    """A kernel's outputs as the task returns them: each expanded output (TensorSpec.broadcast_dims)
    expanded back to its shape (from `shapes`, default the specs'), a view like torch's own.

        >>> y, m = launcher.task_outputs(k.launch(inputs, launcher.encode_out_meta(specs)), specs)
    """
    shapes = shapes if shapes is not None else [s.shape for s in specs]
    return [o.expand(sh) if s.broadcast_dims else o for o, s, sh in zip(outs, specs, shapes)]


def decode_out_meta(meta: list[int], inputs: list[torch.Tensor] | None = None) -> list[OutMeta]:
    """Inverse of encode_out_meta: one OutMeta per output, each size reference resolved against
    `inputs`' sizes (ints, or SymInts under FakeTensor: they just multiply).

        >>> launcher.decode_out_meta([0, 2, launcher.size_ref(0, 0, 2), 8], [torch.empty(3, 8)])
        [OutMeta(dtype=torch.float32, shape=(6, 8), order=(0, 1))]
    """
    out, i = [], 0
    while i < len(meta):
        ndim, code = meta[i + 1], meta[i]
        shape = tuple(_resolve(n, inputs, len(out)) for n in meta[i + 2:i + 2 + ndim])
        out.append(OutMeta(CODE_DTYPES[code % DIM_ORDER], shape, order_of_code(code // DIM_ORDER, ndim)))
        i += 2 + ndim
    return out


def _resolve(entry: int, inputs: list[torch.Tensor] | None, output: int):
    """A size entry of output `output`: the size itself, or what its reference names in inputs."""
    ref = size_ref_of(entry)
    if ref is None:
        return entry
    where = f"out_meta: output {output}'s size {entry} is {ref.k} * inputs[{ref.input}].shape[{ref.dim}]"
    if inputs is None:
        raise ValueError(f"{where}, but no inputs were given to resolve it (decode_out_meta(meta, inputs))")
    if ref.input >= len(inputs):
        raise ValueError(f"{where}, but the launch has {len(inputs)} inputs")
    if ref.dim >= inputs[ref.input].dim():
        raise ValueError(f"{where}, but that input has {inputs[ref.input].dim()} dims")
    return ref.k * inputs[ref.input].shape[ref.dim]


# ---- launch_o<N>: htam::launch as Inductor's C++ wrapper calls it without Python -----------------
# csrc/launcher.cpp says why: out_meta in STABLE_META_SLOTS ints per output ([code, ndim, d0..d7],
# zero padded), the inputs in STABLE_INPUTS optional tensors (the rest None), N tensors back.
# tests/test_launcher.py checks these against the extension's own.
STABLE_INPUTS, STABLE_OUTPUTS, STABLE_META_SLOTS = 16, 4, 2 + 8
# The message launch_o<N> hands the failure hook where a ranged kernel's inputs fit none of its
# buckets (set_fits): the region runs by design, not as a failure (fallback.after_failed_launch).
OUTSIDE_BUCKETS = "htam: the inputs lie outside the kernel's buckets"


def stable_op(n_outputs: int):
    """htam::launch_o<n_outputs> (the launcher loaded)."""
    return getattr(torch.ops.htam, f"launch_o{n_outputs}").default


def stable_args(handle: int, inputs: list, out_meta: list[int]) -> tuple[int, tuple] | None:
    """(outputs, args) to call stable_op(outputs) with what htam::launch(handle, inputs, out_meta)
    is called with; None where the launch has more inputs, outputs or dims than its slots hold.

        >>> launcher.stable_args(h, [x], [0, 2, 4, 8])
        (1, (h, 0, 2, 4, 8, 0, 0, 0, 0, 0, 0, x, None, ..., None))
    """
    slots, i = [], 0
    while i < len(out_meta):
        ndim = out_meta[i + 1]
        if ndim > STABLE_META_SLOTS - 2:
            return None
        slots += [*out_meta[i:i + 2 + ndim], *[0] * (STABLE_META_SLOTS - 2 - ndim)]
        i += 2 + ndim
    n = len(slots) // STABLE_META_SLOTS
    if not 1 <= n <= STABLE_OUTPUTS or len(inputs) > STABLE_INPUTS:
        return None
    return n, (handle, *slots, *inputs, *[None] * (STABLE_INPUTS - len(inputs)))


def meta_of_slots(slots) -> list[int]:
    """out_meta back from launch_o<N>'s slots (the C++ launch reads them alike)."""
    meta = []
    for o in range(0, len(slots), STABLE_META_SLOTS):
        meta += slots[o:o + 2 + slots[o + 1]]
    return meta


def _stable_fake(n: int):
    def fake(handle, *args, **named):
        # the slots positionally; the optional inputs positionally or by name (in0, in1, ...)
        args = [*args, *(named[f"in{i}"] for i in range(STABLE_INPUTS) if f"in{i}" in named)]
        k = n * STABLE_META_SLOTS
        outs = _launch_fake(handle, [x for x in args[k:] if x is not None], meta_of_slots(args[:k]))
        return outs[0] if n == 1 else tuple(outs)
    return fake


def stable_calls() -> dict[int, int]:
    """{handle: successful launch_o<N> calls} (the C++ wrapper's launches, which fallback's Python
    counts never see); {} where the launcher is not loaded."""
    return extension().stable_calls() if extension.cache_info().currsize else {}


def graph_launches() -> dict[int, dict[str, int]]:
    """{handle: GraphStats} of the loaded kernels whose launches may run as CUDA graphs (csrc/
    launcher.cpp: graphs held; plain, replays, captures, instantiations, updates, failures, and
    each path's host ns); {} where the launcher is not loaded."""
    return extension().graph_launches() if extension.cache_info().currsize else {}


def host_times() -> dict[int, dict[str, int]]:
    """{handle: {launches, launch_ns, runs, run_ns}} of the loaded kernels (csrc/launcher.cpp): the
    host ns of their successful launches in the launcher (outputs allocated, tensors described,
    the kernel's host work or its graph launch) and, of the plain calls, in the kernel's own
    htam_run (a conv's fold launch and cuDNN's execute); {} where the launcher is not loaded."""
    return extension().host_times() if extension.cache_info().currsize else {}


CAPTURE_GAP_S = 0.002   # csrc/launcher.cpp kCaptureGapNs: at most one capture per this long a device


def plain_launches() -> int:
    """Launches of our graph-capable kernels that ran plain so far (GraphStats.plain, summed)."""
    return sum(stats.get("plain", 0) for stats in graph_launches().values())


def settle_graphs(call: Callable[[], object], max_calls: int = 32) -> int:
    """Call `call` (a forward on fixed inputs) until one call launches none of our graph-capable
    kernels plain, at most max_calls times, each past the launcher's capture window: then every
    launch the call makes runs as a CUDA graph, as it will in steady serving, and a timing of it
    measures that rather than a mix of captures and plain launches. The calls made; 0 where no
    such kernel is loaded or graph launches are off (set_graph_launches)."""
    if not graph_launches() or not extension().graph_launches_on():
        return 0
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for n in range(1, max_calls + 1):
        before = plain_launches()
        time.sleep(1.25 * CAPTURE_GAP_S)
        call()
        sync()
        extension().graphs_idle(5.0)   # the graph thread's instantiation of this call's capture
        if plain_launches() == before:
            return n
    return max_calls


def set_graph_launches(on: bool) -> bool | None:
    """Whether our kernels' launches may run as CUDA graphs from now on (csrc/launcher.cpp; the
    default: off, unless HTAM_GRAPH_LAUNCHES=1); the last setting, or None where the launcher is not
    loaded (nothing to switch)."""
    return extension().set_graph_launches(on) if extension.cache_info().currsize else None


def fast_launch(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    """torch.ops.htam.launch.default(handle, inputs, out_meta), without the dispatcher's host cost
    in plain eager. Traced calls (torch.compile, torch.export, make_fx, FakeTensor, dispatch or
    function modes) take the op itself, so graphs still record htam::launch.

        >>> y, = launcher.fast_launch(k.handle, [x], launcher.encode_out_meta([TensorSpec.of(x)]))
    """
    if plain_eager(inputs):
        return extension().launch(handle, inputs, out_meta)
    return torch.ops.htam.launch.default(handle, inputs, out_meta)


def plain_eager(inputs: list[torch.Tensor]) -> bool:
    """True when these inputs are being run, not traced: real tensors, no compile/export, no mode.

        >>> launcher.plain_eager([torch.ones(2)]), launcher.plain_eager([])
        (True, False)
    """
    # NOTE: is_compiling() first: Dynamo folds it to True, so it traces only the op branch. The
    # whole test measured 0.5 us per call on a 2-core dev CPU. A traced value is never a plain torch.Tensor (FakeTensor,
    # FunctionalTensor, fx.Proxy), and a mode on the dispatch or function stack (make_fx on real
    # tensors, FlopCounterMode, ...) must see the op.
    return (not torch.compiler.is_compiling() and bool(inputs) and type(inputs[0]) in _EAGER_TYPES
            and not torch._C._len_torch_dispatch_stack() and not torch._C._is_torch_function_mode_enabled())


# Plain eager tensor types; a Parameter is a plain tensor too (a region's first input may be a weight).
_EAGER_TYPES = (torch.Tensor, torch.nn.Parameter)


def _launch_fake(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    # Shapes come from out_meta, its size references from the inputs' (symbolic) sizes; the device
    # from the inputs (all on one device).
    device = inputs[0].device if inputs else torch.device("cuda", torch.cuda.current_device())
    return [m.empty(device) for m in decode_out_meta(out_meta, inputs)]


class Kernel:
    """A kernel .so loaded into this process (never unloaded: captured graphs may point into it).

        >>> k = Kernel("/root/.cache/torch_htam/.../build/3f2a....so")
        >>> k([x], [y])                          # raw return code: 0, HTAM_ERR_SHAPE or cudaError_t
        0
        >>> y, = k.launch([x], [0, 2, 4, 8])     # allocates outputs; raises on a nonzero code
    """

    def __init__(self, so_path: str | Path):
        self.so_path = os.path.abspath(so_path)   # dlopen searches LD paths for bare names
        self.handle: int = get().load(self.so_path)

    def __call__(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
        return torch.ops.htam.run.default(self.handle, inputs, outputs)

    def launch(self, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
        return fast_launch(self.handle, inputs, out_meta)

    def __repr__(self) -> str:
        return f"Kernel({self.so_path!r}, handle={self.handle})"
