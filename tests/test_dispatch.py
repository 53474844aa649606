"""Serving changing sizes without recompiles, on CPU: out_meta sizes that follow the inputs
(launcher.size_ref), and the host-side check before each launch of a kernel kept for some buckets
of sizes (fallback.register(..., buckets)): inside them the kernel runs, outside the task's
reference region does, by design, and each is counted. A Python callable stands in for the C++
launch (allocating from out_meta as launcher.cpp does)."""
import itertools
import logging

import pytest
import torch
import torch.nn.functional as F

from torch_htam import fallback, launcher
from torch_htam import verify as V
from torch_htam.launcher import SizeRef, decode_out_meta, encode_out_meta, out_refs, size_ref
from torch_htam.task import Task, load_reference

from test_dynamic import ranged_task
from test_verify import spec

_ids = itertools.count(20_001)
ERR_SHAPE = "HTAM_ERR_SHAPE (the kernel does not support these shapes/dtypes; run the original region)"


class StandIn:
    """The C++ launch for one kernel: outputs allocated from out_meta (references resolved against
    the inputs), filled by `fn`; `calls`: each launch's leading size; raises at `fail_at` sizes."""

    def __init__(self, fn, fail_at=()):
        self.fn, self.fail_at, self.calls = fn, set(fail_at), []

    def __call__(self, handle, inputs, out_meta):
        self.calls.append(inputs[0].shape[0])
        if inputs[0].shape[0] in self.fail_at:
            raise RuntimeError(f"htam kernel {handle} returned 1000: {ERR_SHAPE}")
        outs = [m.empty("cpu") for m in decode_out_meta(out_meta, inputs)]
        res = self.fn(*inputs)
        for o, r in zip(outs, res if isinstance(res, tuple) else (res,)):
            o.copy_(r)
        return outs


def gelu_affine(x, w, b):
    return F.gelu(x) * w + b


def gelu_inputs(rows, dtype=torch.float32):
    g = torch.Generator().manual_seed(rows)
    return [torch.randn(rows, 32, generator=g, dtype=dtype), torch.randn(32, generator=g, dtype=dtype),
            torch.randn(32, generator=g, dtype=dtype)]


def registered(task, buckets, kernel=gelu_affine, fail_at=()):
    """A fresh handle for `task` kept in `buckets` ([(low, high)] of its leading dim), its stand-in
    launch and its out_meta (outputs following the inputs' sizes)."""
    handle, lead = next(_ids), V.leading_dim(task)
    fallback.register(handle, task, [V.Bucket(*lead, lo, hi) for lo, hi in buckets])
    return handle, StandIn(kernel, fail_at), encode_out_meta(task.outputs, out_refs(task))


# ------------------------------------------------------------------------------ out_meta references

def test_a_size_reference_round_trips_and_never_looks_like_a_size():
    for i, d, k in [(0, 0, 1), (2, 1, 8), (1023, 63, 1), (5, 3, 1 << 40)]:
        entry = size_ref(i, d, k)
        assert entry < 0 and launcher.size_ref_of(entry) == SizeRef(i, d, k)
    assert launcher.size_ref_of(0) is None and launcher.size_ref_of(4096) is None
    for bad in [(1024, 0, 1), (0, 64, 1), (0, 0, 0), (-1, 0, 1)]:
        with pytest.raises(ValueError, match="size_ref"):
            size_ref(*bad)


def test_references_resolve_against_real_sizes():
    specs = [spec((64, 32)), spec((512, 4)), spec(())]
    meta = encode_out_meta(specs, [{0: (0, 0, 1)}, {0: (0, 0, 8), 1: SizeRef(1, 1)}, None])
    assert meta[:4] == [0, 2, size_ref(0, 0), 32] and meta[-2:] == [0, 0]
    x, y = torch.empty(3, 32), torch.empty(3, 4)
    assert [m.shape for m in decode_out_meta(meta, [x, y])] == [(3, 32), (24, 4), ()]
    # without refs: the static encoding, inputs or not
    assert encode_out_meta(specs) == [0, 2, 64, 32, 0, 2, 512, 4, 0, 0]
    assert decode_out_meta(encode_out_meta(specs), [x]) == decode_out_meta(encode_out_meta(specs))


def test_a_reference_without_its_input_is_a_clear_error():
    meta = encode_out_meta([spec((64, 32))], [{0: (1, 0, 2)}])
    with pytest.raises(ValueError, match=r"2 \* inputs\[1\]\.shape\[0\], but no inputs were given"):
        decode_out_meta(meta)
    with pytest.raises(ValueError, match=r"inputs\[1\].*but the launch has 1 inputs"):
        decode_out_meta(meta, [torch.empty(3, 32)])
    with pytest.raises(ValueError, match="that input has 1 dims"):
        decode_out_meta(encode_out_meta([spec((4,))], [{0: (0, 1, 1)}]), [torch.empty(3)])
    with pytest.raises(ValueError, match="dim 2 of a 2-D output"):
        encode_out_meta([spec((64, 32))], [{2: (0, 0, 1)}])


def test_references_resolve_to_symbolic_sizes_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dyn = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = mode.from_tensor(torch.empty(4, 32), symbolic_context=dyn)
    meta = encode_out_meta([spec((64, 32)), spec((512, 32))], [{0: (0, 0, 1)}, {0: (0, 0, 8)}])
    with mode:
        y, z = launcher._launch_fake(0, [x], meta)
    n = x.shape[0]
    assert isinstance(n, torch.SymInt) and isinstance(z.shape[0], torch.SymInt)
    assert y.shape[0].node.expr == n.node.expr and z.shape[0].node.expr == 8 * n.node.expr
    assert (y.shape[1], z.shape[1]) == (32, 32)


def test_out_refs_follow_the_input_dim_each_output_dim_scales_with():
    task = two_input_task()
    assert out_refs(task) == [{0: SizeRef(0, 0, 1)}, {0: SizeRef(1, 0, 1)}]
    lone = Task("flat", "elementwise", "", [spec((4, 16)).with_ranges({0: (1, 64)})],
                [spec((32, 16)).with_ranges({0: (8, 512)})], "s", [])
    assert out_refs(lone) == [{0: SizeRef(0, 0, 8)}]
    odd = Task("odd", "elementwise", "", [spec((4, 16)).with_ranges({0: (1, 64)})],
               [spec((6, 16)).with_ranges({0: (2, 96)})], "s", [])
    with pytest.raises(ValueError, match="no multiple"):
        out_refs(odd)


# ------------------------------------------------------------------------------ per-bucket dispatch

def test_sizes_in_kept_buckets_launch_the_kernel_and_others_run_the_region(caplog):
    task = ranged_task()                       # x [64, 32], rows declared 1-64
    handle, kernel, meta = registered(task, [(2, 8), (9, 64)])     # not kept at size 1
    with caplog.at_level(logging.WARNING, logger="torch_htam"):
        for n in (2, 7, 9, 64, 1, 65, 300):
            inputs = gelu_inputs(n)
            out, = fallback.run_or_fallback(handle, inputs, meta, kernel)
            assert out.shape == (n, 32)
            torch.testing.assert_close(out, gelu_affine(*inputs))
    assert kernel.calls == [2, 7, 9, 64]
    assert fallback.counts([handle]) == fallback.Counts(kernel=4, outside=3, failed=0)
    assert handle not in fallback.failures() and not caplog.records   # the designed path: no warning


def test_inputs_that_differ_elsewhere_run_the_region():
    task = ranged_task()
    handle, kernel, meta = registered(task, [(1, 64)])
    x, w, b = gelu_inputs(8)
    for inputs in [[x, w[:1], b[:1]],                          # a static dim not the spec's
                   gelu_inputs(8, dtype=torch.float64),        # another dtype
                   [x.unsqueeze(-1), w[:1], b[:1]]]:          # another rank
        out, = fallback.run_or_fallback(handle, inputs, meta, kernel)
        torch.testing.assert_close(out, gelu_affine(*inputs).to(torch.float32).reshape(out.shape))
    assert kernel.calls == [] and fallback.counts([handle]) == fallback.Counts(outside=3)


def two_input_task():
    """x [4, 16] with rows declared 1-64 and y [32, 16] whose rows are 8 * x's: (x * 2, y + 1)."""
    src = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x, y):\n"
           "        return x * 2, y + 1\n\ndef get_inputs():\n    return [torch.randn(4, 16), torch.randn(32, 16)]\n\n"
           "def get_init_inputs():\n    return []\n")
    x, y = spec((4, 16)).with_ranges({0: (1, 64)}), spec((32, 16)).with_ranges({0: (8, 512)})
    return Task("two", "elementwise", src, [x, y], [x, y], "two", ["aten.mul.Tensor"])


def test_every_other_dynamic_dim_must_scale_with_the_leading_one():
    task = two_input_task()
    handle, kernel, meta = registered(task, [(1, 64)], kernel=lambda x, y: (x * 2, y + 1))
    for n, m in [(3, 24), (3, 25), (3, 8)]:
        x, y = torch.randn(n, 16), torch.randn(m, 16)
        a, b = fallback.run_or_fallback(handle, [x, y], meta, kernel)
        torch.testing.assert_close((a, b), (x * 2, y + 1))
    assert kernel.calls == [3] and fallback.counts([handle]) == fallback.Counts(kernel=1, outside=2)


def test_the_check_accepts_exactly_the_shapes_verification_scales_to():
    """The host check and verify._sized agree: at each leading size n, the shapes verification
    would run launch the kernel iff a kept bucket holds n."""
    task = two_input_task()
    handle, kernel, meta = registered(task, [(2, 8), (20, 30)], kernel=lambda x, y: (x * 2, y + 1))
    for n in range(1, 70):
        shapes = V._sized(list(task.inputs), n, 4)
        fallback.run_or_fallback(handle, [torch.zeros(s) for s in shapes], meta, kernel)
    assert kernel.calls == [*range(2, 9), *range(20, 31)]


def test_a_failing_launch_at_another_size_still_finds_its_region(caplog):
    task = ranged_task()
    handle, kernel, meta = registered(task, [(1, 64)], fail_at={9, 10})
    with caplog.at_level(logging.WARNING, logger="torch_htam"):
        for n in (9, 10, 11):
            inputs = gelu_inputs(n)
            out, = fallback.run_or_fallback(handle, inputs, meta, kernel)
            torch.testing.assert_close(out, gelu_affine(*inputs))
    assert fallback.counts([handle]) == fallback.Counts(kernel=1, failed=2)
    assert fallback.failures([handle]) == {handle: 2}
    assert len([r for r in caplog.records if "failed at run time" in r.message]) == 1


def test_a_launch_refusing_an_input_layout_runs_on_a_copy_laid_out_as_its_spec():
    """A kernel verified on contiguous x is handed a transposed-layout x (the replay lays out no
    input): it runs on a contiguous copy, not the region, and no failure is counted."""
    task = ranged_task()
    handle, honest, meta = registered(task, [(1, 64)])

    def kernel(h, inputs, out_meta):
        if not inputs[0].is_contiguous():
            raise RuntimeError(f"htam kernel {h} returned 1000: {ERR_SHAPE}")
        return honest(h, inputs, out_meta)
    inputs = gelu_inputs(16)
    inputs[0] = inputs[0].t().contiguous().t()
    out, = fallback.run_or_fallback(handle, inputs, meta, kernel)
    torch.testing.assert_close(out, gelu_affine(*inputs))
    assert fallback.counts([handle]) == fallback.Counts(kernel=1, relaid=1)
    assert honest.calls == [16] and fallback.failures([handle]) == {}


def test_one_handle_serves_the_first_task_whose_buckets_fit():
    small, large = ranged_task(), ranged_task()
    large.signature = "another"
    handle = next(_ids)
    fallback.register(handle, small, [[0, 0, 2, 8]])          # Evaluation.buckets' form
    fallback.register(handle, large, [V.Bucket(0, 0, 9, 64)])
    kernel, meta = StandIn(gelu_affine), encode_out_meta(small.outputs, out_refs(small))
    for n in (1, 2, 9, 64):
        fallback.run_or_fallback(handle, gelu_inputs(n), meta, kernel)
    assert kernel.calls == [2, 9, 64] and fallback.counts([handle]).outside == 1


def test_a_static_registration_launches_as_before():
    task = ranged_task()
    kernel, meta = StandIn(gelu_affine, fail_at={3}), encode_out_meta(task.outputs, out_refs(task))
    for buckets in (None, []):
        handle = next(_ids)
        fallback.register(handle, task, buckets)
        fallback.run_or_fallback(handle, gelu_inputs(100), meta, kernel)   # no check before a launch
        fallback.run_or_fallback(handle, gelu_inputs(3), meta, kernel)     # fails: the region runs
        assert fallback.counts([handle]) == fallback.Counts(kernel=1, failed=1)
    assert kernel.calls == [100, 3, 100, 3]


def test_buckets_must_be_of_the_tasks_leading_dim():
    with pytest.raises(ValueError, match="leading dynamic dim is in0 dim 0"):
        fallback.register(next(_ids), ranged_task(), [V.Bucket(0, 1, 1, 8)])
    static = Task("s", "elementwise", "", [spec((4, 4))], [spec((4, 4))], "s", [])
    with pytest.raises(ValueError, match="a static task"):
        fallback.register(next(_ids), static, [V.Bucket(0, 0, 1, 8)])


def test_counts_sum_over_handles():
    task = ranged_task()
    a, kernel, meta = registered(task, [(2, 64)])
    b, _, _ = registered(task, [(2, 64)])
    for h, n in [(a, 4), (a, 1), (b, 4), (b, 4)]:
        fallback.run_or_fallback(h, gelu_inputs(n), meta, kernel)
    assert fallback.counts({a, b}) == fallback.Counts(kernel=3, outside=1)
    total = fallback.counts()
    assert total.kernel >= 3 and total.outside >= 1


def test_an_extracted_task_runs_its_reference_at_any_size():
    from torch_htam.extract import extract
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    task = extract(mlp, (torch.randn(4, 16),), dynamic={0: {0: (1, 64)}}).tasks[0]
    ref = load_reference(task)
    handle, kernel, meta = registered(task, [(2, 8)], kernel=lambda *xs: ref(*xs))
    w = [torch.randn(s.shape) for s in task.inputs[1:]]
    for n in (1, 5, 40):
        x = torch.randn(n, 16)
        out, = fallback.run_or_fallback(handle, [x, *w], meta, kernel)
        torch.testing.assert_close(out, ref(x, *w))
    assert kernel.calls == [5] and fallback.counts([handle]) == fallback.Counts(kernel=1, outside=2)


# ------------------------------------------------------------------------------ one graph, every size

@torch.library.custom_op("htam_dispatch_test::launch", mutates_args=())
def _launch_op(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    return fallback.run_or_fallback(handle, inputs, out_meta, _OP_KERNELS[handle])


_launch_op.register_fake(launcher._launch_fake)
_OP_KERNELS: dict[int, StandIn] = {}


def test_a_compiled_graph_serves_every_size_without_recompiling():
    from torch._dynamo.testing import CompileCounterWithBackend
    task = ranged_task()
    handle, kernel, meta = registered(task, [(2, 32)])
    _OP_KERNELS[handle] = kernel

    # NOTE: out_meta as a literal in the code, as in a swapped graph's (runtime._replace_region): a
    # list from a closure would be a graph input, its ints symbolic under dynamic=True.
    ns = {"op": _launch_op}
    exec(f"def region(x, w, b):\n    return op({handle}, [x, w, b], {meta!r})[0] + 0\n", ns)
    region = ns["region"]

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(region, backend=counter, dynamic=True, fullgraph=True)
    try:
        for n in (4, 16, 40, 100):     # not 1: Dynamo specializes sizes 0 and 1
            inputs = gelu_inputs(n)
            torch.testing.assert_close(compiled(*inputs), gelu_affine(*inputs))
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 1
    assert kernel.calls == [4, 16] and fallback.counts([handle]) == fallback.Counts(kernel=2, outside=2)


def test_a_failed_launch_in_the_cpp_wrapper_runs_the_region_and_is_counted(monkeypatch):
    """Inductor's C++ wrapper launches static kernels itself (launch_o<N>) and calls
    fallback.after_failed_launch where one fails: the region runs on the same inputs, in out_meta's
    layout, the failure is counted; its successful launches count as kernel calls
    (launcher.stable_calls). A ranged handle's buckets are set in the launcher first, which hands
    inputs outside them to the same hook: its region runs, counted as outside, not as a failure."""
    from types import SimpleNamespace
    task = ranged_task()
    handle, meta = next(_ids), encode_out_meta(task.outputs, out_refs(task))
    fallback.register(handle, task)
    kernel = StandIn(gelu_affine)
    monkeypatch.setattr(launcher, "extension", lambda: SimpleNamespace(launch=kernel))
    monkeypatch.setattr(launcher, "stable_calls", lambda: {handle: 5})
    inputs = gelu_inputs(3)
    out, = fallback.after_failed_launch(handle, inputs, meta, f"htam kernel {handle} returned 1000: {ERR_SHAPE}")
    torch.testing.assert_close(out, gelu_affine(*inputs))
    assert kernel.calls == [] and fallback.counts([handle]) == fallback.Counts(kernel=5, failed=1)
    set_fits = {}
    monkeypatch.setattr(launcher, "extension", lambda: SimpleNamespace(launch=kernel, set_fits=set_fits.__setitem__))
    assert fallback.set_in_launcher(handle) and fallback.set_in_launcher(next(_ids))   # static: as it comes
    assert set_fits == {}
    ranged, _, ranged_meta = registered(ranged_task(), [(1, 64)])
    assert fallback.set_in_launcher(ranged) and set_fits[ranged] == fallback.fits_code(ranged)
    big = gelu_inputs(100)
    out, = fallback.after_failed_launch(ranged, big, ranged_meta, launcher.OUTSIDE_BUCKETS)
    torch.testing.assert_close(out, gelu_affine(*big))
    assert fallback.counts([ranged]) == fallback.Counts(outside=1)

    def refuse(handle, code):
        raise RuntimeError("htam: set_fits for handle 7, which is not loaded")
    monkeypatch.setattr(launcher, "extension", lambda: SimpleNamespace(launch=kernel, set_fits=refuse))
    assert not fallback.set_in_launcher(ranged)      # its launches keep Inductor's Python wrapper
    with pytest.raises(RuntimeError, match="illegal memory access"):     # a crash is raised as it is
        fallback.after_failed_launch(handle, inputs, meta, "CUDA error: an illegal memory access was encountered")


BIAS_GELU_SRC = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x, b):
        return F.gelu(x + b, approximate="tanh")

def get_inputs():
    return [torch.randn(16, 256), torch.randn(256)]

def get_init_inputs():
    return []
'''


@pytest.mark.gpu
def test_gpu_a_ranged_kernel_launched_from_cpp_runs_inside_its_buckets_and_its_region_outside(tmp_path):
    """htam::launch_o1, as Inductor's C++ wrapper calls it (launcher.stable_args), of a real kernel
    kept for rows 1-16 of a declared 1-64 (its buckets set in the launcher: set_in_launcher): rows
    inside run the kernel (a stable call); rows outside are handed by the launcher to
    fallback.after_failed_launch, which runs the region (counted as outside, not failed); the
    outputs are right either way."""
    from test_runtime import BIAS_GELU_CU
    from torch_htam.build import build_many
    res = build_many([BIAS_GELU_CU], out_dir=tmp_path)[0]
    assert res.ok, res.error
    kernel = launcher.Kernel(res.so_path)
    x = spec((16, 256)).with_ranges({0: (1, 64)})
    task = Task("bias_gelu_rows", "elementwise", BIAS_GELU_SRC, [x, spec((256,))], [x], "bias_gelu_rows",
                ["aten.add.Tensor", "aten.gelu.default"])
    fallback.register(kernel.handle, task, [V.Bucket(*V.leading_dim(task), 1, 16)])
    launcher.extension().set_failure_hook(fallback.after_failed_launch)
    assert fallback.set_in_launcher(kernel.handle)
    meta = encode_out_meta(task.outputs, out_refs(task))
    b = torch.randn(256, device="cuda")
    stable = launcher.stable_calls().get(kernel.handle, 0)
    for rows in (1, 16, 17, 64):
        xs = [torch.randn(rows, 256, device="cuda"), b]
        n, args = launcher.stable_args(kernel.handle, xs, meta)
        out = launcher.stable_op(n)(*args)
        torch.testing.assert_close(out, F.gelu(xs[0] + b, approximate="tanh"), rtol=1e-5, atol=1e-5)
    assert launcher.stable_calls()[kernel.handle] - stable == 2
    assert fallback.counts([kernel.handle]).outside == 2 and fallback.counts([kernel.handle]).failed == 0


def _bias_gelu_kept_for_2_to_48(tmp_path):
    """BiasGelu on the GPU with its batch declared 1-64 (example 16), its bias + GELU task and a
    real kernel for it kept for rows 2-48, once the C++ wrapper's launches are checked here:
    (model, x, dynamic, task, kernel)."""
    from test_runtime import BIAS_GELU_CU, BiasGelu
    from torch_htam import inductor
    from torch_htam.build import build_many
    from torch_htam.evaluation import Evaluation
    from torch_htam.extract import extract
    warm = inductor.warm_cpp_wrapper()
    assert warm is None or warm.wait(timeout=400) == 0
    assert inductor.stable_launches_checked()
    torch._dynamo.reset()
    model = BiasGelu().cuda().eval()
    dynamic = {0: {0: (1, 64)}}
    with torch.inference_mode():     # made as the requests are: Dynamo guards on the inference flag
        x = torch.randn(16, 256, device="cuda")
    task = next(t for t in extract(model, (x,), dynamic=dynamic).tasks if "gelu" in t.name)
    res = build_many([BIAS_GELU_CU], out_dir=tmp_path)[0]
    assert res.ok, res.error
    kernel = launcher.Kernel(res.so_path)
    kernel.evaluation = Evaluation(True, "ok", buckets=[[0, 0, 2, 48]])
    return model, x, dynamic, task, kernel


@pytest.mark.gpu
def test_gpu_a_ranged_kernel_serves_every_size_in_a_cpp_wrapper_graph(tmp_path):
    """A real kernel kept for rows 2-48 of a declared 1-64, in Inductor's C++-wrapper graph of
    dynamic size: one graph serves every size, launch_o<N> runs the kernel inside its buckets and
    the region outside, and the answer is right. The graph once reached that wrapper with its size
    input lost, and the generated C++ read the size as a tensor: SIGSEGV on an H200
    (inductor.as_dynamo_inputs)."""
    from torch_htam import inductor
    from torch_htam.capture import marked
    model, x, dynamic, task, kernel = _bias_gelu_kept_for_2_to_48(tmp_path)
    b = inductor.HtamBackend({task.signature: kernel}, options=inductor.WRAPPER_OPTIONS)
    compiled = torch.compile(model, backend=b)
    stable, outside = launcher.stable_calls().get(kernel.handle, 0), fallback.counts([kernel.handle]).outside
    try:
        with torch.inference_mode():
            torch.testing.assert_close(compiled(*marked((x,), dynamic)), model(x), rtol=1e-4, atol=1e-4)
            for rows in (2, 7, 33, 48, 60, 5):
                y = torch.randn(rows, 256, device="cuda")
                torch.testing.assert_close(compiled(y), model(y), rtol=1e-4, atol=1e-4)
    finally:
        torch._dynamo.reset()
    assert len(b.records) == 1 and b.records[0].swapped == [task.signature]
    assert launcher.stable_calls()[kernel.handle] - stable == 6          # 16, 2, 7, 33, 48 and 5
    assert fallback.counts([kernel.handle]).outside - outside == 1        # 60


@pytest.mark.gpu
def test_gpu_a_ranged_kernel_runs_in_the_example_graph_by_its_static_twin(tmp_path):
    """A real kernel kept for rows 2-48 of a declared 1-64, swapped by its static twin
    (extract.static_twin) into the graph specialized to the example's 16 rows, compiled with the
    C++ wrapper: one launch_o<N> there, right; its handle also serves the dynamic graph's sizes
    inside its buckets and hands the others to the region (decide.Trials.at_example's rival)."""
    from torch_htam import inductor
    from torch_htam.capture import marked
    from torch_htam.extract import static_twin
    model, x, dynamic, task, kernel = _bias_gelu_kept_for_2_to_48(tmp_path)
    ranged = inductor.HtamBackend({task.signature: kernel}, options=inductor.WRAPPER_OPTIONS)
    twin = inductor.HtamBackend({static_twin(task): kernel}, options=inductor.WRAPPER_OPTIONS, twins=True)
    # NOTE: each through a code object of its own, as the decision's arms are compiled: on one
    # forward, Dynamo's automatic dynamic would make the second compile dynamic (no static twin)
    dyn, static = inductor.compile_with(model, ranged), inductor.compile_with(model, twin)
    stable, outside = launcher.stable_calls().get(kernel.handle, 0), fallback.counts([kernel.handle]).outside
    try:
        with torch.inference_mode():
            dyn(*marked((x,), dynamic))                              # the dynamic graph: a ranged region
            torch.testing.assert_close(static(x), model(x), rtol=1e-4, atol=1e-4)
            for rows in (7, 60):
                y = torch.randn(rows, 256, device="cuda")
                torch.testing.assert_close(dyn(y), model(y), rtol=1e-4, atol=1e-4)
    finally:
        torch._dynamo.reset()
    assert twin.records[0].swapped == [static_twin(task)], twin.records[0].note
    assert twin.records[0].cpp_wrapper, twin.records[0].python_wrapper_why
    assert launcher.stable_calls()[kernel.handle] - stable == 3          # 16 (dynamic), 16 (static), 7
    assert fallback.counts([kernel.handle]).outside - outside == 1        # 60
