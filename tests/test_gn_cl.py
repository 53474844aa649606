"""Group norm regions posed channels-last (extract.group_norm_boundary) and their kernel (gn_cl.py).

CPU: which regions are posed channels-last (beside a conv; not without one), their specs, the
target that takes them, and that the row kernel refuses them. nvcc (build): the sources compile
for sm_90a. GPU (@gpu): each kernel passes the product's verification at UNet-like and odd shapes
(channels not a multiple of 8, no affine, tokens output, a batch over the workspace's first guess).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.extract import extract
from torch_htam.policy import policy_for
from torch_htam.proposers.expert import gn_cl, rowwise
from torch_htam.proposers.expert.ir import Unsupported
from torch_htam.proposers.expert.proposer import match_task, tuning_grid
from compile_check import assert_checked_and_compiles


class ConvNormSilu(nn.Module):
    """conv -> GroupNorm -> SiLU -> conv, as a diffusion ResBlock has it. cheap: depthwise 1x1
    convs, for tests that read only the norm's region at sizes whose 3x3 convs cost minutes on
    CPU (capture runs the model once)."""

    def __init__(self, c: int, groups: int, affine: bool = True, cheap: bool = False):
        super().__init__()
        k, conv_groups = (1, c) if cheap else (3, 1)
        self.a, self.b = (nn.Conv2d(c, c, k, padding=k // 2, groups=conv_groups) for _ in range(2))
        self.norm = nn.GroupNorm(groups, c, affine=affine)

    def forward(self, x):
        return self.b(F.silu(self.norm(self.a(x))))


class ConvNormTokens(nn.Module):
    """conv -> GroupNorm -> [N, H * W, C] tokens -> linear, as a UNet attention block has it."""

    def __init__(self, c: int, groups: int):
        super().__init__()
        self.a, self.norm, self.q = nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(groups, c), nn.Linear(c, c)

    def forward(self, x):
        return self.q(self.norm(self.a(x)).flatten(2).transpose(1, 2))


class NormSilu(nn.Module):
    def __init__(self, c: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c)

    def forward(self, x):
        return F.silu(self.norm(x))


def _norm_task(model, x):
    tasks = [t for t in extract(model.eval(), (x,)).tasks if "group_norm" in t.name]
    assert len(tasks) == 1, [t.name for t in tasks]
    return tasks[0]


def test_group_norm_beside_a_conv_is_posed_channels_last_and_taken_by_gn_cl():
    task = _norm_task(ConvNormSilu(32, 8), torch.randn(2, 32, 6, 5))
    assert task.inputs[0].channels_last and task.outputs[0].channels_last
    assert not task.inputs[1].channels_last and task.inputs[1].shape == (32,)
    tm = match_task(task, policy_for(task))
    assert tm.target is gn_cl.TARGET and tm.region.epilogue == "silu" and tm.region.groups == 8
    with pytest.raises(Unsupported, match="channels-last"):
        rowwise.TARGET.match(task.graph, policy_for(task))


def test_group_norm_without_a_conv_keeps_its_layout_and_the_row_kernel():
    task = _norm_task(NormSilu(32, 8), torch.randn(2, 32, 6, 5))
    assert task.inputs[0].contiguous and task.outputs[0].contiguous
    assert match_task(task, policy_for(task)).target is rowwise.TARGET


def test_tokens_output_is_row_major_in_the_channels_last_order_and_its_reader_takes_it_so():
    tasks = extract(ConvNormTokens(16, 4).eval(), (torch.randn(2, 16, 4, 3),)).tasks
    norm, = (t for t in tasks if "group_norm" in t.name)
    gemm, = (t for t in tasks if t.kind == "gemm")
    assert norm.inputs[0].channels_last
    assert norm.outputs[0].shape == (2, 12, 16) and norm.outputs[0].contiguous
    assert match_task(norm, policy_for(norm)).region.epilogue == "tokens"
    # the q projection reads the tokens as the norm's kernel writes them (no layout GEMM, no copy)
    assert gemm.inputs[0].shape == (2, 12, 16) and gemm.inputs[0].contiguous


class ConvNormAdd(ConvNormSilu):
    def forward(self, x):
        return self.b(self.norm(self.a(x)) + 1.0)


def test_a_group_norm_region_with_other_ops_keeps_its_layout():
    """Only the chains gn_cl writes (extract.GN_EPILOGUES) are posed channels-last."""
    tasks = extract(ConvNormAdd(16, 4).eval(), (torch.randn(2, 16, 4, 3),)).tasks
    norm, = (t for t in tasks if "group_norm" in t.name)
    assert norm.inputs[0].contiguous and not norm.inputs[0].channels_last


def test_params_are_canonical_and_invalid_vectors_are_refused():
    task = _norm_task(ConvNormSilu(24, 8), torch.randn(2, 24, 4, 4))
    tm = match_task(task, policy_for(task))
    d = tm.defaults
    assert d["vec"] == 4                              # fp32: 16 bytes are 4 channels
    m = tm.region
    assert gn_cl.canonical(m, dict(d, rows_per_block=4, tpr=32)) == dict(d, tpr=32)
    with pytest.raises(Unsupported):
        gn_cl.render(m, dict(d, vec=16))


def test_one_launch_where_the_slab_fits_a_cluster_and_two_where_it_does_not():
    """gn_cl_onepass holds an image's slab across a cluster's registers: the defaults take it where
    a 256-thread block's threads hold 2 or more pixels, never for a 512 x 512 image (a thread would
    hold 512 pixels); its slab is whole groups and whole vectors."""
    def region(c, g, shape):
        task = _norm_task(ConvNormSilu(c, g, cheap=True).to(torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16))
        return match_task(task, policy_for(task))
    tm = region(128, 32, (8, 128, 64, 64))
    assert tm.defaults["onepass"] and "single_kernel_launch" in gn_cl.tags(tm.region, tm.defaults)
    # 1 pixel a thread (8 x 16 x 16 over 8 blocks), or 512-thread blocks: the two launches first
    assert not region(1024, 32, (8, 1024, 16, 16)).defaults["onepass"]
    tm = region(384, 32, (8, 384, 64, 64))
    m, d = tm.region, dict(tm.defaults, onepass=True)
    assert not tm.defaults["onepass"] and gn_cl.canonical(m, d)["onepass"]
    sc, rows, threads, px = gn_cl._onepass(m, d)
    assert sc % 12 == 0 and sc % d["vec"] == 0 and 384 % sc == 0 and threads <= gn_cl.ONEPASS_THREADS
    assert rows * px * gn_cl.CLUSTER >= 64 * 64 and px <= gn_cl.MAX_PX
    assert gn_cl._slab(region(24, 8, (2, 24, 4, 4)).region, 8) == 24      # lcm(3, 8): every channel
    big = region(64, 32, (1, 64, 512, 512))
    assert not big.defaults["onepass"]
    assert not gn_cl.canonical(big.region, dict(big.defaults, onepass=True))["onepass"]
    # with one launch, the two launches' own knobs are the defaults' (one kernel, not three)
    assert gn_cl.canonical(m, dict(d, waves=8, unroll=1)) == gn_cl.canonical(m, d)


def _compile_set() -> list[tuple[str, str]]:
    out = []
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for model, x in ((ConvNormSilu(64, 32), torch.randn(2, 64, 8, 8)),
                         (ConvNormSilu(24, 8, affine=False), torch.randn(2, 24, 3, 5)),
                         (ConvNormTokens(32, 8), torch.randn(2, 32, 4, 4))):
            task = _norm_task(model.to(dt), x.to(dt))
            tm = match_task(task, policy_for(task))
            one = dict(tm.defaults, onepass=True)     # the one launch, whatever the defaults
            out += [(f"{dt}/{type(model).__name__}/{p}", tm.render(p))
                    for p in [tm.defaults, one] + tuning_grid(task, policy_for(task))[:2]]
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_gn_cl_sources_compile_for_sm90a():
    assert_checked_and_compiles(_compile_set())


# ---- GPU: the kernels through the product's verification ---------------------------------------

GPU_CASES = [
    # (model, input shape, dtype)
    ("silu", 128, 32, (8, 128, 64, 64), torch.bfloat16),      # the diffusion UNet's first ResBlock
    ("silu", 384, 32, (2, 384, 16, 16), torch.bfloat16),      # cg 12: vectors across groups
    ("silu", 24, 8, (3, 24, 7, 9), torch.float32),            # cg 3, pixels off every grid
    ("plain", 40, 10, (2, 40, 5, 5), torch.float16),          # no affine
    ("tokens", 64, 32, (2, 64, 8, 8), torch.bfloat16),
    ("silu", 32, 4, (700, 32, 4, 4), torch.float32),          # many images: S falls to 1
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}_{c[1]}_{c[2]}_{c[4]}")
def test_gn_cl_kernel_passes_verification(case):
    from torch_htam.launcher import Kernel
    from torch_htam.task import load_reference
    from torch_htam.verify import verify
    kind, c, g, shape, dt = case
    torch.manual_seed(0)
    model = {"silu": lambda: ConvNormSilu(c, g), "plain": lambda: ConvNormSilu(c, g, affine=False),
             "tokens": lambda: ConvNormTokens(c, g)}[kind]().to(dt)
    task = _norm_task(model, torch.randn(shape, dtype=dt))
    policy = policy_for(task)
    tm = match_task(task, policy)
    assert tm.target is gn_cl.TARGET
    one = dict(tm.defaults, onepass=True)          # the one launch wherever it fits, beside the defaults
    params = [tm.defaults] + [one] * (gn_cl._onepass(tm.region, one) is not None and one != tm.defaults)
    params += tuning_grid(task, policy)[:3]
    results = build.build_many([tm.render(p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    ref = load_reference(task).cuda()
    for p, res in zip(params, results):
        ok, reason, detail, errs = verify(task, Kernel(res.so_path), ref, policy)
        assert ok, (p, reason, detail, errs)


@pytest.mark.gpu
@pytest.mark.parametrize("corner", [0.0, 8.0])
def test_gn_cl_statistics_hold_far_from_zero(corner):
    """fp32 activations of mean 1000 and std 1 (the sums' shift, pixel 0's value, typical or 8
    stds out) normalize as float64 does: sums of x and x^2 would lose (1000 / 1)^2 ulps."""
    from torch_htam.golden import make_inputs
    from torch_htam.launcher import Kernel
    torch.manual_seed(0)
    task = _norm_task(ConvNormSilu(64, 8), torch.randn(2, 64, 32, 32))
    tm = match_task(task, policy_for(task))
    (res,) = build.build_many([tm.render(tm.defaults)])
    assert res.ok, res.error
    ins, m = make_inputs(task, "cuda"), tm.region
    x, w, b = ins[m.x], ins[m.weight], ins[m.bias]
    x.normal_().add_(1000.0)
    x[:, :, 0, 0] += corner
    o = task.outputs[0]
    y = torch.empty_strided(o.shape, o.stride, dtype=o.torch_dtype, device="cuda")
    assert Kernel(res.so_path)(ins, [y]) == 0
    want = F.silu(F.group_norm(x.double(), 8, w.double(), b.double(), eps=tm.region.eps))
    assert (y.double() - want).abs().max().item() < 2e-4


@pytest.mark.gpu
def test_gn_cl_one_launch_kernel_falls_back_to_two_for_a_larger_image():
    """Built for 8 x 8 pixels (one pixel a thread), called with 40 x 40: the two launches run."""
    from torch_htam.golden import make_inputs
    from torch_htam.launcher import Kernel
    torch.manual_seed(0)
    task = _norm_task(ConvNormSilu(64, 16).to(torch.bfloat16), torch.randn(2, 64, 8, 8, dtype=torch.bfloat16))
    tm = match_task(task, policy_for(task))
    (res,) = build.build_many([tm.render(dict(tm.defaults, onepass=True))])
    assert res.ok, res.error
    ins, m = make_inputs(task, "cuda"), tm.region
    for hw in (8, 40):
        ins[m.x] = torch.randn(2, 64, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        y = torch.empty_like(ins[m.x])
        assert Kernel(res.so_path)(ins, [y]) == 0
        # eager bf16 rounds the norm's output before SiLU as the kernel does: within 2 ulps
        want = F.silu(F.group_norm(ins[m.x], 16, ins[m.weight], ins[m.bias], eps=m.eps)).float()
        assert ((y.float() - want).abs() <= 2e-2 + 1e-2 * want.abs()).all(), hw


@pytest.mark.gpu
def test_gn_cl_kernel_replays_in_a_cuda_graph_captured_on_another_stream():
    """Warmed on one stream, captured on another (as reduce-overhead's graphs are): the capture
    stream takes a workspace without allocating, and each replay gives the eager launch's output."""
    from torch_htam.golden import make_inputs
    from torch_htam.launcher import Kernel
    torch.manual_seed(0)
    task = _norm_task(ConvNormSilu(64, 16).to(torch.bfloat16), torch.randn(4, 64, 16, 16, dtype=torch.bfloat16))
    tm = match_task(task, policy_for(task))
    (res,) = build.build_many([tm.render(tm.defaults)])
    assert res.ok, res.error
    k = Kernel(res.so_path)
    ins = make_inputs(task, "cuda")
    o = task.outputs[0]
    eager, graphed = (torch.empty_strided(o.shape, o.stride, dtype=o.torch_dtype, device="cuda") for _ in range(2))
    assert k(ins, [eager]) == 0
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert k(ins, [graphed]) == 0
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    graphed.zero_()
    with torch.cuda.graph(g):
        k(ins, [graphed])
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(graphed, eager)
        graphed.zero_()
