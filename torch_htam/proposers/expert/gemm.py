"""GEMM regions: cuBLASLt matmul with its fused epilogue, plus one in-place epilogue kernel for the rest.

Row-major torch Y[M, N] is column-major Y^T[N, M], so linear (Y = X W^T) runs as
C(N x M) = op_T(W stored K x N) * X^T(stored K x M), and mm/bmm (Y = A B) as
C(N x M) = B^T(stored N x K) * A^T(stored K x M). A bias of length N is then per row of C, which is
what cuBLASLt's BIAS epilogues add. cuBLASLt writes the GEMM result straight into the output; what
the Lt epilogue can't express (erf GELU, residual adds, scales) runs as one fused elementwise kernel
that reads and overwrites the output in place.

The C++ is templates in .cuh files: cublaslt.cuh (the handle, the dtype traits, LtGemm: the knobs
as one type), lt_call.cuh (one matmul described by value), gemm_plain.cuh (the plain path: sizes
read at run time) and gemm_layout.cuh (the layout path: direct calls, scratch, the store kernels).
Python emits the LtGemm typedef, the layout path's constant tables, the epilogue (elementwise.py's
kernel; EpiStore for the layout path's store) and a short htam_run.

NOTE: the cuBLASLt handle and a 32 MiB workspace are created lazily on the first call per device
(cudaMalloc): make the first call outside CUDA-graph capture (verification always does).

    >>> gp = match(task.graph, policy); src = render(gp, defaults(gp))
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx as fx

from torch_htam.build import default_arch
from torch_htam.proposers.expert import elementwise, gemm_cutlass, host
from torch_htam.proposers.expert import gemm_layout as gl
from torch_htam.proposers.expert.cuda import DT, PRELUDE, Emitter, c_float, cuh
from torch_htam.proposers.expert.ir import (
    ExprProgram, Unsupported, _graph_outputs, check_single_output, dtype_of, lower, shape_of, stored, walk,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target

aten = torch.ops.aten
GEMMS = {aten.linear.default, aten.addmm.default, aten.mm.default, aten.matmul.default, aten.bmm.default}
CUBLASLT = cuh("cublaslt.cuh")        # the handle, workspace, dtype traits, LtGemm (the knobs as a type)
LT_CALL = cuh("lt_call.cuh")          # lt_call: a matmul described by value, its descriptors cached
GEMM_PLAIN = cuh("gemm_plain.cuh")    # gemm_plain: the plain path (sizes read at run time)
GEMM_LAYOUT = cuh("gemm_layout.cuh")  # the layout path: direct calls, scratch, layout_store, epi_store
GEMM_OPS = {"linear": "kGemmLinear", "mm": "kGemmMm", "bmm": "kGemmBmm"}
# cuBLASLt tiles the lt_tile knob forces, per arch (docs/experiments/lt_space/tiles.py: near-best
# on the probe's train shapes). NOTE: the heuristic's first tile is within 1.036x of the best the
# probe found (geomean of 63 shapes, up to 1.20x), and which tile wins follows the shape: a space
# a memory of near-in-size tasks steers (bench/findings.md, #35's cuBLASLt entry)
LT_TILES = json.loads((Path(__file__).with_name("lt_tiles.json")).read_text())
ENTRY = "HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {"
LT_EPI = {None: "CUBLASLT_EPILOGUE_DEFAULT", "bias": "CUBLASLT_EPILOGUE_BIAS",
          "relu": "CUBLASLT_EPILOGUE_RELU", "relu_bias": "CUBLASLT_EPILOGUE_RELU_BIAS",
          "gelu": "CUBLASLT_EPILOGUE_GELU", "gelu_bias": "CUBLASLT_EPILOGUE_GELU_BIAS"}


@dataclass
class GemmMatch:
    """A single-GEMM region with an elementwise epilogue, as gemm.match found it."""
    op: str                       # "linear" | "mm" | "bmm"
    a: int                        # input index of X / A
    b: int                        # input index of W (linear) / B
    dtype: str                    # A/B/D dtype
    epilogue: ExprProgram         # elementwise program over the output; input G = the GEMM result
    g: int                        # index of G among epilogue.inputs
    allow_tf32: bool
    facts: TaskFacts = None
    # the layout path (None: the plain path above, sizes read at run time): the GEMM as operands of
    # region inputs (maybe views) and its outputs as boxes of Y = [batch, M, N], captured sizes
    lay: "LayoutGemm | None" = None


@dataclass(frozen=True)
class LayoutGemm:
    """Y[batch, M, N] = A[batch, M, K] @ B[batch, K, N], A and B strided views of region inputs
    (gemm_layout.Operand: rows x cols = M x K and K x N), written to outputs through their layouts."""
    batch: int
    M: int
    N: int
    K: int
    A: gl.Operand
    B: gl.Operand
    outs: tuple[gl.OutLayout, ...]
    in_shapes: tuple[tuple[int, ...], ...]     # every region input's captured shape (checked)
    outer: int = 1      # batch = outer x cuBLASLt's batch: the kernel loops over the outer part
    in_strides: tuple[tuple[int, ...], ...] = ()   # every region input's captured strides (checked)


def _gemm_node(gm):
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in GEMMS]
    if len(nodes) != 1:
        raise Unsupported(f"{len(nodes)} matmul ops (need exactly one)")
    return nodes[0]


def match(gm, policy) -> GemmMatch:
    """Match a single-GEMM region with an elementwise epilogue, whose outputs may be layouts (view,
    transpose, split) of the epilogue's result and whose bmm/matmul operands may be views of region
    inputs; raises Unsupported otherwise."""
    node = _gemm_node(gm)
    outs = _graph_outputs(gm)
    src = gl.chain_source(outs[0]) if outs and hasattr(outs[0], "op") else None
    operands = _bmm_operands(gm, node)
    if operands is None:      # the plain path first: it reads sizes at run time
        try:
            gp = _match_plain(gm, node, policy)
            if _plain_fits(gm, gp):
                return gp
        except Unsupported as e:
            if outs == [src]:
                if any(gl.is_layout(n) and any(u is not node and u.op != "output" and not gl.is_layout(u)
                                               for u in n.users) for n in gm.graph.nodes):
                    raise Unsupported("elementwise ops after a view/transpose of the GEMM result (only "
                                      "layouts after the epilogue are written by the GEMM)") from e
                raise
    if src is None or shape_of(src) != shape_of(node):
        raise Unsupported("GEMM outputs must all be layouts (view/transpose/split) of one epilogue "
                          "value of the GEMM's shape")
    epi_gm = _with_output(gm, src) if outs != [src] else gm
    gp = _match_plain(epi_gm, _gemm_node(epi_gm), policy, operands_checked=operands is not None)
    lay = _layout_gemm(gm, node, src, operands, gp)
    if (operands is None and len(lay.outs) == 1 and lay.outs[0].identity(lay.batch * lay.M * lay.N)
            and _plain_fits(gm, gp)):
        return gp      # a pure reshape of Y: the plain path writes it (sizes read at run time)
    gp.lay = lay
    return gp


def _with_output(gm, value):
    """A copy of gm whose only output is `value` (same placeholders, dead nodes dropped)."""
    g = fx.Graph()
    env = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            break
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output((env[value],))
    g.eliminate_dead_code()
    return fx.GraphModule(gm, g)


def _bmm_operands(gm, node):
    """(A, B) gemm_layout.Operands of a batched matmul (bmm, or matmul other than
    (..., K) x (K, N) of region inputs); None for linear/addmm/mm and plain matmul."""
    t = node.target
    if t not in (aten.bmm.default, aten.matmul.default):
        return None
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    a, b = node.args[0], node.args[1]
    plain = a in ph and b in ph and (t is aten.bmm.default or
                                     (len(shape_of(b)) == 2 and len(shape_of(a)) >= 2))
    if plain:
        return None
    if len(shape_of(a)) < 2 or len(shape_of(b)) < 2:
        raise Unsupported("matmul with a 1-D operand")
    lead = shape_of(node)[:-2]
    ops_ = [gl.operand_of(a, ph, lead), gl.operand_of(b, ph, lead)]
    if any(o.outer > 1 for o in ops_):     # both in the outer-loop form: cuBLASLt batches the last dim
        inner = lead[-1]
        ops_ = [o if o.outer > 1 or o.batch == 1 else
                dataclasses.replace(o, batch=inner, outer=o.batch // inner, s_outer=o.s_batch * inner)
                for o in ops_]
        ops_ = [dataclasses.replace(o, outer=math.prod(lead) // inner) if o.batch == 1 else o for o in ops_]
    return ops_[0], ops_[1]


def _layout_gemm(gm, node, src, operands, gp: GemmMatch) -> LayoutGemm:
    gshape = shape_of(node)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if operands is not None:
        A, B = operands
        M, N = gshape[-2], gshape[-1]
        K = shape_of(node.args[0])[-1]
        batch = math.prod(gshape[:-2])
    else:
        batch, M, N, K, A, B = _plain_operands(gp, ph)
    outs = tuple(gl.output_layouts(gm, src, batch, M, N))
    A, B = _loop_for_outputs(A, B, outs, batch)
    outer = max(A.outer, B.outer)
    if outer > 1 and any(o.box.extent[0] != batch for o in outs):
        raise Unsupported("an output over part of the batch of a looped batched matmul")
    return LayoutGemm(batch, M, N, K, A, B, outs, tuple(shape_of(p) for p in ph), outer,
                      tuple(gl.memory_strides(p) for p in ph))


def _plain_fits(gm, gp: GemmMatch) -> bool:
    """Whether the plain path's contract holds at the captured strides: X, W and the output
    contiguous. MLP-Mixer's token MLP reads X transposed ([B, C, T] of a [B, T, C] tensor), and as
    captured its channel MLP's residual add stored its output transposed (extract.row_major_boundary
    now lays that one out row-major): the plain path's kernels refused both at their own shape,
    every candidate a launch error (zoo-20261130-143804)."""
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return all(gl.is_row_major(n) for n in (ph[gp.a], ph[gp.b], *_graph_outputs(gm)))


def _rows_of(sizes, strides) -> list[tuple[int, int]]:
    """(size, stride) of the dims of size > 1, neighbours that step as one dim merged."""
    dims: list[list[int]] = []
    for n, st in zip(sizes, strides):
        if n == 1:
            continue
        if dims and dims[-1][1] == st * n:
            dims[-1] = [dims[-1][0] * n, st]
        else:
            dims.append([n, st])
    return [tuple(d) for d in dims]


def _plain_operands(gp: GemmMatch, ph) -> tuple:
    """(batch, M, N, K, A, B) of a linear / mm / bmm of region inputs, at their captured strides:
    X's leading dims as cuBLASLt's batch and M where they step as at most two strides (X [B, C, T]
    read transposed: batch B, M C with row step 1), W broadcast over the batch (linear, mm)."""
    xs, ws = shape_of(ph[gp.a]), shape_of(ph[gp.b])
    xst, wst = gl.memory_strides(ph[gp.a]), gl.memory_strides(ph[gp.b])
    K = xs[-1]
    if gp.op == "bmm":            # X [batch, M, K], W [batch, K, N]
        return (xs[0], xs[1], ws[2], K, gl.Operand(gp.a, xs[0], xst[0], xst[1], xst[2]),
                gl.Operand(gp.b, ws[0], wst[0], wst[1], wst[2]))
    lead = _rows_of(xs[:-1], xst[:-1]) or [(1, K)]
    if len(lead) > 2:
        raise Unsupported("a GEMM input X whose leading dims step as more than two strides")
    (batch, s_batch), (M, s_row) = lead if len(lead) == 2 else [(1, 0), lead[0]]
    A = gl.Operand(gp.a, batch, s_batch, s_row, xst[-1])
    if gp.op == "linear":         # W [N, K]: B = W^T, K x N
        return batch, M, ws[0], K, A, gl.Operand(gp.b, 1, 0, wst[1], wst[0])
    return batch, M, ws[1], K, A, gl.Operand(gp.b, 1, 0, wst[0], wst[1])   # W [K, N]


def _loop_for_outputs(A: gl.Operand, B: gl.Operand, outs, batch: int):
    """Operands in the outer-loop form when a contiguous output cannot take cuBLASLt's batch as one
    stride but can per outer index: bmm [B*H, T, d] -> [B, T, H*d] (merge heads) is B calls of H."""
    if A.outer > 1 or B.outer > 1 or batch == 1 or any(o.box.extent[0] != batch for o in outs):
        return A, B
    steps = sorted({step for o in outs for axis, step in o.box.dims if axis == 0 and step > 1})
    if not steps or batch % steps[0] or all(_one_batch_stride(o) for o in outs):
        return A, B
    inner = steps[0]

    def looped(op: gl.Operand) -> gl.Operand:
        if op.batch == 1:
            return dataclasses.replace(op, outer=batch // inner)
        return dataclasses.replace(op, batch=inner, outer=batch // inner, s_outer=op.s_batch * inner)
    return looped(A), looped(B)


def _one_batch_stride(o: gl.OutLayout) -> bool:
    """Whether the contiguous output steps Y's batch with one stride (cuBLASLt's batch as it is)."""
    contig = [math.prod(o.shape[j + 1:]) * mult for j, mult in o.fine_dst()]
    dims = sorted((step, st) for (axis, step), st in zip(o.box.dims, contig) if axis == 0)
    return all(st == dims[0][1] * step for step, st in dims) if dims else True


def _match_plain(gm, node, policy, operands_checked: bool = False) -> GemmMatch:
    """The GEMM with an elementwise epilogue producing one output of its shape (operands_checked:
    the operands are bmm/matmul views the layout path binds; a and b then index nothing)."""
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    t, args = node.target, node.args
    bias = None
    if operands_checked:
        op, a, b = "bmm", args[0], args[1]
    elif t is aten.linear.default:
        op, a, b = "linear", args[0], args[1]
        bias = args[2] if len(args) > 2 else None
        if len(shape_of(b)) != 2:
            raise Unsupported("linear weight must be 2-D")
    elif t is aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            raise Unsupported("addmm with beta/alpha != 1")
        op, bias, a, b = "mm", args[0], args[1], args[2]
    elif t is aten.bmm.default:
        op, a, b = "bmm", args[0], args[1]
    else:
        op, a, b = "mm", args[0], args[1]
        if t is aten.matmul.default and (len(shape_of(b)) != 2 or len(shape_of(a)) < 2):
            raise Unsupported("matmul other than (..., K) x (K, N)")
    if not operands_checked:
        for x in (a, b):
            if x not in ph:
                raise Unsupported("GEMM operands must be region inputs (no prologue ops before the GEMM)")
    dt = dtype_of(node)
    if dtype_of(a) != dt or dtype_of(b) != dt:
        raise Unsupported("mixed-dtype GEMM")
    gshape = shape_of(node)
    check_single_output(gm, gshape, dt, "GEMM")
    g_index = len(ph)

    def leaf(low, n, amap):
        e = low.access(g_index, "dims", amap[1]) if amap[0] == "dims" else low.access(g_index, amap[0])
        if bias is not None:
            e = ("add", e, low.val(bias, low.operand_map(amap, gshape, shape_of(bias))))
        return e

    prog = lower(gm, leaves={node: leaf}, extra_inputs=[(gshape, dt)])
    if prog.kind != "elementwise":
        raise Unsupported("row ops after a GEMM")
    if any(x[0] == "in" and prog.accesses[x[1]].input == g_index and prog.accesses[x[1]].dims !=
           tuple(range(prog.ndim)) for x in walk(prog.outputs[0].expr)):
        raise Unsupported("GEMM result read broadcast/reshaped in the epilogue")
    ia = ph.index(a) if a in ph else -1
    ib = ph.index(b) if b in ph else -1
    gp = GemmMatch(op, ia, ib, dt, prog, g_index, bool(policy and policy.allow_tf32))
    G = _g_expr(prog, g_index)
    fits = (lt_split(gp)[0] is not None or prog.outputs[0].expr == G
            or alpha_split(gp, None, prog.outputs[0].expr)[1] == G)
    lib = cutlass_reason(gp) is None and gemm_cutlass.library_ready()
    gp.facts = TaskFacts("gemm", gshape[-1], 16 // DT[dt][2], has_transcendental=prog.has_transcendental,
                       low_precision=dt != "float32", allow_tf32=gp.allow_tf32, fp32=dt == "float32",
                       epilogue_fits_lt=fits, cutlass_tiles=tuple(range(len(gemm_cutlass.TILES))) if lib else (),
                       lt_tiles=tuple(LT_TILES.get(default_arch(), ())))
    return gp


def _g_expr(prog: ExprProgram, g: int) -> tuple:
    ident = tuple(range(prog.ndim))
    for i, a in enumerate(prog.accesses):
        if a.input == g and a.mode == "dims" and a.dims == ident:
            return ("in", i)
    return ("in", -1)


def _strip(e: tuple) -> tuple:
    while e[0] == "round":
        e = e[2]
    return e


def _bias_of(gp: GemmMatch, e: tuple) -> int | None:
    """The input index of b where e is G + b with b a vector [N] of the GEMM's dtype (a per-column
    bias), else None."""
    prog, G = gp.epilogue, _g_expr(gp.epilogue, gp.g)
    e = _strip(e)
    if e[0] != "add":
        return None
    x, y = _strip(e[1]), _strip(e[2])
    for u, v in ((x, y), (y, x)):
        if u == G and v[0] == "in":
            acc = prog.accesses[v[1]]
            shape, dt = prog.inputs[acc.input]
            if acc.mode == "dims" and acc.dims == (prog.ndim - 1,) and len(shape) == 1 and dt == gp.dtype:
                return acc.input
    return None


def _factor_of(gp: GemmMatch, e: tuple) -> tuple[tuple, int] | None:
    """(f, U's input index) where e is f * U with U [..., N] an input shaped as the GEMM's output,
    read in its own layout, of its dtype (SwiGLU's up projection); else None."""
    prog, G = gp.epilogue, _g_expr(gp.epilogue, gp.g)
    e = _strip(e)
    if e[0] != "mul":
        return None
    ident = tuple(range(prog.ndim))
    for f, u in ((e[1], e[2]), (e[2], e[1])):
        u = _strip(u)
        if u[0] == "in" and u != G:
            acc = prog.accesses[u[1]]
            shape, dt = prog.inputs[acc.input]
            if acc.mode == "dims" and acc.dims == ident and shape == prog.inputs[gp.g][0] and dt == gp.dtype:
                return _strip(f), acc.input
    return None


def cutlass_epilogue(gp: GemmMatch) -> gemm_cutlass.Epilogue | None:
    """The library's epilogue where the whole epilogue is act(G [+ bias]) with act one of
    gemm_cutlass.ACTS' activations or none, or silu(G) * U (silu_mul, _factor_of); None for any other."""
    G = _g_expr(gp.epilogue, gp.g)
    e, act = _strip(gp.epilogue.outputs[0].expr), None
    swiglu = _factor_of(gp, e)
    if swiglu is not None and swiglu[0][0] == "silu" and _strip(swiglu[0][1]) == G:
        return gemm_cutlass.Epilogue("silu_mul", mul=swiglu[1])
    if e[0] in gemm_cutlass.ACTS:
        act, e = e[0], _strip(e[1])
    if e == G:
        return gemm_cutlass.Epilogue(act)
    b = _bias_of(gp, e)
    return gemm_cutlass.Epilogue(act, bias=b) if b is not None else None


def cutlass_reason(gp: GemmMatch) -> str | None:
    """Why the cutlass_gemm library cannot run this region (None: it can, once built)."""
    epi = cutlass_epilogue(gp)
    n, k = gp.epilogue.inputs[gp.g][0][-1], gp.epilogue.inputs[gp.b][0][-1] if gp.b >= 0 else 0
    return gemm_cutlass.reason(gp.op, gp.dtype, n, k, epi.act if epi else None, gp.lay is not None)


def cutlass(gp: GemmMatch, params: dict) -> bool:
    """Whether params select the CUTLASS library's kernel and this region allows it."""
    return bool(params.get("cutlass")) and cutlass_reason(gp) is None


def lt_split(gp: GemmMatch):
    """(lt epilogue kind, bias input index, remaining expression with the fused part replaced by G).
    Picks the largest sub-expression of the form act(G + bias) that cuBLASLt can fuse."""
    prog, G = gp.epilogue, _g_expr(gp.epilogue, gp.g)

    def classify(e):
        s = _strip(e)
        if s[0] in ("relu", "gelu_tanh"):
            inner = _strip(s[1])
            act = "relu" if s[0] == "relu" else "gelu"
            if inner == G:
                return act, None
            b = _bias_of(gp, inner)
            if b is not None:
                return f"{act}_bias", b
        b = _bias_of(gp, s)
        if b is not None:
            return "bias", b
        return None

    best = None
    for sub in walk(prog.outputs[0].expr):       # pre-order: outermost matches come first
        c = classify(sub)
        if c is not None:
            best = (c, sub)
            break
    if best is None:
        return None, None, prog.outputs[0].expr
    (kind, b), sub = best
    rest = _replace(prog.outputs[0].expr, sub, G)
    return kind, b, rest


def _replace(e: tuple, old: tuple, new: tuple) -> tuple:
    if e == old:
        return new
    if e[0] in ("in", "const", "red"):
        return e
    return tuple(_replace(a, old, new) if isinstance(a, tuple) else a for a in e)


def alpha_split(gp: GemmMatch, kind, rest: tuple) -> tuple[float, tuple]:
    """(alpha, rest): a constant scale of the bare product (q @ k^T * 1/sqrt(d)) is cuBLASLt's alpha,
    so the GEMM writes the scaled result itself. Only without a bias epilogue: cuBLASLt adds the
    bias after alpha, where the graph scales the biased value."""
    G = _g_expr(gp.epilogue, gp.g)
    e = _strip(rest)
    if kind is None and e[0] == "mul":
        for x, c in ((e[1], e[2]), (e[2], e[1])):
            if _strip(x) == G and c[0] == "const":
                return c[1], G
    return 1.0, rest


def _prune(prog: ExprProgram) -> ExprProgram:
    """Drop accesses the (reduced) epilogue no longer reads, e.g. the bias cuBLASLt now adds."""
    used = sorted({x[1] for x in walk(prog.outputs[0].expr) if x[0] == "in"})
    remap = {old: new for new, old in enumerate(used)}

    def re(e):
        if e[0] == "in":
            return ("in", remap[e[1]])
        if e[0] in ("const", "red"):
            return e
        return tuple(re(a) if isinstance(a, tuple) else a for a in e)
    out = dataclasses.replace(prog.outputs[0], expr=re(prog.outputs[0].expr))
    return dataclasses.replace(prog, accesses=[prog.accesses[i] for i in used], outputs=[out])


def _split_epilogue(gp: GemmMatch, params: dict) -> tuple:
    """What cuBLASLt's own epilogue takes (its kind, the bias input, alpha) and what is left for
    our epilogue kernel: (kind, bias, alpha, epilogue program or None, its EwParams, its source)."""
    kind, bias, rest = lt_split(gp) if params.get("lt_epilogue") else (None, None, None)
    prog = gp.epilogue
    alpha = 1.0
    if rest is None:
        rest = prog.outputs[0].expr
    elif params.get("lt_epilogue"):
        alpha, rest = alpha_split(gp, kind, rest)
    ew_params = {k: v for k, v in params.items() if k in elementwise.EwParams.__dataclass_fields__}
    ew_params["nc"] = False      # NOTE: the epilogue overwrites G in place; no read-only path on it
    if rest == _g_expr(prog, gp.g):
        return kind, bias, alpha, None, ew_params, ""
    epi_prog = _prune(dataclasses.replace(prog, outputs=[dataclasses.replace(prog.outputs[0], expr=rest)]))
    epi_src = host.EPILOGUE_INPUTS + elementwise.generate(epi_prog, elementwise.EwParams(**ew_params),
                                                          gp.facts.low_precision, entry="static int epilogue_run",
                                                          restrict=False, prelude=False)
    return kind, bias, alpha, epi_prog, ew_params, epi_src


def _lt_gemm(gp: GemmMatch, params: dict, kind) -> str:
    """C++ typedef Gemm: the GEMM's knobs as cublaslt.cuh's LtGemm<dtype, compute type, Lt epilogue,
    algorithm[, forced tile]>."""
    tf32 = bool(params.get("tf32")) and gp.allow_tf32 and gp.dtype == "float32"
    compute = "CUBLAS_COMPUTE_32F_FAST_TF32" if tf32 else "CUBLAS_COMPUTE_32F"
    tile = f", {int(params['lt_tile'])}" if params.get("lt_tile") else ""
    return f"typedef LtGemm<{DT[gp.dtype][0]}, {compute}, {LT_EPI[kind]}, {int(params.get('algo', 0))}{tile}> Gemm;"


def _head(gp: GemmMatch, what: str, kind, params: dict) -> list[str]:
    """A source's first parts: the line naming the candidate, the prelude, cuBLASLt and lt_call."""
    return [f"// torch_htam expert: cuBLASLt {gp.op}{what} epilogue={kind} params={sorted(params.items())}",
            PRELUDE, "#include <algorithm>", "#include <cublasLt.h>", "", CUBLASLT, LT_CALL]


def render(gp: GemmMatch, params: dict) -> str:
    """CUDA source of a GEMM region: gemm_plain (gemm_plain.cuh, sizes read at run time) writes Y,
    then the epilogue kernel runs in place on it where cuBLASLt's epilogue leaves some; the layout
    path (render_layout) where gp.lay is set."""
    if cutlass(gp, params):
        return gemm_cutlass.render(gp.a, gp.b, cutlass_epilogue(gp), len(gp.epilogue.inputs) - 1, int(params.get("cg_tile", 0)))
    if gp.lay is not None:
        return render_layout(gp, params)
    prog = gp.epilogue
    kind, bias, alpha, epi_prog, _, epi_src = _split_epilogue(gp, params)
    bias_in = bias if kind and kind.endswith("bias") else -1
    tail = ["  return HTAM_OK;"]
    if epi_prog is not None:
        tail = ["  {", host.extend_inputs(len(prog.inputs), None, "    ", y="out[0]"),
                "    return epilogue_run(ext, n_in + 1, out, n_out, stream);", "  }"]
    return "\n".join(_head(gp, "", kind, params) + [GEMM_PLAIN, epi_src, _lt_gemm(gp, params, kind), "", ENTRY] + [
        f"  if (n_in != {len(prog.inputs) - 1} || n_out != 1) return HTAM_ERR_SHAPE;",
        "  bool empty = false;",
        f"  const int rc = gemm_plain<Gemm, {GEMM_OPS[gp.op]}>(in, {gp.a}, {gp.b}, {bias_in}, out[0], "
        f"{c_float(alpha)}, &empty, stream);",
        "  if (rc || empty) return rc;"] + tail + ["}", ""])


# ---- the layout path: operands that are views, outputs that are layouts -----------------------

def _lt_operands(L: LayoutGemm) -> dict:
    """cuBLASLt's roles (column-major D = N x M = op(A) op(B), see the module docstring) for the
    row-major operands A[M, K] (strides s_row, s_col) and B[K, N]: cuBLASLt's A is our B^T (N x K),
    its B our A^T (K x M). A unit column stride reads as op N, a unit row stride as op T."""
    def role(rows_n, cols_n, s_row, s_col, name):
        # our operand [R, C] as cuBLASLt's C x R (op N, ld = s_row) or stored R x C (op T, ld = s_col)
        if s_col == 1 or cols_n == 1:
            ld = s_row if rows_n > 1 else cols_n
            if ld >= cols_n:
                return 0, ld
        if s_row == 1 or rows_n == 1:
            ld = s_col if cols_n > 1 else rows_n
            if ld >= rows_n:
                return 1, ld
        raise Unsupported(f"matmul operand {name} with neither unit row nor unit column stride")
    ta, lda = role(L.K, L.N, L.B.s_row, L.B.s_col, "B")
    tb, ldb = role(L.M, L.K, L.A.s_row, L.A.s_col, "A")
    return {"ta": ta, "lda": lda, "tb": tb, "ldb": ldb}


def _braced(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


def _layout_tables(L: LayoutGemm) -> str:
    """C++ constants kGemm (LayGemm) and kOut[] (LayOut per output), gemm_layout.cuh's structs."""
    r, A, B = _lt_operands(L), L.A, L.B
    gemm = [L.batch, L.M, L.N, L.K, L.outer, r["ta"], r["tb"], r["lda"], r["ldb"],
            B.s_batch if B.batch > 1 else 0, A.s_batch if A.batch > 1 else 0, B.s_col, A.s_row, B.s_outer, A.s_outer]
    outs = []
    for o in L.outs:
        v = o.view
        fine = [_braced([s, st, j, mult, axis, step]) for s, st, (j, mult), (axis, step)
                in zip(v.sizes, v.strides, o.fine_dst(), o.box.dims)]
        outs.append("  " + _braced([v.base, _braced(o.box.lo), _braced(o.box.extent), len(fine), _braced(fine)]))
    return "\n".join([
        "// {batch, M, N, K, outer, ta, tb, lda, ldb, sa, sb, a_col, b_row, a_outer, b_outer}",
        f"static const LayGemm kGemm = {_braced(gemm)};",
        "// per output: {base, lo (b, m, n), extent, fine dims: {size, src, dim, mult, axis, step}}",
        f"static const LayOut kOut[{len(L.outs)}] = {{", ",\n".join(outs), "};"])


def _sizes_check(t: str, shape, *extra: str) -> str:
    conds = [f"{t}.ndim != {len(shape)}", *extra, *(f"{t}.sizes[{d}] != {s}" for d, s in enumerate(shape))]
    return f"  if ({' || '.join(conds)}) return HTAM_ERR_SHAPE;"


def _strides_differ(i: int, L: LayoutGemm) -> str:
    """C++ conditions (each led by ' || ') true where in[i]'s strides are not the captured ones
    its operand was read at (size-1 dims step nowhere: any stride)."""
    return "".join(f" || in[{i}].strides[{d}] != {st}" for d, (n, st) in enumerate(zip(L.in_shapes[i], L.in_strides[i]))
                   if n != 1)


def _layout_checks(gp: GemmMatch, bias) -> list[str]:
    """C++ refusing (HTAM_ERR_SHAPE) inputs and outputs other than the captured ones: layouts bake
    the captured sizes. bias: the input cuBLASLt's BIAS epilogue reads, or None."""
    L, code = gp.lay, DT[gp.dtype][1]
    lines = [f"  if (n_in != {len(L.in_shapes)} || n_out != {len(L.outs)}) return HTAM_ERR_SHAPE;"]
    lines += [_sizes_check(f"in[{i}]", shape) for i, shape in enumerate(L.in_shapes)]
    lines += [f"  if (in[{i}].dtype != {code}{_strides_differ(i, L)}) return HTAM_ERR_SHAPE;"
              for i in sorted({L.A.input, L.B.input})]
    lines += [_sizes_check(f"out[{k}]", o.shape, f"out[{k}].dtype != {code}") for k, o in enumerate(L.outs)]
    if bias is not None:
        lines.append(f"  if (in[{bias}].dtype != {code} || in[{bias}].ndim != 1 || in[{bias}].sizes[0] != {L.N}) "
                     "return HTAM_ERR_SHAPE;")
    return lines


def _epilogue_functor(epi_prog: ExprProgram, dtype: str, fast: bool, low_precision: bool) -> str:
    """C++ struct EpiStore, epi_store's Epi (gemm_layout.cuh): the epilogue program over Y, its value
    from its accesses' pointers p{i} at offsets off[kAcc] (Y read from scratch)."""
    em = Emitter(load=lambda a: f"x{a}", red=None, fast=fast, low_precision=low_precision)
    y = em.emit(stored(epi_prog.outputs[0].expr, dtype))
    types = [DT[epi_prog.inputs[a.input][1]][0] for a in epi_prog.accesses]
    args = ", ".join(["const I* off"] + [f"const {t}::raw* p{i}" for i, t in enumerate(types)])
    return "\n".join(["struct EpiStore {", f"  static constexpr int kAcc = {len(types)};",
                      f"  template <typename I> static __device__ __forceinline__ float at({args}) {{",
                      *(f"    const float x{i} = ld1<{t}, false>(p{i} + off[{i}]);" for i, t in enumerate(types)),
                      *("    " + ln for ln in em.lines), f"    return {y};", "  }", "};"])


def _epilogue_y(gp: GemmMatch, epi_prog: ExprProgram, ptr: str) -> list[str]:
    """C++ declaring ys (Y at ptr, contiguous in the region's dims) and ext (the epilogue's inputs:
    the task's, then Y)."""
    return [f"    HtamTensor ys = lay_y({ptr}, {DT[gp.dtype][1]}, kY, {len(epi_prog.shape)});",
            host.extend_inputs(len(gp.epilogue.inputs), None, "    ", y="ys")]


def _fused_stores(gp: GemmMatch, epi_prog: ExprProgram) -> list[str]:
    """C++ launching epi_store once per output: Y (scratch `scr`) and the task's inputs bound as the
    epilogue program's accesses, the output written through its layout."""
    ptrs = "".join(f", (const {DT[epi_prog.inputs[a.input][1]][0]}::raw*)in[{a.input}].data"
                   for a in epi_prog.accesses)
    return ["  {", *_epilogue_y(gp, epi_prog, "scr"),
            "    const HtamTensor* in = ext;   // NOTE: the epilogue's inputs: the task's, then Y",
            "    int64_t it[HTAM_MAX_DIMS];",
            f"    for (int d = 0; d < {len(epi_prog.shape)}; ++d) it[d] = ys.sizes[d];",
            "    Space<NACC> sp;", host.bind_accesses(epi_prog),
            "    for (int k = 0; k < n_out; ++k) {",
            "      const int rc = lay_epi_store<Gemm, EpiStore>(sp, kGemm, kOut[k], max_off, out[k], stream"
            f"{ptrs});",
            "      if (rc) return rc;", "    }", "  }", "  return HTAM_OK;"]


def _direct(gp: GemmMatch, epi_prog) -> list[str]:
    """C++ writing every output with cuBLASLt straight into it where the outputs' strides allow
    (lay_direct), then the in-place epilogue where Y is the one output itself; else on to scratch."""
    L = gp.lay
    # NOTE: the in-place epilogue needs Y contiguous: direct only when Y is the one output itself
    in_place = len(L.outs) == 1 and L.outs[0].identity(L.batch * L.M * L.N)
    # a repeated output is written by the store kernel only
    direct = (epi_prog is None or in_place) and not any(o.box.repeats for o in L.outs)
    lines = [f"  bool direct = {'true' if direct else 'false'};"]
    epi = []
    if epi_prog is not None and in_place:
        lines.append("  if (!htam_contiguous(out[0])) direct = false;")
        epi = ["    {", *_epilogue_y(gp, epi_prog, "out[0].data"),
               "    const int rc = epilogue_run(ext, n_in + 1, &ys, 1, stream); if (rc) return rc; }"]
    return lines + ["  if (direct) {",
                    "    const int drc = lay_direct<Gemm>(kGemm, x, kOut, out, n_out, stream);",
                    "    if (drc != 0 && drc != HTAM_ERR_SHAPE) return drc;",
                    "    if (drc == 0) {", *epi, "      return HTAM_OK;", "    }", "  }"]


def render_layout(gp: GemmMatch, params: dict) -> str:
    """GEMM with layout operands/outputs (gemm_layout.cuh). Each output that is a (batched)
    column-major matrix box of Y at run time (its strides decide) is one cuBLASLt call straight into
    it (a split's q, k, v: three calls over their column ranges; heads of a batch, one call per outer
    index); otherwise cuBLASLt writes Y into scratch and one kernel per output writes it through its
    layout: the epilogue kernel where an epilogue remains (epi_store), else a plain store (layout_store)."""
    L = gp.lay
    kind, bias, alpha, epi_prog, ew_params, epi_src = _split_epilogue(gp, params)
    if not (kind and kind.endswith("bias")):
        bias = None
    consts = [_lt_gemm(gp, params, kind), _layout_tables(L)]
    if epi_prog is not None:
        epi_src += "\n" + _epilogue_functor(epi_prog, gp.dtype, bool(ew_params.get("fast")), gp.facts.low_precision)
        consts.append(f"static const int64_t kY[{len(epi_prog.shape)}] = {_braced(epi_prog.shape)};   // Y's shape")
    operands = (f"  const LtOperands x = {{(const char*)in[{L.B.input}].data, (const char*)in[{L.A.input}].data, "
                f"{'nullptr' if bias is None else f'(const char*)in[{bias}].data'}, {c_float(alpha)}}};")
    stores = (_fused_stores(gp, epi_prog) if epi_prog is not None else
              ["  return lay_store<Gemm>(kGemm, kOut, scr, out, n_out, stream);"])
    return "\n".join(_head(gp, " with layouts", kind, params) + [GEMM_LAYOUT, epi_src, *consts, "", ENTRY] +
                     _layout_checks(gp, bias) + [operands] + _direct(gp, epi_prog) + [
                         "  void* scr = nullptr;",
                         "  { const int rc = lay_scratch<Gemm>(kGemm, x, &scr, stream); if (rc) return rc; }"]
                     + stores + ["}", ""])


# ---- the GEMM target (target.Target) ---------------------------------------------------------------

# strategy ids whose presence _gemm_tags decides from the params
TAG_IDS = ("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores", "bf16_tensor_cores",
           "vectorized_16b_access", "smem_tiling")
# cuBLASLt's knobs: a move of one leaves CUTLASS's path (refit)
LT_KEYS = {"lt_epilogue", "algo", "tf32", "lt_tile"}


def defaults(gp: GemmMatch) -> dict:
    p = elementwise.epilogue_params(16 // DT[gp.dtype][2])
    p.update(lt_epilogue=gp.facts.epilogue_fits_lt, tf32=gp.allow_tf32 and gp.dtype == "float32", algo=0)
    if gp.facts.cutlass_tiles:     # the activation in the GEMM's epilogue: one launch, y stored once
        shape = gp.epilogue.inputs[gp.g][0]
        p.update(cutlass=True, cg_tile=gemm_cutlass.default_tile(math.prod(shape[:-1]), shape[-1]))
    return p


def _gemm_tags(params: dict, facts: TaskFacts) -> list[str]:
    if params.get("cutlass") and facts.cutlass_tiles:
        return ["smem_tiling", "bf16_tensor_cores"]
    tags = ["cublaslt_epilogue" if params["lt_epilogue"] else "gemm_plus_epilogue_kernel"]
    if params.get("lt_tile"):
        tags.append("smem_tiling")
    if params.get("tf32") and facts.allow_tf32 and facts.fp32:
        tags.append("tf32_tensor_cores")
    if not facts.fp32:
        tags.append("bf16_tensor_cores")
    return tags


def tags(gp: GemmMatch, params: dict) -> list[str]:
    return ["single_kernel_launch", "fuse_elementwise_chain"] + _gemm_tags(params, gp.facts)


def retag(gp: GemmMatch, params: dict, tags: list[str]) -> list[str]:
    """GEMM tags follow the GEMM path actually used."""
    return [t for t in tags if t not in TAG_IDS] + _gemm_tags(params, gp.facts)


def grid(gp: GemmMatch, base: dict) -> list[dict]:
    """CUTLASS's tiles first where its library runs the region, then cuBLASLt's ranked algorithms,
    with and without its fused epilogue, then its first algorithm on each tile of LT_TILES."""
    lib = [dict(base, cutlass=True, cg_tile=t) for t in gp.facts.cutlass_tiles]
    off = {"cutlass": False} if base.get("cutlass") else {}
    return (lib + [dict(base, lt_epilogue=v, algo=algo, **off) for v in (base["lt_epilogue"], not base["lt_epilogue"])
                   for algo in range(8)]
            + [dict(base, algo=0, lt_tile=t, **off) for t in gp.facts.lt_tiles])


def canonical(gp: GemmMatch, params: dict) -> dict:
    """CUTLASS's kernel reads its tile only: cuBLASLt's and the epilogue kernel's knobs at their
    defaults; cuBLASLt's path reads no tile."""
    if cutlass(gp, params):
        return dict(defaults(gp), cutlass=True, cg_tile=params.get("cg_tile", 0))
    return {k: v for k, v in params.items() if k != "cg_tile" and not (k == "lt_tile" and not v)}


def refit(gp: GemmMatch, p: dict, moved: dict) -> dict:
    """A move of cuBLASLt's knobs leaves CUTLASS's kernel for cuBLASLt's path."""
    if LT_KEYS & set(moved) and "cutlass" not in moved and p.get("cutlass"):
        return dict(p, cutlass=False)
    return p


def alternates(gp: GemmMatch, base: dict) -> list[dict]:
    """cuBLASLt's default beside CUTLASS's in a task's first step: timing picks per region."""
    return [canonical(gp, dict(base, cutlass=False))] if base.get("cutlass") else []


TARGET = Target(
    kind="gemm", match=match, defaults=defaults, tags=tags, retag=retag,
    start_order=("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores"),
    grid=grid, render=lambda gp, params: render(gp, params), refit=refit, canonical=canonical,
    alternates=alternates,
    libraries=lambda gp: (gemm_cutlass.LIBRARY,) if cutlass_reason(gp) is None else ())
