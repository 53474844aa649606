"""GEMM regions: cuBLASLt matmul with its fused epilogue, plus one in-place epilogue kernel for the rest.

Row-major torch Y[M, N] is column-major Y^T[N, M], so linear (Y = X W^T) runs as
C(N x M) = op_T(W stored K x N) * X^T(stored K x M), and mm/bmm (Y = A B) as
C(N x M) = B^T(stored N x K) * A^T(stored K x M). A bias of length N is then per row of C, which is
what cuBLASLt's BIAS epilogues add. cuBLASLt writes the GEMM result straight into the output; what
the Lt epilogue can't express (erf GELU, residual adds, scales) runs as one fused elementwise kernel
that reads and overwrites the output in place.

NOTE: the cuBLASLt handle and a 32 MiB workspace are created lazily on the first call per device
(cudaMalloc): make the first call outside CUDA-graph capture (verification always does).

    >>> gp = match(task.graph, policy); src = render(gp, defaults(gp))
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from torch_htam.proposers.expert import elementwise, host
from torch_htam.proposers.expert import gemm_layout as gl
from torch_htam.proposers.expert.cuda import DT, PRELUDE, Emitter, c_float, cuh
from torch_htam.proposers.expert.ir import (
    ExprProgram, Unsupported, _graph_outputs, check_single_output, dtype_of, lower, shape_of, stored, walk,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target

aten = torch.ops.aten
GEMMS = {aten.linear.default, aten.addmm.default, aten.mm.default, aten.matmul.default, aten.bmm.default}
CUDA_TYPES = {"float32": "CUDA_R_32F", "bfloat16": "CUDA_R_16BF", "float16": "CUDA_R_16F"}
CUBLASLT = cuh("cublaslt.cuh")     # the handle, workspace and descriptor cache: no params in it
LT_CALL = cuh("lt_call.cuh")       # lt_call (a matmul described by value), the layout store, scratch
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
            return _match_plain(gm, node, policy)
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
    if operands is None and len(lay.outs) == 1 and lay.outs[0].identity(lay.batch * lay.M * lay.N):
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
        xs, ws = shape_of(ph[gp.a]), shape_of(ph[gp.b])
        K, batch = xs[-1], 1
        M = math.prod(xs) // K
        if gp.op == "linear":        # X [M, K] rows, W [N, K]: B = W^T, a K x N view with row step 1
            N = ws[0]
            A, B = gl.Operand(gp.a, 1, 0, K, 1), gl.Operand(gp.b, 1, 0, 1, K)
        elif gp.op == "bmm":
            batch, M, N = xs[0], xs[1], ws[2]
            A, B = gl.Operand(gp.a, batch, M * K, K, 1), gl.Operand(gp.b, batch, K * N, N, 1)
        else:
            N = ws[1]
            A, B = gl.Operand(gp.a, 1, 0, K, 1), gl.Operand(gp.b, 1, 0, N, 1)
    outs = tuple(gl.output_layouts(gm, src, batch, M, N))
    A, B = _loop_for_outputs(A, B, outs, batch)
    outer = max(A.outer, B.outer)
    if outer > 1 and any(o.box.extent[0] != batch for o in outs):
        raise Unsupported("an output over part of the batch of a looped batched matmul")
    return LayoutGemm(batch, M, N, K, A, B, outs, tuple(shape_of(p) for p in ph), outer)


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
    gp.facts = TaskFacts("gemm", gshape[-1], 16 // DT[dt][2], has_transcendental=prog.has_transcendental,
                       low_precision=dt != "float32", allow_tf32=gp.allow_tf32, fp32=dt == "float32",
                       epilogue_fits_lt=fits)
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


def lt_split(gp: GemmMatch):
    """(lt epilogue kind, bias input index, remaining expression with the fused part replaced by G).
    Picks the largest sub-expression of the form act(G + bias) that cuBLASLt can fuse."""
    prog, G = gp.epilogue, _g_expr(gp.epilogue, gp.g)
    D = prog.ndim

    def bias_of(e):
        e = _strip(e)
        if e[0] != "add":
            return None
        x, y = _strip(e[1]), _strip(e[2])
        for u, v in ((x, y), (y, x)):
            if u == G and v[0] == "in":
                acc = prog.accesses[v[1]]
                shape, dt = prog.inputs[acc.input]
                if acc.mode == "dims" and acc.dims == (D - 1,) and len(shape) == 1 and dt == gp.dtype:
                    return acc.input
        return None

    def classify(e):
        s = _strip(e)
        if s[0] in ("relu", "gelu_tanh"):
            inner = _strip(s[1])
            act = "relu" if s[0] == "relu" else "gelu"
            if inner == G:
                return act, None
            b = bias_of(inner)
            if b is not None:
                return f"{act}_bias", b
        b = bias_of(s)
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


def _layouts(op: str) -> dict:
    """cuBLASLt operand roles for row-major torch tensors (see module docstring)."""
    if op == "linear":   # A = W (stored K x N, ld K, op T), B = X (stored K x M, ld K)
        return {"transa": "CUBLAS_OP_T", "a_rows": "K", "a_cols": "N", "lda": "K"}
    return {"transa": "CUBLAS_OP_N", "a_rows": "N", "a_cols": "K", "lda": "N"}   # A = B^T


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


def render(gp: GemmMatch, params: dict) -> str:
    if gp.lay is not None:
        return render_layout(gp, params)
    prog = gp.epilogue
    kind, bias, alpha, epi_prog, ew_params, epi_src = _split_epilogue(gp, params)
    epi_needed = epi_prog is not None
    lay = _layouts(gp.op)
    ctype = CUDA_TYPES[gp.dtype]
    tf32 = bool(params.get("tf32")) and gp.allow_tf32 and gp.dtype == "float32"
    compute = "CUBLAS_COMPUTE_32F_FAST_TF32" if tf32 else "CUBLAS_COMPUTE_32F"
    epi_call = (f"  {{\n{host.extend_inputs(len(prog.inputs), None, '    ', y='out[0]')}\n"
                f"    return epilogue_run(ext, n_in + 1, out, n_out, stream);\n  }}") if epi_needed else "  return HTAM_OK;"
    bias_set = ""
    if kind and kind.endswith("bias"):
        bias_set = (f"    const void* bias = in[{bias}].data;\n"
                    f"    if (in[{bias}].ndim != 1 || in[{bias}].sizes[0] != N || in[{bias}].dtype != {DT[gp.dtype][1]}) return HTAM_ERR_SHAPE;\n"
                    "    CK(cublasLtMatmulDescSetAttribute(E.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));")
    a, b = gp.a, gp.b
    algo = int(params.get("algo", 0))
    if gp.op == "linear":
        shape_code = f"""  const HtamTensor& X = in[{a}]; const HtamTensor& W = in[{b}];
  if (X.ndim < 1 || W.ndim != 2 || !htam_contiguous(X) || !htam_contiguous(W)) return HTAM_ERR_SHAPE;
  const int64_t K = X.sizes[X.ndim - 1], N = W.sizes[0];
  if (W.sizes[1] != K || K == 0) return HTAM_ERR_SHAPE;
  const int64_t M = htam_numel(&X) / K, batch = 1;
  const void* Aptr = W.data; const void* Bptr = X.data;
  const int64_t sA = 0, sB = 0;"""
    elif gp.op == "bmm":
        shape_code = f"""  const HtamTensor& X = in[{a}]; const HtamTensor& W = in[{b}];
  if (X.ndim != 3 || W.ndim != 3 || !htam_contiguous(X) || !htam_contiguous(W)) return HTAM_ERR_SHAPE;
  const int64_t batch = X.sizes[0], M = X.sizes[1], K = X.sizes[2], N = W.sizes[2];
  if (W.sizes[0] != batch || W.sizes[1] != K || K == 0) return HTAM_ERR_SHAPE;
  const void* Aptr = W.data; const void* Bptr = X.data;
  const int64_t sA = K * N, sB = M * K;"""
    else:
        shape_code = f"""  const HtamTensor& X = in[{a}]; const HtamTensor& W = in[{b}];
  if (X.ndim < 2 || W.ndim != 2 || !htam_contiguous(X) || !htam_contiguous(W)) return HTAM_ERR_SHAPE;
  const int64_t K = X.sizes[X.ndim - 1], N = W.sizes[1];
  if (W.sizes[0] != K || K == 0) return HTAM_ERR_SHAPE;
  const int64_t M = htam_numel(&X) / K, batch = 1;
  const void* Aptr = W.data; const void* Bptr = X.data;
  const int64_t sA = 0, sB = 0;"""
    return f"""// torch_htam expert: cuBLASLt {gp.op} epilogue={kind} params={sorted(params.items())}
{PRELUDE}
#include <algorithm>
#include <cublasLt.h>

{epi_src}

{CUBLASLT}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {len(prog.inputs) - 1} || n_out != 1) return HTAM_ERR_SHAPE;
  if (in[{a}].dtype != {DT[gp.dtype][1]} || in[{b}].dtype != {DT[gp.dtype][1]} || out[0].dtype != {DT[gp.dtype][1]}) return HTAM_ERR_SHAPE;
{shape_code}
  if (!htam_contiguous(out[0]) || htam_numel(&out[0]) != batch * M * N) return HTAM_ERR_SHAPE;
  if (M == 0 || N == 0) return HTAM_OK;
  LtState* st = nullptr;
  int rc = lt_state(&st);
  if (rc) return rc;
  int dev = 0; cudaGetDevice(&dev);
  const int al[3] = {{align_of(Aptr), align_of(Bptr), align_of(out[0].data)}};
  static LtEntry cache[4];
  static int next_slot = 0;
  LtEntry* e = nullptr;
  for (auto& c : cache)
    if (c.used && c.dev == dev && c.M == M && c.N == N && c.K == K && c.batch == batch &&
        c.al[0] == al[0] && c.al[1] == al[1] && c.al[2] == al[2]) e = &c;
  if (!e) {{
    e = &cache[next_slot]; next_slot = (next_slot + 1) % 4;
    if (e->used) {{
      cublasLtMatmulDescDestroy(e->op); cublasLtMatrixLayoutDestroy(e->A);
      cublasLtMatrixLayoutDestroy(e->B); cublasLtMatrixLayoutDestroy(e->C);
      e->used = false;
    }}
    CK(cublasLtMatmulDescCreate(&e->op, {compute}, CUDA_R_32F));
    cublasOperation_t ta = {lay["transa"]}, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = {LT_EPI[kind]};
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CK(cublasLtMatrixLayoutCreate(&e->A, {ctype}, {lay["a_rows"]}, {lay["a_cols"]}, {lay["lda"]}));
    CK(cublasLtMatrixLayoutCreate(&e->B, {ctype}, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&e->C, {ctype}, N, M, N));
    if (batch > 1) {{
      const int32_t bc = (int32_t)batch; const int64_t sC = M * N;
      CK(cublasLtMatrixLayoutSetAttribute(e->A, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
      CK(cublasLtMatrixLayoutSetAttribute(e->B, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
      CK(cublasLtMatrixLayoutSetAttribute(e->C, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
      CK(cublasLtMatrixLayoutSetAttribute(e->A, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sA, sizeof(sA)));
      CK(cublasLtMatrixLayoutSetAttribute(e->B, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sB, sizeof(sB)));
      CK(cublasLtMatrixLayoutSetAttribute(e->C, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sC, sizeof(sC)));
    }}
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = kWorkspace;
    const uint32_t ua = al[0], ub = al[1], uc = al[2];
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof(ua));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof(ub));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &uc, sizeof(uc));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &uc, sizeof(uc));
    cublasLtMatmulHeuristicResult_t res[4];
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->handle, e->op, e->A, e->B, e->C, e->C, pref, 4, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {{
      cublasLtMatmulDescDestroy(e->op); cublasLtMatrixLayoutDestroy(e->A);
      cublasLtMatrixLayoutDestroy(e->B); cublasLtMatrixLayoutDestroy(e->C);
      return HTAM_ERR_SHAPE;   // no algorithm for this problem: the original region runs
    }}
    e->algo = res[std::min({algo}, found - 1)].algo;
    e->used = true; e->dev = dev; e->M = M; e->N = N; e->K = K; e->batch = batch;
    e->al[0] = al[0]; e->al[1] = al[1]; e->al[2] = al[2];
  }}
  {{
    auto& E = *e;
    {bias_set}
    const float alpha = {c_float(alpha)}, beta = 0.f;
    CK(cublasLtMatmul(st->handle, E.op, &alpha, Aptr, E.A, Bptr, E.B, &beta, out[0].data, E.C,
                      out[0].data, E.C, &E.algo, st->ws, kWorkspace, stream));
  }}
{epi_call}
}}
"""


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


def _direct_checks(k: int, o: gl.OutLayout, inner: int) -> list[str]:
    """C++ setting ds{k}[3] (the output's b/m/n strides; b: cuBLASLt's batch of `inner` matrices)
    and dso{k} (the stride of the kernel's outer batch loop), and clearing `direct` unless output k
    is a (batched) column-major matrix cuBLASLt can write: one stride per axis, unit along n."""
    lines = [f"  int64_t ds{k}[3] = {{0, 0, 0}};"]
    dst = [f"out[{k}].strides[{j}] * {mult}" for j, mult in o.fine_dst()]
    for f, (axis, step) in enumerate(o.box.dims):
        if axis >= 0 and step == 1:
            lines.append(f"  ds{k}[{axis}] = {dst[f]};")
    lines.append(f"  int64_t dso{k} = ds{k}[0] * {inner};")
    for f, (axis, step) in enumerate(o.box.dims):
        if axis == 0 and step == inner:
            lines.append(f"  dso{k} = {dst[f]};")
    for f, (axis, step) in enumerate(o.box.dims):
        size = o.view.sizes[f]
        if axis == 0 and step % inner == 0:
            lines.append(f"  if ({dst[f]} != dso{k} * {step // inner}) direct = false;")
        elif axis >= 0:
            lines.append(f"  if ({dst[f]} != ds{k}[{axis}] * {step}) direct = false;")
            if axis == 0 and step * size > inner:     # one dim across the loop's boundary
                lines.append(f"  if (dso{k} != ds{k}[0] * {inner}) direct = false;")
    ext = o.box.extent
    ld = f"ds{k}[1]" if ext[1] > 1 else str(ext[2])
    if ext[2] > 1:
        lines.append(f"  if (ds{k}[2] != 1) direct = false;")
    lines.append(f"  const int64_t ldd{k} = {ld};")
    lines.append(f"  if (ldd{k} < {ext[2]}) direct = false;")
    return lines


def _epilogue_store(epi_prog: ExprProgram, dtype: str, fast: bool, low_precision: bool) -> str:
    """C++ kernel epi_store<I>: the epilogue program over Y (read from scratch and the task's inputs
    through its accesses, Space sp over Y's dims, not collapsed) computed for each output element
    and stored through the output's layout (StoreMap): the permuted store is the epilogue's."""
    nacc = len(epi_prog.accesses)
    em = Emitter(load=lambda a: f"x{a}", red=None, fast=fast, low_precision=low_precision)
    y = em.emit(stored(epi_prog.outputs[0].expr, dtype))
    params = "".join(f", const {DT[epi_prog.inputs[a.input][1]][0]}::raw* p{i}" for i, a in enumerate(epi_prog.accesses))
    loads = "\n".join(f"    const float x{i} = ld1<{DT[epi_prog.inputs[a.input][1]][0]}, false>(p{i} + off[{i}]);"
                      for i, a in enumerate(epi_prog.accesses))
    body = "\n".join("    " + ln for ln in em.lines)
    t = DT[dtype][0]
    return f"""
template <typename I>
__global__ void __launch_bounds__(256) epi_store(Space<NACC> sp, StoreMap mp, I n, {t}::raw* __restrict__ o{params}) {{
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {{
    I rem = i, g = (I)mp.base, d = 0;
    for (int k = mp.ndim - 1; k >= 0; --k) {{
      const I sz = (I)mp.size[k], j = rem % sz;
      rem /= sz;
      g += j * (I)mp.src[k];
      d += j * (I)mp.dst[k];
    }}
    I off[{max(nacc, 1)}] = {{}};
    for (int k = sp.ndim - 1; k >= 0; --k) {{     // Y's index -> each access's offset
      const I sz = (I)sp.size[k], j = g % sz;
      g /= sz;
#pragma unroll
      for (int a = 0; a < {nacc}; ++a) off[a] += j * (I)sp.st[a][k];
    }}
{loads}
{body}
    o[d] = {t}::from_f({y});
  }}
}}
"""


def _fused_stores(gp: GemmMatch, epi_prog: ExprProgram, y_numel: int) -> str:
    """C++ launching epi_store once per output: Y (scratch `scr`, the GEMM's shape) and the task's
    inputs bound as the epilogue program's accesses, the output written through its layout."""
    L, raw = gp.lay, f"{DT[gp.dtype][0]}::raw"
    gshape = epi_prog.shape
    ys = ("    HtamTensor ys = {};\n    ys.data = scr; ys.dtype = " + DT[gp.dtype][1] + f"; ys.ndim = {len(gshape)};\n"
          + "".join(f"    ys.sizes[{d}] = {s};\n" for d, s in enumerate(gshape))
          + f"    {{ int64_t acc = 1; for (int d = {len(gshape) - 1}; d >= 0; --d) {{ ys.strides[d] = acc; acc *= ys.sizes[d]; }} }}\n")
    ptrs = "".join(f", (const {DT[epi_prog.inputs[a.input][1]][0]}::raw*)in[{a.input}].data" for a in epi_prog.accesses)
    lines = ["  {", ys, host.extend_inputs(len(epi_prog.inputs), None, "    ", y="ys"),
             "    const HtamTensor* in = ext;   // NOTE: the epilogue's inputs: the task's, then Y",
             "    int64_t it[HTAM_MAX_DIMS];",
             f"    for (int d = 0; d < {len(gshape)}; ++d) it[d] = ys.sizes[d];",
             "    Space<NACC> sp;", host.bind_accesses(epi_prog)]
    for k, o in enumerate(L.outs):
        v = o.view
        lines.append(
            f"    {{ StoreMap mp{{}}; mp.ndim = {len(v.sizes)}; mp.base = {v.base};\n"
            + "".join(f"      mp.size[{f}] = {sz}; mp.src[{f}] = {st}; mp.dst[{f}] = out[{k}].strides[{j}] * {mult};\n"
                      for f, (sz, st, (j, mult)) in enumerate(zip(v.sizes, v.strides, o.fine_dst())))
            + f"      int64_t n = 1, last = 0;\n"
            f"      for (int q = 0; q < mp.ndim; ++q) {{ n *= mp.size[q]; last += (mp.size[q] - 1) * mp.dst[q]; }}\n"
            f"      const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, (int64_t)htam_sm_count() * 16));\n"
            f"      if ({y_numel} < (int64_t(1) << 31) && max_off < (int64_t(1) << 31) && last < (int64_t(1) << 31))\n"
            f"        epi_store<int32_t><<<blocks, 256, 0, stream>>>(sp, mp, (int32_t)n, ({raw}*)out[{k}].data{ptrs});\n"
            f"      else\n"
            f"        epi_store<int64_t><<<blocks, 256, 0, stream>>>(sp, mp, n, ({raw}*)out[{k}].data{ptrs});\n"
            f"      HTAM_CHECK_LAUNCH(); }}")
    lines.append("  }")
    return "\n".join(lines)


def render_layout(gp: GemmMatch, params: dict) -> str:
    """GEMM with layout operands/outputs. Each output that is a (batched) column-major matrix box of
    Y at run time (its strides decide) is one cuBLASLt call straight into it (a split's q, k, v:
    three calls over their column ranges; heads of a batch, one call per outer index); otherwise
    cuBLASLt writes Y into scratch and one kernel per output writes it through its layout: the
    epilogue kernel where an epilogue remains (epi_store), else a plain store (layout_store)."""
    L = gp.lay
    prog = gp.epilogue
    kind, bias, alpha, epi_prog, ew_params, epi_src = _split_epilogue(gp, params)
    epi_needed = epi_prog is not None
    if epi_needed:
        epi_src += _epilogue_store(epi_prog, gp.dtype, bool(ew_params.get("fast")), gp.facts.low_precision)
    ctype, code, esize = CUDA_TYPES[gp.dtype], DT[gp.dtype][1], DT[gp.dtype][2]
    raw = f"{DT[gp.dtype][0]}::raw"
    tf32 = bool(params.get("tf32")) and gp.allow_tf32 and gp.dtype == "float32"
    compute = "CUBLAS_COMPUTE_32F_FAST_TF32" if tf32 else "CUBLAS_COMPUTE_32F"
    algo = int(params.get("algo", 0))
    roles = _lt_operands(L)
    n_in, n_out = len(L.in_shapes), len(L.outs)
    A, B = L.A, L.B
    checks = [f"  if (n_in != {n_in} || n_out != {n_out}) return HTAM_ERR_SHAPE;"]
    for i, shape in enumerate(L.in_shapes):     # NOTE: layouts bake the captured sizes; others are refused
        dims = " || ".join([f"in[{i}].ndim != {len(shape)}"] +
                           [f"in[{i}].sizes[{d}] != {s}" for d, s in enumerate(shape)])
        checks.append(f"  if ({dims}) return HTAM_ERR_SHAPE;")
    for i in sorted({A.input, B.input}):
        checks.append(f"  if (in[{i}].dtype != {code} || !htam_contiguous(in[{i}])) return HTAM_ERR_SHAPE;")
    for k, o in enumerate(L.outs):
        dims = " || ".join([f"out[{k}].ndim != {len(o.shape)}", f"out[{k}].dtype != {code}"] +
                           [f"out[{k}].sizes[{d}] != {s}" for d, s in enumerate(o.shape)])
        checks.append(f"  if ({dims}) return HTAM_ERR_SHAPE;")
    bias_ptr = "nullptr"
    if kind and kind.endswith("bias"):
        checks.append(f"  if (in[{bias}].dtype != {code} || in[{bias}].ndim != 1 || in[{bias}].sizes[0] != {L.N}) "
                      "return HTAM_ERR_SHAPE;")
        bias_ptr = f"(const char*)in[{bias}].data"
    # NOTE: the in-place epilogue needs Y contiguous: direct only when Y is the one output itself
    in_place = len(L.outs) == 1 and L.outs[0].identity(L.batch * L.M * L.N)
    direct = ["  bool direct = " + ("false" if epi_needed and not in_place else "true") + ";"]
    if epi_needed and in_place:
        direct.append("  if (!htam_contiguous(out[0])) direct = false;")
    for k, o in enumerate(L.outs):
        direct += _direct_checks(k, o, L.batch // L.outer)
    if any(o.box.repeats for o in L.outs):     # a repeated output is written by the store kernel only
        direct.append("  direct = false;")

    inner = L.batch // L.outer

    def call(M, N, batch, a_off, b_off, d_ptr, ldd, sd, n0, d_outer, direct=False):
        # one lt_call for Y's box: rows m0.., columns n0.. (offsets folded into a_off / b_off); with
        # an outer batch, one per outer index zo, D stepping d_outer elements. direct: an error
        # leaves the direct calls (drc) instead of returning
        bptr = f"{bias_ptr} + {n0} * {esize}" if bias_ptr != "nullptr" else "nullptr"
        if L.outer > 1:
            batch, a_off, b_off = inner, f"{a_off} + zo * {B.s_outer}", f"{b_off} + zo * {A.s_outer}"
            d_ptr = f"(char*){d_ptr} + zo * {d_outer} * {esize}"
        text = (f"    {{ LtCall c{{}}; c.m = {N}; c.n = {M}; c.k = {L.K}; c.lda = {roles['lda']}; "
                f"c.ldb = {roles['ldb']}; c.ldd = {ldd};\n"
                f"      c.batch = {batch}; c.sa = {B.s_batch if B.batch > 1 else 0}; "
                f"c.sb = {A.s_batch if A.batch > 1 else 0}; c.sd = {sd};\n"
                f"      c.ta = {roles['ta']}; c.tb = {roles['tb']}; c.epi = {LT_EPI[kind]};\n"
                f"      const int rc = lt_call(c, {compute}, {ctype}, {algo}, {c_float(alpha)}, Ab + ({a_off}) * {esize}, "
                f"Bb + ({b_off}) * {esize}, {d_ptr}, {bptr}, stream);\n"
                + ("      if (rc) { drc = rc; break; } }" if direct else "      if (rc) return rc; }"))
        if L.outer > 1:
            text = f"    for (int64_t zo = 0; zo < {L.outer}; ++zo)\n" + text
            if direct:
                text += "\n    if (drc) break;"
        return text
    direct_calls = []
    for k, o in enumerate(L.outs):
        (b0, m0, n0), (nb, nm, nn) = o.box.lo, o.box.extent
        a_off = f"{b0} * {B.s_batch if B.batch > 1 else 0} + {n0} * {B.s_col}"
        b_off = f"{b0} * {A.s_batch if A.batch > 1 else 0} + {m0} * {A.s_row}"
        direct_calls.append(call(nm, nn, nb, a_off, b_off, f"out[{k}].data", f"ldd{k}", f"ds{k}[0]", n0, f"dso{k}", direct=True))
    y_numel = L.batch * L.M * L.N
    stores = []
    for k, o in enumerate(L.outs):
        v = o.view
        stores.append(
            f"    {{ StoreMap mp{{}}; mp.ndim = {len(v.sizes)}; mp.base = {v.base};\n"
            + "".join(f"      mp.size[{f}] = {s}; mp.src[{f}] = {st}; mp.dst[{f}] = out[{k}].strides[{j}] * {mult};\n"
                      for f, (s, st, (j, mult)) in enumerate(zip(v.sizes, v.strides, o.fine_dst())))
            + f"      const int rc = store_layout<{raw}>(scr, out[{k}], mp, {y_numel}, stream);\n"
              f"      if (rc) return rc; }}")
    def epilogue_on(ptr: str) -> str:
        # the in-place epilogue kernel over Y (the GEMM's shape, contiguous) at ptr
        gshape = prog.shape
        return ("    { HtamTensor ys = {};\n    ys.data = " + ptr + "; ys.dtype = " + code + f"; ys.ndim = {len(gshape)};\n"
                + "".join(f"    ys.sizes[{d}] = {s};\n" for d, s in enumerate(gshape))
                + f"    {{ int64_t acc = 1; for (int d = {len(gshape) - 1}; d >= 0; --d) {{ ys.strides[d] = acc; acc *= ys.sizes[d]; }} }}\n"
                + host.extend_inputs(len(prog.inputs), None, "    ", y="ys") + "\n"
                + "    const int rc = epilogue_run(ext, n_in + 1, &ys, 1, stream); if (rc) return rc; }\n")
    direct_epi = epilogue_on("out[0].data") if epi_needed and in_place else ""
    if epi_needed:      # the epilogue kernel stores every output through its layout (no copy kernel)
        stores = [_fused_stores(gp, epi_prog, y_numel)]
    return f"""// torch_htam expert: cuBLASLt {gp.op} with layouts epilogue={kind} params={sorted(params.items())}
{PRELUDE}
#include <algorithm>
#include <cublasLt.h>

{CUBLASLT}
{LT_CALL}
{epi_src}
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{chr(10).join(checks)}
  const char* Ab = (const char*)in[{B.input}].data;   // cuBLASLt's A: our B operand
  const char* Bb = (const char*)in[{A.input}].data;   // cuBLASLt's B: our A operand
{chr(10).join(direct)}
  if (direct) {{
    // NOTE: cuBLASLt may have no algorithm for an output's strides (HTAM_ERR_SHAPE): the scratch
    // path below then writes every output, those written here included
    int drc = 0;
    do {{
{chr(10).join(direct_calls)}
    }} while (0);
    if (drc != 0 && drc != HTAM_ERR_SHAPE) return drc;
    if (drc == 0) {{
{direct_epi}
      return HTAM_OK;
    }}
  }}
  void* scr = nullptr;
  {{ const int rc = lt_scratch((size_t){y_numel} * {esize}, &scr); if (rc) return rc; }}
{call(L.M, L.N, L.batch, "0", "0", "scr", str(L.N), str(L.M * L.N), 0, inner * L.M * L.N)}
{chr(10).join(stores)}
  return HTAM_OK;
}}
"""


# ---- the GEMM target (target.Target) ---------------------------------------------------------------

# strategy ids whose presence _gemm_tags decides from the params
TAG_IDS = ("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores", "bf16_tensor_cores",
           "vectorized_16b_access")


def defaults(gp: GemmMatch) -> dict:
    p = elementwise.epilogue_params(16 // DT[gp.dtype][2])
    p.update(lt_epilogue=gp.facts.epilogue_fits_lt, tf32=gp.allow_tf32 and gp.dtype == "float32", algo=0)
    return p


def _gemm_tags(params: dict, facts: TaskFacts) -> list[str]:
    tags = ["cublaslt_epilogue" if params["lt_epilogue"] else "gemm_plus_epilogue_kernel"]
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
    """The library's ranked algorithms, with and without cuBLASLt's fused epilogue."""
    return [dict(base, lt_epilogue=v, algo=algo) for v in (base["lt_epilogue"], not base["lt_epilogue"])
            for algo in range(8)]


TARGET = Target(
    kind="gemm", match=match, defaults=defaults, tags=tags, retag=retag,
    start_order=("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores"),
    grid=grid, render=lambda gp, params: render(gp, params))
