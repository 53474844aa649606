"""Elementwise breadth: integer and bool values, the activations spelled out in expression ops,
eval batch norm anywhere in a chain, and the GEMM / conv epilogues that take any of them.

CPU: each lowered program is evaluated with torch ops on the program's own expression tuples
(`evaluate`, value types as ir.value_type says: int64 math in int64, bools as bools) and compared
with the module, exactly for integer / bool outputs; generated sources compile for sm_90a.
GPU (@gpu): the generated kernels against torch through the real build and launcher.
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
from torch_htam.proposers.expert import ExpertProposer, conv, gemm
from torch_htam.proposers.expert.ir import VT, Unsupported, lower, program_value_type
from torch_htam.task import Task, TensorSpec
from compile_check import assert_compiles

NVCC = pytest.mark.skipif(paths.nvcc_path() is None, reason="needs nvcc")


def graph_of(model: nn.Module, *args):
    return torch.export.export(model.eval(), args, strict=False).graph_module


def small_task(model: nn.Module, *args) -> Task:
    gm = graph_of(model, *args)
    with torch.no_grad():
        outs = model(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return Task("small", "x", "", [TensorSpec.of(a) for a in args], [TensorSpec.of(o) for o in outs],
                "sig", [], graph=gm)


# ---- a torch evaluator of ir programs (the reference semantics of each expression op) ----

_TORCH = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
    "max": torch.maximum, "min": torch.minimum, "abs": torch.abs, "relu": torch.relu,
    "sq": lambda a: a * a, "exp": torch.exp, "log": torch.log, "log1p": torch.log1p,
    "expm1": torch.expm1, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "erf": torch.erf, "recip": torch.reciprocal, "silu": F.silu,
    "gelu_erf": F.gelu, "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "sin": torch.sin,
    "cos": torch.cos, "exp2": torch.exp2, "log2": torch.log2, "tan": torch.tan, "erfc": torch.erfc,
    "floor": torch.floor, "ceil": torch.ceil, "trunc": torch.trunc, "rint": torch.round,
    "sign": torch.sign, "fmod": torch.fmod, "mod": torch.remainder,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "powc": torch.pow, "pow": torch.pow, "select": torch.where,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "not": torch.logical_not, "isnan": torch.isnan, "isinf": torch.isinf,
    "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor,
    "bnot": torch.bitwise_not,
}
_CT = {"f": torch.float32, "i": torch.int64, "b": torch.bool}


def _read(prog, a, x: torch.Tensor) -> torch.Tensor:
    shape = prog.shape
    if a.mode == "flat":
        return x.reshape(shape)
    if a.mode == "suffix":
        return x.reshape(-1).repeat(math.prod(shape) // x.numel()).reshape(shape)
    kept = sorted((d, k) for k, d in enumerate(a.dims) if d >= 0)
    y = x.reshape([x.shape[k] for k in range(x.dim()) if a.dims[k] >= 0]) if kept else x.reshape(())
    order = [k for k in range(x.dim()) if a.dims[k] >= 0]
    y = y.permute([order.index(k) for _, k in kept]) if kept else y
    view = [1] * len(shape)
    for (d, k) in kept:
        view[d] = x.shape[k]
    return y.reshape(view).expand(shape)


def evaluate(prog, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each output of an elementwise prog, computed by torch op by op in the value types."""
    vt = program_value_type(prog)
    loads = [_read(prog, a, inputs[a.input]).to(_CT[VT[inputs[a.input].dtype.__str__()[6:]]])
             for a in prog.accesses]
    memo: dict = {}

    def ev(e):
        if e in memo:
            return memo[e]
        op = e[0]
        if op == "in":
            r = loads[e[1]]
        elif op in ("const", "iconst", "bconst"):
            r = torch.tensor(e[1], dtype=_CT[vt(e)])
        elif op == "cast":
            r = ev(e[2]).to(_CT[e[1]])
        elif op == "round":
            r = ev(e[2]).to(getattr(torch, e[1])).to(_CT[VT[e[1]]])
        else:
            r = _TORCH[op](*[ev(a) for a in e[1:]])
            if vt(e) == "f":
                r = r.float()
        memo[e] = r
        return r
    return [ev(o.expr).to(getattr(torch, o.dtype)) for o in prog.outputs]


def check_program(model: nn.Module, *args, atol=1e-5):
    prog = lower(graph_of(model, *args), strided=True)
    with torch.no_grad():
        want = model(*args)
    want = list(want) if isinstance(want, tuple) else [want]
    got = evaluate(prog, list(args))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-5)
        else:
            assert torch.equal(g, w), (g, w)      # integers and bools: exact
    return prog


# ---- integer and bool programs ----

class PositionIds(nn.Module):
    """GPT-2 / Llama: position ids from a past length, and a padded-position mask arithmetic."""
    def forward(self, ids, past):
        pos = ids + past                      # int64 + int64 (a 0-dim past length)
        return pos.unsqueeze(0) * 2 - (ids != 0).long()


class T5Buckets(nn.Module):
    """T5's relative-position buckets: int64 in, log of a float ratio truncated back to int64."""
    def forward(self, ctx, mem):
        rel = mem[None, :] - ctx[:, None]
        nb, max_exact, max_dist = 16, 8, 128
        ret = (rel > 0).to(torch.long) * nb
        rel = torch.abs(rel)
        large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_dist / max_exact)
                             * (nb - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return ret + torch.where(rel < max_exact, rel, large)


class MaskFill(nn.Module):
    """An attention mask built with eq / lt / where / masked_fill, bool and float outputs."""
    def forward(self, x, mask):
        keep = (mask == 1) & (x > -1.0)
        return x.masked_fill(~keep, float("-inf")), keep, torch.where(mask.bool(), x, 0.0)


def test_integer_programs_are_exact():
    prog = check_program(PositionIds(), torch.randint(0, 50, (1, 37)), torch.tensor(5))
    assert [o.dtype for o in prog.outputs] == ["int64"]
    vt = program_value_type(prog)
    assert all(vt(x) != "f" for x in _walk(prog.outputs[0].expr))    # no float round trip
    big = torch.tensor([[2 ** 40 + 1]])        # not a float32 value: a float trip would change it
    check_program(PositionIds(), big, torch.tensor(3))
    ctx, mem = torch.arange(64), torch.arange(96)
    prog = check_program(T5Buckets(), ctx, mem)
    assert prog.inputs == [((64,), "int64"), ((96,), "int64")]


def test_bool_outputs_and_masks():
    x, mask = torch.randn(2, 4, 32), torch.randint(0, 2, (2, 1, 32))
    prog = check_program(MaskFill(), x, mask)
    assert [o.dtype for o in prog.outputs] == ["float32", "bool", "float32"]


def test_int32_wraps_like_torch():
    class M(nn.Module):
        def forward(self, a):
            return a * 65536 + 7
    a = torch.tensor([[40000, -3, 123456]], dtype=torch.int32)
    check_program(M(), a)


def _walk(e):
    from torch_htam.proposers.expert.ir import walk
    return walk(e)


# ---- activations (the composite ones spelled out as torch's CUDA kernels compute them) ----

ACTS = {
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "hardtanh": lambda x: F.hardtanh(x, -2.0, 1.5),
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "mish": F.mish, "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, 0.7), "selu": F.selu, "celu": lambda x: F.celu(x, 0.5),
    "softplus": F.softplus, "softplus_beta": lambda x: F.softplus(x, 2.0, 5.0), "silu": F.silu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "relu6": F.relu6, "relu": F.relu, "logit": lambda x: torch.logit(x.sigmoid()),
    "exp2": torch.exp2, "erfc": torch.erfc, "sign": torch.sign, "round": torch.round,
}


class Act(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def forward(self, x):
        return ACTS[self.name](x)


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_lowers_like_torch(name):
    x = torch.randn(4, 257) * 4
    check_program(Act(name), x)


def test_eval_batch_norm_anywhere_in_a_chain():
    class M(nn.Module):
        def forward(self, x, w, b, mean, var):
            return F.batch_norm(torch.relu(x), mean, var, w, b, False, 0.1, 1e-5) * 2
    c = 8
    check_program(M(), torch.randn(2, c, 5, 5), torch.randn(c), torch.randn(c), torch.randn(c),
                  torch.rand(c) + 0.5)

    class Train(nn.Module):
        def forward(self, x, mean, var):
            return F.batch_norm(x, mean, var, None, None, True, 0.1, 1e-5)
    with pytest.raises(Unsupported):
        lower(graph_of(Train(), torch.randn(2, 4, 3, 3), torch.zeros(4), torch.ones(4)))


def test_a_spelled_out_gelu_is_one_program():
    class M(nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    prog = check_program(M(), torch.randn(4, 64))
    assert prog.has_transcendental


def test_row_programs_refuse_integers_clearly():
    # (bool masks are row programs' inputs: tests/test_rows.py)
    class M(nn.Module):
        def forward(self, x, pos):
            return torch.softmax(x + pos, -1)
    with pytest.raises(Unsupported, match="int64/int32 values in a row program"):
        lower(graph_of(M(), torch.randn(2, 8), torch.arange(8)))


# ---- GEMM and conv epilogues ----

class LinearAct(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.act = act

    def forward(self, x, w, b):
        return ACTS[self.act](F.linear(x, w, b))


class ConvActBn(nn.Module):
    """conv -> nonlinearity -> eval batch norm (the BN after the activation, as in some nets)."""
    def __init__(self, act="relu"):
        super().__init__()
        self.act = act

    def forward(self, x, w, gamma, beta, mean, var):
        return F.batch_norm(ACTS[self.act](F.conv2d(x, w, None, 1, 1)), mean, var, gamma, beta, False, 0.1, 1e-5)


def _gemm_args(dtype=torch.float32):
    return torch.randn(4, 16, 32, dtype=dtype), torch.randn(48, 32, dtype=dtype), torch.randn(48, dtype=dtype)


def _conv_args(dtype=torch.float32):
    return (torch.randn(2, 8, 10, 10, dtype=dtype), torch.randn(16, 8, 3, 3, dtype=dtype), torch.randn(16, dtype=dtype),
            torch.randn(16, dtype=dtype), torch.randn(16, dtype=dtype), torch.rand(16, dtype=dtype) + 0.5)


EPILOGUE_ACTS = ["leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "mish", "elu", "selu", "softplus",
                 "silu", "gelu", "gelu_tanh", "sigmoid", "tanh", "relu6"]


@pytest.mark.parametrize("act", EPILOGUE_ACTS)
def test_gemm_takes_any_activation_epilogue(act):
    task = small_task(LinearAct(act), *_gemm_args())
    gp = gemm.match(task.graph, policy_for(task))
    src = gemm.render(gp, gemm.defaults(gp))
    # the bias goes to cuBLASLt (or the epilogue), the activation runs in our epilogue kernel
    # unless cuBLASLt has it (tanh GELU)
    assert ("epilogue_run(ext" in src) == (act != "gelu_tanh")


@pytest.mark.parametrize("act", ["relu", "hardswish", "mish", "leaky_relu"])
def test_conv_activation_then_batch_norm(act):
    task = small_task(ConvActBn(act), *_conv_args())
    cp = conv.match(task.graph, policy_for(task))
    assert cp.bn is None and not cp.fusable            # the BN is in the epilogue program
    src = conv.render(cp, dict(conv.defaults(cp), tiled=False))
    assert "epilogue_run(ext" in src


def _first_sources(tasks) -> list[tuple[str, str]]:
    out = []
    for name, task in tasks:
        prop = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=1, policy=policy_for(task)))
        assert prop.candidates, (name, prop.note)
        out.append((name, prop.candidates[0].source))
    return out


@pytest.mark.build
@NVCC
def test_new_paths_compile_for_sm90a():
    have_cublas, have_cudnn = build.find_cublas() is not None, build.find_cudnn() is not None
    tasks = [("position_ids", small_task(PositionIds(), torch.randint(0, 50, (1, 37)), torch.tensor(5))),
             ("t5_buckets", small_task(T5Buckets(), torch.arange(64), torch.arange(96))),
             ("mask_fill", small_task(MaskFill(), torch.randn(2, 4, 32), torch.randint(0, 2, (2, 1, 32)))),
             ("int32", small_task(_Int32(), torch.ones(3, 5, dtype=torch.int32))),
             ("acts_bf16", small_task(_AllActs(), torch.randn(4, 64, dtype=torch.bfloat16))),
             ("sliced_mask", small_task(*_sliced_args()))]
    if have_cublas:
        tasks.append(("linear_hardswish", small_task(LinearAct("hardswish"), *_gemm_args(torch.bfloat16))))
    if have_cudnn:
        tasks.append(("conv_mish_bn", small_task(ConvActBn("mish"), *_conv_args())))
    todo = _first_sources(tasks)
    assert_compiles(todo)


def _sliced_args():
    return SlicedMask(), torch.tril(torch.ones(20, 20)).view(1, 1, 20, 20), torch.randn(1, 8, 8)


class _Int32(nn.Module):
    def forward(self, a):
        return (a * 3) % 5 - (a > 1).int()


class _AllActs(nn.Module):
    def forward(self, x):
        return sum(ACTS[n](x) for n in EPILOGUE_ACTS if n != "relu6")


# ---- GPU: the kernels against torch (the lead runs these) ----

@pytest.mark.gpu
@pytest.mark.parametrize("case", ["position_ids", "t5_buckets", "mask_fill", "int32", "acts", "sliced_mask"])
def test_elementwise_kernels_match_torch_on_gpu(case):
    from torch_htam.launcher import Kernel
    from torch_htam.verify import poison_
    make = {"position_ids": lambda: (PositionIds(), torch.randint(0, 50, (1, 37)), torch.tensor(5)),
            "t5_buckets": lambda: (T5Buckets(), torch.arange(64), torch.arange(96)),
            "mask_fill": lambda: (MaskFill(), torch.randn(2, 4, 32), torch.randint(0, 2, (2, 1, 32))),
            "int32": lambda: (_Int32(), torch.randint(-100, 100, (3, 5), dtype=torch.int32)),
            "acts": lambda: (_AllActs(), torch.randn(4, 64)), "sliced_mask": _sliced_args}[case]
    model, *args = make()
    task = small_task(model, *args)
    src = _first_sources([(case, task)])[0][1]
    res = build.build_many([src])[0]
    assert res.ok, res.error
    kernel = Kernel(res.so_path)
    inputs = [a.cuda() for a in args]
    with torch.no_grad():
        ref = model(*inputs)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    outs = [poison_(torch.empty_like(r)) for r in ref]     # NaN / int sentinels: unwritten shows
    assert kernel(inputs, outs) == 0
    torch.cuda.synchronize()
    for o, r in zip(outs, ref):
        if r.dtype.is_floating_point:
            torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
        else:
            assert torch.equal(o, r)


def test_a_permuted_read_is_a_strided_access():
    class M(nn.Module):
        def forward(self, x, b):
            return x.permute(2, 0, 1) * 2 + b.transpose(0, 1)
    prog = check_program(M(), torch.randn(3, 4, 5), torch.randn(4, 3))
    assert {a.dims for a in prog.accesses} == {(1, 2, 0), (2, 1)}
    with pytest.raises(Unsupported, match="element order"):      # row kernels read rows in order
        lower(graph_of(M(), torch.randn(3, 4, 5), torch.randn(4, 3)))


class SlicedMask(nn.Module):
    """minGPT: the causal buffer sliced to the sequence length, compared (bool out)."""
    def forward(self, bias, x):
        t = x.shape[1]
        return bias[:, :, :t, :t] == 0, x + bias[:, :, 1:t + 1:1, 2:2 * t + 2:2].squeeze(1)


def test_sliced_inputs_are_read_in_place():
    from torch_htam.proposers.expert.elementwise import match
    bias = torch.tril(torch.ones(20, 20)).view(1, 1, 20, 20)
    args = (bias, torch.randn(1, 8, 8))
    prog = lower(graph_of(SlicedMask(), *args), strided=True)
    want = SlicedMask()(*args)
    got = evaluate_sliced(prog, list(args))
    assert all(torch.equal(g.reshape(w.shape), w) for g, w in zip(got, want))
    assert {(a.starts, a.steps) for a in prog.accesses if a.starts} == {((0, 0, 0, 0), (1, 1, 1, 1)),
                                                                        ((0, 0, 1, 2), (1, 1, 1, 2))}
    with pytest.raises(Unsupported, match="slice"):          # row kernels do not bind slices
        lower(graph_of(SlicedMask(), *args))
    assert match(graph_of(SlicedMask(), *args), None).program.accesses == prog.accesses


def evaluate_sliced(prog, inputs):
    """evaluate() with each sliced access' input cut to what it reads."""
    import dataclasses
    ins, accs = list(inputs), []
    for a in prog.accesses:
        if a.starts:
            x = inputs[a.input]
            idx = tuple(slice(s, s + st * (prog.shape[d] if d >= 0 else 1), st)
                        for s, st, d in zip(a.starts, a.steps, a.dims))
            ins.append(x[idx])
            a = dataclasses.replace(a, input=len(ins) - 1, starts=(), steps=())
        accs.append(a)
    return evaluate(dataclasses.replace(prog, accesses=accs), ins)


def test_ternary_arithmetic_and_tensor_clamps():
    class M(nn.Module):
        def forward(self, x, a, b, w):
            return (torch.addcmul(x, a, b, value=0.5) + torch.addcdiv(x, a, b.abs() + 1)
                    + torch.lerp(x, a, w) + torch.lerp(x, b, 0.75) + torch.clamp(x, min=a, max=a + 1))
    x, a, b = torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)
    check_program(M(), x, a, b, torch.rand(3, 16))


def test_conv_epilogue_with_a_bool_mask_is_refused_clearly():
    class M(nn.Module):
        def forward(self, x, w, mask):
            return F.conv2d(x, w, None, 1, 1).masked_fill(mask, 0.0)
    task = small_task(M(), torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3), torch.rand(2, 8, 6, 6) > 0.5)
    with pytest.raises(Unsupported, match="integer/bool inputs in a conv epilogue"):
        conv.match(task.graph, policy_for(task))


# ---- memory order: outputs stored through their strides walk the first output's layout ----

HARNESS = r"""
#include <cstdio>
int main() {
  // a channels-last [16, 96, 56, 56] add: two inputs and the output at strides [301056, 1, 5376, 96]
  Space<3> s;
  s.ndim = 4;
  const int64_t size[4] = {16, 96, 56, 56}, st[4] = {301056, 1, 5376, 96};
  for (int d = 0; d < 4; ++d) { s.size[d] = size[d]; for (int a = 0; a < 3; ++a) s.st[a][d] = st[d]; }
  Space<3> logical = s;
  htam_collapse<3>(logical, 3, false);
  htam_order_by<3>(s, 2);
  htam_collapse<3>(s, 3, false);
  // an SE multiply: x channels-last [32, 480, 14, 14], the scale [32, 480, 1, 1], the output as x
  Space<3> se;
  se.ndim = 4;
  const int64_t ss[4] = {32, 480, 14, 14}, xs[4] = {94080, 1, 6720, 480}, gs[4] = {480, 1, 0, 0};
  for (int d = 0; d < 4; ++d) { se.size[d] = ss[d]; se.st[0][d] = xs[d]; se.st[1][d] = gs[d]; se.st[2][d] = xs[d]; }
  htam_order_by<3>(se, 2);
  htam_collapse<3>(se, 3, false);
  // an expanded output (stride 0 along a dim of size > 1): the order is left alone
  Space<1> ex;
  ex.ndim = 2; ex.size[0] = 4; ex.size[1] = 8; ex.st[0][0] = 0; ex.st[0][1] = 1;
  Space<1> ex2 = ex;
  ex2.st[0][0] = 1; ex2.st[0][1] = 4;
  htam_order_by<1>(ex, 0);
  htam_order_by<1>(ex2, 0);
  // gemm_layout's store maps order by htam_memory_order too: ConvNeXt's GEMM result stored
  // permuted to [16, 96, 56, 56] channels-last; and a dim that repeats an element has no order
  const int64_t psz[4] = {16, 96, 56, 56}, pst[4] = {301056, 1, 5376, 96}, rst[2] = {0, 1}, rsz[2] = {4, 8};
  int po[4], ro[2];
  const bool pok = htam_memory_order(pst, psz, 4, po), rok = htam_memory_order(rst, rsz, 2, ro);
  printf("%d %d %d %d %d %d | ", (int)pok, po[0], po[1], po[2], po[3], (int)rok);
  printf("%d %d %lld %lld | %d %lld %lld %lld %lld %lld %lld | %lld %lld | %lld %lld %lld %lld\n",
         logical.ndim, s.ndim, (long long)s.size[0], (long long)s.st[2][0],
         se.ndim, (long long)se.size[0], (long long)se.size[1], (long long)se.size[2],
         (long long)se.st[0][2], (long long)se.st[1][2], (long long)se.st[1][1],
         (long long)ex.st[0][0], (long long)ex.st[0][1],
         (long long)ex2.size[0], (long long)ex2.size[1], (long long)ex2.st[0][0], (long long)ex2.st[0][1]);
  return 0;
}
"""


@pytest.mark.build
@NVCC
def test_a_space_walks_its_first_outputs_memory_order(tmp_path):
    # host code only: nvcc builds it, the CPU runs it
    import subprocess
    from torch_htam.proposers.expert.cuda import PRELUDE
    (tmp_path / "h.cu").write_text(PRELUDE + HARNESS)
    exe = tmp_path / "h"
    subprocess.run([paths.nvcc_path(), "-std=c++17", f"-I{build.CSRC}", str(tmp_path / "h.cu"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out[:7] == ["1", "0", "2", "3", "1", "0", "|"]      # n, h, w, c; the stride-0 dim: none
    got = out[7:]
    logical, flat, n, inner = got[0:4]
    # walked in logical order the add keeps 3 dims (h and w merge), the innermost 96 elements
    # apart; in the output's memory order it is one unit-stride dim over all 16 x 96 x 56 x 56
    assert (logical, flat, n, inner) == ("3", "1", str(16 * 96 * 56 * 56), "1")
    # the SE multiply: [32, 196, 480], x unit-stride along the channels, the scale too (0 along h*w)
    assert got[5:12] == ["3", "32", "196", "480", "1", "1", "0"]
    assert got[13:15] == ["0", "1"]                      # expanded output: order kept
    assert got[16:20] == ["8", "4", "4", "1"]             # a transposed output: its order


class _ClAdd(nn.Module):
    def forward(self, a, b):
        return a + b


class _SeMul(nn.Module):
    def forward(self, x, g):
        return x * torch.sigmoid(g)


def _cl_cases():
    cl = dict(memory_format=torch.channels_last)
    return {"cl_add": (_ClAdd(), torch.randn(2, 24, 7, 9, dtype=torch.bfloat16).to(**cl),
                       torch.randn(2, 24, 7, 9, dtype=torch.bfloat16).to(**cl)),
            "cl_se_mul": (_SeMul(), torch.randn(2, 40, 5, 6).to(**cl), torch.randn(2, 40, 1, 1))}


@pytest.mark.build
@NVCC
def test_channels_last_elementwise_kernels_compile_for_sm90a():
    assert_compiles(_first_sources([(n, small_task(m, *a)) for n, (m, *a) in _cl_cases().items()]))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["cl_add", "cl_se_mul"])
def test_channels_last_elementwise_kernels_match_torch_on_gpu(case):
    from torch_htam.launcher import Kernel
    from torch_htam.verify import poison_
    model, *args = _cl_cases()[case]
    src = _first_sources([(case, small_task(model, *args))])[0][1]
    res = build.build_many([src])[0]
    assert res.ok, res.error
    inputs = [a.cuda() for a in args]
    with torch.no_grad():
        ref = model(*inputs)
    out = poison_(torch.empty_like(ref))          # channels-last, as the task's output spec
    assert out.stride() == ref.stride() and not out.is_contiguous()
    assert Kernel(res.so_path)(inputs, [out]) == 0
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)
