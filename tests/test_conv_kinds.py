"""Conv kinds beyond conv2d (conv_geom.py): conv1d, conv3d, conv_transpose1d/2d/3d, grouped and
depthwise convs, each with the epilogues conv2d fuses (bias, eval batch norm, residual, activation).

CPU: matching (kind, geometry in cuDNN's dims, which paths each kind takes), clear Unsupported
messages, nvcc for sm_90a. GPU (@gpu): every seed candidate against torch, at the captured batch
and at another one (a second cached cuDNN plan).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from test_expert import propose, small_task
from torch_htam import build, paths
from torch_htam.policy import make, policy_for
from torch_htam.proposers.expert import conv
from torch_htam.proposers.expert.ir import Unsupported
from compile_check import assert_compiles

FUNCS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TFUNCS = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class KindBlock(nn.Module):
    """conv (any kind) -> [eval batch norm] -> [+ residual] -> activation."""

    def __init__(self, dims=2, transposed=False, bn=False, act="relu", **geo):
        super().__init__()
        self.dims, self.transposed, self.bn, self.act, self.geo = dims, transposed, bn, act, geo

    def forward(self, x, w, b, gamma, beta, mean, var, res):
        f = (TFUNCS if self.transposed else FUNCS)[self.dims]
        y = f(x, w, b, **self.geo)
        if self.bn:
            y = F.batch_norm(y, mean, var, gamma, beta, False, 0.1, 1e-5)
        if res is not None:
            y = y + res
        return {"relu": F.relu, "gelu": F.gelu, "relu6": F.relu6, "hardswish": F.hardswish,
                None: lambda t: t}[self.act](y)


def kind_inputs(block: KindBlock, n=2, c=8, k=16, size=9, r=3, bias=True, res=False, dtype=torch.float32,
                device="cpu") -> list:
    groups = block.geo.get("groups", 1)
    x = torch.randn(n, c, *[size] * block.dims, dtype=dtype, device=device)
    wshape = (c, k // groups) if block.transposed else (k, c // groups)
    w = torch.randn(*wshape, *[r] * block.dims, dtype=dtype, device=device) * 0.2
    y = (TFUNCS if block.transposed else FUNCS)[block.dims](x, w, None, **block.geo)
    vec = [torch.randn(k, dtype=dtype, device=device) for _ in range(4)]
    var = torch.rand(k, dtype=dtype, device=device) + 0.5
    return [x, w, vec[0] if bias else None, vec[1], vec[2], vec[3], var, torch.randn_like(y) if res else None]


CASES = {
    "conv1d_bias_gelu": (KindBlock(1, act="gelu", padding=1), {}),
    "conv1d_s2_bn_add_relu": (KindBlock(1, bn=True, stride=2, padding=1), {"res": True, "bias": False}),
    "conv3d_bn_relu": (KindBlock(3, bn=True, padding=1), {"size": 6}),
    "conv3d_s2_dil2_plain": (KindBlock(3, act=None, stride=2, padding=2, dilation=2), {"size": 7, "bias": False}),
    "convt1d_s2_relu": (KindBlock(1, True, stride=2, padding=1, output_padding=1), {}),
    "convt2d_s2_bn_relu": (KindBlock(2, True, bn=True, stride=2), {"r": 2, "bias": False}),
    "convt2d_g2_op1_add": (KindBlock(2, True, act=None, stride=2, padding=1, output_padding=1, groups=2),
                           {"res": True}),
    "convt3d_s2_relu": (KindBlock(3, True, stride=2, padding=1), {"size": 5}),
    "depthwise_bn_relu6": (KindBlock(2, bn=True, act="relu6", padding=1, groups=8), {"k": 8, "bias": False}),
    "grouped4_s2_relu": (KindBlock(2, stride=2, padding=1, groups=4), {}),
    "depthwise1d_gelu": (KindBlock(1, act="gelu", padding=1, groups=8), {"k": 16}),
}


def _case(name, dtype=torch.float32, device="cpu"):
    block, kw = CASES[name]
    return block, kind_inputs(block, dtype=dtype, device=device, **kw)


def _task(block, inputs):
    keep = [i for i, v in enumerate(inputs) if v is not None]

    class Bound(nn.Module):
        def forward(self, *xs):
            full = [None] * len(inputs)
            for i, v in zip(keep, xs):
                full[i] = v
            return block(*full)
    return small_task(Bound(), *[inputs[i] for i in keep])


def _match(name, dtype=torch.float32, policy=None):
    task = _task(*_case(name, dtype))
    return conv.match(task.graph, policy or policy_for(task))


@pytest.mark.parametrize("name", CASES)
def test_each_kind_matches_with_its_geometry(name):
    block, _ = CASES[name]
    cp = _match(name)
    assert (cp.kind.spatial, cp.kind.transposed) == (block.dims, block.transposed)
    # cuDNN's dims: conv1d as a 2-D conv of height 1 (unit stride/dilation, no padding in H)
    dims = max(2, block.dims)
    assert len(cp.stride) == len(cp.padding) == len(cp.dilation) == dims
    st = block.geo.get("stride", 1)
    assert cp.stride[-1] == st and (block.dims != 1 or (cp.stride[0], cp.padding[0], cp.dilation[0]) == (1, 0, 1))
    assert cp.groups == block.geo.get("groups", 1) and (cp.bn is not None) == block.bn
    d = conv.defaults(cp)
    assert d["graph"] and not d["fused"] and not d["tiled"]     # the backend API first
    src = conv.render(cp, d)
    assert build.check_source(src) == []
    assert f"kSpatial = {dims};" in src and f"kTransposed = {str(block.transposed).lower()};" in src
    assert "cudnnBackendExecute(" in src
    # only conv2d forward takes the NHWC copies and the tiled 1x1 kernel
    assert not cp.facts.nhwc_conv and not cp.facts.tiled_conv


@pytest.mark.parametrize("name", CASES)
def test_legacy_and_fused_paths_only_where_cudnn_has_them(name):
    block, _ = CASES[name]
    cp = _match(name)
    legacy = dict(conv.defaults(cp), graph=False)
    if block.transposed or block.dims == 3:
        assert not cp.fusable
        with pytest.raises(Unsupported, match="backend API only"):
            conv.render(cp, legacy)
        # the search never offers a setting that cannot render
        assert all(c.params["graph"] and not c.params["fused"] for c in propose(_task(*_case(name)), n=8).candidates)
    else:      # conv1d and grouped 2-D convs: the legacy API too (a conv1d as 4-D descriptors)
        src = conv.render(cp, legacy)
        assert "cudnnConvolutionForward(" in src and "cudnnSetTensor4dDescriptor" in src


def test_conv1d_fuses_on_the_legacy_api():
    cp = _match("conv1d_s2_bn_add_relu")
    assert cp.fusable and cp.residual is not None
    src = conv.render(cp, dict(conv.defaults(cp), fused=True))
    assert "cudnnConvolutionBiasActivationForward(" in src and f"in[{cp.residual}].ndim != 3" in src


def test_transposed_output_size_and_channels():
    """conv_transpose's y: (H - 1) * stride - 2 * pad + dil * (k - 1) + output_padding + 1 per dim,
    K = w.sizes[1] * groups output channels (w is [C, K/g, ...])."""
    src = conv.render(*(lambda cp: (cp, conv.defaults(cp)))(_match("convt2d_g2_op1_add")))
    assert "Wt.sizes[1] * 2" in src and "(d[2] - 1) * 2 - 2 * 1 + 1 * (d[5] - 1) + 1 + 1" in src


def test_unsupported_conv_forms_say_why():
    class Same(nn.Module):
        def forward(self, x, w):
            return F.conv1d(x, w, padding="same")
    cp = conv.match(small_task(Same(), torch.randn(2, 4, 10), torch.randn(8, 4, 3)).graph, make("fp32"))
    assert cp.padding == (0, 1)           # "same" with an odd kernel: symmetric
    prop = propose(small_task(Same(), torch.randn(2, 4, 10), torch.randn(8, 4, 4)))
    assert prop.candidates == [] and "padding='same' with kernel (4,)" in prop.note

    class Prologue(nn.Module):
        def forward(self, x, w):
            return F.conv3d(F.relu(x), w)
    prop = propose(small_task(Prologue(), torch.randn(2, 4, 5, 5, 5), torch.randn(8, 4, 3, 3, 3)))
    assert prop.candidates == [] and "conv3d input must be a region input" in prop.note


def test_a_channels_last_grouped_conv_gets_no_candidates_and_plan_says_why():
    """The NCHW conv kernels return HTAM_ERR_SHAPE on another layout, and channels-last is a plain
    conv2d's alone (test_conv_channels_last.py), so a channels-last grouped conv is unsupported up
    front, not failed candidate by candidate."""
    from torch_htam import coverage
    from torch_htam.extract import extract
    model = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1, groups=2), nn.BatchNorm2d(32), nn.ReLU()).eval()
    x = torch.randn(2, 16, 8, 8)
    assert coverage.path_of(extract(model, (x,)).tasks[0]) is None
    last = extract(model.to(memory_format=torch.channels_last), (x.to(memory_format=torch.channels_last),))
    assert "channels-last" in coverage.path_of(last.tasks[0])


def test_precision_follows_the_policy_for_every_kind():
    strict = _match("conv3d_bn_relu", policy=make("fp32"))
    assert "kStrictFp32 = true" in conv.render(strict, conv.defaults(strict))
    tf32 = _match("convt2d_s2_bn_relu", policy=make("tf32"))
    assert "kStrictFp32 = false" in conv.render(tf32, conv.defaults(tf32))
    for dtype, ct in ((torch.bfloat16, "CUDNN_DATA_BFLOAT16"), (torch.float16, "CUDNN_DATA_HALF")):
        cp = _match("conv1d_bias_gelu", dtype)
        assert ct in conv.render(cp, conv.defaults(cp))


# half precision for one case of each cuDNN path (the others differ from these in constants only)
HALF = {"conv1d_bias_gelu": (torch.bfloat16, torch.float16), "conv3d_bn_relu": (torch.bfloat16,),
        "convt2d_s2_bn_relu": (torch.bfloat16,), "depthwise_bn_relu6": (torch.float16,)}


def _compile_set() -> list[tuple[str, str]]:
    """Each case's default in fp32, the half-precision ones above, and conv1d on the legacy fused
    call: ~17 sources with cuDNN's headers (a build of all 66 seed candidates ran past 300 s on 2
    shared cores)."""
    out = []
    for name in CASES:
        for dtype in (torch.float32,) + HALF.get(name, ()):
            block, inputs = _case(name, dtype)
            out.append((f"{name}/{dtype}", propose(_task(block, inputs), n=1).candidates[0].source))
    cp = _match("conv1d_s2_bn_add_relu")
    out.append(("conv1d_s2_bn_add_relu/fused", conv.render(cp, dict(conv.defaults(cp), fused=True))))
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn() is None, reason="needs nvcc + cuDNN")
def test_conv_kind_sources_compile_for_sm90a():
    todo = _compile_set()
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_conv_kind_candidates_match_torch(name, dtype):
    """Every seed candidate against eager torch (TF32 off, the strict-fp32 reference), at the
    captured batch (2) and at 3: a second shape, a second cached cuDNN plan."""
    from torch_htam.launcher import Kernel
    block, inputs = _case(name, dtype)
    task = _task(block, inputs)
    policy = policy_for(task)
    cands = propose(task, n=4).candidates
    results = build.build_many([c.source for c in cands])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    matched = []
    for cand, res in zip(cands, results):
        kernel = Kernel(res.so_path)
        ok = True
        for batch in (2, 3):
            torch.manual_seed(batch)
            xs = kind_inputs(block, n=batch, dtype=dtype, device="cuda", **CASES[name][1])
            with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                ref = block(*xs)
            out = torch.full_like(ref, float("nan"))
            assert kernel([x for x in xs if x is not None], [out]) == 0, (name, cand.params)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all(), (name, cand.params)      # every element written
            ok &= torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
        matched.append(ok)
    # strict fp32 must match for every candidate; in half precision the defaults at least
    assert matched[0] and (dtype != torch.float32 or all(matched)), [c.params for c in cands]
