"""GEMMs whose outputs are reshaped (view / transpose / split into heads) and batched matmuls whose
operands are views (k.transpose(-2, -1)): torch_htam/proposers/expert/gemm_layout.py and gemm.py's
layout path.

CPU: the strided maps the matcher reads reproduce torch's outputs from the GEMM result, each output
covers its box of the result exactly once, the operand strides give torch's product, unsupported
layouts say why, generated sources pass the static check and compile for sm_90a.
GPU (@gpu, the lead runs them): every case against torch through the real build, both seed
candidates (cuBLASLt's epilogue; our epilogue kernel), with contiguous outputs (the scratch path
where cuBLASLt cannot write the layout: a store, or the epilogue kernel storing through the layout)
and with outputs laid out as the task's specs say (verification's way: cuBLASLt writes them).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.policy import policy_for
from torch_htam.proposers.base import ProposalRequest
from torch_htam.proposers.expert import ExpertProposer, gemm
from torch_htam.proposers.expert import gemm_layout as gl
from torch_htam.proposers.expert.ir import Unsupported, _graph_outputs
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import Task, TensorSpec
from compile_check import assert_compiles, seed_sources


class Heads(nn.Module):
    """BERT / T5's q: linear + view + transpose(1, 2) to [B, H, T, d] (a view: not contiguous)."""
    def forward(self, x, w, b):
        B, T, C = x.shape
        return F.linear(x, w, b).view(B, T, 4, C // 4).transpose(1, 2)


class ScaledHeads(nn.Module):
    """Whisper's q: (linear * scale) + view + transpose + contiguous (the epilogue kernel's case)."""
    def forward(self, x, w, b):
        B, T, C = x.shape
        return (F.linear(x, w, b) * 0.125).view(B, T, 4, C // 4).transpose(1, 2).contiguous()


class SplitQKV(nn.Module):
    """GPT-2's c_attn: addmm + view + split into q, k, v; k and v to heads."""
    def forward(self, x, w, b):
        T, C = x.shape[0], x.shape[1]
        q, k, v = torch.addmm(b, x, w).view(1, T, w.shape[1]).split(C, dim=2)
        return q, k.view(1, T, 4, C // 4).transpose(1, 2), v.view(1, T, 4, C // 4).transpose(1, 2)


class ScoresOfViews(nn.Module):
    """MinGPT's q @ k^T with q, k heads of [1, T, C] region inputs."""
    def forward(self, q, k):
        B, T, C = q.shape
        q = q.view(B, T, 4, C // 4).transpose(1, 2)
        k = k.view(B, T, 4, C // 4).transpose(1, 2)
        return q @ k.transpose(-2, -1)


class AttnTimesV(nn.Module):
    """MinGPT's (att @ v).transpose(1, 2).contiguous().view(B, T, C)."""
    def forward(self, att, v):
        B, H, T, _ = att.shape
        v = v.view(B, T, H, -1).transpose(1, 2)
        return (att @ v).transpose(1, 2).contiguous().view(B, T, -1)


class RepeatKV(nn.Module):
    """Llama's v with grouped-query attention: linear + view + transpose to 2 kv heads, each
    repeated twice (expand + reshape: a stride-0 dim of the output's map, no library call writes it)."""
    def forward(self, x, w):
        B, T, _ = x.shape
        y = F.linear(x, w).view(B, T, 2, w.shape[0] // 2).transpose(1, 2)
        return y[:, :, None].expand(B, 2, 2, T, w.shape[0] // 2).reshape(B, 4, T, w.shape[0] // 2)


class ScaledBmmT(nn.Module):
    """bmm with a transposed operand and a scale epilogue: [Z, T, d] x [Z, T, d]^T * 1/sqrt(d)."""
    def forward(self, q, k):
        return torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1]))


class ScaledLinearToNCHW(nn.Module):
    """ConvNeXt's block end: gamma * pwconv2(x) on [B, H, W, C], permuted back to [B, C, H, W]
    (channels-last memory: the store walks the output's memory order, gemm_layout.cuh lay_order)."""
    def forward(self, x, w, b, g):
        return (g * F.linear(x, w, b)).permute(0, 3, 1, 2)


class LinearGelu(nn.Module):
    """MLP-Mixer's token MLP: gelu(linear(x)) with x a transposed view ([B, C, T] of [B, T, C])."""
    def forward(self, x, w, b):
        return F.gelu(F.linear(x, w, b))


class ResidualAdd(nn.Module):
    """MLP-Mixer's channel MLP end: res + linear(x), res transposed in memory (the output too)."""
    def forward(self, x, w, b, res):
        return res + F.linear(x, w, b)


def _cases(dtype=torch.float32, device="cpu") -> dict:
    def r(*s, scale=1.0):
        return torch.randn(*s, dtype=dtype, device=device) * scale
    return {
        "heads": (Heads(), [r(2, 24, 64), r(64, 64, scale=0.1), r(64)]),
        "scaled_heads": (ScaledHeads(), [r(2, 24, 64), r(64, 64, scale=0.1), r(64)]),
        "split_qkv": (SplitQKV(), [r(24, 64), r(64, 192, scale=0.1), r(192)]),
        "scores_of_views": (ScoresOfViews(), [r(1, 24, 64), r(1, 24, 64)]),
        "attn_times_v": (AttnTimesV(), [r(1, 4, 24, 24), r(1, 24, 64)]),
        # batch 2 x 4 heads of a [B, T, C] input: no one batch stride, the kernel loops over b
        "scores_of_views_b2": (ScoresOfViews(), [r(2, 24, 64), r(2, 24, 64)]),
        "attn_times_v_b2": (AttnTimesV(), [r(2, 4, 24, 24), r(2, 24, 64)]),
        "scaled_bmm_t": (ScaledBmmT(), [r(6, 24, 16), r(6, 24, 16)]),
        "repeat_kv": (RepeatKV(), [r(2, 24, 64), r(32, 64, scale=0.1)]),
        "scaled_linear_to_nchw": (ScaledLinearToNCHW(), [r(2, 7, 9, 48), r(24, 48, scale=0.1), r(24), r(24)]),
        # inputs at their captured strides: X read transposed, a residual (and so the output) stored so
        "transposed_x": (LinearGelu(), [r(2, 64, 24).transpose(1, 2), r(32, 64, scale=0.1), r(32)]),
        "transposed_residual": (ResidualAdd(), [r(2, 24, 96), r(64, 96, scale=0.1), r(64),
                                                r(2, 64, 24).transpose(1, 2)]),
    }


def _task(model: nn.Module, args: list) -> Task:
    gm = torch.export.export(model, tuple(args), strict=False).graph_module
    outs = model(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return Task("layout", "gemm", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(o) for o in outs],
                "sig", [], graph=gm)


def _epilogue_value(gm, args):
    """The value all outputs are layouts of (the epilogue's result), computed by torch."""
    src = gl.chain_source(_graph_outputs(gm)[0])
    return gemm._with_output(gm, src)(*args)[0]


@pytest.mark.parametrize("name", list(_cases()))
def test_layout_maps_reproduce_torch(name):
    model, args = _cases()[name]
    task = _task(model, args)
    gp = match_task(task, policy_for(task)).region
    assert gp.lay is not None
    L = gp.lay
    y = _epilogue_value(task.graph, args).contiguous().flatten()
    ref = model(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, want in zip(L.outs, ref):
        got = torch.as_strided(y, o.view.sizes, o.view.strides, o.view.base).reshape(o.shape)
        assert torch.equal(got, want)
        # the output covers its box of Y = [batch, M, N] exactly once (what a direct write needs),
        # or a whole number of times when it repeats it
        idx = torch.as_strided(torch.arange(y.numel()), o.view.sizes, o.view.strides, o.view.base).flatten()
        (b0, m0, n0), (b1, m1, n1) = o.box.lo, o.box.hi
        box = torch.arange(y.numel()).view(L.batch, L.M, L.N)[b0:b1, m0:m1, n0:n1].flatten()
        copies = idx.numel() // box.numel()
        assert copies * box.numel() == idx.numel() and (copies > 1) == o.box.repeats
        assert torch.equal(idx.sort().values, box.repeat_interleave(copies).sort().values)
    # the operands' strided views of the inputs give torch's product
    a_in, b_in = args[L.A.input], args[L.B.input]
    def operand(x, op, rows, cols):      # [outer, inner, rows, cols] as the kernel steps x's memory
        inner = L.batch // L.outer
        return torch.as_strided(x, (L.outer, inner, rows, cols), (op.s_outer, op.s_batch if op.batch > 1 else 0,
                                                                 op.s_row, op.s_col), x.storage_offset()
                                ).reshape(L.batch, rows, cols)
    A, B = operand(a_in, L.A, L.M, L.K), operand(b_in, L.B, L.K, L.N)
    node = gemm._gemm_node(task.graph)
    interp = {}

    class Grab(torch.fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            interp[n] = v
            return v
    Grab(task.graph).run(*args)
    y_raw = interp[node]
    if node.target is torch.ops.aten.linear.default or node.target is torch.ops.aten.addmm.default:
        y_raw = y_raw - (args[2] if len(args) > 2 else 0)     # the bias is the epilogue's, not the product's
    torch.testing.assert_close((A @ B).flatten(), y_raw.contiguous().flatten(), atol=1e-4, rtol=1e-4)


def test_heads_of_a_batch_loop_over_it():
    model, args = _cases()["attn_times_v_b2"]
    L = match_task(_task(model, args), None).region.lay
    assert (L.outer, L.batch) == (2, 8) and L.A.batch == L.B.batch == 4


def test_split_outputs_are_column_ranges():
    model, args = _cases()["split_qkv"]
    L = match_task(_task(model, args), None).region.lay
    assert [o.box.lo[2] for o in L.outs] == [0, 64, 128]
    assert [o.box.extent for o in L.outs] == [(1, 24, 64)] * 3


def test_pure_view_of_the_result_stays_on_the_plain_path():
    class AddmmView(nn.Module):     # GPT-2's c_proj: addmm + view, the result's own element order
        def forward(self, x, w, b):
            return torch.addmm(b, x, w).view(1, x.shape[0], w.shape[1])
    task = _task(AddmmView(), [torch.randn(16, 32), torch.randn(32, 48), torch.randn(48)])
    gp = match_task(task, policy_for(task)).region
    assert gp.lay is None          # sizes read at run time, cuBLASLt writes the output
    src = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))).candidates[0].source
    assert "CUBLASLT_EPILOGUE_BIAS" in src


def test_repeated_output_is_written_by_the_store_kernel():
    """GQA's repeat: the output's map steps 0 along the repeat; no direct cuBLASLt write."""
    model, args = _cases()["repeat_kv"]
    task = _task(model, args)
    L = match_task(task, policy_for(task)).region.lay
    assert [o.box.repeats for o in L.outs] == [True]
    src = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))).candidates[0].source
    assert "direct = false;" in src and "store_layout" in src


class _ViewThenAdd(nn.Module):
    """An elementwise op after the layout ops (ViT's out proj + transpose + residual)."""
    def forward(self, x, w, r):
        return F.linear(x, w).view(x.shape[0], 1, w.shape[0]).transpose(0, 1) + r


@pytest.mark.parametrize("model,args,why", [
    (_ViewThenAdd(), [torch.randn(5, 16), torch.randn(16, 16), torch.randn(1, 5, 16)], "elementwise ops after a view"),
])
def test_unsupported_layouts_say_why(model, args, why):
    task = _task(model, args)
    with pytest.raises(Unsupported, match=why):
        gemm.match(task.graph, policy_for(task))


def _sources(dtype) -> list[tuple[str, str]]:
    return seed_sources({name: _task(model, args) for name, (model, args) in _cases(dtype).items()})


def test_candidates_pass_the_static_check():
    srcs = _sources(torch.float32)
    assert len(srcs) == 2 * len(_cases())
    for name, s in srcs:
        assert build.check_source(s) == [], name


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cublas() is None, reason="needs nvcc and cuBLAS")
def test_layout_sources_compile_for_sm90a():
    srcs = _sources(torch.float32)[::2] + _sources(torch.bfloat16)[1::2]
    assert_compiles(srcs)


# ---- GPU: against torch through the real build (lead runs these) ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(_cases()))
def test_layout_gemms_match_torch(name, dtype):
    from torch_htam.launcher import Kernel
    from torch_htam.verify import strides_like
    model, args = _cases(dtype)[name]
    task = _task(model, args)
    policy = policy_for(task)
    cands = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=2, policy=policy)).candidates
    results = build.build_many([c.source for c in cands])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    inputs = [x.cuda() for x in args]
    with torch.no_grad():
        ref = model(*inputs)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    for cand, res in zip(cands, results):
        kernel = Kernel(res.so_path)
        # contiguous outputs (the runtime's) and outputs laid out as the specs say (verification's)
        for strided in (False, True):
            outs = [torch.empty_strided(r.shape, strides_like(s, r.shape) if strided else
                                        torch.empty(r.shape).stride(), dtype=r.dtype, device="cuda")
                    .fill_(float("nan")) for r, s in zip(ref, task.outputs)]
            assert kernel(inputs, outs) == 0, (cand.params, strided)
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                assert torch.isfinite(o).all(), (name, cand.params, strided)
                torch.testing.assert_close(o, r, atol=policy.atol, rtol=policy.rtol)


def test_scale_of_the_bare_product_is_cublaslt_alpha():
    """q @ k^T * 1/sqrt(d): one cuBLASLt call writes the scaled scores (no epilogue kernel); with a
    bias the scale stays in the epilogue kernel (cuBLASLt adds the bias after alpha)."""
    model, args = _cases()["scaled_bmm_t"]
    task = _task(model, args)
    first = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))).candidates[0]
    assert first.params["lt_epilogue"] and "epilogue_run" not in first.source
    model, args = _cases()["scaled_heads"]
    task = _task(model, args)
    first = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))).candidates[0]
    assert "epilogue_run(" in first.source


def test_a_layout_gemm_with_a_declared_range_is_not_proposed():
    """A linear viewed to heads has its sizes fixed at the example's (the layout path): over a
    declared batch range it would refuse every other size, so the expert proposes no candidate
    for it and says why; the same region without a range keeps its candidates."""
    from torch_htam.extract import extract_tasks
    x, w, b = torch.randn(2, 8, 64), torch.randn(64, 64), torch.randn(64)
    def gemm_task(dynamic):
        return next(t for t in extract_tasks(Heads().eval(), (x, w, b), dynamic=dynamic) if t.kind == "gemm")
    propose = lambda t: ExpertProposer().propose(ProposalRequest(t, "", [], n=2, policy=policy_for(t)))  # noqa: E731
    assert propose(gemm_task(None)).candidates
    ranged = propose(gemm_task({0: {0: (1, 16)}}))
    assert not ranged.candidates and "declared 2-16" in ranged.note, ranged.note
