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
from dataclasses import dataclass

import torch

from torch_htam.proposers.expert import elementwise, host
from torch_htam.proposers.expert.cuda import DT, PRELUDE, cuh
from torch_htam.proposers.expert.ir import (
    ExprProgram, Unsupported, check_single_output, dtype_of, lower, shape_of, walk,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target

aten = torch.ops.aten
GEMMS = {aten.linear.default, aten.addmm.default, aten.mm.default, aten.matmul.default, aten.bmm.default}
CUDA_TYPES = {"float32": "CUDA_R_32F", "bfloat16": "CUDA_R_16BF", "float16": "CUDA_R_16F"}
CUBLASLT = cuh("cublaslt.cuh")     # the handle, workspace and descriptor cache: no params in it
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


def _gemm_node(gm):
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in GEMMS]
    if len(nodes) != 1:
        raise Unsupported(f"{len(nodes)} matmul ops (need exactly one)")
    return nodes[0]


def match(gm, policy) -> GemmMatch:
    """Match a single-GEMM region with an elementwise epilogue; raises Unsupported otherwise."""
    node = _gemm_node(gm)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    t, args = node.target, node.args
    bias = None
    if t is aten.linear.default:
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
    gp = GemmMatch(op, ph.index(a), ph.index(b), dt, prog, g_index, bool(policy and policy.allow_tf32))
    fits = lt_split(gp)[0] is not None or prog.outputs[0].expr == _g_expr(prog, g_index)
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


def render(gp: GemmMatch, params: dict) -> str:
    kind, bias, rest = lt_split(gp) if params.get("lt_epilogue") else (None, None, None)
    prog = gp.epilogue
    if rest is None:
        rest = prog.outputs[0].expr
    G = _g_expr(prog, gp.g)
    epi_needed = rest != G
    ew_params = {k: v for k, v in params.items() if k in elementwise.EwParams.__dataclass_fields__}
    ew_params["nc"] = False      # NOTE: the epilogue overwrites G in place; no read-only path on it
    epi_src = ""
    if epi_needed:
        epi_prog = _prune(dataclasses.replace(prog, outputs=[dataclasses.replace(prog.outputs[0], expr=rest)]))
        epi_src = host.EPILOGUE_INPUTS + elementwise.generate(epi_prog, elementwise.EwParams(**ew_params),
                                       gp.facts.low_precision, entry="static int epilogue_run",
                                       restrict=False, prelude=False)
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
    const float alpha = 1.f, beta = 0.f;
    CK(cublasLtMatmul(st->handle, E.op, &alpha, Aptr, E.A, Bptr, E.B, &beta, out[0].data, E.C,
                      out[0].data, E.C, &E.algo, st->ws, kWorkspace, stream));
  }}
{epi_call}
}}
"""


# ---- the GEMM target (target.Target) ---------------------------------------------------------------

# strategy ids whose presence _gemm_tags decides from the params
TAG_IDS = ("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores", "bf16_tensor_cores",
           "vectorized_16b_access")


def defaults(gp: GemmMatch) -> dict:
    p = dataclasses.asdict(elementwise.EwParams(vec=16 // DT[gp.dtype][2]))
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
