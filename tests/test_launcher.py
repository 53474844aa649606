"""launcher.py: out_meta encoding and dtype codes (CPU); the C++ launcher on a GPU (gpu-marked)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_htam import build, launcher
from torch_htam.task import DTYPES, TensorSpec

KERNELS = Path(__file__).parent / "kernels"


def test_dtype_codes_match_the_abi_header():
    header = (launcher.CSRC / "htam_abi.h").read_text()
    enum = dict(re.findall(r"HTAM_(\w+) = (\d+)", header.split("enum HtamDtype")[1].split("};")[0]))
    assert {name.lower(): int(code) for name, code in enum.items()} == launcher.DTYPE_CODES
    assert set(launcher.DTYPE_CODES) == set(DTYPES)
    # ...and the C++ side lists the same types in the same order.
    cpp = (launcher.CSRC / "launcher.cpp").read_text()
    order = re.search(r"types\[\] = \{(.*?)\}", cpp, re.S).group(1)
    assert [t.strip() for t in order.split(",")] == ["at::kFloat", "at::kHalf", "at::kBFloat16", "at::kDouble",
                                                     "at::kLong", "at::kInt", "at::kBool", "at::kChar", "at::kByte"]


def test_out_meta_round_trip():
    specs = [TensorSpec((4, 8), "float32", (8, 1)), TensorSpec((), "int64", ()), TensorSpec((2, 0, 3), "bfloat16", (0, 3, 1))]
    meta = launcher.encode_out_meta(specs)
    assert meta == [0, 2, 4, 8, 4, 0, 2, 3, 2, 0, 3]
    assert launcher.decode_out_meta(meta) == [(torch.float32, (4, 8), (0, 1)), (torch.int64, (), ()),
                                              (torch.bfloat16, (2, 0, 3), (0, 1, 2))]


@pytest.mark.parametrize("shape, stride, order", [
    ((2, 3, 4, 5), (60, 1, 15, 3), (0, 2, 3, 1)),              # a conv region's output: channels-last
    ((1, 8, 1500, 64), (768000, 64, 512, 1), (0, 2, 1, 3)),    # q of [1, 1500, 512] read as 8 heads
    ((32, 64, 256), (16384, 1, 64), (0, 2, 1)),                # a linear's output, transposed
    ((3, 1, 5), (5, 99, 1), (0, 1, 2)),                        # contiguous: a size-1 dim's stride is moot
])
def test_a_dense_output_in_any_dim_order_round_trips(shape, stride, order):
    spec = TensorSpec(shape, "float32", stride)
    assert spec.dim_order == order and launcher.unallocatable([spec]) is None
    meta = launcher.encode_out_meta([spec])
    assert launcher.decode_out_meta(meta) == [(torch.float32, shape, order)]
    out, = launcher._launch_fake(0, [torch.empty(1, device="meta")], meta)     # what Inductor plans with
    assert out.shape == shape and all(n == 1 or a == b for n, a, b in zip(shape, out.stride(), stride))


def test_an_output_that_is_not_dense_is_refused():
    for spec in [TensorSpec((4, 8), "float32", (16, 1)),         # every other row: a slice's result
                 TensorSpec((4, 8), "float32", (8, 2))]:         # every other column
        assert spec.dim_order is None
        with pytest.raises(ValueError, match="allocates dense outputs, but an output has strides"):
            launcher.encode_out_meta([spec])


def test_a_layout_code_that_is_no_order_is_an_error():
    assert launcher.order_of_code(launcher.order_code((2, 0, 1)), 3) == (2, 0, 1)
    with pytest.raises(ValueError, match="not a permutation"):
        launcher.order_code((0, 0, 1))
    for code in [1, launcher.order_code((2, 0, 1)) | 1 << 9]:   # (1, 0, 0); an order with a 4th dim
        with pytest.raises(ValueError, match="is no order of 3 dims"):
            launcher.order_of_code(code, 3)


def test_fake_impl_allocates_from_out_meta():
    x = torch.empty(3, 5, device="meta")
    outs = launcher._launch_fake(0, [x], [2, 2, 3, 5, 6, 1, 7])
    assert [(o.shape, o.dtype, o.device.type) for o in outs] == [
        (torch.Size([3, 5]), torch.bfloat16, "meta"), (torch.Size([7]), torch.bool, "meta")]


def test_plain_eager_accepts_only_real_tensors_outside_tracing():
    x = torch.ones(3)
    assert launcher.plain_eager([x]) and launcher.plain_eager([torch.nn.Parameter(x), x])
    assert not launcher.plain_eager([])
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert not launcher.plain_eager([fake])
    assert not launcher.plain_eager([fake])                  # a FakeTensor, even outside its mode

    class Nop(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Nop():
        assert not launcher.plain_eager([x])


def _branch(x):
    # What fast_launch does, observable on CPU: +1 on the eager binding, -1 on the op.
    return x + 1 if launcher.plain_eager([x]) else x - 1


def test_traced_calls_take_the_op_branch():
    from torch.fx.experimental.proxy_tensor import make_fx
    x = torch.zeros(2)
    assert torch.equal(_branch(x), x + 1)
    assert torch.equal(make_fx(_branch)(x)(x), x - 1)                # real tensors, a dispatch mode
    assert torch.equal(torch.compile(_branch, backend="eager", fullgraph=True)(x), x - 1)
    torch._dynamo.reset()

    class M(torch.nn.Module):
        def forward(self, x):
            return _branch(x)

    ep = torch.export.export(M(), (x,), strict=False)
    assert torch.equal(ep.module()(x), x - 1)


def test_a_lock_file_left_by_a_killed_build_does_not_hold_the_next(tmp_path):
    """cpp_extension.load waits while its lock file exists (FileBaton on some torch versions); a
    build killed mid-way left one. build_lock takes an flock, under which such a file is stale."""
    from torch_htam.launcher import build_lock
    (tmp_path / "lock").write_text("")
    with build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
    with build_lock(tmp_path):     # taken again once released
        pass


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch has CUDA")
def test_cpu_torch_gets_a_clear_error():
    with pytest.raises(RuntimeError, match="needs a CUDA build of torch"):
        launcher.get()


ARG_CHECKS = """
m = launcher.extension()
for args in [(0, [1], [0, 1, 4]), (0, [], "x"), (0,), (0, [], [0, 1, 4])]:
    try:
        m.launch(*args)
    except (TypeError, RuntimeError) as e:
        print(type(e).__name__, e)
"""


# The C++ decoding of out_meta's size references against launcher.decode_out_meta's (CPU tensors:
# out_shapes only reads sizes), then its errors for a reference to a missing input or dim.
REF_CHECKS = """
import random
import torch
from torch_htam.launcher import DIM_ORDER, decode_out_meta, order_code, size_ref
xs = [torch.empty(3, 5), torch.empty(7)]
rng = random.Random(0)
cl, heads = DIM_ORDER * order_code((0, 2, 3, 1)), DIM_ORDER * order_code((0, 2, 1, 3))
metas = [[0, 2, size_ref(0, 0, 4), 5, cl, 4, 1, size_ref(1, 0), 2, size_ref(0, 1, 3)], [4, 0],
         [heads + 2, 4, 1, 8, size_ref(0, 0, 500), 64], [DIM_ORDER * order_code((1, 0)), 2, 0, 3]]
for _ in range(50):
    i = rng.randrange(2)
    metas.append([2, 2, size_ref(i, rng.randrange(xs[i].dim()), rng.randrange(1, 1 << 20)), rng.randrange(9)])
def python_side(meta):
    return [(list(o.shape), list(o.empty("meta").stride())) for o in decode_out_meta(meta, xs)]
print(all(m.out_layouts(xs, meta) == python_side(meta) for meta in metas))
for args in [(xs, [0, 1, size_ref(2, 0)]), (xs, [0, 1, size_ref(1, 1, 2)]), (xs, [DIM_ORDER, 3, 1, 2, 3])]:
    try:
        m.out_layouts(*args)
    except RuntimeError as e:
        print(str(e).splitlines()[0])
try:
    m.launch(0, xs, [0, 1, size_ref(5, 0)])
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""

# launch_o<N>, what Inductor's C++ wrapper calls (inductor.stable_launches): the extension's slot
# counts are launcher.py's; a graph's launches (one output, two outputs with a size reference) are
# rewritten into ops Inductor calls through the dispatcher without Python (its own predicate), and
# the rewritten graph traces to the same outputs; a launch with more inputs than the slots, or a
# ranged kernel's, leaves the graph as it was, as does any before the canary ran (warm_main).
STABLE_CHECKS = """
from torch.fx.experimental.proxy_tensor import make_fx
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch_htam import fallback, inductor
print((m.STABLE_INPUTS, m.STABLE_OUTPUTS, m.STABLE_META_SLOTS) ==
      (launcher.STABLE_INPUTS, launcher.STABLE_OUTPUTS, launcher.STABLE_META_SLOTS))
launch = torch.ops.htam.launch.default

def f(x, w):
    a, = launch(11, [x, w], [0, 2, 4, 8])
    b, c = launch(12, [a], [2, 2, size_ref(0, 0), 8, launcher.DIM_ORDER * 720, 4, 1, 2, 3, 4])   # c channels-last
    return a + 1, b * 2, c

def shapes(gm, *args):
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return [(v.meta["val"].shape, v.meta["val"].dtype, v.meta["val"].stride()) for v in out]
x, w = torch.randn(4, 8), torch.randn(8)
gm = make_fx(f, tracing_mode="fake")(x, w)
before = shapes(gm)
print(inductor.stable_launches(gm))       # not yet checked under the C++ wrapper on this torch
inductor.stable_launches_checked = lambda: True
print(inductor.stable_launches(gm), shapes(gm) == before == shapes(make_fx(gm, tracing_mode="fake")(x, w)))
ops = [n.target for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "namespace", "") == "htam"]
print([str(op) for op in ops], all(CppWrapperCpu._compatible_with_stableivalue(op) for op in ops))
many = make_fx(lambda *xs: launch(13, list(xs), [0, 1, 4])[0], tracing_mode="fake")(*[x[0]] * 17)
fallback.set_in_launcher = lambda h: h != 14
ranged = make_fx(lambda x: launch(14, [x], [0, 1, 4])[0], tracing_mode="fake")(x[0])
print([inductor.stable_launches(g) for g in (many, ranged)],
      [n.target for g in (many, ranged) for n in g.graph.nodes if n.target is launch] == [launch, launch])
# the C shims: each launch_o<N> declared to Inductor (a key equal to the op, pickled by name, as
# Inductor pickles its config into cache keys), one C parameter per schema argument and return,
# and the symbols global, where the C++ wrapper's library finds them
import ctypes, pickle
import torch._inductor.config as inductor_config
shims = inductor_config.aot_inductor.custom_ops_to_c_shims
outs = range(1, launcher.STABLE_OUTPUTS + 1)
stable = [launcher.stable_op(n) for n in outs]
print(all(op in shims for op in stable), launch not in shims,
      [pickle.loads(pickle.dumps(k)) == k.op for k in shims] == [True] * len(stable),
      [len(d.split(",")) for (d,) in shims.values()] == [len(op._schema.arguments) + len(op._schema.returns) for op in stable],
      all(hasattr(ctypes.CDLL(None), f"aoti_torch_cuda_launch_o{n}") for n in outs),
      len(pickle.dumps(inductor_config.save_config_portable())) > 0)
"""

# A ranged kernel's buckets as the launcher checks them before a launch_o<N> (fits_hold on CPU
# tensors) against fallback's own check, on sizes inside, at and outside the buckets, other
# dtypes, ranks and static dims: the C++ decoding of fallback.fits_code and its holds() agree.
FITS_CHECKS = """
import random, sys
sys.path.insert(0, "tests")
from test_verify import GELU_SRC, spec
from torch_htam import fallback
from torch_htam.task import Task
from torch_htam.verify import Bucket
print(m.OUTSIDE_BUCKETS == launcher.OUTSIDE_BUCKETS)
# x [8, 32] rows declared 1-64 (the leading size), y [16, 4] rows twice x's, w [32] static
x, y = spec((8, 32)).with_ranges({0: (1, 64)}), spec((16, 4)).with_ranges({0: (2, 128)})
task = Task("fits", "elementwise", GELU_SRC, [x, y, spec((32,))], [x], "fits", [])
fallback.register(99, task, [Bucket(0, 0, 1, 8), Bucket(0, 0, 24, 40)])
code, fits = fallback.fits_code(99), fallback._HANDLES[99].fits
rng, agree, inside = random.Random(0), True, 0
for _ in range(400):
    n = rng.choice([1, 7, 8, 9, 23, 24, 33, 40, 41, 64])
    xs = [torch.empty(n, 32 if rng.random() < 0.9 else 31), torch.empty(2 * n + (rng.random() < 0.1), 4),
          torch.empty(32 if rng.random() < 0.95 else 31)]
    if rng.random() < 0.05:
        xs[0] = xs[0].half()
    if rng.random() < 0.05:
        xs[1] = xs[1][None]
    py = fallback._fits(fits, xs)
    agree &= m.fits_hold(code, xs) == py
    inside += py
print(agree, inside > 50, inside < 350)
try:
    m.fits_hold([code[0][:-1]], [])
except RuntimeError as e:
    print("code ends at position" in str(e))
"""


# Graph launches are off unless HTAM_GRAPH_LAUNCHES=1 (the environment below has none), and
# set_graph_launches switches them, returning the last setting.
GRAPH_CHECKS = """
print(m.graph_launches_on(), m.set_graph_launches(True), m.graph_launches_on(), m.set_graph_launches(False))
"""


@pytest.mark.build
@pytest.mark.skipif(torch.version.cuda is None or shutil.which(os.environ.get("CXX", "c++")) is None
                    or launcher._cuda_toolkit() is None, reason="needs a CUDA build of torch, c++ and CUDA headers")
def test_launcher_compiles_and_checks_its_arguments_without_a_gpu(tmp_path):
    """CPU: csrc/launcher.cpp builds against this torch, and its fast binding rejects bad arguments
    with Python errors before touching a GPU (built in a subprocess: its ops stay out of this one)."""
    # NOTE: no CUDA_HOME: launcher._fix_cuda_home finds the toolkit where the nvcc on PATH is a
    # wrapper (this CI image). The arch list only matters to cpp_extension without a visible GPU.
    env = {**{k: v for k, v in os.environ.items() if k != "HTAM_GRAPH_LAUNCHES"}, "HTAM_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")}
    r = subprocess.run([sys.executable, "-c", "from torch_htam import launcher" + ARG_CHECKS + REF_CHECKS
                        + STABLE_CHECKS + FITS_CHECKS + GRAPH_CHECKS],
                       env=env, capture_output=True, text=True,
                       timeout=600, cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [
        "TypeError launch: inputs[0] is a int, not a torch.Tensor",
        "TypeError launch: out_meta must be a list or tuple of ints",
        "TypeError launch(handle, inputs, out_meta) takes exactly 3 arguments",
        "RuntimeError htam: no kernel with handle 0 (0 loaded); get one from htam::load(path)",
        "True",
        "htam: out_meta output 0's size -3 is 1 * inputs[2].shape[0], but the launch has 2 inputs",
        "htam: out_meta output 0's size -66562 is 2 * inputs[1].shape[1], but that input has 1 dims",
        "htam: out_meta layout code 1 is no order of 3 dims",
        "htam: out_meta output 0's size -6 is 1 * inputs[5].shape[0], but the launch has 2 inputs",
        "True", "False", "True True", "['htam.launch_o1.default', 'htam.launch_o2.default'] True",
        "[False, False] True", "True True True True True True", "True", "True True True", "True",
        "False False True True"]
    # A deployment box with no compiler imports the launcher a bundle carried (bundle.load adopts it).
    box = {**env, "HTAM_CACHE_DIR": str(tmp_path / "box"), "CXX": "no-such-compiler"}
    adopt = ("import sys; from pathlib import Path; from torch_htam import launcher\n"
             "print(launcher.adopt(Path(sys.argv[1]) / 'missing'))\n"
             "print(launcher.adopt(Path(sys.argv[1]) / 'bundle'))" + ARG_CHECKS)
    ship = "import sys; from pathlib import Path; from torch_htam import launcher; print(launcher.ship(Path(sys.argv[1]) / 'bundle'))"
    r = subprocess.run([sys.executable, "-c", ship, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).parents[1])
    assert r.stdout.strip() == "True", r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-c", adopt, str(tmp_path)], env=box, capture_output=True,
                       text=True, timeout=300, cwd=Path(__file__).parents[1])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[:2] == ["False", "True"] and r.stdout.splitlines()[-1].startswith("RuntimeError")
    # A launcher whose symbols cannot be made global declares no C shim: the C++ wrapper calls
    # launch_o<N> through the dispatcher, as it would find no shim to call at load time.
    noshim = ("import ctypes, os\n"
              "import torch._inductor.config as c\n"
              "load = ctypes.CDLL\n"
              "def refuse(name, mode=0, *args, **kwargs):\n"
              "    if mode & os.RTLD_NOLOAD: raise OSError('refused')\n"
              "    return load(name, mode, *args, **kwargs)\n"
              "ctypes.CDLL = refuse\n"
              "from torch_htam import launcher\n"
              "launcher.extension()\n"
              "print(len(c.aot_inductor.custom_ops_to_c_shims), launcher.stable_op(1) is not None)")
    r = subprocess.run([sys.executable, "-c", noshim], env=env, capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).parents[1])
    assert r.stdout.split() == ["0", "True"], r.stderr[-3000:]
    assert "go through the dispatcher (refused)" in r.stderr


HANDLES = """
import sys; from torch_htam import launcher
print(*(launcher.Kernel(p).handle for p in sys.argv[1:]))
"""


@pytest.mark.build
@pytest.mark.skipif(torch.version.cuda is None or shutil.which(os.environ.get("CXX", "c++")) is None
                    or launcher._cuda_toolkit() is None or shutil.which("nvcc") is None,
                    reason="needs a CUDA build of torch, c++, nvcc and CUDA headers")
def test_a_kernels_handle_is_the_same_in_every_process_and_from_every_path(tmp_path):
    """A handle names a library's bytes, not a load order: a compiled graph that Inductor cached in
    one process names the same kernels in another (a bundle's Inductor code, bundle.py). CPU: the
    libraries are only dlopened, never launched."""
    names = ["add_f32.cu", "scale_extern_c.cu"]
    built = build.build_many([(KERNELS / n).read_text() for n in names], out_dir=tmp_path / "k")
    assert all(r.ok for r in built), [r.error for r in built]
    add, scale = (str(r.so_path) for r in built)
    copy = tmp_path / "bundle_copy.so"
    shutil.copyfile(add, copy)
    env = {**os.environ, "HTAM_CACHE_DIR": str(tmp_path / "cache"),
           "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")}

    def handles(*paths):
        r = subprocess.run([sys.executable, "-c", HANDLES, *paths], env=env, capture_output=True,
                           text=True, timeout=600, cwd=Path(__file__).parents[1])
        assert r.returncode == 0, r.stderr[-3000:]
        return [int(h) for h in r.stdout.split()]
    first = handles(add, scale)
    later = handles(scale, str(copy), add)
    assert first[0] != first[1] and later == [first[1], first[0], first[0]]


# ---------------------------------------------------------------- GPU: the C++ launcher itself

@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """Build the samples once (one ninja batch) and load them."""
    names = ["add_f32.cu", "abi_probe.cu", "launch_error.cu", "scale_extern_c.cu"]
    results = build.build_many([(KERNELS / n).read_text() for n in names],
                               out_dir=tmp_path_factory.mktemp("kernels"))
    for n, r in zip(names, results):
        assert r.ok, f"{n}: {r.error}\n{r.log}"
    return {n.removesuffix(".cu"): launcher.Kernel(r.so_path) for n, r in zip(names, results)}


@pytest.mark.gpu
def test_launcher_builds_and_registers_ops():
    ops = launcher.get()
    for name in ("load", "run", "launch"):
        assert hasattr(ops, name)
    assert launcher.build_dir().exists()


@pytest.mark.gpu
def test_kernel_runs_and_matches_torch(kernels):
    add = kernels["add_f32"]
    a, b = torch.randn(1000, 33, device="cuda"), torch.randn(1000, 33, device="cuda")
    out = torch.full_like(a, float("nan"))
    assert add([a, b], [out]) == 0
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    y, = add.launch([a, b], launcher.encode_out_meta([TensorSpec.of(a)]))
    torch.testing.assert_close(y, a + b, rtol=0, atol=0)
    y, = kernels["scale_extern_c"].launch([a], [0, 2, 1000, 33])
    torch.testing.assert_close(y, 2 * a, rtol=0, atol=0)
    assert launcher.Kernel(add.so_path).handle == add.handle, "loading a path twice reuses its handle"


@pytest.mark.gpu
def test_host_times_count_each_launch_and_the_kernels_own_host_work(kernels):
    """launcher.host_times: each launch adds its host ns in the launcher, and each plain call the
    ns in the kernel's own htam_run, which are part of those."""
    add = kernels["add_f32"]
    a, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    before = launcher.host_times()[add.handle]
    for _ in range(3):
        add.launch([a, b], [0, 1, 64])
    after = launcher.host_times()[add.handle]
    assert after["launches"] - before["launches"] == 3 and after["runs"] - before["runs"] == 3
    assert 0 < after["run_ns"] - before["run_ns"] <= after["launch_ns"] - before["launch_ns"]


@pytest.mark.gpu
def test_launcher_fills_the_abi_structs(kernels):
    probe = kernels["abi_probe"]
    x = torch.randn(4, 6, 8, device="cuda").transpose(0, 2)            # non-contiguous strides
    h = torch.zeros(3, 5, device="cuda", dtype=torch.float16)
    s = torch.tensor(7, device="cuda", dtype=torch.int32)              # 0-dim
    info, = probe.launch([x, h, s], [4, 1, 60])
    rows = info.view(3, 20).tolist()
    for row, t, code in zip(rows, (x, h, s), (0, 1, 5)):
        nd = t.dim()
        assert row[0] == nd and row[1] == code and row[18] == 1
        assert row[2:2 + nd] == list(t.shape) and row[10:10 + nd] == list(t.stride())
        assert row[2 + nd:10] == [-1] * (8 - nd)


@pytest.mark.gpu
def test_error_codes_propagate(kernels):
    add = kernels["add_f32"]
    a = torch.randn(16, device="cuda", dtype=torch.float16)
    assert add([a, a], [torch.empty_like(a)]) == 1000                          # HTAM_ERR_SHAPE
    with pytest.raises(RuntimeError, match="HTAM_ERR_SHAPE"):
        add.launch([a, a], [1, 1, 16])
    out = torch.empty(16, device="cuda")
    # 4096 threads per block: CUDA 13 on an H100 answered cudaErrorInvalidValue (1), older
    # runtimes cudaErrorInvalidConfiguration (9); either way a CUDA error code, named in the raise.
    code = kernels["launch_error"]([], [out])
    assert code in (1, 9)
    with pytest.raises(RuntimeError, match="cudaErrorInvalid(Value|Configuration)"):
        kernels["launch_error"].launch([out], [0, 1, 16])
    with pytest.raises(RuntimeError, match="current CUDA device"):      # mixed devices
        add([a, a], [torch.empty(16, dtype=torch.float16)])
    with pytest.raises(RuntimeError, match="no kernel with handle"):
        torch.ops.htam.launch(10**6, [out], [0, 1, 16])


@pytest.mark.gpu
def test_load_errors_are_clear(tmp_path):
    ops = launcher.get()
    with pytest.raises(RuntimeError, match="cannot read kernel library .*missing.so"):
        ops.load(str(tmp_path / "missing.so"))
    src = tmp_path / "other.c"
    src.write_text("int other(void) { return 0; }\n")
    so, cc = tmp_path / "other.so", os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to make a library without htam_run")
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    with pytest.raises(RuntimeError, match="no `htam_run` symbol"):
        ops.load(str(so))


@pytest.mark.gpu
def test_launch_under_torch_compile_fullgraph(kernels):
    add = kernels["add_f32"]
    meta = [0, 2, 64, 32]

    def f(a, b):
        y, = torch.ops.htam.launch(add.handle, [a, b], meta)
        return torch.relu(y) * 2

    a, b = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(a, b), torch.relu(a + b) * 2)


@pytest.mark.gpu
def test_launch_inside_cuda_graph_capture(kernels):
    add = kernels["add_f32"]
    a, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    add.launch([a, b], [0, 1, 256])            # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):               # captures on a side stream: the current one
        y, = add.launch([a, b], [0, 1, 256])
    a.copy_(torch.arange(256.0, device="cuda"))
    b.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.arange(256.0, device="cuda") + 1)


# ---------------------------------------------------------------- GPU: the eager fast path

@pytest.mark.gpu
def test_fast_launch_matches_the_op(kernels):
    assert callable(launcher.extension().launch)
    add, probe = kernels["add_f32"], kernels["abi_probe"]
    a, b = torch.randn(100, 7, device="cuda"), torch.randn(100, 7, device="cuda")
    assert launcher.plain_eager([a, b])
    meta = launcher.encode_out_meta([TensorSpec.of(a)])
    fast, = launcher.fast_launch(add.handle, [a, b], meta)
    op, = torch.ops.htam.launch.default(add.handle, [a, b], meta)
    assert type(fast) is torch.Tensor and fast.shape == (100, 7) and fast.is_contiguous()
    torch.testing.assert_close(fast, op, rtol=0, atol=0)
    torch.testing.assert_close(fast, a + b, rtol=0, atol=0)
    # The ABI structs the kernel sees are the same on both paths (non-contiguous + 0-dim inputs).
    x = torch.randn(4, 6, 8, device="cuda").transpose(0, 2)
    s = torch.tensor(7, device="cuda", dtype=torch.int32)
    torch.testing.assert_close(launcher.fast_launch(probe.handle, [x, s], [4, 1, 40])[0],
                               torch.ops.htam.launch.default(probe.handle, [x, s], [4, 1, 40])[0], rtol=0, atol=0)
    # A Parameter first (a region that starts with a weight) also takes the binding.
    w = torch.nn.Parameter(a.clone(), requires_grad=False)
    torch.testing.assert_close(launcher.extension().launch(add.handle, [w, b], meta)[0], a + b, rtol=0, atol=0)


@pytest.mark.gpu
def test_launch_allocates_an_output_in_its_dim_order(kernels):
    """A transposed output ([8, 5] stored [5, 8]) is allocated dense in that order on both paths;
    the probe writes what it was given about x into the output's memory, in memory order."""
    probe, x = kernels["abi_probe"], torch.randn(4, 6, device="cuda")
    meta = launcher.encode_out_meta([TensorSpec((8, 5), "int64", (1, 8))])
    for call in (launcher.fast_launch, torch.ops.htam.launch.default):
        y, = call(probe.handle, [x], meta)
        assert y.shape == (8, 5) and y.stride() == (1, 8)
        assert y.t().reshape(-1)[:4].tolist() == [2, 0, 4, 6]     # ndim, dtype code, sizes


@pytest.mark.gpu
def test_fast_launch_errors_are_runtime_errors_with_the_code_name(kernels):
    add, bad = kernels["add_f32"], kernels["launch_error"]
    ext = launcher.extension()
    h = torch.randn(16, device="cuda", dtype=torch.float16)
    out = torch.empty(16, device="cuda")
    for call in (launcher.fast_launch, ext.launch):        # the wrapper and the binding itself
        with pytest.raises(RuntimeError, match="HTAM_ERR_SHAPE"):
            call(add.handle, [h, h], [1, 1, 16])
        with pytest.raises(RuntimeError, match="cudaErrorInvalid(Value|Configuration)"):
            call(bad.handle, [out], [0, 1, 16])
        with pytest.raises(RuntimeError, match="no kernel with handle"):
            call(10**6, [out], [0, 1, 16])
        with pytest.raises(RuntimeError, match="out_meta is truncated"):
            call(add.handle, [out, out], [0, 2, 16])
        with pytest.raises(RuntimeError, match="current CUDA device"):
            call(add.handle, [out, torch.empty(16)], [0, 1, 16])
    # The launcher still works after the errors.
    torch.testing.assert_close(launcher.fast_launch(add.handle, [out.fill_(1), out], [0, 1, 16])[0],
                               torch.full_like(out, 2), rtol=0, atol=0)


@pytest.mark.gpu
def test_fast_launch_inside_cuda_graph_capture(kernels):
    add = kernels["add_f32"]
    a, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    launcher.fast_launch(add.handle, [a, b], [0, 1, 256])     # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):               # the capture stream is the current stream
        assert launcher.plain_eager([a, b])     # so the binding, not the op, is what is captured
        y, = launcher.fast_launch(add.handle, [a, b], [0, 1, 256])
    a.copy_(torch.arange(256.0, device="cuda"))
    b.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.arange(256.0, device="cuda") + 1)


@pytest.mark.gpu
def test_fast_launch_under_torch_compile_records_the_op(kernels):
    add = kernels["add_f32"]
    graphs = []

    def recording(gm, example_inputs):     # a Dynamo backend that keeps the graph it was given
        graphs.append(gm)
        return gm.forward

    def f(a, b):
        y, = launcher.fast_launch(add.handle, [a, b], [0, 2, 64, 32])
        return torch.relu(y) * 2

    a, b = torch.randn(64, 32, device="cuda"), torch.randn(64, 32, device="cuda")
    torch.testing.assert_close(torch.compile(f, backend=recording, fullgraph=True)(a, b), torch.relu(a + b) * 2)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.htam.launch.default in targets and launcher.fast_launch not in targets
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(a, b), torch.relu(a + b) * 2)   # inductor
    torch._dynamo.reset()


@pytest.mark.gpu
def test_fast_launch_under_export_records_the_op(kernels):
    add = kernels["add_f32"]

    class M(torch.nn.Module):
        def forward(self, a, b):
            return launcher.fast_launch(add.handle, [a, b], [0, 1, 128])[0]

    a, b = torch.randn(128, device="cuda"), torch.randn(128, device="cuda")
    ep = torch.export.export(M(), (a, b), strict=False)
    assert torch.ops.htam.launch.default in [n.target for n in ep.graph.nodes if n.op == "call_function"]
    torch.testing.assert_close(ep.module()(a, b), a + b, rtol=0, atol=0)


def test_settle_graphs_calls_until_a_call_launches_nothing_plain(monkeypatch):
    """launcher.settle_graphs: calls the forward until one call adds no plain launch of a
    graph-capable kernel (each key of it has a graph), at most max_calls times; none loaded, or
    graph launches off: no call."""
    stats = {7: {"plain": 0, "replays": 0}}
    calls = []

    def forward():                       # its first 3 calls launch 2 kernels plain each, then replays
        calls.append(1)
        key = "plain" if len(calls) <= 3 else "replays"
        stats[7][key] += 2

    class Ext:
        on = True

        @staticmethod
        def graphs_idle(seconds):
            return True

        @classmethod
        def graph_launches_on(cls):
            return cls.on
    monkeypatch.setattr(launcher, "graph_launches", lambda: stats)
    monkeypatch.setattr(launcher, "extension", Ext)
    assert launcher.settle_graphs(forward) == 4 and len(calls) == 4
    calls.clear()
    stats[7]["plain"] = 0
    assert launcher.settle_graphs(lambda: stats[7].update(plain=stats[7]["plain"] + 1), max_calls=5) == 5
    Ext.on = False                       # graph launches switched off: every launch stays plain
    assert launcher.settle_graphs(forward) == 0 and calls == []
    Ext.on = True
    monkeypatch.setattr(launcher, "graph_launches", lambda: {})
    assert launcher.settle_graphs(forward) == 0 and calls == []
