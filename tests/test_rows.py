"""Reductions and normalizations in every form models use (the rowwise target beyond the last dim).

CPU: how each pattern lowers (the iteration space: kept dims, then the reduced ones; strided outputs;
int64 indices; bool masks), which mapping the source carries, clear Unsupported messages, and an
nvcc compile of the generated sources for sm_90a. GPU (@gpu): numerics against torch, including
shapes the bench tasks do not have (odd sizes, strided inputs, keepdim, several dims).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_htam import build, paths
from torch_htam.policy import policy_for
from torch_htam.proposers.expert import rowwise
from torch_htam.proposers.expert.ir import Unsupported, lower, walk
from torch_htam.proposers.expert.proposer import match_task
from torch_htam.task import Task, TensorSpec
from compile_check import assert_compiles


class Fn(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *args):
        return self.f(*args)


def task_of(f, *args) -> Task:
    """f's whole graph as one task; loss ops decomposed (into in-place ops too) as capture does."""
    from torch_htam.capture import functionalize
    from torch_htam.decompose import decompose_losses
    model = Fn(f).eval()
    gm = torch.export.export(model, args, strict=False).graph_module
    decompose_losses(gm)
    functionalize(gm)
    outs = model(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return Task("rows", "x", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(o) for o in outs],
                "sig", [], graph=gm)


# name -> (function, inputs): each must lower to one row program
CASES = {
    "sum_dim1": (lambda x: x.sum(1), lambda: [torch.randn(4, 33, 7)]),
    "mean_hw_keepdim": (lambda x: x.mean((2, 3), keepdim=True), lambda: [torch.randn(2, 5, 6, 7)]),
    "amax_dim0": (lambda x: x.amax(0), lambda: [torch.randn(9, 5)]),
    "prod_dim1": (lambda x: x.prod(1), lambda: [torch.randn(3, 6, 5)]),
    "var_dim1": (lambda x: x.var(1, keepdim=True), lambda: [torch.randn(3, 17, 5)]),
    "std_last": (lambda x: x.std(-1, correction=0), lambda: [torch.randn(3, 17)]),
    "argmax_last": (lambda x: x.argmax(-1), lambda: [torch.randn(6, 101)]),
    "argmin_dim1": (lambda x: x.argmin(1), lambda: [torch.randn(6, 10, 3)]),
    "max_pair_dim1": (lambda x: x.max(1), lambda: [torch.randn(4, 10, 3)]),
    "min_pair_keepdim": (lambda x: x.min(-1, keepdim=True), lambda: [torch.randn(4, 10)]),
    "argmax_all": (lambda x: x.argmax(), lambda: [torch.randn(7, 9)]),
    "sum_all": (lambda x: x.sum(), lambda: [torch.randn(7, 9, 3)]),
    "softmax_dim1": (lambda x: x.softmax(1), lambda: [torch.randn(2, 9, 13)]),
    "channel_rmsnorm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * w.view(1, -1, 1, 1),
                        lambda: [torch.randn(2, 12, 5, 7), torch.randn(12)]),
    "layernorm_chw": (lambda x, w, b: F.layer_norm(x, (6, 5, 7), w, b),
                      lambda: [torch.randn(3, 6, 5, 7), torch.randn(6, 5, 7), torch.randn(6, 5, 7)]),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                      lambda: [torch.randn(2, 6, 5, 7), torch.randn(6), torch.randn(6)]),
    "layernorm_permute": (lambda x, w, b: F.layer_norm(x.transpose(1, 2), (12,), w, b),
                          lambda: [torch.randn(2, 12, 37), torch.randn(12), torch.randn(12)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b),
                   lambda: [torch.randn(2, 12, 5, 7), torch.randn(12), torch.randn(12)]),
    "group_norm_1d": (lambda x: F.group_norm(x, 2), lambda: [torch.randn(3, 8)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), lambda: [torch.randn(4, 19, 3)]),
    "vector_norm": (lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True), lambda: [torch.randn(5, 21)]),
    "masked_softmax": (lambda x, m: torch.softmax((x * 0.125).masked_fill(m, float("-inf")), -1),
                       lambda: [torch.randn(2, 3, 16, 16), torch.ones(16, 16, dtype=torch.bool).triu(1)[None, None]]),
    # losses, whole (decompose.py): full reductions (mean over all) and per-row ones
    "mse_loss": (lambda x, t: F.mse_loss(x, t), lambda: [torch.randn(3, 5, 7, 9), torch.randn(3, 5, 7, 9)]),
    "smooth_l1_loss": (lambda x, t: F.smooth_l1_loss(x, t, beta=0.5),
                       lambda: [torch.randn(3, 5, 7, 9), torch.randn(3, 5, 7, 9)]),
    # a target with exact zeros: xlogy(0, 0) is 0 (not 0 * log 0 = NaN)
    "kl_div_batchmean": (lambda x, t: F.kl_div(x, t, reduction="batchmean"),
                         lambda: [torch.randn(6, 37).log_softmax(-1),
                                  torch.randn(6, 37).softmax(-1) * (torch.arange(37) % 3 != 0)]),
    "hinge_embedding_loss": (lambda x, y: F.hinge_embedding_loss(x, y, margin=0.5),
                             lambda: [torch.randn(6, 37), (torch.arange(6 * 37).view(6, 37) % 2) * 2.0 - 1]),
    "cosine_similarity": (lambda a, b: F.cosine_similarity(a, b, dim=1), lambda: [torch.randn(6, 37), torch.randn(6, 37)]),
    # log_softmax, then the target's log-probability gathered per row (an ignored target gives 0)
    "cross_entropy_none": (lambda x, t: F.cross_entropy(x, t, reduction="none"),
                           lambda: [torch.randn(6, 37), torch.tensor([3, -100, 0, 36, 5, 17])]),
    # ... and its mean over the rows that count (an outer sum, and an exact int64 count of targets)
    "cross_entropy_mean": (lambda x, t: F.cross_entropy(x, t),
                           lambda: [torch.randn(70, 37), torch.where(torch.arange(70) % 9 == 0, -100, torch.arange(70) * 5 % 37)]),
    "row_mean_then_mean": (lambda x: x.pow(2).mean(-1).sqrt().mean(), lambda: [torch.randn(3, 50, 19)]),
    "nll_loss_none": (lambda x, t: F.nll_loss(x.log_softmax(-1) * 0.5, t, reduction="none"),
                      lambda: [torch.randn(5, 3, 37).flatten(0, 1), torch.arange(15) * 2 % 37]),
}


# GroupNorm reads its input flat over (N, G, C / G, pixels): a non-contiguous input is HTAM_ERR_SHAPE
# (the runtime runs PyTorch's), so those cases take contiguous inputs only
CONTIGUOUS_ONLY = {"group_norm", "group_norm_1d"}


def _task(name: str, dtype=torch.float32) -> Task:
    f, inputs = CASES[name]
    return task_of(f, *[x.to(dtype) if x.is_floating_point() else x for x in inputs()])


@pytest.mark.parametrize("name", list(CASES))
def test_every_pattern_has_a_rowwise_path(name):
    task = _task(name)
    tm = match_task(task, policy_for(task))
    assert tm.kind == "rowwise"


def test_a_gather_is_read_once_per_row_along_the_row_only():
    prog = lower(_task("cross_entropy_none").graph)
    (out,) = prog.outputs
    assert out.row and any(x[0] == "gather" for x in walk(out.expr))
    # the int64 target is a per-row access; the logits are read along the row
    assert [prog.inputs[a.input][1] for a in prog.accesses if not a.column_varying(prog.ndim)] == ["int64"]
    with pytest.raises(Unsupported, match="output of shape"):     # several picks per row
        lower(task_of(lambda x, i: x.log_softmax(-1).gather(1, i), torch.randn(4, 8),
                      torch.zeros(4, 2, dtype=torch.long)).graph)
    with pytest.raises(Unsupported, match="per column"):       # a gathered value broadcast over the row
        lower(task_of(lambda x, i: x.log_softmax(-1) - x.log_softmax(-1).gather(1, i), torch.randn(4, 8),
                      torch.zeros(4, 1, dtype=torch.long)).graph)


def test_a_mean_over_rows_is_one_program_with_sums_over_rows():
    """cross_entropy's mean: the per-row losses and the count of counted targets are summed over
    the rows after the row kernel (the count an exact integer), one value for the program."""
    prog = lower(_task("cross_entropy_mean").graph)
    (out,) = prog.outputs
    assert out.total and not out.row and len(prog.outer) == 2
    assert sorted(x[2] for x in walk(out.expr) if x[0] == "outer") == ["f", "i"]
    assert not rowwise.has_split_rows(prog) and not rowwise.has_column_mapping(prog)
    with pytest.raises(Unsupported, match="sum over rows used per row"):     # a total broadcast back
        lower(task_of(lambda x: x.sum(-1) - x.sum(-1).mean(), torch.randn(4, 8)).graph)


def test_a_middle_dim_reduction_iterates_kept_dims_then_the_reduced_one():
    prog = lower(_task("sum_dim1").graph)
    assert prog.shape == (4, 7, 33) and prog.nred == 1
    assert prog.accesses[0].dims == (0, 2, 1)        # input dim 1 -> the row
    assert rowwise.has_column_mapping(prog)          # strided columns: the column mapping exists
    assert not rowwise.has_column_mapping(lower(_task("std_last").graph))


def test_several_trailing_dims_form_one_row():
    prog = lower(_task("layernorm_chw").graph)
    assert prog.nred == 3 and prog.shape == (3, 6, 5, 7)
    assert lower(_task("mean_hw_keepdim").graph).nred == 2


def test_full_outputs_of_a_middle_dim_row_are_stored_through_strides():
    prog = lower(_task("channel_rmsnorm").graph)
    (out,) = prog.outputs
    assert not out.row and out.dims == (0, 3, 1, 2) and prog.strided_outputs == [0]


def test_group_norm_rows_are_a_groups_channels_and_pixels():
    prog = lower(_task("group_norm").graph)
    assert prog.shape == (2, 3, 4, 35) and prog.nred == 2
    x, w, b = prog.accesses
    assert x.mode == "flat" and w.mode == "span" and w.dims == (1, 2)   # weight [C] over (group, channel)


def test_arg_reductions_write_int64_indices_and_the_values():
    prog = lower(_task("max_pair_dim1").graph)
    values, indices = prog.outputs
    assert values.row and values.dtype == "float32" and values.expr[0] == "red"
    assert indices.row and indices.dtype == "int64" and indices.expr == ("idx", values.expr[1])
    assert prog.reductions[0].kind == "argmax"


def test_a_bool_mask_is_read_as_an_input():
    prog = lower(_task("masked_softmax").graph)
    assert [dt for _, dt in prog.inputs] == ["float32", "bool"]
    assert any(x[0] == "select" for r in prog.reductions for x in _walk(r.expr))


def _walk(e):
    from torch_htam.proposers.expert.ir import walk
    return walk(e)


def test_unsupported_row_patterns_say_why():
    with pytest.raises(Unsupported, match="vector norm of order"):
        lower(task_of(lambda x: torch.linalg.vector_norm(x, 3, -1), torch.randn(2, 4)).graph)
    with pytest.raises(Unsupported, match="int64"):     # index math stays on PyTorch
        lower(task_of(lambda x: x.argmax(-1) + 1, torch.randn(4, 8)).graph)
    with pytest.raises(Unsupported, match="rows are"):
        lower(task_of(lambda x: x.sum(0) + x.sum(1), torch.randn(4, 4)).graph)


def _sources() -> list[tuple[str, str]]:
    out = []
    for name in CASES:
        for dt in (torch.float32, torch.bfloat16):
            task = _task(name, dt)
            tm = match_task(task, policy_for(task))
            out.append((f"{name}/{dt}", tm.render(tm.defaults)))
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_row_sources_compile_for_sm90a():
    todo = _sources()
    assert_compiles(todo, timeout_s=1200)   # ~50 sources, one batch


# ---- GPU: numerics against torch (the lead runs these) ----

def _strided(x: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (last dim strided by 2)."""
    return torch.stack([x, torch.zeros_like(x)], -1)[..., 0] if x.dim() else x


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_row_patterns_match_torch(name, dtype):
    from torch_htam.launcher import Kernel
    task = _task(name, dtype)
    tm = match_task(task, policy_for(task))
    policy = policy_for(task)
    f, make = CASES[name]
    res = build.build_many([tm.render(tm.defaults)])[0]
    assert res.ok, res.error
    kernel = Kernel(res.so_path)
    layouts = ((0, "contiguous"),) if name in CONTIGUOUS_ONLY else ((0, "contiguous"), (1, "strided"))
    for seed, layout in layouts:
        torch.manual_seed(seed)
        inputs = [x.to(dtype) if x.is_floating_point() else x for x in make()]
        inputs = [x.cuda() for x in inputs]
        if layout == "strided":
            inputs = [_strided(x) for x in inputs]
        ref = f(*inputs)
        ref = list(ref) if isinstance(ref, tuple) else [ref]
        outs = [torch.full_like(r, float("nan") if r.is_floating_point() else -7).contiguous() for r in ref]
        assert kernel(inputs, outs) == 0
        torch.cuda.synchronize()
        for o, r in zip(outs, ref):
            if r.is_floating_point():
                torch.testing.assert_close(o, r, atol=policy.atol, rtol=policy.rtol, equal_nan=True)
            else:
                assert torch.equal(o, r), (name, layout)


# ---- losses: export keeps them whole (aten.mse_loss ...); capture decomposes them (decompose.py)

LOSSES = {
    "mse": (lambda x, t: F.mse_loss(x, t), lambda: [torch.randn(16, 10), torch.randn(16, 10)]),
    "l1_sum": (lambda x, t: F.l1_loss(x, t, reduction="sum"), lambda: [torch.randn(16, 10), torch.randn(16, 10)]),
    "smooth_l1": (lambda x, t: F.smooth_l1_loss(x, t, beta=0.5), lambda: [torch.randn(16, 10), torch.randn(16, 10)]),
    "kl_div": (lambda x, t: F.kl_div(x, t, reduction="batchmean"),
               lambda: [torch.randn(16, 10).log_softmax(-1), torch.randn(16, 10).softmax(-1)]),
    "hinge": (lambda x, t: F.hinge_embedding_loss(x, t), lambda: [torch.randn(16, 10), torch.randn(16, 10).sign()]),
    "cosine": (lambda x, t: F.cosine_similarity(x, t, dim=-1), lambda: [torch.randn(16, 10), torch.randn(16, 10)]),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_losses_are_decomposed_into_rows_with_a_path(name):
    from torch_htam.coverage import path_of
    from torch_htam.extract import extract
    f, make = LOSSES[name]
    ex = extract(Fn(f).eval(), tuple(make()))
    ops = {str(n.target) for t in ex.tasks for n in t.graph.graph.nodes if n.op == "call_function"}
    assert not any("loss" in o or "kl_div" in o or "cosine" in o for o in ops), ops
    assert ex.tasks and all(path_of(t) is None for t in ex.tasks), [path_of(t) for t in ex.tasks]


def test_cross_entropy_gathers_in_the_row_kernel_and_keeps_the_int64_count_on_pytorch():
    """F.cross_entropy decomposes to log_softmax and nll_loss: the target's log-probability is
    gathered in the log_softmax's row kernel (a path); the count of non-ignored targets (a sum of
    bools into int64) has no path rather than being computed in float."""
    from torch_htam.coverage import path_of
    from torch_htam.extract import extract
    ex = extract(Fn(lambda x, t: F.cross_entropy(x, t)).eval(),
                 (torch.randn(16, 10), torch.randint(0, 10, (16,))))
    ops_of = {t.name: {str(n.target) for n in t.graph.graph.nodes} for t in ex.tasks}
    row = next(t for t in ex.tasks if "aten._log_softmax.default" in ops_of[t.name])
    assert "aten.gather.default" in ops_of[row.name] and path_of(row) is None
    assert any(p and "int64" in p for p in (path_of(t) for t in ex.tasks))


# ---- the mappings' launch choices (memory-bound: bytes in flight per SM, blocks per SM) ----

def _defaults(f, *args) -> dict:
    task = task_of(f, *args)
    return match_task(task, policy_for(task)).defaults


@pytest.mark.parametrize("dtype,nbytes", [(torch.float32, 4), (torch.bfloat16, 2)], ids=["fp32", "bf16"])
def test_a_column_reduction_keeps_16_bytes_in_flight_per_lane(dtype, nbytes):
    """sum over dim 1 of [B, C, HW] (the column mapping at run time): each lane issues 16 bytes of
    loads before it adds them, where one step is one 2-4 byte element."""
    p = _defaults(lambda x: x.sum(1), torch.randn(4, 256, 64, dtype=dtype))
    assert p["col_unroll"] * nbytes == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_groupnorm_row_is_held_by_a_block_of_at_most_512_threads(dtype):
    """GroupNorm(32, 256) on [16, 256, 32, 32]: rows of 8 x 1024 values, held in registers whole
    (one DRAM read), by blocks small enough for several to be resident per SM."""
    x = torch.randn(2, 256, 32, 32, dtype=dtype)
    w, b = torch.randn(256, dtype=dtype), torch.randn(256, dtype=dtype)
    p = _defaults(lambda x, w, b: F.group_norm(x, 32, w, b), x, w, b)
    assert p["nv"] > 0 and p["tpr"] <= 512
    per_thread = p["vec"] * p["nv"]
    assert p["tpr"] * per_thread >= 8 * 1024 and per_thread <= (32 if dtype == torch.bfloat16 else 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_long_row_read_once_loads_several_chunks_per_thread(dtype):
    """argmax over a 32000-wide vocabulary: streamed, 16 values per thread loaded before they are
    compared, 256-thread blocks (several per SM); a row too short for every thread to have that
    many full chunks keeps one chunk per step."""
    p = _defaults(lambda x: x.argmax(-1), torch.randn(4, 32000, dtype=dtype))
    assert p["nv"] == 0 and p["tpr"] <= 256 and p["su"] * p["vec"] == 16 and p["occ"] == 1024
    assert 32000 // (p["tpr"] * p["vec"]) >= p["su"]
    short = _defaults(lambda x, s: (F.silu(x) * s).mean(-1), torch.randn(4, 768), torch.randn(768))
    assert short.get("su", 1) == 1


def test_the_grid_tries_the_column_and_streaming_knobs():
    from torch_htam.proposers.expert.proposer import tuning_grid
    task = _task("var_dim1")
    base = match_task(task, policy_for(task)).defaults
    grid = tuning_grid(task, policy_for(task))
    assert {p["col_unroll"] for p in grid} - {base["col_unroll"]}
    assert any(not p["col_onepass"] for p in grid)
    task = task_of(lambda x: x.argmax(-1), torch.randn(4, 32000))
    assert {p.get("su", 1) for p in tuning_grid(task, policy_for(task))} >= {1, 2, 4}


# column-mapping and streamed programs at sizes where the unrolled loops have tails (ncol not a
# multiple of lanes x steps, rows not a multiple of 32), with the knobs' non-default settings
KNOB_CASES = {
    "sum_dim1": (lambda x: x.sum(1), lambda: [torch.randn(3, 1001, 37)]),
    "var_dim1": (lambda x: x.var(1, keepdim=True), lambda: [torch.randn(5, 333, 70) + 3.0]),
    "softmax_dim1": (lambda x: x.softmax(1), lambda: [torch.randn(2, 301, 45)]),
    "argmin_dim1": (lambda x: x.argmin(1), lambda: [torch.randn(6, 517, 33).round()]),   # ties
    "layernorm_permute": (lambda x, w, b: F.layer_norm(x.transpose(1, 2), (100,), w, b),
                          lambda: [torch.randn(3, 100, 45), torch.randn(100), torch.randn(100)]),
    "channel_rmsnorm": CASES["channel_rmsnorm"],
    "argmax_long": (lambda x: x.argmax(-1), lambda: [torch.randn(5, 9000).round()]),   # ties
    "max_pair_long": (lambda x: x.max(-1), lambda: [torch.randn(7, 4100)]),
}
KNOBS = [{"col_unroll": 1}, {"col_unroll": 2, "col_onepass": False}, {"col_unroll": 8}, {"su": 1},
         {"su": 2}, {"su": 4, "occ": 0}]


def _knob_task(name: str, dtype) -> Task:
    f, make = KNOB_CASES[name]
    torch.manual_seed(0)
    return task_of(f, *[x.to(dtype) for x in make()])


def _knob_sources(dtype=torch.float32) -> list[tuple[str, str]]:
    out = []
    for name in KNOB_CASES:
        tm = match_task(_knob_task(name, dtype), policy_for(_knob_task(name, dtype)))
        out += [(f"{name}/{k}", tm.render(dict(tm.defaults, **k))) for k in KNOBS]
    return out


@pytest.mark.build
@pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")
def test_knob_settings_compile_for_sm90a():
    assert_compiles(_knob_sources(torch.bfloat16)[::2] + _knob_sources()[1::2], timeout_s=1200)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(KNOB_CASES))
def test_knob_settings_match_torch(name, dtype):
    """Every setting of the column-mapping / streaming knobs against torch, contiguous and strided
    inputs (the column mapping runs where the reduced dim is strided)."""
    from torch_htam.launcher import Kernel
    task = _knob_task(name, dtype)
    policy = policy_for(task)
    tm = match_task(task, policy)
    f, make = KNOB_CASES[name]
    results = build.build_many([tm.render(dict(tm.defaults, **k)) for k in KNOBS])
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for knob, res in zip(KNOBS, results):
        kernel = Kernel(res.so_path)
        for layout in ("contiguous", "strided"):
            torch.manual_seed(0)
            inputs = [x.to(dtype).cuda() for x in make()]
            if layout == "strided":
                inputs = [_strided(x) for x in inputs]
            ref = f(*inputs)
            ref = list(ref) if isinstance(ref, tuple) else [ref]
            outs = [torch.full_like(r, float("nan") if r.is_floating_point() else -7).contiguous() for r in ref]
            assert kernel(inputs, outs) == 0
            torch.cuda.synchronize()
            for o, r in zip(outs, ref):
                if r.is_floating_point():
                    torch.testing.assert_close(o, r, atol=policy.atol, rtol=policy.rtol,
                                               msg=lambda m: f"{name} {knob} {layout}: {m}")
                else:
                    assert torch.equal(o, r), (name, knob, layout)
