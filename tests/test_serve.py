"""Serving changing sizes on CPU: with declared dynamic dims the compiled model's graph has symbolic
sizes, the backend swaps ranged kernels into it, and new sizes run without a recompile. Stand-in
kernels (a custom op running the task's own reference, which takes its sizes from its inputs)
check the plumbing; tests/test_dispatch.py checks the per-bucket dispatch of real launches."""
import dataclasses
import itertools

import pytest
import torch
import torch.nn as nn

from torch_htam import inductor, runtime
from torch_htam.capture import marked
from torch_htam.evaluation import Evaluation
from torch_htam.extract import extract
from torch_htam.launcher import decode_out_meta
from torch_htam.task import load_reference

_KERNELS: dict[int, "RangedKernel"] = {}
_ids = itertools.count(1)


@torch.library.custom_op("htam_serve_test::run", mutates_args=())
def run_op(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    outs = _KERNELS[handle](inputs)
    metas = decode_out_meta(out_meta, inputs)
    assert [(o.dtype, tuple(o.shape)) for o in outs] == [m[:2] for m in metas]
    return [o.clone() for o in outs]


@run_op.register_fake
def _(handle, inputs, out_meta):
    return [m.empty(inputs[0].device) for m in decode_out_meta(out_meta, inputs)]


PROVIDER = runtime.Provider(torch.ops.htam_serve_test.run.default, lambda k: k)


class RangedKernel:
    """Kernel-like, verified over its task's range: runs the task's reference at whatever sizes
    it is given, and records them."""

    def __init__(self, task):
        self.task, self.ref = task, load_reference(task)
        self.handle = next(_ids)
        self.evaluation = Evaluation(True, "ok", buckets=[[0, 0, 2, 8], [0, 0, 9, 64]])
        self.sizes: list[tuple] = []
        _KERNELS[self.handle] = self

    def __call__(self, inputs):
        self.sizes.append(tuple(inputs[0].shape))
        out = self.ref(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]


class Block(nn.Module):
    """Heads split by x's own batch (a view with a symbolic size), a GEMM, a row-wise op."""

    def __init__(self):
        super().__init__()
        self.qkv, self.norm = nn.Linear(16, 48), nn.LayerNorm(16)

    def forward(self, x):
        h = self.qkv(self.norm(x)).view(x.shape[0], 3, 16)
        return torch.softmax(h, -1).sum(1)


@pytest.fixture
def block():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, x, dynamic = Block().eval(), torch.randn(4, 16), {0: {0: (1, 64)}}
    found = extract(model, (x,), dynamic=dynamic)
    yield model, x, dynamic, found
    torch._dynamo.reset()


def test_new_sizes_run_the_kernels_without_a_recompile(block):
    model, x, dynamic, found = block
    assert found.capture.dynamic and found.tasks
    kernels = {t.signature: RangedKernel(t) for t in found.tasks}
    b = inductor.HtamBackend(kernels, provider=PROVIDER)
    compiled = torch.compile(model, backend=b)
    with torch.no_grad():
        compiled(*marked((x,), dynamic))            # the first call: the dims marked dynamic
        for n in (3, 17, 50, 9):
            y = torch.randn(n, 16)
            torch.testing.assert_close(compiled(y), model(y))
    assert len(b.records) == 1                      # one graph served every size
    assert sorted(b.records[0].swapped) == sorted(kernels)
    for k in kernels.values():
        assert [s[0] for s in k.sizes[-4:]] == [3, 17, 50, 9]


def test_a_static_task_is_not_swapped_into_a_graph_of_dynamic_size(block):
    """The kernels of the static tasks (found at the example size alone) do not match the ranged
    tasks of the dynamic graph: nothing is swapped, the model is right at every size."""
    model, x, dynamic, _ = block
    static = extract(model, (x,))
    kernels = {t.signature: RangedKernel(t) for t in static.tasks}
    b = inductor.HtamBackend(kernels, provider=PROVIDER)
    compiled = torch.compile(model, backend=b)
    with torch.no_grad():
        compiled(*marked((x,), dynamic))
        y = torch.randn(11, 16)
        torch.testing.assert_close(compiled(y), model(y))
    assert [r.swapped for r in b.records] == [[]]


def test_the_marks_outlive_a_compile(block):
    """Each arm of optimize's decision compiles with the same marked inputs: the re-export inside
    the backend must leave their marks (torch.export strips the marks of what it is given)."""
    model, x, dynamic, found = block
    kernels = {t.signature: RangedKernel(t) for t in found.tasks}
    inputs = marked((x,), dynamic)
    with torch.no_grad():
        for _ in range(2):
            b = inductor.HtamBackend(kernels, provider=PROVIDER)
            inductor.compile_with(model, b)(*inputs)
            assert sorted(b.records[0].swapped) == sorted(kernels)
    assert hasattr(inputs[0], "_dynamo_dynamic_indices")


def test_a_static_graph_beside_the_dynamic_one_skips_the_re_export(block, monkeypatch):
    """Size 1 gets a graph of its own from torch.compile (static sizes): with only ranged kernels
    given, the backend hands it to Inductor without re-exporting it, and the answer is right."""
    from torch_htam import capture
    model, x, dynamic, found = block
    kernels = {t.signature: RangedKernel(t) for t in found.tasks}
    b = inductor.HtamBackend(kernels, provider=PROVIDER)
    compiled = torch.compile(model, backend=b)
    exports = []
    real = capture.export_graph
    monkeypatch.setattr(capture, "export_graph", lambda *a: exports.append(a) or real(*a))
    with torch.no_grad():
        compiled(*marked((x,), dynamic))
        one = torch.randn(1, 16)
        torch.testing.assert_close(compiled(one), model(one))
    assert len(b.records) == 2 and len(exports) == 1
    assert b.records[1].swapped == [] and "every kernel given serves a declared range" in b.records[1].note


# ---- re-export of a Dynamo graph whose code is narrower than the declared range --------------------

class _AtMost64(torch.nn.Module):
    """A graph whose code allows batch <= 64 only (as a CUDA attention kernel may bound a length
    Dynamo's graph does not show), exported with a declared 2-128."""

    def forward(self, x):
        torch._check(x.shape[0] <= 64)
        return x * 2


class _Only8(torch.nn.Module):
    """A graph whose code serves batch 8 only."""

    def forward(self, x):
        torch._check(x.shape[0] == 8)
        return x + 1


def _plan(low: int, high: int):
    from torch_htam.symbolic import ExportPlan
    return ExportPlan([("t", 0)], [{0: "s0"}], {"s0": (low, high)})


def test_an_export_narrower_than_the_range_is_kept_with_the_narrower_range():
    from torch_htam.capture import _export_sized
    ep = _export_sized(_AtMost64(), _plan(2, 128), [torch.randn(8, 4)])
    (val,) = [n.meta["val"] for n in ep.graph.nodes if n.op == "placeholder"]
    r = ep.range_constraints[val.shape[0].node.expr]
    assert (int(r.lower), int(r.upper)) == (2, 64)


def test_an_export_that_fixes_a_declared_size_is_refused():
    from torch_htam.capture import _export_sized
    with pytest.raises(torch._dynamo.exc.UserError, match="specialized"):
        _export_sized(_Only8(), _plan(2, 128), [torch.randn(8, 4)])


def test_the_cpp_wrapper_serves_a_swapped_graph_of_dynamic_size(block, monkeypatch):
    """Inductor's C++ wrapper on the swapped graph of dynamic size: it takes Dynamo's inputs, the
    size input among them, and is right at every size. A graph whose placeholders kept their
    re-exported values lost its size input under that wrapper (compile_fx reads such a graph as an
    exported one), so the C++ read the size as the next tensor: an error on the CPU, a SIGSEGV on a
    GPU (inductor.as_dynamo_inputs). The stand-in op is no htam::launch, which alone the backend
    hands that wrapper (stable_launches): here it is given it regardless."""
    model, x, dynamic, found = block
    kernels = {t.signature: RangedKernel(t) for t in found.tasks}
    b = inductor.HtamBackend(kernels, provider=PROVIDER)
    monkeypatch.setattr(b, "_inductor_options", lambda swapped=None, record=None: {"cpp_wrapper": True})
    compiled = torch.compile(model, backend=b)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        torch.testing.assert_close(compiled(*marked((x,), dynamic)), model(x))
        for n in (3, 17, 50):
            y = torch.randn(n, 16)
            torch.testing.assert_close(compiled(y), model(y))
    assert len(b.records) == 1 and sorted(b.records[0].swapped) == sorted(kernels)
    for k in kernels.values():
        assert [s[0] for s in k.sizes[-3:]] == [3, 17, 50]


def test_a_ranged_kernel_swaps_into_the_example_graph_by_its_static_twin(block):
    """A ranged kernel keyed by its task's static twin (extract.static_twin) is swapped into the
    graph specialized to the example's sizes (HtamBackend(twins=True)), compiled beside the
    dynamic graph through a code object of its own (inductor.compile_with), as the decision's STATIC
    arm with kernels is; the answer is right at the example's sizes."""
    from torch_htam.extract import static_twin
    model, x, dynamic, found = block
    task = found.tasks[0]
    kernel = RangedKernel(task)
    kernel.evaluation = Evaluation(True, "ok", buckets=[[0, 0, 2, 48]])
    ranged = inductor.HtamBackend({task.signature: kernel}, provider=PROVIDER)
    twin = inductor.HtamBackend({static_twin(task): kernel}, provider=PROVIDER, twins=True)
    dyn, static = inductor.compile_with(model, ranged), inductor.compile_with(model, twin)
    with torch.inference_mode():
        dyn(*marked((x,), dynamic))
        torch.testing.assert_close(static(x), model(x))
    assert [r.swapped for r in ranged.records] == [[task.signature]]
    assert [r.swapped for r in twin.records] == [[static_twin(task)]]
    assert kernel.sizes[-1][0] == x.shape[0]             # the twin's launch, at the example's rows


def _ranged(name: str, batch: int, low: int, high: int):
    """A one-input task whose leading dim (batch) is declared low..high."""
    from torch_htam.task import Task, TensorSpec
    spec = TensorSpec((batch, 16), "float32", (16, 1)).with_ranges({0: (low, high)})
    return Task(name, "elementwise", "", [spec], [spec], name, [])


def test_kept_sizes_intersect_each_kernels_buckets_in_the_declared_size():
    """Each ranged kernel's kept buckets, in its leading dim (k times the declared size), give the
    declared sizes it runs at; an arm runs its kernels where all of them do. A static task
    constrains nothing; two declared ranges or a dim no multiple of the range cannot be said."""
    from torch_htam.serving import kept_sizes
    from torch_htam.verify import Bucket
    dyn = {0: {0: (1, 64)}}
    batch = _ranged("batch", 32, 2, 64)                 # k = 1 (size 1 is Dynamo's own graph)
    rows = _ranged("rows", 32 * 128, 256, 64 * 128)     # k = 128: batch * 128 rows
    at, sizes = kept_sizes([(batch, [[0, 0, 9, 64]]),
                            (rows, [Bucket(0, 0, 129, 2048), Bucket(0, 0, 2049, 8192)])], dyn)
    assert at == (0, 0) and sizes == frozenset(range(9, 65))
    static = _ranged("static", 4, 4, 4)
    static = dataclasses.replace(static, inputs=[dataclasses.replace(static.inputs[0], dynamic=(), ranges=())])
    assert kept_sizes([(static, [])], dyn) is None                           # nothing ranged
    assert kept_sizes([(static, []), (batch, [[0, 0, 2, 8]])], dyn)[1] == frozenset(range(2, 9))
    assert kept_sizes([(batch, [[0, 0, 2, 8]])], {0: {0: (1, 64)}, 1: {1: (1, 2048)}}) is None
    odd = _ranged("odd", 33, 2, 65)                      # no multiple of 1-64
    assert kept_sizes([(odd, [[0, 0, 2, 65]])], dyn) is None
    assert kept_sizes([(batch, None)], dyn) is None        # a ranged kernel without its buckets


def test_a_bucket_split_runs_the_kernels_arm_at_its_sizes_only():
    from torch_htam.serving import BucketSplit
    split = BucketSplit(lambda x: "kernels", lambda x: "base", (0, 0), frozenset(range(9, 65)))
    assert [split(torch.empty(n, 2)) for n in (1, 8, 9, 64)] == ["base", "base", "kernels", "kernels"]


def test_a_ranged_tasks_static_twin_is_the_static_task_at_its_example(block):
    """extract.static_twin: the signature a ranged task's region has in the graph specialized to
    the example's sizes is that graph's own task's signature; a static task has none."""
    from torch_htam.extract import static_twin
    model, x, dynamic, found = block
    torch._dynamo.reset()
    static = {t.signature for t in extract(model, (x,)).tasks}
    assert {static_twin(t) for t in found.tasks} == static
    assert all(static_twin(t) is None for t in extract(model, (x,)).tasks)


def test_the_example_graph_runs_the_ranged_kernels_by_their_twins(block):
    """HtamBackend(twins=True) swaps ranged kernels, keyed by their static twins, into the graph
    specialized to the example's sizes: each runs there at the example's size, right."""
    from torch_htam.extract import static_twin
    model, x, dynamic, found = block
    torch._dynamo.reset()
    kernels = {static_twin(t): RangedKernel(t) for t in found.tasks}
    b = inductor.HtamBackend(kernels, provider=PROVIDER, twins=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=b)(x), model(x))
    assert sorted(b.records[0].swapped) == sorted(kernels)
    assert all(k.sizes and k.sizes[-1][0] == 4 for k in kernels.values())
    untwinned = inductor.HtamBackend(kernels, provider=PROVIDER)   # ranged kernels, a static graph
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=untwinned)(x)
    assert [r.swapped for r in untwinned.records] == [[]]


def test_route_names_the_graph_each_size_runs():
    """serving.route through ExampleSplit over BucketSplit, as optimize nests them."""
    from torch_htam.serving import BucketSplit, ExampleSplit, Route, route
    buckets = BucketSplit(lambda x: "kernels", lambda x: "base", (0, 0), frozenset(range(9, 65)))
    split = ExampleSplit(lambda x: "example", buckets, ((0, torch.Size([32, 2])),))
    for n, want, ran in ((32, Route.EXAMPLE, "example"), (16, Route.KERNELS, "kernels"), (4, Route.BASE, "base")):
        x = torch.empty(n, 2)
        assert route(split, (x,)) is want and split(x) == ran
    assert route(lambda x: x, (torch.empty(4, 2),)) is Route.CHOSEN
