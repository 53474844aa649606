"""The tiled pointwise-conv kernel (proposers/expert/pwconv.py + pwconv.cuh).

CPU: where the smem_tiling strategy is offered (1x1 convs, tensor-core math allowed), its tags, and
that every dtype / epilogue / tile setting compiles for sm_90a. GPU: the full verification
protocol (verify.verify: several seeds and distributions, a second shape, poisoned outputs, run
twice) on shapes that exercise every tail: channels not a multiple of the tile, C not a multiple
of 32 or of a 16-byte vector, pixel tiles that span images, an odd pixel count (the scalar path).
"""
from __future__ import annotations

import re

import pytest
import torch

from test_expert import ConvBlock, bench_task, conv_inputs, conv_task, propose
from torch_htam import build, paths
from torch_htam.policy import make, policy_for
from torch_htam.proposers.base import ProposalRequest
from torch_htam.proposers.expert import ExpertProposer, conv
from torch_htam.proposers.expert.ir import Unsupported
from compile_check import assert_compiles

# name -> (block, conv_inputs kwargs); all 1x1 convs
CASES = {
    "bn_add_relu": (ConvBlock(padding=0), dict(n=3, c=64, k=96, hw=14, res=True, bias=False)),
    "bn_relu6_tails": (ConvBlock(act="relu6", padding=0), dict(n=2, c=40, k=200, hw=7)),
    "bias_silu_c30": (ConvBlock(bn=False, act="silu", padding=0), dict(n=2, c=30, k=64, hw=8)),
    "plain_c256": (ConvBlock(bn=False, act=None, padding=0), dict(n=2, c=256, k=64, hw=16, bias=False)),
}
TILES = [dict(), dict(bm=64, bn=64, stages=3, ju=2), dict(bm=128, bn=64, ju=8, minb=1), dict(bm=64, stages=4, minb=3),
         dict(bm=64, bn=256, minb=1, pre=False), dict(persist=False), dict(pre=False, ju=8),
         dict(bn=128, pre=True, persist=True)]     # (the defaults differ by dtype: both layouts run)
POLICY = {torch.float32: "tf32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _plan(name: str, dtype, device="cpu"):
    block, kw = CASES[name]
    inputs = conv_inputs(r=1, padding=0, dtype=dtype, device=device, **kw)
    task = conv_task(block, [x.cpu() if x is not None else None for x in inputs])
    return task, conv.match(task.graph, make(POLICY[dtype]))


class Bound(torch.nn.Module):
    """The case's block over its non-None inputs (the task's reference, as conv_task binds it)."""

    def __init__(self, name: str):
        super().__init__()
        block, kw = CASES[name]
        full = conv_inputs(r=1, padding=0, **kw)
        self.block, self.keep, self.n = block, [i for i, v in enumerate(full) if v is not None], len(full)

    def forward(self, *xs):
        full = [None] * self.n
        for i, v in zip(self.keep, xs):
            full[i] = v
        return self.block(*full)


def test_tiling_is_offered_for_1x1_convs_with_tensor_core_math():
    task = bench_task("conv_bn_add_relu_fp32")
    for policy, offered in ((make("tf32"), 4), (make("fp32"), 0)):
        # the defaults themselves are tiled where allowed; with no parent they come first, tagged
        # with nothing (no strategy applied), then the space's settings that apply the strategy
        assert conv.defaults(conv.match(task.graph, policy))["tiled"] == bool(offered)
        cands = ExpertProposer().propose(ProposalRequest(task, "data_reuse", ["smem_tiling"], n=4,
                                                         policy=policy)).candidates
        tiled = [c for c in cands if c.params.get("tiled")]
        assert len(tiled) == offered, [c.params for c in cands]
        assert [c.tags for c in tiled] == ([[]] + [["smem_tiling"]] * 3 if offered else [])
        for c in tiled:
            assert "pw::main_loop<F32" in c.source and "cudnn" not in c.source
            assert re.search(r"true, true, 4, \d, (true|false), true, int32_t>", c.source)     # 3xTF32 by default
            assert build.check_source(c.source) == []
    # strict fp32 has no tensor-core kernel to offer: the render says why instead
    cp = conv.match(task.graph, make("fp32"))
    with pytest.raises(Unsupported, match="TF32"):
        conv.render(cp, dict(conv.defaults(cp), tiled=True))
    cp = conv.match(task.graph, make("tf32"))
    assert "true, true, 4, 8, false, false, int32_t>" in conv.render(cp, dict(conv.defaults(cp), tiled=True, split=False))
    # a 3x3 conv keeps cuDNN only
    cp3 = conv.match(bench_task("conv_bn_relu_bf16").graph, make("bf16"))
    assert not cp3.facts.tiled_conv
    with pytest.raises(Unsupported, match="1x1"):
        conv.render(cp3, dict(conv.defaults(cp3), tiled=True))
    # the first round of a 1x1 conv starts from it (the baseline: no strategy applied, no tag) and
    # still tries cuDNN's paths
    seed = propose(task, n=8).candidates
    assert seed[0].params["tiled"] and seed[0].tags == []
    assert any(not c.params["tiled"] and c.params["fused"] for c in seed)
    assert any(not c.params["tiled"] and "cudnnBackendExecute(" in c.source for c in seed)


def test_epilogue_reads_the_tile_and_folds_batch_norm_per_channel():
    task, cp = _plan("bn_add_relu", torch.bfloat16)
    src = conv.render(cp, dict(conv.defaults(cp), tiled=True))
    # conv value rounded to bf16 as torch's conv output is, then (cv - center) * scale + beta
    assert "typedef BF16 STG;" in src and "const float cv = cvs[e];" in src
    assert "sS[threadIdx.x] = BF16::to_f(gamma[i]) * rsqrtf(BF16::to_f(var[i]) + eps);" in src
    assert "sT[threadIdx.x] = BF16::to_f(mean[i]) - 0.f;" in src
    assert "const float t0 = (cv - sT[r]);" in src and "const float t1 = (t0 * sS[r]);" in src
    assert "fold_kernel" not in src          # no separate launch, no scratch buffers
    _, cp32 = _plan("bn_add_relu", torch.float32)
    assert "typedef F32 STG;" in conv.render(cp32, dict(conv.defaults(cp32), tiled=True))


def _compile_set() -> list[tuple[str, str]]:
    out = []
    for name in CASES:
        for dtype in POLICY:
            _, cp = _plan(name, dtype)
            for tile in (TILES if name == "bn_add_relu" else TILES[:1]):
                out.append((f"{name}/{dtype}/{tile}", conv.render(cp, dict(conv.defaults(cp), tiled=True, **tile))))
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_tiled_sources_compile_for_sm90a():
    todo = _compile_set()
    assert all(build.check_source(s) == [] for _, s in todo)
    assert_compiles(todo)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(POLICY), ids=str)
@pytest.mark.parametrize("name", CASES)
def test_tiled_pointwise_conv_verifies(name, dtype):
    from torch_htam import verify as V
    from torch_htam.launcher import Kernel
    task, cp = _plan(name, dtype)
    policy = make(POLICY[dtype])
    srcs = [conv.render(cp, dict(conv.defaults(cp), tiled=True, **t)) for t in TILES]
    results = build.build_many(srcs)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    ref = Bound(name)
    for tile, res in zip(TILES, results):
        ok, reason, detail, errs = V.verify(task, Kernel(res.so_path), ref, policy)
        assert (ok, reason) == (True, "ok"), (name, dtype, tile, detail)


@pytest.mark.gpu
def test_tiled_kernel_verifies_on_the_suite_task():
    """The bench task itself (ResNet-50's bottleneck tail, TF32) under the search's policy."""
    from torch_htam import verify as V
    from torch_htam.launcher import Kernel
    from torch_htam.task import load_reference
    task = bench_task("conv_bn_add_relu_fp32")
    policy = policy_for(task, conv=True)
    cp = conv.match(task.graph, policy)
    res = build.build(conv.render(cp, dict(conv.defaults(cp), tiled=True)))
    assert res.ok, res.error
    ok, reason, detail, _ = V.verify(task, Kernel(res.so_path), load_reference(task).cuda(), policy)
    assert (ok, reason) == (True, "ok"), detail


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(POLICY), ids=str)
def test_infinities_and_nan_pass_through_like_torch(dtype):
    """split_tf32 hands the tensor cores x plus half a tf32 ulp and the remainder x - big: an
    infinite x must still give +-inf (its remainder inf - inf would be NaN) and a NaN x NaN, at the
    same positions as a float64 conv on the CPU."""
    from torch_htam.launcher import Kernel
    task, cp = _plan("plain_c256", dtype)
    res = build.build(conv.render(cp, dict(conv.defaults(cp), tiled=True)))
    assert res.ok, res.error
    _, kw = CASES["plain_c256"]
    full = conv_inputs(r=1, padding=0, dtype=dtype, device="cuda", **kw)
    x = full[0]
    x[0, 5, 3, 4], x[1, 100, 0, 0], x[1, 7, 10, 10] = float("inf"), float("-inf"), float("nan")
    ins = [v for v in full if v is not None]
    ref = Bound("plain_c256")(*[v.double().cpu() for v in ins])
    out = torch.empty(ref.shape, dtype=dtype, device="cuda")
    assert Kernel(res.so_path)(ins, [out]) == 0
    torch.cuda.synchronize()
    out = out.double().cpu()
    assert int(ref.isinf().sum()) >= 128 and int(ref.isnan().sum()) >= 64
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert torch.equal(out[ref.isinf()], ref[ref.isinf()])


def test_a_conv_with_few_output_tiles_starts_on_cudnn_and_can_still_tile():
    """A squeeze-excite FC as a 1x1 conv on [32, 672, 1, 1] has 3 tiles of output: the tiled
    kernel would leave most SMs idle, so the defaults take cuDNN; the grid still offers it."""
    from test_expert import small_task
    from torch_htam.proposers.expert import pwconv
    from torch_htam.proposers.expert.proposer import tuning_grid
    fc = torch.nn.Conv2d(672, 168, 1).to(torch.bfloat16)
    task = small_task(torch.nn.Sequential(fc, torch.nn.ReLU()), torch.randn(32, 672, 1, 1, dtype=torch.bfloat16))
    cp = conv.match(task.graph, policy_for(task))
    d = conv.defaults(cp)
    assert pwconv.reason(cp) is None and pwconv.tiles(cp, d) == 3 < conv.PW_MIN_TILES and not d["tiled"]
    assert any(p.get("tiled") for p in tuning_grid(task))
    big = conv.match(bench_task("conv_bn_add_relu_bf16").graph, make("bf16"))
    assert pwconv.tiles(big, conv.defaults(big)) >= conv.PW_MIN_TILES and conv.defaults(big)["tiled"]
