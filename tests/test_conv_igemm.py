"""The implicit-GEMM conv (proposers/expert/conv_igemm.cuh): one launch of conv2d + batch norm from
its raw statistics + residual + ReLU over channels-last bf16 / fp16, against torch.

A small htam_run (HARNESS) binds a conv site's tensors to ig::run_site: x [N, C, H, W]
channels-last, w [K, C, R, S] channels-last or contiguous (odd batches), gamma, beta, mean, var
[K], an optional residual like y; stride, padding, dilation, the tile and ReLU as IG_ defines. Built for sm_90a on any machine (`build`); run on a GPU
against torch's conv, batch norm, add and ReLU on the same inputs (`gpu`)."""
import pytest
import torch
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.proposers.expert.cuda import DT, PRELUDE, cuh

HARNESS = r"""
// in: x [N, C, H, W] (channels-last), w [K, C, R, S] (channels-last or contiguous), gamma, beta, mean, var [K]
// (IG_VT), [residual like y]; out: y [N, K, P, Q] channels-last
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 6 + IG_HAS_RES || n_out != 1) return HTAM_ERR_SHAPE;
  const HtamTensor* const vecs[5] = {&in[2], &in[3], &in[4], &in[5], nullptr};
  return ig::run_site<IG_DTYPE, IG_VT, IG_BM, IG_BN, IG_STAGES, IG_RELU>(
      in[0], in[1], out[0], vecs, IG_HAS_RES ? &in[6] : nullptr, IG_DTC, IG_VTC,
      ig::Site{IG_SH, IG_SW, IG_PH, IG_PW, IG_DH, IG_DW, IG_EPS}, stream);
}
"""

def _dt(dtype: torch.dtype) -> tuple[str, str, int]:
    """cuda.DT's (trait, HtamDtype code, bytes) of a torch dtype."""
    return DT[str(dtype).removeprefix("torch.")]


def source(dtype, vdtype, stride, pad, dil, relu, res, tile=(128, 64, 3), eps=1e-5) -> str:
    """The harness's source: the kernel for these settings (w's layout is read at run time)."""
    bm, bn, stages = tile
    defines = dict(DTYPE=_dt(dtype)[0], VT=_dt(vdtype)[0], DTC=_dt(dtype)[1], VTC=_dt(vdtype)[1], SH=stride, SW=stride, PH=pad, PW=pad, DH=dil, DW=dil,
                   RELU="true" if relu else "false", HAS_RES=int(res), BM=bm, BN=bn, STAGES=stages, EPS=f"{eps}f")
    head = "".join(f"#define IG_{k} {v}\n" for k, v in defines.items())
    return head + PRELUDE + cuh("pwconv.cuh") + cuh("conv_igemm.cuh") + HARNESS


# (N, C, H, W, K, R, S, stride, pad, dil, relu, residual, dtype, tile): odd sizes, strides, a 7x7,
# K not a multiple of the tile (40, 96) or of 2 (33: scalar stores), one row tile past M's end.
# Few tiles and many k-blocks split the reduction across a cluster (split_for, on 132 SMs): the
# first case 2 ways, the 7x7 4 ways (49 k-blocks: uneven shares), the last three 8 ways, the
# last two with a KCRS weight (odd batch).
CASES = [
    (2, 64, 8, 8, 64, 3, 3, 1, 1, 1, True, True, torch.bfloat16, (128, 64, 3)),
    (3, 32, 7, 9, 96, 3, 3, 2, 1, 1, True, False, torch.bfloat16, (64, 64, 4)),
    (1, 64, 5, 5, 40, 1, 1, 1, 0, 1, False, False, torch.bfloat16, (128, 64, 3)),
    (5, 128, 14, 14, 256, 1, 1, 2, 0, 1, True, False, torch.float16, (128, 64, 3)),
    (2, 32, 11, 13, 64, 7, 7, 1, 3, 1, True, False, torch.bfloat16, (64, 128, 3)),
    (16, 256, 4, 4, 128, 3, 3, 1, 1, 1, True, True, torch.bfloat16, (128, 64, 3)),
    (1, 32, 9, 9, 33, 3, 3, 1, 2, 2, False, False, torch.float16, (64, 64, 4)),
    (1, 512, 7, 7, 512, 3, 3, 1, 1, 1, True, True, torch.bfloat16, (128, 64, 3)),
    (3, 256, 7, 7, 256, 3, 3, 1, 1, 1, True, False, torch.float16, (64, 128, 3)),
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


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_the_conv_builds_for_an_arch_without_clusters(tmp_path):
    """sm_80 (A100) compiles the split-K epilogue out (clusters are sm_90's); split_for never
    splits on a device that cannot launch clusters."""
    res = build.build(source(torch.bfloat16, torch.bfloat16, 1, 1, 1, True, True), arch="sm_80", out_dir=tmp_path)
    assert res.ok, res.error


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
    w = (torch.randn(k, c, r, s, device="cuda", generator=g) / (c * r * s) ** 0.5).to(dt)
    w = w.contiguous(memory_format=cl) if n % 2 == 0 else w.contiguous()   # odd batches: a KCRS weight
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


# ---- the kernel as the expert proposes it for a channels-last conv region (conv_igemm.py) --------

def _region(dtype=torch.bfloat16, c=32, k=64, r=3, res=False, bias=False, w_cl=True, stride=1, act="relu",
            device="cpu", n=2):
    """(block, inputs, task, kept input indices, match) of a conv2d [+ BN] [+ residual] [ReLU] region
    laid out as a channels-last model holds it (tests/test_conv_channels_last.py's helpers)."""
    from test_conv_channels_last import _task, block_inputs
    from test_conv_kinds import KindBlock
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import conv
    block = KindBlock(bn=True, act=act, stride=stride, padding=r // 2)
    inputs = block_inputs(block, n=n, c=c, k=k, size=9, r=r, bias=bias, res=res, w_cl=w_cl, dtype=dtype,
                          device=device)
    task, keep = _task(block, inputs)
    return block, inputs, task, keep, conv.match(task.graph, policy_for(task))


def test_the_implicit_gemm_conv_is_offered_last_where_it_applies():
    """A bf16 channels-last conv with 32 input channels and a KRSC (or 1x1) weight: igemm settings
    close its grid, one per tile, canonical (cuDNN's knobs at their defaults), tagged with the
    strategies they embody; the defaults and the cuDNN settings are as before."""
    from torch_htam.proposers.expert import conv, conv_igemm
    *_, cp = _region()
    assert cp.channels_last and conv_igemm.reason(cp) is None
    base = conv.defaults(cp)
    assert "igemm" not in base
    grid = conv.grid(cp, base)
    own = [p for p in grid if p.get("igemm")]
    assert grid[-len(own):] == own
    assert [(p["ig_bm"], p["ig_bn"], p["ig_stages"]) for p in own] == list(conv_igemm.IG_TILES)
    moved = conv.canonical(cp, dict(own[0], algo=3, fused=not base["fused"], vec32=False))
    assert moved == conv.canonical(cp, own[0]) and moved["algo"] == base["algo"]
    assert {"smem_tiling", "bf16_tensor_cores", "fold_batchnorm"} <= set(conv.tags(cp, own[0]))
    sources = {conv.render(cp, p) for p in own}
    assert len(sources) == len(own) and all("implicit-GEMM" in s.splitlines()[0] for s in sources)
    # without igemm, a setting's tile knobs are dropped: the cuDNN setting it is
    assert conv.canonical(cp, dict(base, ig_bm=64)) == conv.canonical(cp, base)


def test_smem_tiling_moves_an_eligible_channels_last_conv_to_the_implicit_gemm_kernel(monkeypatch):
    """The search reaches the kernel: smem_tiling's moves on a channels-last bf16 conv are its tiles
    (where a 1x1 NCHW conv's are pwconv's) where CUTLASS's library is not built (tests/
    test_conv_cutlass.py: its tiles come first); a later move of cuDNN's knobs returns to cuDNN's path."""
    from torch_htam.proposers.expert import conv, conv_cutlass, conv_igemm, strategies
    monkeypatch.setattr(conv_cutlass, "library_ready", lambda: False)
    *_, cp = _region()
    assert cp.facts.igemm_tiles == conv_igemm.IG_TILES and not cp.facts.tiled_conv
    moves = strategies.moves_for("smem_tiling", cp.facts)
    assert moves and all(m["igemm"] for m in moves)
    assert {(m["ig_bm"], m["ig_bn"], m["ig_stages"]) for m in moves} == set(conv_igemm.IG_TILES)
    own = conv.canonical(cp, dict(conv.defaults(cp), **moves[0]))
    assert conv.igemm(cp, own)
    back = conv.refit(cp, dict(own, algo=2), {"algo": 2})
    assert not conv.igemm(cp, back) and "implicit-GEMM" not in conv.render(cp, back).splitlines()[0]
    assert conv.igemm(cp, conv.refit(cp, dict(own, ig_bm=64), {"ig_bm": 64}))
    *_, fp32 = _region(dtype=torch.float32)
    assert not fp32.facts.igemm_tiles and strategies.moves_for("smem_tiling", fp32.facts) == []


@pytest.mark.parametrize("kw, why", [
    (dict(dtype=torch.float32), "bf16 / fp16"),
    (dict(c=16), "multiple of 32"),
])
def test_the_implicit_gemm_conv_says_why_it_does_not_apply(kw, why):
    from torch_htam.proposers.expert import conv, conv_igemm
    *_, cp = _region(**kw)
    assert why in conv_igemm.reason(cp)
    assert not any(p.get("igemm") for p in conv.grid(cp, conv.defaults(cp)))
    # asked for anyway, the region renders on cuDNN's path
    assert "implicit-GEMM" not in conv.render(cp, dict(conv.defaults(cp), igemm=True)).splitlines()[0]


def test_a_weight_in_either_layout_takes_the_kernel():
    """A model's KCRS weight (the kernel gathers its tiles) or a channels-last one (16-byte copies)."""
    from torch_htam.proposers.expert import conv_igemm
    assert all(conv_igemm.reason(_region(w_cl=cl)[-1]) is None for cl in (True, False))


IG_REGIONS = {   # name: _region's arguments
    "3x3_bn_relu": dict(),
    "3x3_bn_add_relu_kcrs": dict(w_cl=False, res=True, c=64),
    "3x3_s2_bn_bias": dict(stride=2, bias=True, act=None, k=40),
    "1x1_bn_add_relu": dict(r=1, w_cl=False, res=True, c=64, k=96),
}


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="nvcc not installed")
def test_the_proposed_sources_build():
    from compile_check import assert_compiles
    from torch_htam.proposers.expert import conv, conv_igemm
    todo = []
    for name, kw in IG_REGIONS.items():
        for dt in (torch.bfloat16, torch.float16):
            *_, cp = _region(dtype=dt, **kw)
            bm, bn, st = conv_igemm.IG_TILES[len(todo) % len(conv_igemm.IG_TILES)]
            todo.append((f"{name}/{dt}", conv.render(cp, dict(conv.defaults(cp), cutlass=False, igemm=True, ig_bm=bm, ig_bn=bn,
                                                                 ig_stages=st))))
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", IG_REGIONS)
def test_the_proposed_kernel_matches_torch_at_other_batches(name, dtype):
    """Each tile's kernel against eager torch at the captured batch and two others (no plan per
    size: the geometry comes from the tensors), judged as verification judges."""
    from torch_htam.launcher import Kernel
    from torch_htam.policy import policy_for
    from torch_htam.proposers.expert import conv, conv_igemm
    from torch_htam.verify import within_torch_error
    block, _, task, keep, cp = _region(dtype=dtype, device="cuda", **IG_REGIONS[name])
    policy = policy_for(task)
    params = [dict(conv.defaults(cp), cutlass=False, igemm=True, ig_bm=bm, ig_bn=bn, ig_stages=st)
              for bm, bn, st in conv_igemm.IG_TILES]
    results = build.build_many([conv.render(cp, p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for n in (2, 1, 7):
        torch.manual_seed(n)
        _, xs, *_ = _region(dtype=dtype, device="cuda", n=n, **IG_REGIONS[name])
        with torch.no_grad():
            ref = block(*xs)
            ref64 = block(*[x.double() if x is not None else None for x in xs])
        for p, res_ in zip(params, results):
            out = torch.full_like(ref, float("nan")).to(memory_format=torch.channels_last)
            assert Kernel(res_.so_path)([xs[i] for i in keep], [out]) == 0, (p, n)
            torch.cuda.synchronize()
            assert torch.isfinite(out).all(), (p, n)
            assert (torch.allclose(out.float(), ref.float(), atol=policy.atol, rtol=policy.rtol)
                    or within_torch_error(out.float(), ref.float(), ref64, policy.atol, policy.rtol)[0]), (p, n)
