"""The pool target (torch_htam/proposers/expert/pool.py): max / avg / adaptive-avg pooling, 1-3-D,
with its elementwise prologue and epilogue fused.

CPU: partition (a conv keeps its BN + ReLU epilogue when a pool follows; the pool region gets the
rest), matching (geometry, prologue, epilogue, indices only where read), Unsupported messages,
strategy moves, nvcc for sm_90a. GPU (@gpu): every seed candidate against torch, at the captured
shape and at other spatial sizes (the geometry is baked in, the sizes are read at run time).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from test_expert import propose, small_task
from torch_htam import build, paths
from torch_htam.coverage import path_of
from torch_htam.extract import extract
from torch_htam.policy import policy_for
from torch_htam.proposers.expert import pool
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.proposers.expert.proposer import match_task, tuning_grid
from compile_check import assert_compiles


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


def _bn_relu_pool(x, m, v, g, b):
    return F.max_pool2d(F.relu(F.batch_norm(x, m, v, g, b, False, 0.1, 1e-5)), 3, 2, 1)


def _vecs(c=4):
    return [torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)]


# name -> (function, input shapes at capture, other spatial sizes to run at)
CASES = {
    "max2d_k3s2p1": (lambda x: F.max_pool2d(x, 3, 2, 1), [(2, 4, 11, 11)]),
    "max2d_indices": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), [(2, 4, 10, 10)]),
    "max2d_dil2_ceil": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True), [(2, 4, 12, 12)]),
    "max1d_ceil": (lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True), [(2, 4, 10)]),
    "max3d": (lambda x: F.max_pool3d(x, 2), [(2, 4, 6, 6, 6)]),
    "avg2d_nopad_count": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [(2, 4, 10, 10)]),
    "avg2d_ceil": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), [(2, 4, 10, 10)]),
    "avg1d": (lambda x: F.avg_pool1d(x, 3, 2, 1), [(2, 4, 10)]),
    "avg3d_divisor": (lambda x: F.avg_pool3d(x, 2, divisor_override=3), [(2, 4, 6, 6, 6)]),
    "global_avg_flatten": (lambda x: torch.flatten(F.adaptive_avg_pool2d(x, 1), 1), [(2, 64, 7, 7)]),
    "adaptive2d_uneven": (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), [(2, 4, 10, 9)]),
    "adaptive1d": (lambda x: F.adaptive_avg_pool1d(x, 1), [(2, 4, 10)]),
    "adaptive3d": (lambda x: F.adaptive_avg_pool3d(x, 2), [(2, 4, 5, 6, 7)]),
    "bn_relu_max2d": (_bn_relu_pool, [(2, 4, 10, 10), (4,), (4,), (4,), (4,)]),
    "avg2d_relu_epilogue": (lambda x: F.relu(F.avg_pool2d(x, 2)) * 2.0, [(2, 4, 10, 10)]),
    # channels-last inputs (CHANNELS_LAST): global pools, whose [N, C, 1, 1] outputs are contiguous
    "global_avg_cl": (lambda x: F.adaptive_avg_pool2d(x, 1), [(2, 64, 7, 7)]),
    "global_avg_cl_odd": (lambda x: torch.flatten(F.relu(F.adaptive_avg_pool2d(x, 1)), 1), [(3, 36, 5, 6)]),
}
CHANNELS_LAST = {"global_avg_cl", "global_avg_cl_odd"}     # their first input is channels-last


def _inputs(name, dtype=torch.float32, device="cpu", spatial=None):
    shapes = CASES[name][1]
    xs = []
    for i, s in enumerate(shapes):
        if i == 0 and spatial is not None:
            s = s[:2] + spatial
        t = torch.randn(*s, dtype=dtype, device=device)
        if i == 0 and name in CHANNELS_LAST:
            t = t.to(memory_format=torch.channels_last)
        xs.append(t.abs() + 0.5 if i == 2 else t)      # the batch norm's running var: positive
    return xs


def _task(name, dtype=torch.float32, device="cpu"):
    # NOTE: the GPU test captures on the GPU: torch's CPU avg_pool3d has no bf16/fp16 kernel
    return small_task(Fn(CASES[name][0]), *_inputs(name, dtype, device))


@pytest.mark.parametrize("name", CASES)
def test_each_pool_matches_and_renders(name):
    task = _task(name)
    tm = match_task(task, policy_for(task))
    assert tm.target is pool.TARGET and path_of(task) is None
    cands = propose(task, n=4).candidates
    assert len(cands) == 4 and all(build.check_source(c.source) == [] for c in cands)
    assert len({tuple(sorted(c.params.items())) for c in cands}) == 4


def test_geometry_is_torch_s():
    pm = pool.match(_task("max2d_dil2_ceil").graph, None)
    w = pm.window
    assert (w.op, w.spatial, w.kernel, w.stride, w.padding, w.dilation, w.ceil_mode) == \
        ("max", 2, (1, 3, 3), (1, 2, 2), (0, 1, 1), (1, 2, 2), True)
    w = pool.match(_task("avg3d_divisor").graph, None).window
    assert (w.op, w.kernel, w.stride, w.divisor) == ("avg", (2, 2, 2), (2, 2, 2), 3)   # stride defaults to kernel
    w = pool.match(_task("avg2d_nopad_count").graph, None).window
    assert not w.count_include_pad
    w = pool.match(_task("adaptive2d_uneven").graph, None).window
    assert (w.op, w.out) == ("adaptive_avg", (1, 3, 4))


def test_prologue_and_epilogue_fuse():
    pm = pool.match(_task("bn_relu_max2d").graph, None)
    ops = {x[0] for x in pool._walk(pm.pro_expr)}
    assert {"sub", "rsqrt", "relu"} <= ops                    # batch norm and ReLU at each tap
    assert "fuse_row_prologue_epilogue" in pool.tags(pm, pool.defaults(pm))
    pm = pool.match(_task("global_avg_flatten").graph, None)
    assert pm.outputs == [("float32", ("in", 0))]                # flatten: a view, written in order
    pm = pool.match(_task("avg2d_relu_epilogue").graph, None)
    assert {x[0] for x in pool._walk(pm.outputs[0][1])} >= {"relu", "mul"}


def test_indices_only_where_read():
    pm = pool.match(_task("max2d_indices").graph, None)
    assert [dt for dt, _ in pm.outputs] == ["float32", "int64"]

    class ValuesOnly(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 2, return_indices=True)[0] + 1.0
    pm = pool.match(small_task(ValuesOnly(), torch.randn(2, 4, 8, 8)).graph, None)
    assert [dt for dt, _ in pm.outputs] == ["float32"]


def test_warp_per_window_for_global_pooling():
    """A 7x7 window (49 taps) gets a warp and shuffles; a 3x3 window a thread."""
    big = pool.match(_task("global_avg_flatten").graph, None)
    small = pool.match(_task("max2d_k3s2p1").graph, None)
    assert pool.defaults(big)["tpr"] == 32 and pool.defaults(small)["tpr"] == 1
    assert "warp_shuffle_reduction" in pool.tags(big, pool.defaults(big))
    grid = tuning_grid(_task("max2d_k3s2p1"))
    assert {p["tpr"] for p in grid} >= {1, 8, 32} and all(pool.valid(p) for p in grid)
    with pytest.raises(Unsupported, match="tpr"):
        pool.render(small, dict(pool.defaults(small), tpr=3))


def test_an_average_over_a_channels_last_input_maps_lanes_to_channels():
    """Channels-last averages default to pool_body_cl (8 warps sharing a 49-tap window, one warp
    walking a 30-tap one); a contiguous input, or a max pool, keeps a window per lane."""
    big = pool.match(_task("global_avg_cl").graph, None)
    small = pool.match(_task("global_avg_cl_odd").graph, None)
    assert big.channels_last and pool.defaults(big)["cl"] == 8 and pool.defaults(small)["cl"] == 1
    assert "coalesced_layout_access" in pool.tags(big, pool.defaults(big))
    assert not pool.match(_task("global_avg_flatten").graph, None).channels_last
    assert pool.defaults(pool.match(_task("global_avg_flatten").graph, None))["cl"] == 0
    cl_max = small_task(Fn(lambda x: F.max_pool2d(x, 3, 2, 1)),
                        torch.randn(2, 8, 9, 9).to(memory_format=torch.channels_last))
    pm = pool.match(cl_max.graph, None)
    assert pm.channels_last and pool.defaults(pm)["cl"] == 0
    assert not any(p.get("cl") for p in tuning_grid(cl_max))
    with pytest.raises(Unsupported, match="averages only"):
        pool.render(pm, dict(pool.defaults(pm), cl=4))
    cl_grid = tuning_grid(_task("global_avg_cl"))
    assert {p["cl"] for p in cl_grid} >= {0, 1, 2, 4, 8, 16} and all(pool.valid(p) for p in cl_grid)


def test_unsupported_pools_say_why():
    class Two(nn.Module):
        def forward(self, x):
            return F.max_pool2d(F.avg_pool2d(x, 2), 2)
    with pytest.raises(Unsupported, match="2 pooling ops"):
        pool.match(small_task(Two(), torch.randn(2, 4, 8, 8)).graph, None)

    class Unbatched(nn.Module):
        def forward(self, x):
            return F.max_pool2d(x, 2)
    unbatched = small_task(Unbatched(), torch.randn(4, 8, 8))
    with pytest.raises(Unsupported, match="need batched"):
        pool.match(unbatched.graph, None)
    unbatched.kind = "rowwise"        # as partition makes it: the pool target's reason, alone
    assert path_of(unbatched) == "max_pool2d on a 3-D input (need batched [N, C, ...])"

    class Other(nn.Module):      # the epilogue reads another tensor besides the pooled value
        def forward(self, x, b):
            return F.avg_pool2d(x, 2) + b
    with pytest.raises(Unsupported, match="another tensor"):
        pool.match(small_task(Other(), torch.randn(2, 4, 8, 8), torch.randn(2, 4, 4, 4)).graph, None)


class ConvBnReluPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)


def test_conv_keeps_its_epilogue_and_the_pool_has_a_path():
    """ops.keeps_epilogue: conv + BN + ReLU stay one conv region when a pool follows; the pool is
    a region of its own, which the pool target takes."""
    found = extract(ConvBnReluPool().eval(), (torch.randn(2, 3, 16, 16),))
    kinds = sorted(t.kind for t in found.tasks)
    assert kinds == ["conv", "rowwise"], [(t.kind, t.ops) for t in found.tasks]
    conv_task = next(t for t in found.tasks if t.kind == "conv")
    assert any("batch_norm" in op for op in conv_task.ops) and any("relu" in op for op in conv_task.ops)
    assert all(path_of(t) is None for t in found.tasks)


class BnReluPoolFlatten(nn.Module):
    """A pre-activation head: batch norm + ReLU on the block's output, global pool, flatten."""
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.flatten(F.adaptive_avg_pool2d(F.relu(self.bn(x)), 1), 1)


def test_pool_region_takes_its_prologue_and_epilogue():
    """No conv before it: batch norm + ReLU join the pool's region as its prologue, flatten as its
    epilogue, and the whole region is one pool kernel."""
    found = extract(BnReluPoolFlatten().eval(), (torch.randn(2, 8, 7, 7),))
    assert len(found.tasks) == 1
    task = found.tasks[0]
    assert task.kind == "rowwise" and {"batch_norm", "relu", "adaptive_avg_pool2d"} <= \
        {op.split(".")[1] for op in task.ops}
    tm = match_task(task, policy_for(task))
    assert tm.target is pool.TARGET and "fuse_row_prologue_epilogue" in tm.tags(tm.defaults)


def _compile_set():
    """Each case's first two seed candidates in fp32 (a thread and a warp per window), and three
    cases in bf16 and fp16 (prologue rounding, indices, the flatten epilogue)."""
    out = []
    for name in CASES:
        half = (torch.bfloat16, torch.float16) if name in ("bn_relu_max2d", "max2d_indices", "global_avg_flatten",
                                                            "global_avg_cl") else ()
        for dtype in (torch.float32,) + half:
            out += [(f"{name}/{dtype}/{i}", c.source) for i, c in enumerate(propose(_task(name, dtype), n=2).candidates)]
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_pool_sources_compile_for_sm90a():
    todo = _compile_set()
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_pool_candidates_match_torch(name, dtype):
    """Every seed candidate (thread and warp per window, read-only loads, grid-stride) against
    torch, at the captured sizes and at other spatial sizes; indices exactly."""
    from torch_htam.launcher import Kernel
    task = _task(name, dtype, "cuda")
    policy = policy_for(task)
    cands = propose(task, n=4).candidates
    results = build.build_many([c.source for c in cands])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    shape = CASES[name][1][0]
    sizes = [None, tuple(s + 3 for s in shape[2:])]
    for cand, res in zip(cands, results):
        kernel = Kernel(res.so_path)
        for spatial in sizes:
            torch.manual_seed(len(sizes))
            xs = _inputs(name, dtype, "cuda", spatial)
            with torch.no_grad():
                ref = CASES[name][0](*xs)
            ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
            outs = [torch.full_like(r, float("nan")) if r.is_floating_point() else torch.full_like(r, -7)
                    for r in ref]
            assert kernel(xs, outs) == 0, (name, cand.params)
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                if r.is_floating_point():
                    assert torch.isfinite(o).all(), (name, cand.params)
                    torch.testing.assert_close(o, r, atol=policy.atol, rtol=policy.rtol,
                                               msg=lambda m: f"{name} {cand.params} {spatial}: {m}")
                else:
                    assert torch.equal(o, r), (name, cand.params, spatial)
