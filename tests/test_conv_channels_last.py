"""Channels-last conv regions (extract.channels_last_boundary, conv.render_cl): a plain conv2d's
task takes x and the residual and gives y stored N, H, W, C, the layout Inductor runs convs in, and
the kernel is one fold plus one cuDNN graph with [bias] [+ residual] [ReLU] fused into the conv
(or, fused=False, the conv alone and our epilogue kernel after it).

CPU: which regions run channels-last, what the matcher accepts and refuses (and says why), nvcc for
sm_90a. GPU (@gpu): every seed candidate against torch in each dtype at two batch sizes, the weight
NCHW or channels-last, and the output channels-last.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch
import torch.nn as nn

from compile_check import assert_compiles
from test_conv_kinds import KindBlock, kind_inputs
from test_conv_kinds import _task as conv_kinds_task
from test_expert import propose
from torch_htam import build, paths
from torch_htam.extract import extract
from torch_htam.policy import make, policy_for
from torch_htam.proposers.expert import conv
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.verify import within_torch_error

CL = torch.channels_last


def block_inputs(block: KindBlock, n=2, c=16, k=32, size=9, r=3, bias=False, res=False, w_cl=False,
                 dtype=torch.float32, device="cpu") -> list:
    """test_conv_kinds' inputs laid out as a channels-last model holds them (x, the residual; w
    when w_cl), with some tiny variances."""
    xs = kind_inputs(block, n, c, k, size, r, bias, res, dtype, device)
    xs[0] = xs[0].to(memory_format=CL)
    xs[1] = xs[1].to(memory_format=CL) if w_cl else xs[1]
    # NOTE: a tiny variance makes the scale large: the cancellation a weight-folded batch norm suffers
    xs[6] = torch.rand(k, dtype=dtype, device=device) ** 4 + 1e-4
    xs[7] = xs[7].to(memory_format=CL) if res else None
    return xs


CASES = {   # ResNet's conv regions, and the forms beside them
    "3x3_bn_relu": (KindBlock(bn=True, padding=1), {}),
    "1x1_bn_add_relu": (KindBlock(bn=True), {"r": 1, "res": True}),
    "1x1_s2_bn": (KindBlock(bn=True, act=None, stride=2), {"r": 1}),          # a downsample branch
    "7x7_s2_bn_relu_wcl": (KindBlock(bn=True, stride=2, padding=3), {"r": 7, "c": 3, "size": 16, "w_cl": True}),
    "7x7_s2_bn_relu": (KindBlock(bn=True, stride=2, padding=3), {"r": 7, "c": 3, "size": 16}),   # ResNet's stem
    "3x3_c5_bias": (KindBlock(act=None, padding=1), {"c": 5, "bias": True}),
    "3x3_k12_bn_add_relu": (KindBlock(bn=True, padding=1), {"k": 12, "res": True}),
    "3x3_bias_relu": (KindBlock(padding=1), {"bias": True}),
    "3x3_plain": (KindBlock(act=None, padding=1), {}),
    "1x1_bn_hardswish": (KindBlock(bn=True, act="hardswish"), {"r": 1}),   # MobileNetV3's expansion
}


def _case(name, dtype=torch.float32, device="cpu", n=2):
    block, kw = CASES[name]
    return block, block_inputs(block, n=n, dtype=dtype, device=device, **kw)


def _task(block, inputs):
    """(the task of block over the inputs given, the indices of those inputs)."""
    return conv_kinds_task(block, inputs), [i for i, v in enumerate(inputs) if v is not None]


def test_extract_lays_out_plain_conv2d_regions_channels_last():
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.ReLU()).eval()
    tasks = {t.name: t for t in extract(model, (torch.randn(2, 8, 6, 6),)).tasks}
    plain = next(t for n, t in tasks.items() if "batch_norm" in n)
    assert plain.inputs[0].channels_last and plain.outputs[0].channels_last
    assert plain.inputs[1].contiguous                                       # the weight as held
    grouped = next(t for n, t in tasks.items() if "batch_norm" not in n)
    assert all(s.contiguous for s in grouped.inputs + grouped.outputs)       # groups 4: NCHW kernels


@pytest.mark.parametrize("name", CASES)
def test_each_case_matches_channels_last(name):
    block, inputs = _case(name)
    task, keep = _task(block, inputs)
    cp = conv.match(task.graph, policy_for(task))
    assert cp.channels_last and cp.relu == (block.act == "relu")
    assert (cp.residual is not None) == (inputs[7] is not None)
    assert not (cp.facts.tiled_conv or cp.facts.nhwc_conv or cp.facts.epilogue_fits_cudnn)
    src = conv.render(cp, conv.defaults(cp))
    assert "channels-last" in src.splitlines()[0]
    # the grid moves down cuDNN's ranking (and across TF32 in fp32): distinct kernels
    assert len({conv.render(cp, p) for p in conv.grid(cp, conv.defaults(cp))}) == len(conv.grid(cp, conv.defaults(cp)))


def test_hardswish_runs_after_cudnns_conv_never_in_its_graph():
    """cuDNN's pointwise ops have no hardswish: a conv + batch norm + hardswish region takes the
    conv-only graph and then our epilogue kernel, on every setting; the implicit GEMM refuses it."""
    from torch_htam.proposers.expert import conv_igemm
    block, inputs = _case("1x1_bn_hardswish", torch.bfloat16)
    task, _ = _task(block, inputs)
    cp = conv.match(task.graph, policy_for(task))
    assert cp.channels_last and cp.hardswish and not cp.relu and not cp.fusable
    base = conv.defaults(cp)
    assert base["fused"] is False and "hardswish" in conv.render(cp, base).splitlines()[0]
    grid = conv.grid(cp, base)
    assert grid and not any(p.get("fused") for p in grid)
    assert conv.canonical(cp, dict(base, fused=True)) == conv.canonical(cp, base)
    assert "hardswish" in conv_igemm.reason(cp)


def test_an_epilogue_cudnn_cannot_fuse_is_refused_with_the_reason():
    block = KindBlock(bn=True, act="gelu", padding=1)
    inputs = block_inputs(block)
    task, _ = _task(block, inputs)
    with pytest.raises(Unsupported, match="channels-last conv: the epilogue"):
        conv.match(task.graph, policy_for(task))


def test_nchw_input_keeps_the_nchw_paths():
    block, inputs = _case("3x3_bn_relu")
    inputs[0] = inputs[0].contiguous()
    task, _ = _task(block, inputs)
    assert not conv.match(task.graph, policy_for(task)).channels_last


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn() is None, reason="needs nvcc + cuDNN")
def test_channels_last_sources_compile_for_sm90a():
    todo = []
    for name, dtype in (("1x1_bn_add_relu", torch.bfloat16), ("3x3_bias_relu", torch.float32),
                        ("1x1_s2_bn", torch.float16), ("3x3_plain", torch.float32),
                        ("1x1_bn_hardswish", torch.bfloat16)):
        task, _ = _task(*_case(name, dtype))
        todo.append((f"{name}/{dtype}", propose(task, n=1).candidates[0].source))
    assert_compiles(todo)


def _ranged(task):
    """The task serving batch 2-16 (its x's dim 0), as an optimize with a declared range makes it."""
    return dataclasses.replace(task, inputs=[task.inputs[0].with_ranges({0: (2, 16)}), *task.inputs[1:]])


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn() is None, reason="needs nvcc + cuDNN")
def test_a_ranged_batch_is_matched_as_sliced_and_compiles():
    """A task whose batch is a served range is matched batch-ranged (render_cl runs the batch in
    slices of planned sizes, batch_slice.cuh); a static task's is not. Both cuDNN paths build."""
    from torch_htam.proposers.expert.proposer import match_task
    todo = []
    for name, dtype, cl in (("1x1_bn_add_relu", torch.bfloat16, True), ("3x3_bn_relu", torch.float32, False)):
        block, inputs = _case(name, dtype)
        inputs[0] = inputs[0] if cl else inputs[0].contiguous()
        task, _ = _task(block, inputs)
        assert not match_task(task, policy_for(task)).region.batch_ranged
        assert match_task(_ranged(task), policy_for(task)).region.batch_ranged
        todo += [(f"{name}/{dtype}/ranged/{c.params.get('fused')}", c.source)
                 for c in propose(_ranged(task), n=4).candidates]
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ("1x1_bn_add_relu", "3x3_bn_relu", "3x3_c5_bias"))
def test_a_sliced_batch_matches_torch(name):
    """A ranged task's candidates (the epilogue fused into cuDNN's graph and split after it) at
    batches cut into several slices (5 = 4 + 1, 7 = 6 + 1, 11 = 8 + 3, 13 = 12 + 1), with the
    residual and the output offset per slice."""
    block, inputs = _case(name, torch.bfloat16, "cuda")
    task, _ = _task(block, inputs)
    sources = [c.source for c in propose(_ranged(task), n=4).candidates]
    assert all(_matches_torch(name, torch.bfloat16, sources, batches=(2, 5, 7, 11, 13, 16)))


@pytest.mark.gpu
def test_preplan_launches_a_ranged_conv_at_every_planned_size_once():
    from torch_htam import runtime
    from torch_htam.launcher import Kernel
    block, inputs = _case("1x1_bn_add_relu", torch.bfloat16, "cuda")
    task, _ = _task(block, inputs)
    task = dataclasses.replace(_ranged(task), kind="conv")   # as extract names a conv region's task
    (res,) = build.build_many([propose(task, n=1).candidates[0].source])
    kernel = Kernel(res.so_path)
    buckets = [[0, 0, 2, 8], [0, 0, 9, 16]]   # as kept_buckets gives them: [input, dim, low, high]
    assert runtime.preplan(kernel, task, buckets) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert runtime.preplan(kernel, task, buckets) == [1, 2, 3, 4, 6, 8, 12, 16]   # cached: no launch
    assert runtime.preplan(kernel, dataclasses.replace(task, signature="other"), []) == []   # no buckets


def _matches_torch(name, dtype, sources, batches=(2, 3)) -> list[bool]:
    """Each source built and run against eager torch at the captured batch (2) and at 3 (a second
    cached cuDNN plan) or at `batches`, its output written channels-last; judged as verification judges: within
    the policy of torch's result, or about as close to the float64 result as torch's is (a tiny
    var amplifies torch's own bf16 rounding)."""
    from torch_htam.launcher import Kernel
    block, inputs = _case(name, dtype, "cuda")
    task, keep = _task(block, inputs)
    policy = policy_for(task)
    results = build.build_many(sources)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    matched = []
    for res in results:
        kernel = Kernel(res.so_path)
        ok = True
        for batch in batches:
            torch.manual_seed(batch)
            _, xs = _case(name, dtype, "cuda", n=batch)
            with torch.no_grad():
                ref = block(*xs)
                ref64 = block(*[x.double() if x is not None else None for x in xs])
            out = torch.full_like(ref, float("nan")).to(memory_format=CL)
            if kernel([xs[i] for i in keep], [out]) != 0:   # an engine cuDNN has not: a failed candidate
                ok = False
                continue
            torch.cuda.synchronize()
            ok &= bool(torch.isfinite(out).all())
            ok &= (torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
                   or within_torch_error(out.float(), ref.float(), ref64, policy.atol, policy.rtol)[0])
        matched.append(ok)
    return matched


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_channels_last_candidates_match_torch(name, dtype):
    """Every seed candidate against eager torch; fp32 under the TF32 policy of cuDNN's convs
    (PyTorch's default), the tolerance verification uses."""
    block, inputs = _case(name, dtype, "cuda")
    task, _ = _task(block, inputs)
    cands = propose(task, n=4).candidates
    assert cands, "no candidate"
    matched = _matches_torch(name, dtype, [c.source for c in cands])
    assert matched[0], [c.params for c in cands]      # the default at least


SPLIT = ("7x7_s2_bn_relu", "1x1_bn_add_relu", "3x3_k12_bn_add_relu", "3x3_c5_bias")


def test_the_epilogue_can_run_as_its_own_kernel_after_the_conv():
    """fused=False (gemm_plus_epilogue_kernel): cuDNN's conv alone, then our epilogue kernel; in
    the grid wherever there is an epilogue, not for a bare conv (the same kernel either way)."""
    for name in SPLIT:
        task, _ = _task(*_case(name, torch.bfloat16))
        cp = conv.match(task.graph, policy_for(task))
        grid = conv.grid(cp, conv.defaults(cp))
        assert {p["fused"] for p in grid} == {True, False}, name
        split, fused = dict(conv.defaults(cp), fused=False), dict(conv.defaults(cp), fused=True)
        assert "gemm_plus_epilogue_kernel" in conv.tags(cp, split)
        assert "gemm_plus_epilogue_kernel" not in conv.tags(cp, fused)
        assert conv.render(cp, split) != conv.render(cp, fused)
    task, _ = _task(*_case("3x3_plain", torch.bfloat16))
    cp = conv.match(task.graph, policy_for(task))
    assert {p["fused"] for p in conv.grid(cp, conv.defaults(cp))} == {True}
    assert conv.canonical(cp, dict(conv.defaults(cp), fused=False)) == conv.defaults(cp)


def test_the_defaults_split_the_epilogue_under_16_bytes_of_channels_a_pixel():
    """A stem's 3 channels (6 bytes a pixel in bf16, 12 in fp32) start split, where cuDNN's
    runtime-fusion engines are slow; 5 fp32 channels (20 bytes) and 16 start fused."""
    for name, dtype, fused in (("7x7_s2_bn_relu", torch.bfloat16, False), ("7x7_s2_bn_relu", torch.float32, False),
                               ("3x3_c5_bias", torch.bfloat16, False), ("3x3_c5_bias", torch.float32, True),
                               ("3x3_bn_relu", torch.bfloat16, True)):
        task, _ = _task(*_case(name, dtype))
        cp = conv.match(task.graph, policy_for(task))
        base = conv.defaults(cp)
        assert base["fused"] is fused, (name, dtype)
        assert conv.grid(cp, base)[0]["fused"] is fused      # the grid starts with the defaults' form


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn() is None, reason="needs nvcc + cuDNN")
def test_split_epilogue_sources_compile_for_sm90a():
    todo = []
    for name, dtype, policy in (("7x7_s2_bn_relu", torch.bfloat16, "bf16"), ("3x3_k12_bn_add_relu", torch.float16, "fp16"),
                                ("1x1_bn_add_relu", torch.float32, "tf32"), ("3x3_c5_bias", torch.float32, "fp32")):
        task, _ = _task(*_case(name, dtype))
        cp = conv.match(task.graph, make(policy))
        todo.append((f"{name}/{dtype}/split", conv.render(cp, dict(conv.defaults(cp), fused=False))))
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", SPLIT)
def test_split_epilogue_matches_torch(name, dtype):
    """The conv-only graph and the epilogue kernel after it: 16 bytes a thread where they make
    whole channels (K=32), one element a thread where they do not (K=12 in half types)."""
    task, _ = _task(*_case(name, dtype))
    cp = conv.match(task.graph, policy_for(task))
    assert _matches_torch(name, dtype, [conv.render(cp, dict(conv.defaults(cp), fused=False))]) == [True]


@pytest.mark.gpu
def test_one_library_serves_many_shapes_in_one_cuda_graph():
    """A source holds a conv's geometry, not its sizes, so a model's regions of one form share one
    library (ResNet-50's 1x1 conv + BN + ReLU: eight shapes). Each shape is planned once, on its
    first call; six of them then record and replay in one CUDA graph, which a re-plan inside the
    capture would have invalidated."""
    from torch_htam.launcher import Kernel
    block, dtype = CASES["3x3_bn_relu"][0], torch.bfloat16
    shapes = [dict(), dict(c=32, k=16), dict(k=16, size=5), dict(size=7), dict(n=3), dict(c=8, k=24)]
    runs = []
    for kw in shapes:
        torch.manual_seed(len(runs))
        xs = block_inputs(block, dtype=dtype, device="cuda", **kw)
        task, keep = _task(block, xs)
        with torch.no_grad():
            ref, ref64 = block(*xs), block(*[x.double() if x is not None else None for x in xs])
        runs.append(([xs[i] for i in keep], ref, (ref64, policy_for(task))))
    res = build.build(propose(task, n=1).candidates[0].source)
    assert res.ok, res.error
    kernel = Kernel(res.so_path)
    for ins, ref, _ in runs:                                     # warm-up: one plan per shape
        assert kernel(ins, [torch.empty_like(ref, memory_format=CL)]) == 0
    outs = [torch.full_like(ref, float("nan")).to(memory_format=CL) for _, ref, _ in runs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        codes = [kernel(ins, [out]) for (ins, _, _), out in zip(runs, outs)]
    graph.replay()
    torch.cuda.synchronize()
    assert codes == [0] * len(runs)
    for (_, ref, (ref64, policy)), out in zip(runs, outs):    # as verification judges (above)
        assert (torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
                or within_torch_error(out.float(), ref.float(), ref64, policy.atol, policy.rtol)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_captured_conv_region_verifies_and_times_in_the_worker(dtype):
    """The whole evaluation a search runs (verification, then timing on channels-last outputs
    against eager and Inductor): the fused kernel is correct and its time is a real one."""
    from torch_htam.evaluation import evaluate
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
    model = model.eval().to("cuda", dtype)
    task = next(t for t in extract(model, (torch.randn(8, 64, 28, 28, device="cuda", dtype=dtype),)).tasks
                if t.kind == "conv")
    assert task.inputs[0].channels_last
    ev = evaluate(task, propose(task, n=1).candidates[0].source)
    assert ev.correct, (ev.reason, ev.detail)


def test_a_conv_region_with_an_epilogue_cudnn_cannot_fuse_keeps_nchw():
    # MobileNet's conv + BN + ReLU6: the NCHW kernels run it, so its task stays NCHW
    model = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU6()).eval()
    task = extract(model, (torch.randn(2, 8, 6, 6),)).tasks[0]
    assert task.kind == "conv" and all(s.contiguous for s in task.inputs + task.outputs)


@dataclasses.dataclass
class _GraphedConv:
    """A built 3x3 conv + BN + ReLU kernel (it exports htam_graph_epoch) and its block's inputs."""
    block: nn.Module
    xs: list
    keep: list
    policy: object
    kernel: object
    meta: list

    @classmethod
    def build(cls, seed: int) -> "_GraphedConv":
        from torch_htam import launcher
        from torch_htam.launcher import Kernel
        block = CASES["3x3_bn_relu"][0]
        torch.manual_seed(seed)
        xs = block_inputs(block, n=4, dtype=torch.bfloat16, device="cuda")
        task, keep = _task(block, xs)
        assert keep[0] == 0   # the image is the launch's first input
        res = build.build(propose(task, n=1).candidates[0].source)
        assert res.ok, res.error
        return cls(block, xs, keep, policy_for(task), Kernel(res.so_path), launcher.encode_out_meta(task.outputs))

    def stats(self) -> dict:
        from torch_htam import launcher
        return launcher.extension().graph_launches().get(self.kernel.handle, {})

    def launch(self):
        y, = self.kernel.launch([self.xs[i] for i in self.keep], self.meta)
        return y

    def check(self, y, step) -> None:
        """y is the block's output on the inputs as they are now."""
        with torch.no_grad():
            xs = self.xs
            ref, ref64 = self.block(*xs).float(), self.block(*[x.double() if x is not None else None for x in xs])
        p = self.policy
        assert (torch.allclose(y.float(), ref, atol=p.atol, rtol=p.rtol)
                or within_torch_error(y.float(), ref, ref64, p.atol, p.rtol)[0]), step


@pytest.fixture
def graph_launches_on():
    """Graph launches switched on for the test (they are off unless HTAM_GRAPH_LAUNCHES=1)."""
    from torch_htam import launcher
    before = launcher.extension().set_graph_launches(True)
    yield
    launcher.extension().set_graph_launches(before)


@pytest.mark.gpu
def test_a_conv_kernels_launches_run_as_graphs_and_read_each_calls_values(graph_launches_on):
    """A conv kernel exports htam_graph_epoch, so the launcher records the launch of tensors met a
    second time (the fold, cuDNN's execute), its graph thread makes that executable, and later
    launches of them are one cudaGraphLaunch. Each call still reads that call's values: the image
    refilled, the weight and the batch norm's statistics changed in place. Past 8 graphs of one
    shape, a new key's capture updates one in place. Inside the caller's own CUDA-graph capture the
    launch stays plain, and that capture replays right."""
    from torch_htam import launcher
    conv = _GraphedConv.build(seed=0)
    xs = conv.xs

    def launch_and_check(step):
        time.sleep(0.003)                                 # past the launcher's 2 ms between captures
        y = conv.launch()                                 # the step's one allocation: the same block
        torch.cuda.synchronize()
        assert launcher.extension().graphs_idle(30.0)     # the capture it may have queued is done
        conv.check(y, step)

    before = conv.stats()
    for step in range(5):
        xs[0].normal_()
        xs[1].mul_(1.1)                      # the weight, then the running mean and var, in place
        xs[5].add_(0.05)
        xs[6].mul_(1.2)
        launch_and_check(step)
    after = conv.stats()
    assert after["captures"] == before.get("captures", 0) + 1, (before, after)
    assert after["replays"] >= before.get("replays", 0) + 3, (before, after)

    images = [torch.randn_like(xs[0]) for _ in range(12)]   # 12 keys of one shape, each met 3 times
    for i, image in enumerate(images):
        xs[0] = image
        for again in range(3):
            image.normal_()
            launch_and_check((i, again))
    s = conv.stats()
    assert s["updates"] >= 4 and s["failures"] == 0 and s["replays"] >= after["replays"] + 12, s

    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        y = conv.launch()
    assert conv.stats()["replays"] == s["replays"]   # captured plain
    xs[0].normal_()
    outer.replay()
    torch.cuda.synchronize()
    conv.check(y, "outer")


@pytest.mark.gpu
def test_a_conv_kernel_launched_by_two_threads_in_turn_captures_nothing(graph_launches_on):
    """Where two threads take turns at launching our kernels, the launcher captures nothing (a
    capture on one thread fails a device-wide synchronization on the other); each launch still
    runs, plain, and is right. NOTE: after the graphs test above: this one holds captures off for
    the process's next 10 s."""
    import threading
    conv = _GraphedConv.build(seed=1)

    def launch():
        y = conv.launch()
        torch.cuda.synchronize()
        return y

    before = conv.stats().get("captures", 0)
    for step in range(8):                 # one key, met 8 times, from either thread in turn
        time.sleep(0.003)                 # past the launcher's 2 ms between captures
        out = {}
        if step % 2:
            t = threading.Thread(target=lambda: out.update(y=launch()))
            t.start()
            t.join()
        else:
            out["y"] = launch()
        conv.check(out["y"], step)
    assert conv.stats().get("captures", 0) == before
