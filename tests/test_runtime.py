"""Swap-in runtime: CPU tests with a stand-in kernel op, and a GPU test with a real CUDA kernel.

The CPU stand-in is a custom op with the launch schema that runs the region's own task graph, so
the test checks the rewiring (which nodes go, input/output order, getitem wiring, guards), not a
kernel's numerics.
"""
import copy
import dataclasses
import itertools
import math
import operator
import shutil
import subprocess

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import runtime
from torch_htam.extract import extract
from torch_htam.partition import partition
from torch_htam.launcher import decode_out_meta
from torch_htam.task import Task, TensorSpec

_KERNELS: dict[int, "CpuKernel"] = {}   # handle -> stand-in, as the launcher maps handle -> .so symbol
_ids = itertools.count(1)


@torch.library.custom_op("htam_test::run", mutates_args=())
def run_op(handle: int, inputs: list[torch.Tensor], out_meta: list[int]) -> list[torch.Tensor]:
    outs = _KERNELS[handle](inputs)
    metas = decode_out_meta(out_meta, inputs)
    assert [(o.dtype, tuple(o.shape)) for o in outs] == [m[:2] for m in metas]
    return [m.empty(o.device).copy_(o) for o, m in zip(outs, metas)]


@run_op.register_fake
def _(handle, inputs, out_meta):
    return [m.empty(inputs[0].device) for m in decode_out_meta(out_meta, inputs)]


class CpuKernel:
    """Kernel-like: `.handle`; runs the task's own region graph (placeholders in input order)."""

    def __init__(self, task):
        self.task, self.graph, self.calls = task, task.graph, 0
        self.handle = next(_ids)
        self.speedup = 1.5
        _KERNELS[self.handle] = self

    def __call__(self, inputs):
        self.calls += 1
        return list(self.graph(*inputs))


PROVIDER = runtime.Provider(torch.ops.htam_test.run.default, lambda k: k)


class MLP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)
        self.tag = "kept"

    def forward(self, x):
        h = F.gelu(self.fc(x), approximate="tanh")
        return self.ln(x + self.proj(h))

    def describe(self):
        return f"mlp:{self.tag}"


def _tasks(found):
    return {t.signature: t for t in found.tasks}


def _aten_calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
            and getattr(n.target, "namespace", None) == "aten"]


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 8, 32)
    cap = extract(model, (x,))
    assert cap.capture.method == "export"
    tasks = _tasks(cap)
    kernels = {sig: CpuKernel(t) for sig, t in tasks.items()}
    return model, x, cap, tasks, kernels


def test_swap_replaces_regions(setup):
    model, x, cap, tasks, kernels = setup
    gm = cap.capture.graphs[0]
    new, swapped = runtime.swap(gm, cap.sites_of(0), kernels, PROVIDER)
    assert {s.signature for s in swapped} == set(tasks) and len(swapped) == len(partition(gm))
    launches = [n for n in new.graph.nodes if n.target is torch.ops.htam_test.run.default]
    assert len(launches) == len(swapped) and not _aten_calls(new)
    assert len(_aten_calls(gm)) > 0   # the captured graph itself is untouched
    fresh = torch.randn(4, 8, 32)
    with torch.no_grad():
        assert torch.equal(new(fresh)[0], model(fresh))
    assert all(k.calls == 1 for k in kernels.values())


class LinearThenTranspose(nn.Module):
    """MLP-Mixer's token MLP end: a linear whose result is read transposed ([B, C, T] stored as
    [B, T, C]): the region's output is dense in dim order (0, 2, 1)."""

    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(8, 8), nn.Linear(16, 16)

    def forward(self, x):                        # x [2, 16, 8]
        return self.fc2(torch.relu(self.fc(x).transpose(1, 2) + 1.0))


def test_a_transposed_output_is_swapped_in_at_its_layout():
    torch.manual_seed(0)
    model, x = LinearThenTranspose().eval(), torch.randn(2, 16, 8)
    cap = extract(model, (x,))
    kernels = {t.signature: CpuKernel(t) for t in cap.tasks}
    laid = [o for t in cap.tasks for o in t.outputs if o.dim_order not in (None, tuple(range(len(o.shape))))]
    assert laid, [o for t in cap.tasks for o in t.outputs]
    new, swapped = runtime.swap(cap.capture.graphs[0], cap.sites_of(0), kernels, PROVIDER)
    assert len(swapped) == len(kernels)
    # the graph's meta (what Inductor plans buffers with) has the layout the launcher allocates
    metas = {tuple(n.meta["val"].stride()) for n in new.graph.nodes
             if n.target is operator.getitem and isinstance(n.meta.get("val"), torch.Tensor)}
    assert {o.stride for o in laid} <= metas
    fresh = torch.randn(2, 16, 8)
    with torch.no_grad():
        torch.testing.assert_close(new(fresh)[0], model(fresh))


def test_swap_only_some_regions(setup):
    model, x, cap, tasks, kernels = setup
    gemm = {s: k for s, k in kernels.items() if k.task.kind == "gemm"}
    assert 0 < len(gemm) < len(kernels)
    new, swapped = runtime.swap(cap.capture.graphs[0], cap.sites_of(0), gemm, PROVIDER)
    assert {s.signature for s in swapped} == set(gemm)
    assert any(str(n.target) == "aten.layer_norm.default" for n in _aten_calls(new))
    with torch.no_grad():
        assert torch.equal(new(x)[0], model(x))


def test_load_failure_leaves_region(setup):
    model, x, cap, tasks, kernels = setup

    def load(k):
        if k.task.kind == "gemm":
            raise OSError("cannot open shared object file")
        return k
    new, swapped = runtime.swap(cap.capture.graphs[0], cap.sites_of(0), kernels, runtime.Provider(PROVIDER.op, load))
    assert all(kernels[s.signature].task.kind != "gemm" for s in swapped)
    assert new.htam_load_errors and all("OSError" in v for v in new.htam_load_errors.values())
    with torch.no_grad():
        assert torch.equal(new(x)[0], model(x))


def test_install_guards_and_restore(setup):
    model, x, cap, tasks, kernels = setup
    model.extra = nn.Identity()
    ref_forward = model.forward
    out = runtime.install(model, cap, kernels, provider=PROVIDER)
    assert out is model and isinstance(model, MLP)
    assert model.tag == "kept" and model.describe() == "mlp:kept" and isinstance(model.extra, nn.Identity)
    assert set(model.state_dict()) == set(MLP().state_dict())   # no wrapper state leaks in
    rep = model.htam_report
    assert rep.swapped == len(tasks) and all(t.status == "swapped" for t in rep.tasks)
    with torch.no_grad():
        fresh = torch.randn(4, 8, 32)
        expect = ref_forward(fresh)
        calls = sum(k.calls for k in kernels.values())
        assert torch.equal(model(fresh), expect)
        assert sum(k.calls for k in kernels.values()) == calls + len(tasks)
        other = torch.randn(3, 8, 32)                      # new batch size -> original path
        assert torch.equal(model(other), ref_forward(other))
        model(fresh.transpose(0, 1).contiguous().transpose(0, 1))   # same shape, other strides
    model(fresh)                                           # grad enabled, weights require grad
    assert rep.fast_calls == 1 and rep.fallback_calls == 3
    assert rep.fallback_reasons == {"input shape/dtype/stride": 2, "autograd": 1}
    assert "autograd" in rep.format() and "swapped" in rep.format()
    runtime.restore(model)
    assert "forward" not in model.__dict__ and model.forward.__func__ is MLP.forward


def test_install_sees_weight_updates_and_train_mode(setup):
    model, x, cap, tasks, kernels = setup
    runtime.install(model, cap, kernels, provider=PROVIDER)
    with torch.no_grad():
        model.fc.weight.mul_(0.5)                          # in place
        model.proj.bias = nn.Parameter(torch.randn(32))    # reassigned
        expect = MLP.forward(model, x)
        assert torch.equal(model(x), expect)
        assert model.htam_report.fast_calls == 1
        model.train()
        model(x)
    assert model.htam_report.fallback_reasons == {"training mode": 1}


def test_installed_graph_reads_weights_in_one_fetch(setup):
    """No get_attr chain is left in the installed graph (each `.` on a module is a Python call of
    nn.Module.__getattr__); one fetch reads the model's live tensors, and a module swapped for one
    that exposes its weights some other way still works (the getattr fallback)."""
    model, x, cap, tasks, kernels = setup
    runtime.install(model, cap, kernels, provider=PROVIDER)
    gm = model.forward.htam.gm
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert "_htam_fetch_attrs" in gm.code
    fetch = next(n.target for n in gm.graph.nodes if n.op == "call_function" and n.target.__name__ == "_htam_fetch_attrs")
    fetched = fetch()
    assert any(t is model.fc.weight for t in fetched) and any(t is model.ln.bias for t in fetched)

    class Exposed(nn.Module):      # weight and bias as properties: not in _parameters
        def __init__(self, lin):
            super().__init__()
            self.inner = lin

        @property
        def weight(self):
            return self.inner.weight

        @property
        def bias(self):
            return self.inner.bias

    with torch.no_grad():
        model.proj = nn.Linear(128, 32)                     # a new submodule: read through the dicts
        assert torch.equal(model(x), MLP.forward(model, x))
        model.proj = Exposed(nn.Linear(128, 32))            # no dict path: the getattr chain
        expect = F.layer_norm(x + F.linear(F.gelu(model.fc(x), approximate="tanh"), model.proj.weight,
                                           model.proj.bias), (32,), model.ln.weight, model.ln.bias)
        assert torch.allclose(model(x), expect, atol=1e-6)
    assert model.htam_report.fast_calls == 2


def test_autograd_guard_sees_a_parameter_reassigned_after_install(setup):
    """Frozen weights at install, then a trainable one assigned: a grad-mode call must take the
    original path (our kernels have no backward), not return an output without a graph."""
    model, x, cap, tasks, kernels = setup
    for p in model.parameters():
        p.requires_grad_(False)
    runtime.install(model, cap, kernels, provider=PROVIDER)
    model(x)
    assert model.htam_report.fast_calls == 1
    model.proj.weight = nn.Parameter(torch.randn(32, 128))       # trainable
    y = model(x)
    assert y.requires_grad and model.htam_report.fallback_reasons == {"autograd": 1}


def test_copies_of_an_installed_model_run_their_own_weights(setup):
    """copy.deepcopy and torch.save of an installed model give a model on its original path that
    computes with its own weights (the swapped forward closes over the first model's graph)."""
    import io
    model, x, cap, tasks, kernels = setup
    runtime.install(model, cap, kernels, provider=PROVIDER)
    twin = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        twin.fc.weight.mul_(0.5)
        assert torch.equal(twin(x), MLP.forward(twin, x))
        assert not torch.equal(twin(x), model(x))
        assert torch.equal(loaded(x), MLP.forward(loaded, x))
        assert model.htam_report.fast_calls == 1                 # the original keeps its kernels
    assert "forward" not in twin.__dict__ and twin.describe() == "mlp:kept"


def test_install_under_torch_compile_and_export(setup):
    model, x, cap, tasks, kernels = setup
    expect = copy.deepcopy(model)
    runtime.install(model, cap, kernels, provider=PROVIDER)
    with torch.no_grad():
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        fresh = torch.randn(4, 8, 32)
        assert torch.equal(compiled(fresh), expect(fresh))
        ep = torch.export.export(model, (x,), strict=False)
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "htam_test.run.default" in ops
    torch._dynamo.reset()


def test_dynamo_capture_is_left_on_original_path(setup):
    model, x, cap, tasks, kernels = setup
    cap.capture.exported, cap.capture.method = None, "dynamo"
    runtime.install(model, cap, kernels, provider=PROVIDER)
    assert "forward" not in model.__dict__
    assert model.htam_report.swapped == 0 and "dynamo" in model.htam_report.note


def test_unusable_cache_entry_is_not_swapped(setup):
    model, x, cap, tasks, kernels = setup

    class SlowEntry:   # what cache.Entry answers for a verified kernel that did not win
        def usable(self, min_speedup):
            return False
    sig = next(iter(kernels))
    kernels[sig] = SlowEntry()
    runtime.install(model, cap, kernels, provider=PROVIDER,
                    min_speedup=1.03)
    status = {t.signature: t.status for t in model.htam_report.tasks}
    assert status[sig].startswith("not usable") and model.htam_report.swapped == len(tasks) - 1


def test_task_report_says_where_a_ranged_kernel_runs():
    """A ranged kernel's report carries the buckets it runs in and its per-bucket timings, so a
    user can read which sizes get it; a static kernel's carries none."""
    from types import SimpleNamespace as NS
    ranged = NS(speedup=1.4, policy={}, compile_speedup=1.2, ref_ms=0.05, buckets=[[0, 0, 9, 64]],
                bucket_times=[[2, 8, 4, 0.012, 0.010], [9, 64, 24, 0.020, 0.026]])
    static = NS(speedup=1.3, policy={}, compile_speedup=1.1, ref_ms=0.04, buckets=[], bucket_times=[])
    tasks = [NS(name="conv", signature="r", count=2, kind="conv"), NS(name="gemm", signature="s", count=1, kind="gemm")]
    kernels = {"r": NS(evaluation=ranged), "s": NS(evaluation=static)}
    swapped = [NS(signature="r"), NS(signature="s")]
    by = {t.signature: t for t in runtime._task_reports(tasks, kernels, swapped, {}, {})}
    assert by["r"].buckets == [[0, 0, 9, 64]] and by["r"].bucket_times[0] == [2, 8, 4, 0.012, 0.010]
    assert by["s"].buckets == [] and by["s"].bucket_times == []
    assert by["r"].describe().endswith("(sizes 9-64)") and "sizes" not in by["s"].describe()


# ---- GPU: a real kernel through the launcher -----------------------------------------------

BIAS_GELU_CU = r"""
#include "htam_abi.h"
// out = gelu_tanh(x + b); x: (M, N) contiguous fp32, b: (N,). One thread per element.
__global__ void bias_gelu(const float* x, const float* b, float* y, long n, long cols) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i] + b[i % cols];
  y[i] = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t s) {
  if (n_in != 2 || n_out != 1 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  long n = htam_numel(&in[0]), cols = in[1].sizes[0];
  bias_gelu<<<(n + 255) / 256, 256, 0, s>>>((const float*)in[0].data, (const float*)in[1].data,
                                            (float*)out[0].data, n, cols);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
"""


class BiasGelu(nn.Module):
    """bias + GELU on the input, then a projection: (add, gelu) is an elementwise region (x, b)."""

    def __init__(self, d=256):
        super().__init__()
        self.b = nn.Parameter(torch.randn(d))
        self.proj = nn.Linear(d, 64)

    def forward(self, x):
        return self.proj(F.gelu(x + self.b, approximate="tanh"))


@pytest.mark.gpu
def test_gpu_bias_gelu_kernel(tmp_path):
    from torch_htam import launcher
    from torch_htam.build import build_many

    torch.manual_seed(0)
    model = BiasGelu().cuda().eval()
    x = torch.randn(16, 256, device="cuda")
    cap = extract(model, (x,))
    tasks = _tasks(cap)
    target = [t for t in tasks.values() if t.kind == "elementwise"
              and any("gelu" in op for op in t.ops) and len(t.inputs) == 2]
    assert len(target) == 1, [(t.name, t.ops) for t in tasks.values()]
    res = build_many([BIAS_GELU_CU], out_dir=tmp_path)[0]
    assert res.ok, res.log
    kernel = launcher.Kernel(res.so_path)
    runtime.install(model, cap, {target[0].signature: kernel})
    assert model.htam_report.swapped == 1
    ref = BiasGelu.forward
    with torch.no_grad():
        fresh = torch.randn(16, 256, device="cuda")
        torch.testing.assert_close(model(fresh), ref(model, fresh), atol=1e-5, rtol=1e-5)
        assert model.htam_report.fast_calls == 1
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(fresh), ref(model, fresh), atol=1e-5, rtol=1e-5)
        static = torch.randn(16, 256, device="cuda")
        side = torch.cuda.Stream()                      # warm up off the capture stream, as
        side.wait_stream(torch.cuda.current_stream())   # torch.cuda.graph's docs ask
        with torch.cuda.stream(side):
            model(static)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(static)
        static.copy_(fresh * 2)
        g.replay()
        torch.testing.assert_close(out, ref(model, fresh * 2), atol=1e-5, rtol=1e-5)
        other = torch.randn(5, 256, device="cuda")
        torch.testing.assert_close(model(other), ref(model, other))
    assert model.htam_report.fallback_reasons == {"input shape/dtype/stride": 1}
    torch._dynamo.reset()


class ScaledGelu(nn.Module):
    """Makes a tensor constant inside forward: export lifts it onto this submodule's path
    (as HF GPT-2's attention does), where the user's own module has no such attribute."""

    def __init__(self, d=32):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return F.gelu(self.fc(x)) * torch.tensor([0.5, 2.0]).repeat(16)


class WithConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = ScaledGelu()

    def forward(self, x):
        return self.block(x) + 1.0


def test_install_keeps_lifted_constants_of_submodules():
    torch.manual_seed(0)
    model = WithConstants().eval()
    x = torch.randn(4, 32)
    cap = extract(model, (x,))
    lifted = [n.target for n in cap.capture.graphs[0].graph.nodes
              if n.op == "get_attr" and not runtime._resolves(model, n.target)]
    assert lifted, "the pattern under test: a get_attr the user's model does not have"
    kernels = {sig: CpuKernel(t) for sig, t in _tasks(cap).items()}
    state_keys = set(model.state_dict())
    runtime.install(model, cap, kernels, provider=PROVIDER)
    assert model.htam_report.swapped > 0
    assert set(model.state_dict()) == state_keys          # nothing added to the user's modules
    with torch.no_grad():
        fresh = torch.randn(4, 32)
        assert torch.equal(model(fresh), model.forward.htam.original(fresh))
        assert model.htam_report.fast_calls == 1


class ConvBlock(nn.Module):
    """conv + BN + residual + ReLU, then a 1x1 conv: two conv regions, one reading the other."""

    def __init__(self, c=8):
        super().__init__()
        self.conv, self.bn, self.pw = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.Conv2d(c, c, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.bn(self.conv(x)) + x))


class StridesSeen(CpuKernel):
    def __call__(self, inputs):
        self.seen = [tuple(t.stride()) for t in inputs]
        return super().__call__(inputs)


def test_conv_regions_take_and_give_channels_last():
    # Inductor runs convs channels-last: a conv region's task says so, and the swapped graph lays
    # its activations out that way (a copy of the NCHW model input; none between the two regions)
    torch.manual_seed(0)
    model, x = ConvBlock().eval(), torch.randn(2, 8, 6, 6)
    cap = extract(model, (x,))
    convs = [t for t in cap.tasks if t.kind == "conv"]
    assert len(convs) == 2
    for t in convs:
        assert t.inputs[0].channels_last and t.outputs[0].channels_last
        assert not t.inputs[1].channels_last and t.inputs[1].contiguous     # the weight stays as held
    kernels = {t.signature: StridesSeen(t) for t in cap.tasks}
    new, swapped = runtime.swap(cap.capture.graphs[0], cap.sites_of(0), kernels, PROVIDER)
    assert len(swapped) == len(cap.tasks)
    forced = [n for n in new.graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default]
    assert len(forced) == 2     # each conv region's activation input
    fresh = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        out = new(fresh)[0]
        torch.testing.assert_close(out, model(fresh))
    assert out.is_contiguous(memory_format=torch.channels_last)
    cl = torch.empty(2, 8, 6, 6).to(memory_format=torch.channels_last).stride()
    assert all(k.seen[0] == cl for k in kernels.values())


class TransposedStream(nn.Module):
    """Whisper's encoder in small: a conv front end transposed to [B, T, C], so eager stores every
    residual add's result (and a layer norm's input) transposed; then LN -> linear + residual."""

    def __init__(self, c=16):
        super().__init__()
        self.conv, self.ln, self.fc = nn.Conv1d(c, c, 3, padding=1), nn.LayerNorm(c), nn.Linear(c, c)

    def forward(self, x, pos):
        h = self.conv(x).permute(0, 2, 1) + pos     # [B, T, C] stored [B, C, T]
        return h + self.fc(self.ln(h))


def test_regions_take_and_give_row_major_what_eager_laid_out_transposed():
    """A boundary an elementwise or row-wise op made, stored permuted by eager's TensorIterator,
    is row-major in its task (Inductor lays it out as the runtime asks); the swapped graph forces
    it so at the inputs, allocates the outputs so and computes what the model does."""
    torch.manual_seed(0)
    model, x, pos = TransposedStream().eval(), torch.randn(2, 16, 12), torch.randn(12, 16)
    h = model.conv(x).permute(0, 2, 1) + pos
    assert not h.is_contiguous()          # eager's layout: the add follows the permute
    cap = extract(model, (x, pos))
    by_kind = {t.kind: t for t in cap.tasks}
    norm, gemm = by_kind["rowwise"], by_kind["gemm"]
    assert norm.inputs[0].contiguous and norm.outputs[0].contiguous
    assert all(s.contiguous for s in gemm.inputs + gemm.outputs)          # X, W, bias, residual, out
    kernels = {t.signature: StridesSeen(t) for t in cap.tasks}
    new, swapped = runtime.swap(cap.capture.graphs[0], cap.sites_of(0), kernels, PROVIDER)
    assert {s.name for s in swapped} >= {norm.name, gemm.name}
    fresh, fresh_pos = torch.randn(2, 16, 12), torch.randn(12, 16)
    with torch.no_grad():
        torch.testing.assert_close(new(fresh, fresh_pos)[0], model(fresh, fresh_pos))
    for t in (norm, gemm):
        k = kernels[t.signature]
        assert all(st == sp.stride for st, sp in zip(k.seen, t.inputs)), (t.name, k.seen)
    launches = [n for n in new.graph.nodes if n.target is PROVIDER.op]
    assert all(v.is_contiguous() for n in launches for v in n.meta["val"])


# ---- pre-planning: the batch slices of a ranged conv ------------------------------------------------

@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_planned_sizes_are_every_slice_batch_slice_cuts(tmp_path):
    """batch_slice.cuh (C++, in the kernel) and runtime.planned_sizes (Python, at load) name the
    same sizes: every slice of every batch up to 300 is a planned size, the slices add up to the
    batch, and there are at most 2 log2(batch) + 1 of them."""
    from torch_htam.proposers.expert.cuda import cuh
    from torch_htam.runtime import planned_sizes
    (tmp_path / "s.cpp").write_text(cuh("batch_slice.cuh") + """
#include <cstdio>
int main() {
  for (int64_t n = 1; n <= 300; ++n) {
    for (int64_t left = n; left > 0; left -= batch_slice(left)) std::printf("%lld ", (long long)batch_slice(left));
    std::printf("\\n");
  }
}
""")
    subprocess.run(["g++", "-std=c++17", "-O1", str(tmp_path / "s.cpp"), "-o", str(tmp_path / "s")], check=True)
    out = subprocess.run([str(tmp_path / "s")], check=True, capture_output=True, text=True).stdout
    for n, line in enumerate(out.splitlines(), start=1):
        slices = [int(v) for v in line.split()]
        assert sum(slices) == n and slices == sorted(slices, reverse=True)
        assert set(slices) <= set(planned_sizes(n)), n
        assert len(slices) <= 2 * math.log2(n) + 1
    assert planned_sizes(64) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert len(planned_sizes(2048)) == 22      # a range to 2048 plans 22 sizes, not 2048


def test_preplan_leaves_static_tasks_and_other_kinds_alone(monkeypatch):
    """Only a conv task with kept buckets is launched at load (checked as if on a GPU)."""
    from torch_htam.runtime import preplan
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    class Kernel:                       # a stand-in that fails the test if launched
        so_path = "/nonexistent.so"

        def __call__(self, *a):
            raise AssertionError("launched")
    x = TensorSpec.of(torch.zeros(4, 8)).with_ranges({0: (1, 8)})
    gemm = Task("g", "gemm", "", [x], [TensorSpec.of(torch.zeros(4, 8))], "sig", [])
    assert preplan(Kernel(), gemm, [[0, 0, 1, 8]]) == []
    assert preplan(Kernel(), dataclasses.replace(gemm, kind="conv"), []) == []
    over_length = TensorSpec.of(torch.zeros(2, 8, 16)).with_ranges({2: (1, 32)})    # conv1d over L
    assert preplan(Kernel(), dataclasses.replace(gemm, kind="conv", inputs=[over_length]), [[0, 2, 1, 32]]) == []


def test_suspended_runs_the_original_and_puts_everything_back():
    """attach.suspended: inside, the original forward (and the user's own compile, if any); after,
    the same compiled call, report and copy rule as before, nothing rebuilt."""
    import copy
    from torch_htam import attach
    model, x = MLP().eval(), torch.randn(3, 32)
    calls = []

    def call(*a, **k):
        calls.append("ours")
        return MLP.forward(model, *a, **k)

    report = runtime.Report(note="ours")
    attach.compiled(model, call, report)
    with attach.suspended(model) as m:
        assert m is model and model._compiled_call_impl is None
        model(x)
        assert calls == []
    model(x)
    assert calls == ["ours"] and model._compiled_call_impl is call and model.htam_report is report
    assert copy.deepcopy(model)._compiled_call_impl is None          # the copy rule is back too
    fwd = lambda *a: MLP.forward(model, *a)  # noqa: E731
    fwd.htam = True
    attach.forward(model, fwd, report)
    with attach.suspended(model):
        assert "forward" not in model.__dict__
    assert model.forward is fwd


def test_the_report_shows_a_phases_part_inside_its_whole():
    """'search: confirming winners' is time inside 'search' (a phase within a phase): the report
    shows it there, not as more time beside it; 'decide: compile' has no 'decide' phase and stays."""
    from torch_htam.report import Report
    rep = Report(phases={"capture": 1.5, "decide: compile": 13.0, "search: confirming winners": 20.0,
                         "search": 60.0})
    line = next(x for x in rep.format().splitlines() if x.strip().startswith("time:"))
    assert line.strip() == ("time: capture 1.5 s, decide: compile 13.0 s, "
                            "search 60.0 s (confirming winners 20.0 s)")
