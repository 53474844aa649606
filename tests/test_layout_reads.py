"""Elementwise regions that read across layouts: cat (rotary embeddings, ViT's class token) as
windowed reads, inputs read reshaped then permuted (ViT's patch conv output), outputs that reshape
a broadcast (GQA's repeat of k/v heads); and the partition that gives them such regions (ops after
a permute of an anchor's result start an elementwise region).

CPU: partition shapes, the lowering's semantics (an emulator of ExprProgram reads against torch),
Unsupported messages, nvcc for sm_90a. GPU (@gpu, the lead runs them): the generated kernels
through the real build and launcher against torch.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.coverage import path_of
from torch_htam.extract import extract
from torch_htam.policy import policy_for
from torch_htam.proposers.base import ProposalRequest
from torch_htam.proposers.expert import ExpertProposer
from torch_htam.proposers.expert.ir import Unsupported, lower
from torch_htam.task import Task, TensorSpec
from compile_check import assert_compiles, seed_sources


# ---- the patterns, as the zoo's models write them ---------------------------------------------

class Rotary(nn.Module):
    """Llama's apply_rotary_pos_emb on q [B, H, T, d] with cos / sin [B, 1, T, d]."""
    def forward(self, q, cos, sin):
        h = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., h:], q[..., :h]), dim=-1) * sin


class RotaryRepeat(nn.Module):
    """Llama's k: rotary, then the kv heads repeated for grouped-query attention (repeat_kv)."""
    def forward(self, k, cos, sin):
        B, KV, T, d = k.shape
        k = k * cos + torch.cat((-k[..., d // 2:], k[..., :d // 2]), dim=-1) * sin
        return k[:, :, None].expand(B, KV, 2, T, d).reshape(B, KV * 2, T, d)


class RotaryChunk(nn.Module):
    """The zoo's Llama: rotate_half by chunk, its halves read as slices of q."""
    def forward(self, q, cos, sin):
        a, b = q.chunk(2, dim=-1)
        return q * cos + torch.cat((-b, a), dim=-1) * sin


class RotarySplit(nn.Module):
    """rotate_half by split (sizes given): the same slices."""
    def forward(self, q, cos, sin):
        h = q.shape[-1] // 2
        a, b = q.split([h, h], dim=-1)
        return q * cos + torch.cat((-b, a), dim=-1) * sin


class SliceOfSlice(nn.Module):
    """Two stepped slices of one dim, read as one: x[:, ::2][:, 1::2] is x[:, 2::4]."""
    def forward(self, x, y):
        return x[:, ::2][:, 1::2] * 2 + y


class PatchTokens(nn.Module):
    """ViT's patch embedding after the conv: [B, C, h, w] -> [B, h * w, C], the class token
    before it, the position embedding added."""
    def forward(self, x, cls, pos):
        B, C = x.shape[:2]
        x = x.reshape(B, C, -1).permute(0, 2, 1)
        return torch.cat([cls.expand(B, -1, -1), x], dim=1) + pos


class ConvPermuteAdd(nn.Module):
    """Whisper's second conv: conv1d + GELU, permute to [B, T, C], + the positional embedding."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 3, stride=2, padding=1)

    def forward(self, x, pos):
        return F.gelu(self.conv(x)).permute(0, 2, 1) + pos


class PermuteAdd(nn.Module):
    """Whisper's encoder input: the conv output [B, C, T] read as [B, T, C] + the positional
    embedding [T, C] (torch gives the sum x's permuted layout, so pos is the read across it)."""
    def forward(self, x, pos):
        return x.permute(0, 2, 1) + pos


class PermuteAddRowMajor(nn.Module):
    """The same sum stored row-major: x is the read across the output's layout."""
    def forward(self, x, pos):
        return (x.permute(0, 2, 1) + pos).contiguous()


class TransposeGate(nn.Module):
    """A 4-d transposed read with outer dims: (x[B, H, S, T].transpose(2, 3) - 1) * y[B, H, T, S]."""
    def forward(self, x, y):
        return (x.transpose(2, 3) - 1) * y


class ScaleRows(nn.Module):
    """x[B, T, C] * s[T, 1] + 1: s steps by one along T but is one value along each row (no tile)."""
    def forward(self, x, s):
        return x * s + 1


class ProjTransposeAdd(nn.Module):
    """ViT's attention out proj (nn.MultiheadAttention, batch_first): linear + view + transpose +
    the residual."""
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x, r):
        T, B = x.shape[0] // r.shape[0], r.shape[0]
        return self.proj(x).view(T, B, 32).transpose(1, 0) + r


class QRotary(nn.Module):
    """Llama's q projection: linear + view + transpose to heads, then the rotary embedding."""
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 32, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, 4, 8).transpose(1, 2)
        return Rotary()(q, cos, sin)


class NormTransposed(nn.Module):
    """ViT's encoder block under nn.MultiheadAttention: layer_norm, then transpose(1, 0) to
    [T, B, C] (a row program's output stored through permuted strides)."""
    def forward(self, x, w, b):
        return F.layer_norm(x, x.shape[-1:], w, b, 1e-6).transpose(1, 0)


class SlicedPosNorm(nn.Module):
    """MinGPT's embedding sum before the first layer_norm: x + pos[:, :T] (a sliced read in the
    row program's prologue)."""
    def forward(self, x, pos, w, b):
        return F.layer_norm(x + pos[:, :x.shape[1]], x.shape[-1:], w, b)


def _cases(dtype=torch.float32, device="cpu") -> dict:
    def r(*s):
        return torch.randn(*s, dtype=dtype, device=device)
    return {
        "rotary": (Rotary(), [r(2, 4, 24, 16), r(2, 1, 24, 16), r(2, 1, 24, 16)]),
        "rotary_repeat": (RotaryRepeat(), [r(2, 2, 24, 16), r(2, 1, 24, 16), r(2, 1, 24, 16)]),
        "rotary_chunk": (RotaryChunk(), [r(2, 4, 24, 16), r(2, 1, 24, 16), r(2, 1, 24, 16)]),
        "rotary_split": (RotarySplit(), [r(2, 4, 24, 16), r(2, 1, 24, 16), r(2, 1, 24, 16)]),
        "patch_tokens": (PatchTokens(), [r(2, 32, 3, 5), r(1, 1, 32), r(1, 16, 32)]),
        "slice_of_slice": (SliceOfSlice(), [r(4, 32), r(4, 8)]),
        # sizes off the tile edges (32, 64): partial tiles on both dims
        "permute_add": (PermuteAdd(), [r(2, 70, 100), r(100, 70)]),
        "permute_add_row_major": (PermuteAddRowMajor(), [r(2, 70, 100), r(100, 70)]),
        "transpose_gate": (TransposeGate(), [r(2, 3, 36, 66), r(2, 3, 66, 36)]),
    }


def _all_cases(dtype=torch.float32, device="cpu") -> dict:
    """The elementwise cases and the row program whose output is stored transposed."""
    def r(*s):
        return torch.randn(*s, dtype=dtype, device=device)
    return {**_cases(dtype, device), "norm_transposed": (NormTransposed(), [r(2, 40, 64), r(64), r(64)]),
            "sliced_pos_norm": (SlicedPosNorm(), [r(2, 24, 64), r(1, 32, 64), r(64), r(64)])}


def _task(model: nn.Module, args: list) -> Task:
    gm = torch.export.export(model, tuple(args), strict=False).graph_module
    outs = model(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return Task("layout_reads", "elementwise", "", [TensorSpec.of(a) for a in args],
                [TensorSpec.of(o) for o in outs], "sig", [], graph=gm)


# ---- an emulator of elementwise ExprPrograms (the lowering's meaning, checked against torch) ----

_OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
        "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
        "select": torch.where}


def _read(prog, acc, x: torch.Tensor, grid: list[torch.Tensor]) -> torch.Tensor:
    """Access acc of input x at every iteration index (grid[d]: the index along dim d), as the
    host binds it: "dims" with slice starts / steps, a window (zero outside), a reshaped view."""
    assert acc.mode == "dims", acc
    x = x.reshape(acc.view) if acc.view else x
    starts = acc.starts or (0,) * x.dim()
    steps = acc.steps or (1,) * x.dim()
    idx, inside = [], torch.ones_like(grid[0], dtype=torch.bool)
    for k, d in enumerate(acc.dims):
        i = torch.zeros_like(grid[0]) if d < 0 or x.shape[k] == 1 and not acc.starts else grid[d]
        j = starts[k] + i * steps[k]
        if d >= 0 and acc.window and d == acc.window[0]:
            inside &= (grid[d] >= acc.window[1]) & (grid[d] < acc.window[2])
        idx.append(j)
    idx = [torch.where(inside, j, 0) for j in idx]
    return torch.where(inside, x[tuple(idx)].double(), 0.0)


def emulate(prog, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each output of an elementwise program, in float64, over its iteration space (row-major)."""
    grid = list(torch.meshgrid(*[torch.arange(s) for s in prog.shape], indexing="ij"))
    memo = {}

    def ev(e):
        if e in memo:
            return memo[e]
        op = e[0]
        if op == "in":
            v = _read(prog, prog.accesses[e[1]], inputs[prog.accesses[e[1]].input], grid)
        elif op in ("const", "iconst", "bconst"):
            v = torch.tensor(e[1], dtype=torch.float64)
        elif op == "coord":
            v = grid[e[1]].double()
        elif op == "round":
            v = ev(e[2]).to(getattr(torch, e[1])).double()
        else:
            v = _OPS[op](*[ev(a) for a in e[1:]])
        memo[e] = v
        return v
    return [ev(o.expr).expand(prog.shape) for o in prog.outputs]


@pytest.mark.parametrize("name", list(_cases()))
def test_lowering_reads_match_torch(name):
    model, args = _cases()[name]
    prog = lower(_task(model, args).graph, strided=True)
    ref = model(*args)
    (got,) = emulate(prog, args)
    assert got.numel() == ref.numel()
    torch.testing.assert_close(got.reshape(ref.shape), ref.double(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["rotary", "rotary_chunk", "rotary_split"])
def test_cat_reads_each_operand_inside_its_window_only(name):
    model, args = _cases()[name]
    prog = lower(_task(model, args).graph, strided=True)
    windows = sorted(a.window for a in prog.accesses if a.window)
    assert windows == [(3, 0, 8, 16), (3, 8, 16, 16)]
    assert prog.coords == (3,)


def test_reshaped_input_read_permuted_binds_the_reshape():
    model, args = _cases()["patch_tokens"]
    prog = lower(_task(model, args).graph, strided=True)
    (acc,) = [a for a in prog.accesses if a.view]
    assert acc.view == (2, 32, 15) and acc.window == (1, 1, 16, 16)


def test_row_output_transposed_is_stored_through_strides():
    model, args = _all_cases()["norm_transposed"]
    prog = lower(_task(model, args).graph)
    assert prog.kind == "rowwise" and prog.outputs[0].dims == (1, 0, 2)


def test_row_program_reads_a_sliced_input():
    model, args = _all_cases()["sliced_pos_norm"]
    prog = lower(_task(model, args).graph)
    assert prog.kind == "rowwise"
    (acc,) = [a for a in prog.accesses if a.starts]
    assert acc.input == 1 and acc.starts == (0, 0, 0) and acc.dims == (-1, 1, 2)


def test_repeat_output_iterates_over_the_broadcast():
    model, args = _cases()["rotary_repeat"]
    prog = lower(_task(model, args).graph, strided=True)
    assert prog.shape == (2, 2, 2, 24, 16)
    assert prog.size_source[0] == "split" and prog.size_source[2] == ((0,), (1, 2), (3,), (4,))


# ---- permuted reads: the tiled (transposing) elementwise kernel ---------------------------------

def _first_params(task: Task) -> dict:
    req = ProposalRequest(task, "seed", [], n=1, policy=policy_for(task))
    return ExpertProposer().propose(req).candidates[0].params


@pytest.mark.parametrize("name,tile_dims", [("permute_add", (2, 1)), ("permute_add_row_major", (1, 2)),
                                            ("transpose_gate", None)])
def test_permuted_read_takes_the_tiled_kernel_first(name, tile_dims):
    model, args = _cases()[name]
    task = _task(model, args)
    prog = lower(task.graph, strided=True)
    if tile_dims is not None:       # which dim the tile reads along and which it writes along
        assert prog.tile_dims == tile_dims
    else:
        assert prog.tile_dims is not None
    assert _first_params(task)["tile"] == 32
    model, args = _cases(torch.bfloat16)[name]
    assert _first_params(_task(model, args))["tile"] == 64   # 2-byte outputs: 64 x 64 tiles


@pytest.mark.parametrize("model,args", [
    (Rotary(), [torch.randn(2, 4, 24, 16), torch.randn(2, 1, 24, 16), torch.randn(2, 1, 24, 16)]),
    (ScaleRows(), [torch.randn(2, 24, 40), torch.randn(24, 1)]),        # broadcast along the row
    (PermuteAdd(), [torch.randn(2, 70, 100).permute(0, 2, 1).contiguous().permute(0, 2, 1),
                    torch.randn(100, 70)]),     # x laid out as the output: no read across
], ids=["rotary", "scale_rows", "permute_of_permuted"])
def test_plain_reads_keep_the_flat_kernel(model, args):
    task = _task(model, args)
    assert lower(task.graph, strided=True).tile_dims is None
    assert _first_params(task)["tile"] == 0


@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_tile_dims_are_picked_from_the_run_time_strides(tmp_path):
    """htam_tile_dims (the tiled kernel's host pick) on Spaces the host binds for x.permute(0, 2, 1)
    + pos over [8, 1500, 1280], run on this CPU: w, the dim the output steps by one along; r, the
    dim the staged reads step by one along; no tile for a plain or row-broadcast read."""
    import subprocess
    from torch_htam.proposers.expert.cuda import PRELUDE
    from torch_htam.proposers.expert.elementwise import TILE_DIMS
    main = r"""
#include <stdio.h>
static void run(const int64_t* s0, const int64_t* s1, const int64_t* so, unsigned stageable) {
  Space<3> s; s.ndim = 3; s.size[0] = 8; s.size[1] = 1500; s.size[2] = 1280;
  for (int d = 0; d < 3; ++d) { s.st[0][d] = s0[d]; s.st[1][d] = s1[d]; s.st[2][d] = so[d]; }
  htam_collapse<3>(s, 3, false);
  int r, w; unsigned staged;
  const bool ok = htam_tile_dims<3>(s, 2, stageable, 2, &r, &w, &staged);
  printf("%d %d %d %u\n", (int)ok, ok ? r : -1, ok ? w : -1, staged);
}
int main() {
  const int64_t x[3] = {1920000, 1, 1500}, pos[3] = {0, 1280, 1}, rowmajor[3] = {1920000, 1280, 1},
                row_scale[3] = {0, 1, 0};
  run(x, pos, x, 3u);              // output laid out as x: pos is staged
  run(x, pos, rowmajor, 3u);       // row-major output: x is staged
  run(rowmajor, pos, rowmajor, 3u);
  run(rowmajor, row_scale, rowmajor, 3u);
  run(x, pos, rowmajor, 2u);       // x not stageable (an integer or windowed read)
  return 0;
}
"""
    (tmp_path / "t.cu").write_text(PRELUDE + TILE_DIMS + main)
    inc = str(build.CSRC)
    subprocess.run([paths.nvcc_path(), "-std=c++17", "-I", inc, "-o", str(tmp_path / "t"), str(tmp_path / "t.cu")],
                   check=True, capture_output=True, timeout=300)
    got = subprocess.run([str(tmp_path / "t")], check=True, capture_output=True, text=True).stdout.split("\n")
    assert got[:5] == ["1 2 1 2", "1 1 2 1", "0 -1 -1 0", "0 -1 -1 0", "0 -1 -1 0"]


@pytest.mark.parametrize("model,args,why", [
    # a cat operand that is itself a cat: one window per read
    (type("NestedCat", (nn.Module,), {"forward": lambda self, a, b, c: torch.cat([torch.cat([a, b], -1), c], -1) * 2})(),
     [torch.randn(4, 3), torch.randn(4, 5), torch.randn(4, 2)], "cat of a cat's operand"),
    # cat then a row op in one region: row kernels read no concatenated operands
    (type("CatNorm", (nn.Module,), {"forward": lambda self, a, b: F.layer_norm(torch.cat([a, b], -1), (8,))})(),
     [torch.randn(4, 3), torch.randn(4, 5)], "only the elementwise kernel reads concatenated"),
])
def test_unsupported_cats_say_why(model, args, why):
    with pytest.raises(Unsupported, match=why):
        lower(_task(model, args).graph, strided=True)
        raise AssertionError("lowered")


# ---- partition: ops after a permute of an anchor's result --------------------------------------

def _regions(model, args):
    ex = extract(model, tuple(args))
    return [(t.kind, sorted({str(n.target).split(".")[1] for n in t.graph.graph.nodes
                             if n.op == "call_function"}), path_of(t)) for t in ex.tasks]


def test_conv_keeps_its_epilogue_and_the_permuted_add_reads_it_in_place():
    regions = _regions(ConvPermuteAdd().eval(), [torch.randn(1, 8, 32), torch.randn(1, 16, 16)])
    kinds = {k: (ops, why) for k, ops, why in regions}
    assert set(kinds) == {"conv", "elementwise"}
    assert "gelu" in kinds["conv"][0] and "permute" not in kinds["conv"][0]
    assert "permute" in kinds["elementwise"][0] and "add" in kinds["elementwise"][0]
    assert all(why is None for _, _, why in regions), regions


class SqueezeExcite(nn.Module):
    """EfficientNet's gate: conv 1x1 on the pooled [B, C, 1, 1] + sigmoid, times the input."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(F.adaptive_avg_pool2d(x, 1))) * x


def test_gate_spread_over_the_input_is_not_the_convs_epilogue():
    regions = _regions(SqueezeExcite().eval(), [torch.randn(2, 16, 8, 8)])
    conv = next(ops for k, ops, _ in regions if k == "conv")
    assert "sigmoid" in conv and "mul" not in conv
    assert any(k == "elementwise" and "mul" in ops for k, ops, _ in regions), regions
    assert all(why is None for _, _, why in regions), regions


def test_gemm_writes_the_transposed_layout_and_the_residual_add_follows():
    regions = _regions(ProjTransposeAdd().eval(), [torch.randn(10, 32), torch.randn(2, 5, 32)])
    kinds = {k: (ops, why) for k, ops, why in regions}
    assert set(kinds) == {"gemm", "elementwise"}
    assert "transpose" in kinds["gemm"][0] and "add" not in kinds["gemm"][0]
    assert all(why is None for _, _, why in regions), regions


def test_rotary_after_the_q_heads_is_one_elementwise_region():
    regions = _regions(QRotary().eval(), [torch.randn(1, 16, 32), torch.randn(1, 1, 16, 8),
                                          torch.randn(1, 1, 16, 8)])
    assert [k for k, _, _ in regions].count("elementwise") == 1, regions
    ew = next(ops for k, ops, _ in regions if k == "elementwise")
    assert {"cat", "neg", "mul", "add"} <= set(ew)
    assert all(why is None for _, _, why in regions), regions


# ---- nvcc and the GPU ---------------------------------------------------------------------------

def _sources(dtype) -> list[tuple[str, str]]:
    return seed_sources({name: _task(model, args) for name, (model, args) in _all_cases(dtype).items()})


def test_candidates_pass_the_static_check():
    srcs = _sources(torch.float32)
    assert len(srcs) == 2 * len(_all_cases())
    for name, s in srcs:
        assert build.check_source(s) == [], name


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_layout_read_sources_compile_for_sm90a():
    assert_compiles(_sources(torch.float32)[::2] + _sources(torch.bfloat16)[1::2])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name", list(_all_cases()))
def test_layout_read_kernels_match_torch(name, dtype):
    from torch_htam.launcher import Kernel
    from torch_htam.verify import poison_
    model, args = _all_cases(dtype)[name]
    task = _task(model, args)
    policy = policy_for(task)
    cands = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=2, policy=policy)).candidates
    results = build.build_many([c.source for c in cands])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    inputs = [x.cuda() for x in args]
    with torch.no_grad():
        ref = model(*inputs)
    for cand, res in zip(cands, results):
        kernel = Kernel(res.so_path)
        out = poison_(torch.empty_like(ref))
        assert kernel(inputs, [out]) == 0, cand.params
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), (name, cand.params)
        torch.testing.assert_close(out, ref, atol=policy.atol, rtol=policy.rtol)
