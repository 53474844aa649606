"""Attention: SDPA and hand-written (MinGPT-style) attention as one task, the expert's flash
kernel (proposers/expert/attention.py + attention.cuh).

CPU: the region is one attention task with a path; what match read (operand views as strides,
score steps, masks) is run by a float64 emulation of the kernel's contract (emulate) and compared
with the task's own graph, so the binding of views and the step order are checked without a GPU;
clear Unsupported messages; nvcc for sm_90a. GPU (@gpu, the lead runs them): the built kernel
against torch for each dtype, mask kind, causal, GQA, tails and head dims 64 / 128.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.coverage import path_of
from torch_htam.extract import extract
from torch_htam.policy import policy_for
from torch_htam.proposers.expert import attention
from torch_htam.proposers.expert.proposer import match_task, tuning_grid
from compile_check import assert_checked_and_compiles


class Sdpa(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, *mask):
        return F.scaled_dot_product_attention(q, k, v, **self.kw, **({"attn_mask": mask[0]} if mask else {}))


class HeadsSdpa(nn.Module):
    """GPT-2's shape of it: q from a [B, L, C] tensor viewed to heads, the result back to [B, L, C]."""

    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads

    def forward(self, x, k, v):
        B, L, C = x.shape
        q = x.view(B, L, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, L, C)


class MinGPTAttention(nn.Module):
    """minGPT's attention core: split of qkv, heads, matmul, scale, causal masked_fill, softmax,
    eval dropout, matmul, heads back."""

    def __init__(self, heads: int, block: int, div: bool = False):
        super().__init__()
        self.heads, self.div = heads, div
        self.drop = nn.Dropout(0.1)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, qkv):
        B, T, C3 = qkv.shape
        C = C3 // 3
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1)
        att = att / math.sqrt(k.size(-1)) if self.div else att * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.drop(torch.softmax(att, dim=-1))
        return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


class AddMaskAttention(nn.Module):
    """An additive mask and torch.where on the scores, p @ v over a bmm-free 4-D matmul."""

    def forward(self, q, k, v, bias, keep):
        att = torch.matmul(q, k.transpose(-1, -2)) * 0.125 + bias
        att = torch.where(keep, att, -1e4)
        return torch.matmul(att.softmax(-1), v)


def _one_task(model, *inputs):
    ex = extract(model.eval(), inputs)
    tasks = [t for t in ex.tasks if t.kind == "attention"]
    assert len(tasks) == 1, [(t.kind, t.ops) for t in ex.tasks]
    return tasks[0]


# ---- a float64 emulation of the kernel's contract ----------------------------------------------

def _bound(t: torch.Tensor, b: attention.Bind) -> torch.Tensor:
    """t seen as attention.cuh's fa::bind reads it: 4 dims (batch, head, row, col)."""
    if b.mode == 0:
        sz = [1] * (4 - t.dim()) + list(t.shape)
        st = [0] * (4 - t.dim()) + list(t.stride())
        st = [0 if n == 1 else s for n, s in zip(sz, st)]
        return t.as_strided(sz, st, t.storage_offset())
    grown = {i for i in b.grow if i >= 0} if b.mode == 1 else set()
    assert all(n == m or i in grown for i, (n, m) in enumerate(zip(t.shape, b.src))) and t.dim() == len(b.src)
    size = [t.shape[i] if i >= 0 else n for n, i in zip(b.size, b.grow)] if b.mode == 1 else list(b.size)
    if b.mode == 1:
        st = [sum(c * s for c, s in zip(row, t.stride())) for row in b.coef]
        off = sum(c * s for c, s in zip(b.base, t.stride()))
    else:
        assert t.is_contiguous()
        st, off = list(b.fst), b.foff
    st = [0 if n == 1 else s for n, s in zip(size, st)]
    return t.as_strided(size, st, t.storage_offset() + off)


def emulate(am: attention.AttnMatch, inputs: list[torch.Tensor], out: torch.Tensor) -> None:
    q, k, v = (_bound(inputs[b.index], b).double() for b in (am.q, am.k, am.v))
    B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    k, v = (t.repeat_interleave(H // t.shape[1], 1).expand(B, H, -1, -1) for t in (k, v))
    x = q @ k.transpose(-1, -2)
    masks = [_bound(inputs[m.bind.index], m.bind).double().expand(B, H, L, S) for m in am.masks]
    for st in am.steps:
        if st.op == "mul":
            x = x * st.value
        elif st.op == "div":
            x = x / st.value
        else:
            m = masks[am.mask_of[id(st.mask.node)]]
            if st.op == "bias":
                x = x + m
            else:
                import operator
                cmp = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
                       "gt": operator.gt, "ge": operator.ge}
                cond = cmp[st.mask.cond[0]](m, st.mask.cond[1]) if st.mask.cond else m != 0
                cond = ~cond if st.mask.negate else cond
                x = torch.where(cond, torch.full_like(x, st.value), x)
    if am.causal:
        x = x.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), float("-inf"))
    mx = x.amax(-1, keepdim=True)
    p = torch.exp(x - torch.where(mx == float("-inf"), 0.0, mx))
    l = p.sum(-1, keepdim=True)
    o = (p @ v) / l
    if am.zero_empty:
        o = torch.where(l > 0, o, 0.0)
    _bound(out, am.o).copy_(o.to(out.dtype))


def _inputs(task, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in task.inputs:
        extent = 1 + sum((n - 1) * st for n, st in zip(s.shape, s.stride) if n > 0)
        if s.dtype == "bool":
            flat = torch.rand(extent, generator=g) > 0.3
        else:
            flat = torch.randn(extent, generator=g).to(s.torch_dtype)
        out.append(flat.as_strided(s.shape, s.stride))
    return out


def check_emulation(task, seed: int = 0, atol: float = 1e-5, am=None):
    """The kernel's contract (emulate) against the task's graph on the task's inputs; am: the match
    to emulate (default the task's own: another size's match must read these tensors too)."""
    am = am or attention.match(task.graph, policy_for(task))
    ins = _inputs(task, seed)
    with torch.no_grad():
        ref = task.graph(*ins)[0]
    out = torch.full(ref.shape, float("nan"), dtype=ref.dtype).as_strided(ref.shape, ref.stride())
    emulate(am, ins, out)
    assert not torch.isnan(out).any() or torch.isnan(ref).any()
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=atol, equal_nan=True)
    return am


# ---- CPU: matching and binding -----------------------------------------------------------------

QKV = (torch.randn(2, 3, 10, 16), torch.randn(2, 3, 12, 16), torch.randn(2, 3, 12, 16))


@pytest.mark.parametrize("kw,mask", [
    ({}, None), ({"is_causal": True}, None), ({"scale": 0.3}, None),
    ({}, torch.rand(10, 12) > 0.3), ({}, torch.randn(1, 3, 10, 12)), ({"is_causal": True, "scale": 2.0}, None),
], ids=["plain", "causal", "scale", "bool_mask", "additive_mask", "causal_scale"])
def test_sdpa_is_one_task_with_a_path(kw, mask):
    task = _one_task(Sdpa(**kw), *QKV, *([mask] if mask is not None else []))
    assert task.ops == ["aten.scaled_dot_product_attention.default"]
    assert path_of(task) is None
    am = check_emulation(task)
    assert am.causal == kw.get("is_causal", False) and len(am.masks) == (mask is not None)


def test_sdpa_causal_with_more_queries_than_keys_is_top_left():
    q, k, v = torch.randn(1, 2, 12, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    check_emulation(_one_task(Sdpa(is_causal=True), q, k, v))


def test_sdpa_gqa():
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    am = check_emulation(_one_task(Sdpa(enable_gqa=True), q, k, v))
    assert am.gqa


def test_views_around_sdpa_are_read_in_place():
    task = _one_task(HeadsSdpa(4), torch.randn(2, 10, 64), torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16))
    am = check_emulation(task)
    assert am.q.mode == 1 and am.o.mode != 0     # q and the output through their views


class QkvHeads(nn.Module):
    """An encoder's attention: q, k, v split from one (B, L, 3C) projection, viewed to heads, the
    result back to (B, L, C): each operand a strided view of a tensor with rows 3C apart."""

    def forward(self, qkv):
        B, L, C3 = qkv.shape
        q, k, v = (t.view(B, L, 4, C3 // 12).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, C3 // 3)


@pytest.mark.parametrize("model, at, other, grown", [
    (QkvHeads(), lambda n: (torch.randn(n, 10, 192),), 7, 0),        # batch: a served encoder's
    (QkvHeads(), lambda n: (torch.randn(2, n, 192),), 13, 1),        # sequence
    (HeadsSdpa(4), lambda n: (torch.randn(2, n, 64), torch.randn(2, 4, n, 16), torch.randn(2, 4, n, 16)), 13, 1),
], ids=["qkv_batch", "qkv_rows", "gpt_rows"])
def test_views_matched_at_one_size_read_another(model, at, other, grown):
    """A ranged task's views are traced at its example size; the binding reads the batch or
    sequence it passes through at any other size (Bind.grow), as the task's own graph computes
    there, so one kernel serves the range (the served encoder's 12 attention kernels were refused
    at every batch but the example's: HTAM_ERR_SHAPE)."""
    am = attention.match(_one_task(model, *at(4)).graph, policy_for(_one_task(model, *at(4))))
    assert any(b.mode == 1 for b in (am.q, am.k, am.v, am.o))
    assert all(grown in b.grow or all(i < 0 for i in b.grow) for b in (am.q, am.o) if b.mode == 1)
    check_emulation(_one_task(model, *at(other)), am=am)


@pytest.mark.parametrize("div", [False, True], ids=["mul", "div"])
def test_mingpt_attention_is_one_region(div):
    task = _one_task(MinGPTAttention(4, 32, div), torch.randn(2, 16, 96))
    names = [o.split(".")[1] for o in task.ops]
    assert names.count("matmul") == 2 and "softmax" in names and "masked_fill" in names and "eq" in names
    assert path_of(task) is None
    am = check_emulation(task)
    assert not am.zero_empty and [s.op for s in am.steps] == ["div" if div else "mul", "fill"]


def test_additive_mask_and_where_attention():
    q, k, v = torch.randn(2, 2, 8, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    task = _one_task(AddMaskAttention(), q, k, v, torch.randn(2, 1, 8, 12), torch.rand(8, 12) > 0.2)
    am = check_emulation(task)
    assert [s.op for s in am.steps] == ["mul", "bias", "fill"]


def test_unsupported_head_dim_says_so():
    q = torch.randn(1, 2, 8, 320)
    task = _one_task(Sdpa(), q, q, q)
    why = path_of(task)
    assert why is not None and "head dim 320" in why and "up to 256" in why


def test_head_dims_off_the_16_byte_grid_are_read_by_elements():
    """E = 12 and Ev = 20: padded to 16 / 32 on chip, element loads (no 16-byte chunks)."""
    q, k, v = torch.randn(1, 2, 9, 12), torch.randn(1, 2, 7, 12), torch.randn(1, 2, 7, 20)
    am = check_emulation(_one_task(Sdpa(), q, k, v))
    assert (am.head_dim, am.v_dim) == (12, 20)


def test_dropout_in_sdpa_is_unsupported():
    task = _one_task(Sdpa(dropout_p=0.1), *QKV)
    assert "dropout" in path_of(task)


def test_training_dropout_breaks_the_pattern():
    """A live dropout between softmax and @ v is no no-op: the chain is not one attention."""
    class Live(nn.Module):
        def forward(self, q, k, v):
            return F.dropout(torch.softmax(q @ k.transpose(-1, -2), -1), 0.5, True) @ v
    ex = extract(Live().eval(), QKV)
    assert not any(t.kind == "attention" for t in ex.tasks)


def test_grid_is_valid_and_distinct():
    task = _one_task(Sdpa(is_causal=True), *(t.to(torch.bfloat16) for t in QKV))
    grid = tuning_grid(task, policy_for(task))
    assert len(grid) >= 6 and len({tuple(sorted(p.items())) for p in grid}) == len(grid)
    tm = match_task(task, policy_for(task))
    assert all(attention.smem_bytes(tm.region, p) <= attention.SMEM_LIMIT for p in grid)


def test_fp32_runs_on_tf32_tensor_cores_only_where_the_policy_allows_tf32():
    """An fp32 region searches the TF32 kernel's tiles (first: its default) under a TF32 policy, and
    under strict fp32 never: a params dict asking for TF32 there still renders the FMA kernel."""
    task = _one_task(Sdpa(scale=1.0), *QKV, torch.randn(1, 3, 10, 12))
    tf32, strict = policy_for(task, matmul=True), policy_for(task, matmul=False)
    assert (tf32.name, strict.name) == ("tf32", "fp32")
    loose, exact = match_task(task, tf32), match_task(task, strict)
    assert loose.defaults.get("tf32") is True and loose.defaults.get("split") and not exact.defaults.get("tf32")
    grid = tuning_grid(task, tf32)
    assert any(p.get("tf32") for p in grid) and any(p.get("tf32") is False for p in grid)
    assert not any(p.get("tf32") for p in tuning_grid(task, strict))
    assert all(attention.smem_bytes(loose.region, p) <= attention.SMEM_LIMIT for p in grid)
    assert attention._tf32(loose.region, loose.defaults)
    assert not attention._tf32(exact.region, dict(exact.defaults, tf32=True, stages=2))
    assert "tf32_tensor_cores" in attention.tags(loose.region, loose.defaults)


# ---- cuDNN's fused attention (csrc/cudnn_sdpa.cu) -------------------------------------------------

def test_cudnn_attention_takes_plain_scaled_attention_in_half_types_only():
    """cuDNN's variant runs a region of one scale and at most a causal mask, q/k/v of one head dim,
    in bf16 / fp16; the reason says what stops it otherwise."""
    bf = lambda *ts: tuple(t.to(torch.bfloat16) for t in ts)      # noqa: E731
    ok = [_one_task(Sdpa(is_causal=True), *bf(*QKV)), _one_task(Sdpa(scale=0.3), *bf(*QKV))]
    for task in ok:
        assert attention.cudnn_why_not(match_task(task, policy_for(task)).region) is None
    assert [attention.cudnn_scale(match_task(t, policy_for(t)).region) for t in ok] == pytest.approx([16 ** -0.5, 0.3])
    # minGPT's causal mask is a tensor it reads (a tril buffer), not is_causal
    mingpt = _one_task(MinGPTAttention(4, 32), *bf(torch.randn(2, 16, 96)))
    assert "causal mask only" in attention.cudnn_why_not(match_task(mingpt, policy_for(mingpt)).region)
    masked = _one_task(Sdpa(), *bf(*QKV), torch.rand(10, 12) > 0.3)
    fp32 = _one_task(Sdpa(is_causal=True), *QKV)
    q, v = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16), torch.randn(1, 2, 8, 24, dtype=torch.bfloat16)
    for task, words in ((masked, "causal mask only"), (fp32, "bf16 / fp16"), (_one_task(Sdpa(), q, q, v), "head dims")):
        assert words in attention.cudnn_why_not(match_task(task, policy_for(task)).region)


@pytest.mark.parametrize("built", [True, False])
def test_cudnn_attention_is_in_the_grid_once_its_library_is_built(built, monkeypatch):
    """The expert offers cuDNN's attention (one setting: it reads no tile knob) only where its
    library is built, tagged with its own strategy; the HTG's move to it is that setting."""
    from torch_htam.proposers.expert.strategies import moves_for
    monkeypatch.setattr(attention, "_cudnn_library", lambda: built)
    task = _one_task(Sdpa(is_causal=True), *(t.to(torch.bfloat16) for t in QKV))
    tm = match_task(task, policy_for(task))
    grid = tuning_grid(task, policy_for(task))
    cudnn = [p for p in grid if p.get("backend") == "cudnn"]
    assert cudnn == ([{**tm.defaults, "backend": "cudnn"}] if built else [])
    assert moves_for("cudnn_fused_attention", tm.region.facts) == ([{"backend": "cudnn"}] if built else [])
    if built:
        assert attention.tags(tm.region, cudnn[0]) == ["cudnn_fused_attention"]
        assert "htam_cudnn_sdpa" in tm.render(cudnn[0])


def _cudnn_set() -> list[tuple[str, str]]:
    """cuDNN-variant sources: causal in place, GPT-2's heads view, GQA, fp16."""
    bf = torch.bfloat16
    cases = [(Sdpa(is_causal=True), tuple(t.to(bf) for t in QKV)),
             (HeadsSdpa(4), (torch.randn(2, 16, 64, dtype=bf), torch.randn(2, 4, 16, 16, dtype=bf),
                             torch.randn(2, 4, 16, 16, dtype=bf))),
             (Sdpa(enable_gqa=True), (torch.randn(1, 8, 20, 64, dtype=bf), torch.randn(1, 2, 30, 64, dtype=bf),
                                      torch.randn(1, 2, 30, 64, dtype=bf))),
             (Sdpa(), tuple(t.to(torch.float16) for t in QKV))]
    out = []
    for i, (model, ins) in enumerate(cases):
        task = _one_task(model, *ins)
        out.append((f"cudnn/{i}", attention.render_cudnn(match_task(task, policy_for(task)).region)))
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None or build.find_cudnn_frontend() is None or build.find_cudnn() is None,
                    reason="needs nvcc, cuDNN and its frontend's headers (pip install --no-deps nvidia-cudnn-frontend)")
def test_cudnn_attention_library_builds_once_and_its_candidates_link_it():
    """csrc/cudnn_sdpa.cu builds for sm_90a (minutes: the frontend's headers), once, and loads with
    every symbol resolved (cuDNN, NVRTC: no GPU needed to load); the expert's cuDNN candidates
    compile in seconds against it, name it as a dependency and load too."""
    import ctypes
    import os
    import subprocess
    so, err = build.library(attention.CUDNN_LIBRARY, "sm_90a")
    assert so is not None, err
    ctypes.CDLL(str(so), mode=os.RTLD_NOW)
    assert build.library(attention.CUDNN_LIBRARY, "sm_90a") == (so, "")       # built: found, not rebuilt
    todo = _cudnn_set()
    assert all(build.check_source(src) == [] for _, src in todo)
    results = build.build_many([src for _, src in todo], arch="sm_90a")
    assert all(r.ok for r in results), [(n, r.error[:800]) for (n, _), r in zip(todo, results) if not r.ok]
    needed = subprocess.run(["readelf", "-d", results[0].so_path], capture_output=True, text=True).stdout
    assert so.name in needed
    ctypes.CDLL(results[0].so_path, mode=os.RTLD_NOW)


# ---- nvcc ----------------------------------------------------------------------------------------

def _compile_set() -> list[tuple[str, str]]:
    out = []
    cases = [(Sdpa(is_causal=True), QKV, None), (Sdpa(), QKV, torch.rand(10, 12) > 0.3),
             (Sdpa(), QKV, torch.randn(1, 3, 10, 12)), (MinGPTAttention(4, 32), (torch.randn(2, 16, 96),), None)]
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for i, (model, ins, mask) in enumerate(cases):
            ins = tuple(t.to(dt) for t in ins) + ((mask if mask.dtype == torch.bool else mask.to(dt),) if mask is not None else ())
            task = _one_task(model, *ins)
            tm = match_task(task, policy_for(task))
            out.append((f"{dt}/{i}", tm.render(tm.defaults)))
    q = torch.randn(1, 2, 8, 128, dtype=torch.bfloat16)
    task = _one_task(Sdpa(), q, q, q)
    tm = match_task(task, policy_for(task))
    out += [(f"d128/{p}", tm.render(p)) for p in tuning_grid(task, policy_for(task))[:3]]
    q, v = torch.randn(1, 2, 8, 12, dtype=torch.float16), torch.randn(1, 2, 8, 20, dtype=torch.float16)
    task = _one_task(Sdpa(is_causal=True), q, q, v)
    tm = match_task(task, policy_for(task))
    out.append(("d12", tm.render(tm.defaults)))
    for i, (model, ins, mask) in enumerate(cases):      # fp32 on TF32 tensor cores
        task = _one_task(model, *ins, *(() if mask is None else (mask,)))
        tm = match_task(task, policy_for(task, matmul=True))
        out += [(f"tf32/{i}/{p}", tm.render(p)) for p in tuning_grid(task, policy_for(task, matmul=True))[:2]]
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_attention_sources_compile_for_sm90a():
    assert_checked_and_compiles(_compile_set())


# ---- GPU: the kernel against torch -----------------------------------------------------------------

GPU_CASES = [
    # (dtype, B, H, Hk, L, S, D, causal, mask)
    ("bfloat16", 2, 4, 4, 512, 512, 64, True, None),
    ("bfloat16", 2, 4, 4, 197, 131, 64, False, None),
    ("float16", 1, 4, 2, 100, 300, 128, False, "bool"),
    ("bfloat16", 1, 2, 2, 64, 77, 128, False, "float"),
    ("bfloat16", 1, 2, 2, 300, 100, 64, True, None),
    ("float32", 2, 3, 3, 130, 257, 64, True, None),
    ("float32", 1, 2, 2, 77, 64, 128, False, "bool"),
    ("float32", 1, 2, 1, 33, 100, 64, False, "float"),
    ("bfloat16", 1, 3, 3, 50, 70, 20, True, None),          # head dim off the 16-byte grid: element loads
    ("float32", 1, 3, 3, 50, 70, 24, False, "bool"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "_".join(map(str, c)))
def test_kernel_matches_torch(case):
    from torch_htam.launcher import Kernel
    dt, B, H, Hk, L, S, D, causal, mask = case
    dtype = getattr(torch, dt)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, h, n, D, dtype=dtype) for h, n in ((H, L), (Hk, S), (Hk, S)))
    m = None if mask is None else (torch.rand(L, S) > 0.3 if mask == "bool" else torch.randn(1, H, L, S, dtype=dtype))
    model = Sdpa(is_causal=causal, enable_gqa=Hk != H)
    task = _one_task(model, q, k, v, *([m] if m is not None else []))
    policy = policy_for(task)
    tm = match_task(task, policy)
    params = [tm.defaults] + tuning_grid(task, policy)[1:4]
    results = build.build_many([tm.render(p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    ins = [t.cuda() for t in (q, k, v) + ((m,) if m is not None else ())]
    with torch.no_grad():
        ref = model(*ins)
    for p, res in zip(params, results):
        out = torch.full_like(ref, float("nan"))
        assert Kernel(res.so_path)(ins, [out]) == 0, p
        torch.cuda.synchronize()
        torch.testing.assert_close(out, ref, atol=policy.atol, rtol=policy.rtol, msg=lambda s: f"{p}: {s}")


TF32_CASES = [
    # (B, H, Hk, L, S, D, causal, mask): T5's encoder (unscaled, a bias), tails, GQA, an odd head dim
    (4, 8, 8, 512, 512, 64, False, "float"),
    (2, 3, 3, 130, 257, 64, True, None),
    (1, 4, 2, 100, 300, 128, False, "bool"),
    (1, 3, 3, 50, 70, 18, True, None),                      # head dim off the 16-byte grid: element loads
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", TF32_CASES, ids=lambda c: "_".join(map(str, c)))
def test_tf32_kernel_passes_verification(case):
    """fa_mma on TF32 (the Tf32 tag) under the TF32 policy, through the product's own protocol
    (verify: seeds, input distributions, a float64 judgement), at each of its first tiles."""
    from torch_htam.launcher import Kernel
    from torch_htam.task import load_reference
    from torch_htam.verify import verify
    B, H, Hk, L, S, D, causal, mask = case
    q, k, v = (torch.randn(B, h, n, D) for h, n in ((H, L), (Hk, S), (Hk, S)))
    m = None if mask is None else (torch.rand(L, S) > 0.3 if mask == "bool" else torch.randn(1, H, L, S))
    model = Sdpa(is_causal=causal, enable_gqa=Hk != H, **({"scale": 1.0} if mask == "float" else {}))
    task = _one_task(model, q, k, v, *([m] if m is not None else []))
    policy = policy_for(task, matmul=True)
    tm = match_task(task, policy)
    tf32 = [p for p in [tm.defaults] + tuning_grid(task, policy) if p.get("tf32")]
    params = [p for p in tf32 if p["split"]][:2] + [p for p in tf32 if not p["split"]][:1]
    if mask == "float":                # unscaled scores: only 3xTF32 holds the policy (Tf32<SPLIT>)
        params = params[:2]
    results = build.build_many([tm.render(p) for p in params])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    ref = load_reference(task).cuda()
    for p, res in zip(params, results):
        ok, reason, detail, errs = verify(task, Kernel(res.so_path), ref, policy)
        assert ok, (p, reason, detail, errs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mingpt_kernel_matches_torch(dtype):
    """The hand-written region at GPT-2 size, T = 200 (a tail in both L and S), through its real
    inputs: the qkv tensor it splits and the tril buffer it compares with 0."""
    from torch_htam.launcher import Kernel
    torch.manual_seed(0)
    model = MinGPTAttention(12, 512).to(dtype).eval()
    ex = extract(model, (torch.randn(2, 200, 3 * 768, dtype=dtype),))
    task = next(t for t in ex.tasks if t.kind == "attention")
    policy = policy_for(task)
    tm = match_task(task, policy)
    res = build.build_many([tm.render(tm.defaults)])[0]
    assert res.ok, res.error
    ins = [v.cuda() for v in ex.values[task.signature]]
    with torch.no_grad():
        ref = task.graph.cuda()(*ins)[0]
    out = torch.full_like(ref, float("nan"))
    assert Kernel(res.so_path)(ins, [out]) == 0
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, atol=policy.atol, rtol=policy.rtol)

def test_bert_example_attention_is_covered():
    """examples/bert_encoder.py: q @ k^T / sqrt(d) + mask_bias, softmax, dropout, @ v (the
    additive padding mask is a region input: every layer reads the same one)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "bert_encoder.py"
    spec = importlib.util.spec_from_file_location("bert_encoder", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, inputs = mod.get_model()
    ex = extract(model.eval(), inputs)
    tasks = [t for t in ex.tasks if t.kind == "attention"]
    assert len(tasks) == 1 and tasks[0].count >= 2 and path_of(tasks[0]) is None
    am = check_emulation(tasks[0])
    assert [s.op for s in am.steps] == ["div", "bias"]


@pytest.mark.parametrize("name", ["vit", "gpt2", "bert", "llama", "t5", "whisper_encoder", "mingpt"])
def test_zoo_attention_tasks_read_their_views_right(name):
    """Every attention task of the zoo's transformers has a path, and what match read of it (views
    of split / selected / transposed q, k, v, T5's additive position bias, the heads folded back
    into [B, L, C]) gives torch's answer under the kernel's contract."""
    from zoo_models import ZOO
    try:
        model, inputs = ZOO[name]()
    except ImportError as e:
        pytest.skip(f"{name}: {e}")
    tasks = [t for t in extract(model, inputs).tasks if t.kind == "attention"]
    assert tasks
    for t in tasks:
        assert path_of(t) is None, (t.name, path_of(t))
        check_emulation(t)


def test_mask_added_before_the_scores_and_a_scale_after_the_fill():
    """mask + s (the mask first) and a scale after masked_fill: the steps keep torch's order."""
    class M(nn.Module):
        def forward(self, q, k, v, bias, drop):
            att = bias + q @ k.transpose(-1, -2)
            att = att.masked_fill(drop, -1e9) * 0.5
            return torch.softmax(att, dim=-1) @ v
    q, k, v = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    task = _one_task(M(), q, k, v, torch.randn(8, 8), torch.rand(1, 1, 8, 8) > 0.7)
    am = check_emulation(task)
    assert [s.op for s in am.steps] == ["bias", "fill", "mul"]


def test_gpt_block_example_attention_is_covered():
    """examples/gpt_block.py, the README's flagship: y.transpose(1, 2).contiguous().view(B, T, C)
    is captured as a transpose and a view (the no-op contiguous dropped), a view that is illegal
    on a strided tensor; match must still read the output through it."""
    from torch_htam.modelspec import load_model_spec
    from pathlib import Path
    model, inputs = load_model_spec(str(Path(__file__).resolve().parents[1] / "examples" / "gpt_block.py"))
    tasks = [t for t in extract(model.eval(), inputs).tasks if t.kind == "attention"]
    assert len(tasks) == 1 and path_of(tasks[0]) is None, path_of(tasks[0])
    am = check_emulation(tasks[0])
    assert am.causal and am.o.mode != 0


@pytest.mark.gpu
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c[0] != "float32" and c[8] is None and c[6] % 8 == 0],
                         ids=lambda c: "_".join(map(str, c)))
def test_cudnn_attention_matches_torch(case):
    """cuDNN's fused attention on the shapes the flash kernel is checked on (those it takes)."""
    from torch_htam.launcher import Kernel
    so, err = build.library(attention.CUDNN_LIBRARY, build.default_arch())
    if so is None:
        pytest.skip(err)
    dt, B, H, Hk, L, S, D, causal, _ = case
    dtype = getattr(torch, dt)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, h, n, D, dtype=dtype) for h, n in ((H, L), (Hk, S), (Hk, S)))
    model = Sdpa(is_causal=causal, enable_gqa=Hk != H)
    task = _one_task(model, q, k, v)
    policy = policy_for(task)
    res = build.build(attention.render_cudnn(match_task(task, policy).region))
    assert res.ok, res.error
    ins = [t.cuda() for t in (q, k, v)]
    with torch.no_grad():
        ref = model(*ins)
    out = torch.full_like(ref, float("nan"))
    assert Kernel(res.so_path)(ins, [out]) == 0
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, atol=policy.atol, rtol=policy.rtol)


def test_a_ranged_task_is_refused_only_where_its_views_fix_a_ranged_dim():
    """A ranged encoder attention (batch 2-16) keeps its candidates: its views pass the batch
    through (Bind.grow). With its output declared ranged on the dim the result's heads and columns
    merge into, the kernel would refuse every size but the example's: the expert proposes nothing,
    and says why."""
    import dataclasses
    from torch_htam.extract import extract_tasks
    from torch_htam.proposers.base import ProposalRequest
    from torch_htam.proposers.expert import ExpertProposer
    (task,) = [t for t in extract_tasks(QkvHeads().eval(), (torch.randn(4, 10, 192),), dynamic={0: {0: (1, 16)}})
               if t.kind == "attention"]
    assert task.inputs[0].ranges
    propose = lambda t: ExpertProposer().propose(ProposalRequest(t, "", [], n=2, policy=policy_for(t)))  # noqa: E731
    assert len(propose(task).candidates) == 2
    merged = dataclasses.replace(task, outputs=[task.outputs[0].with_ranges({0: (2, 16), 2: (64, 128)})])
    refused = propose(merged)
    assert not refused.candidates and "the output through views that fix its dim 2" in refused.note, refused.note


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_ranged_attention_kernel_runs_right_at_other_sizes(dtype):
    """The served encoder's shape of it (q, k, v views of one fused projection, the result back to
    (B, L, C)), extracted with the batch declared 1-16 at batch 4: the one kernel built for it runs
    right at batches 2, 7 and 16, and verification keeps it in every bucket (its bindings grow
    along the batch: Bind.grow; before, HTAM_ERR_SHAPE at every batch but the example's)."""
    from torch_htam.evaluation import run_job
    from torch_htam.extract import extract_tasks
    from torch_htam.launcher import Kernel
    torch.manual_seed(0)
    model = QkvHeads().eval()
    (task,) = [t for t in extract_tasks(model, (torch.randn(4, 10, 192, dtype=dtype),), dynamic={0: {0: (1, 16)}})
               if t.kind == "attention"]
    tm = match_task(task, policy_for(task))
    res = build.build(tm.render(tm.defaults))
    assert res.ok, res.error
    kernel = Kernel(res.so_path)
    for n in (2, 7, 16):
        qkv = torch.randn(n, 10, 192, dtype=dtype, device="cuda")
        q, k, v = (t.view(n, 10, 4, 16) for t in qkv.split(64, dim=2))
        with torch.no_grad():
            ref = model(qkv)
        out = torch.full_like(ref, float("nan"))
        assert kernel([q, k, v], [out]) == 0, n
        torch.cuda.synchronize()
        torch.testing.assert_close(out, ref, atol=policy_for(task).atol, rtol=policy_for(task).rtol)
    got = run_job({"kind": "evaluate", "task": task.to_json(), "so_path": res.so_path,
                   "policy": policy_for(task).to_json(), "time": False})
    assert got["correct"] and got["buckets"] == [[0, 0, 2, 8], [0, 0, 9, 16]], got
