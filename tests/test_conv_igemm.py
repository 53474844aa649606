"""The implicit-GEMM conv (proposers/expert/conv_igemm.cuh): one launch of conv2d + batch norm from
its raw statistics + residual + ReLU over channels-last bf16 / fp16, against torch.

A small htam_run (HARNESS) binds a conv site's tensors to ig::launch: x [N, C, H, W] and w [K, C, R,
S] channels-last, gamma, beta, mean, var [K], an optional residual like y; stride, padding,
dilation, the tile and ReLU as IG_ defines. Built for sm_90a on any machine (`build`); run on a GPU
against torch's conv, batch norm, add and ReLU on the same inputs (`gpu`)."""
import pytest
import torch
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.proposers.expert.cuda import PRELUDE, cuh

HARNESS = r"""
// in: x [N, C, H, W], w [K, C, R, S] (both channels-last in memory), gamma, beta, mean, var [K]
// (IG_VT), [residual like y]; out: y [N, K, P, Q] channels-last
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 6 + IG_HAS_RES || n_out != 1) return HTAM_ERR_SHAPE;
  const HtamTensor &x = in[0], &w = in[1], &y = out[0];
  ig::Geom g;
  g.N = (int)x.sizes[0]; g.C = (int)x.sizes[1]; g.H = (int)x.sizes[2]; g.W = (int)x.sizes[3];
  g.K = (int)w.sizes[0]; g.R = (int)w.sizes[2]; g.S = (int)w.sizes[3];
  g.P = (int)y.sizes[2]; g.Q = (int)y.sizes[3];
  g.sh = IG_SH; g.sw = IG_SW; g.ph = IG_PH; g.pw = IG_PW; g.dh = IG_DH; g.dw = IG_DW;
  g.M = g.N * g.P * g.Q;
  // channels-last: the channel stride 1, then W, H, N
  const HtamTensor* cl[] = {&x, &w, &y, IG_HAS_RES ? &in[6] : &y};
  for (const HtamTensor* t : cl)
    if (t->strides[1] != 1 || t->strides[3] != t->sizes[1] || t->strides[2] != t->sizes[1] * t->sizes[3])
      return HTAM_ERR_SHAPE;
  typedef typename IG_DTYPE::raw raw;
  typedef typename IG_VT::raw vraw;
  ig::BnEpi<IG_DTYPE, IG_VT, IG_RELU> epi{(const vraw*)in[2].data, (const vraw*)in[3].data, (const vraw*)in[4].data,
                                 (const vraw*)in[5].data, nullptr,
                                 IG_HAS_RES ? (const raw*)in[6].data : nullptr, IG_EPS};
  return ig::launch<IG_DTYPE, IG_BM, IG_BN, IG_STAGES>((const raw*)x.data, (const raw*)w.data, (raw*)y.data, g, epi, stream);
}
"""

TRAIT = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def source(dtype, vdtype, stride, pad, dil, relu, res, tile=(128, 64, 3), eps=1e-5) -> str:
    bm, bn, stages = tile
    defines = dict(DTYPE=TRAIT[dtype], VT=TRAIT[vdtype], SH=stride, SW=stride, PH=pad, PW=pad, DH=dil, DW=dil,
                   RELU="true" if relu else "false", HAS_RES=int(res), BM=bm, BN=bn, STAGES=stages, EPS=f"{eps}f")
    head = "".join(f"#define IG_{k} {v}\n" for k, v in defines.items())
    return head + PRELUDE + cuh("pwconv.cuh") + cuh("conv_igemm.cuh") + HARNESS


# (N, C, H, W, K, R, S, stride, pad, dil, relu, residual, dtype, tile): odd sizes, strides, a 7x7,
# K not a multiple of the tile (40, 96) or of 2 (33: scalar stores), one row tile past M's end
CASES = [
    (2, 64, 8, 8, 64, 3, 3, 1, 1, 1, True, True, torch.bfloat16, (128, 64, 3)),
    (3, 32, 7, 9, 96, 3, 3, 2, 1, 1, True, False, torch.bfloat16, (64, 64, 4)),
    (1, 64, 5, 5, 40, 1, 1, 1, 0, 1, False, False, torch.bfloat16, (128, 64, 3)),
    (5, 128, 14, 14, 256, 1, 1, 2, 0, 1, True, False, torch.float16, (128, 64, 3)),
    (2, 32, 11, 13, 64, 7, 7, 1, 3, 1, True, False, torch.bfloat16, (64, 128, 3)),
    (16, 256, 4, 4, 128, 3, 3, 1, 1, 1, True, True, torch.bfloat16, (128, 64, 3)),
    (1, 32, 9, 9, 33, 3, 3, 1, 2, 2, False, False, torch.float16, (64, 64, 4)),
]


def _out(n, h, r, stride, pad, dil) -> int:
    return (h + 2 * pad - dil * (r - 1) - 1) // stride + 1


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_the_conv_builds_for_each_tile_dtype_and_epilogue(tmp_path):
    srcs = [source(dt, dt, s, p, d, relu, res, tile) for (_, _, _, _, _, _, _, s, p, d, relu, res, dt, tile)
            in CASES[:4]]
    results = build.build_many(srcs, arch="sm_90a", out_dir=tmp_path, jobs=2)
    assert [(r.ok, r.error) for r in results] == [(True, "")] * len(srcs)


def _reference(x, w, stats, res, stride, pad, dil, relu, eps):
    """torch's site on the same (rounded) inputs, in fp32: conv rounded to the dtype as torch
    stores it, then batch norm, the residual and ReLU."""
    gamma, beta, mean, var = (t.float() for t in stats)
    y = F.conv2d(x.float(), w.float(), stride=stride, padding=pad, dilation=dil).to(x.dtype).float()
    y = F.batch_norm(y, mean, var, gamma, beta, False, 0.0, eps)
    if res is not None:
        y = y + res.float()
    return torch.relu(y) if relu else y


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:9])) + f"-{str(c[12])[6:]}")
def test_the_conv_matches_torch(case, tmp_path):
    from torch_htam.launcher import Kernel
    n, c, h, w_, k, r, s, stride, pad, dil, relu, has_res, dt, tile = case
    res_ = build.build(source(dt, dt, stride, pad, dil, relu, has_res, tile), out_dir=tmp_path)
    assert res_.ok, res_.error
    g = torch.Generator(device="cuda").manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(n, c, h, w_, device="cuda", generator=g).to(dt).contiguous(memory_format=cl)
    w = (torch.randn(k, c, r, s, device="cuda", generator=g) / (c * r * s) ** 0.5).to(dt).contiguous(memory_format=cl)
    stats = (1 + 0.1 * torch.randn(k, device="cuda", generator=g), 0.1 * torch.randn(k, device="cuda", generator=g),
             0.1 * torch.randn(k, device="cuda", generator=g), 0.5 + torch.rand(k, device="cuda", generator=g))
    stats = tuple(t.to(dt) for t in stats)
    p, q = _out(n, h, r, stride, pad, dil), _out(n, w_, s, stride, pad, dil)
    res = torch.randn(n, k, p, q, device="cuda", generator=g).to(dt).contiguous(memory_format=cl) if has_res else None
    y = torch.full((n, k, p, q), float("nan"), device="cuda", dtype=dt).contiguous(memory_format=cl)
    ins = [x, w, *stats] + ([res] if has_res else [])
    assert Kernel(res_.so_path)(ins, [y]) == 0
    torch.cuda.synchronize()
    want = _reference(x, w, stats, res, stride, pad, dil, relu, 1e-5)
    assert torch.isfinite(y.float()).all()
    torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2 * (1 + want.abs().max().item()))


@pytest.mark.gpu
def test_the_conv_declines_channels_not_a_multiple_of_32(tmp_path):
    """24 input channels: a 32-channel step would cross taps, so the launch returns HTAM_ERR_SHAPE
    (1000, htam_abi.h) and writes nothing (the runtime then runs the region)."""
    from torch_htam.launcher import Kernel
    res_ = build.build(source(torch.bfloat16, torch.bfloat16, 1, 1, 1, True, False), out_dir=tmp_path)
    assert res_.ok, res_.error
    cl = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 24, 8, 8, **cl).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 24, 3, 3, **cl).contiguous(memory_format=torch.channels_last)
    stats = [torch.ones(64, **cl) for _ in range(4)]
    y = torch.full((2, 64, 8, 8), 7.0, **cl).contiguous(memory_format=torch.channels_last)
    assert Kernel(res_.so_path)([x, w, *stats], [y]) == 1000
    assert bool((y == 7.0).all())
