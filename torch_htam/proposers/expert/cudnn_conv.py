"""The cuDNN calls of a conv kernel, as C text for conv.render: the legacy API and the backend
("graph") API. Each gives the per-shape cache entry with its planning (`*_entry`) and the per-call
conv (`legacy_run`, `graph_run`); conv.py holds the matching, the BN fold and the epilogue.

    >>> src = graph_entry(cp, strict=True, algo=0)     # cp: conv.match(...)     # C: struct ConvEntry, plan_entry, bind
"""
from __future__ import annotations

from torch_htam.proposers.expert.conv_match import ConvMatch
from torch_htam.proposers.expert.cuda import cuh

# ConvEntry, release(), use_algo(): the legacy path's cache entry, no params in it
LEGACY_ENTRY = cuh("cudnn_legacy.cuh")
CUDNN_TYPES = {"float32": "CUDNN_DATA_FLOAT", "bfloat16": "CUDNN_DATA_BFLOAT16", "float16": "CUDNN_DATA_HALF"}


def legacy_entry(cp: ConvMatch, math: str, strict: bool, fused: bool, algo: int) -> str:
    """Legacy API: the per-shape cache entry (descriptors + ranked algorithms) and its planning.
    2-D forward convs only (a conv1d is one of height 1, conv_geom.py)."""
    cudnn_t = CUDNN_TYPES[cp.dtype]
    (sh, sw), (ph_, pw), (dh, dw), G = cp.stride, cp.padding, cp.dilation, cp.groups
    identity_only = fused and not cp.relu   # cuDNN: IDENTITY activation only with IMPLICIT_PRECOMP_GEMM
    fused_descs = ""
    if fused:
        fused_descs = f"""
  CD(cudnnCreateTensorDescriptor(&e->b));
  CD(cudnnSetTensor4dDescriptor(e->b, CUDNN_TENSOR_NCHW, {cudnn_t}, 1, K, 1, 1));
  CD(cudnnCreateActivationDescriptor(&e->act));
  CD(cudnnSetActivationDescriptor(e->act, {"CUDNN_ACTIVATION_RELU" if cp.relu else "CUDNN_ACTIVATION_IDENTITY"}, CUDNN_NOT_PROPAGATE_NAN, 0.0));"""
    return f"""
{LEGACY_ENTRY}
static int plan_entry(DnnState* st, ConvEntry* e, const int64_t* d, int64_t P, int64_t Q) {{
  const int K = (int)d[4];
  CD(cudnnCreateTensorDescriptor(&e->x));
  CD(cudnnCreateTensorDescriptor(&e->y));
  CD(cudnnCreateFilterDescriptor(&e->f));
  CD(cudnnCreateConvolutionDescriptor(&e->conv));
  CD(cudnnSetTensor4dDescriptor(e->x, CUDNN_TENSOR_NCHW, {cudnn_t}, (int)d[0], (int)d[1], (int)d[2], (int)d[3]));
  CD(cudnnSetTensor4dDescriptor(e->y, CUDNN_TENSOR_NCHW, {cudnn_t}, (int)d[0], K, (int)P, (int)Q));
  CD(cudnnSetFilter4dDescriptor(e->f, {cudnn_t}, CUDNN_TENSOR_NCHW, K, (int)(d[1] / {G}), (int)d[5], (int)d[6]));
  CD(cudnnSetConvolution2dDescriptor(e->conv, {ph_}, {pw}, {sh}, {sw}, {dh}, {dw}, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CD(cudnnSetConvolutionGroupCount(e->conv, {G}));
  // NOTE: set before ranking so the heuristic only proposes algorithms valid under this math type.
  CD(cudnnSetConvolutionMathType(e->conv, {math}));{fused_descs}
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  CD(cudnnGetConvolutionForwardAlgorithm_v7(st->handle, e->x, e->f, e->conv, e->y,
                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
  for (int i = 0; i < found; ++i) {{
    const cudnnConvolutionFwdAlgoPerf_t& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
    if ({"true" if identity_only else "false"} && p.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
    bool dup = false;
    for (int j = 0; j < e->n_algo; ++j) dup |= e->algo[j] == p.algo;
    if (dup && {"true" if strict else "false"}) continue;
    e->algo[e->n_algo] = p.algo;
    e->math[e->n_algo] = {"CUDNN_FMA_MATH" if strict else "p.mathType"};   // strict fp32: never TF32
    e->mem[e->n_algo] = p.memory;
    ++e->n_algo;
  }}
  if (e->n_algo == 0 && {"true" if identity_only else "false"}) {{
    e->algo[0] = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM; e->math[0] = {math}; e->mem[0] = 0;
    e->n_algo = 1;
  }}
  if (e->n_algo == 0) return HTAM_ERR_SHAPE;   // no algorithm under this precision: the original region runs
  return use_algo(st, e, std::min({algo}, e->n_algo - 1));
}}
"""


def legacy_run(cp: ConvMatch, fused: bool, scale_w: bool) -> str:
    """Legacy API: the per-call conv, moving down the ranking when cuDNN declines an algorithm."""
    if fused:
        z = f"in[{cp.residual}].data" if cp.residual is not None else "Y.data"
        call = (f"cudnnConvolutionBiasActivationForward(st->handle, &one, e->x, X.data, e->f, "
                f"{'w2' if scale_w else 'Wt.data'}, e->conv, e->algo[e->pick], st->ws, e->mem[e->pick], "
                f"&{'one' if cp.residual is not None else 'zero'}, e->y, {z}, e->b, shift, e->act, e->y, Y.data)")
    else:
        call = ("cudnnConvolutionForward(st->handle, &one, e->x, X.data, e->f, Wt.data, e->conv, "
                "e->algo[e->pick], st->ws, e->mem[e->pick], &zero, e->y, Y.data)")
    return f"""  const float one = 1.f, zero = 0.f;
  (void)zero;
  for (;;) {{
    const cudnnStatus_t s = {call};
    if (s == CUDNN_STATUS_SUCCESS) break;
    // cuDNN declines some (algorithm, fusion) pairs only at run time: take the next ranked one.
    if (!not_supported(s) || e->pick + 1 >= e->n_algo) return 3000 + (int)s;
    if ((rc = use_algo(st, e, e->pick + 1))) return rc;
  }}"""


# Backend ("graph") API: cudnn_graph.cuh, after the constants it reads.
GRAPH_ENTRY = cuh("cudnn_graph.cuh")


def graph_run(x: str = "X.data", w: str = "Wt.data", y: str = "Y.data", args: str = "nullptr") -> str:
    """The per-call conv on the backend API (after the fold kernel, before the epilogue), on the
    buffers named x, w, y and the fused epilogue's operands `args` (C expressions)."""
    return f"""  for (;;) {{
    cudnnBackendDescriptor_t pack = nullptr;
    if ((rc = bind(e, {x}, {w}, {y}, st->ws, {args}, &pack))) return rc;
    const cudnnStatus_t s = cudnnBackendExecute(st->handle, e->plan, pack);
    if (s == CUDNN_STATUS_SUCCESS) break;
    // an engine cuDNN declines only at run time: plan the next usable one
    if (!not_supported(s) || next_plan(st, e, e->pick + 1, 0)) return 3000 + (int)s;
  }}"""


def graph_entry(cp: ConvMatch, strict: bool, algo: int, nhwc: bool = False,
                epilogue: tuple[tuple[str, str], ...] = (), vec_type: str = "CUDNN_DATA_FLOAT") -> str:
    """Backend API: the per-shape cache entry (descriptors, execution plan, variant pack) and planning:
    this conv's constants, then cudnn_graph.cuh. epilogue: pointwise ops fused into the conv's
    graph (NHWC, 2-D only), each (mode, operand): mode "sub", "mul", "add" or "relu"; operand a
    vector 'c', 's', 'b' ([1, K, 1, 1] of vec_type), 'z' (the residual) or "" (unary)."""
    modes = {"sub": "CUDNN_POINTWISE_SUB", "mul": "CUDNN_POINTWISE_MUL", "add": "CUDNN_POINTWISE_ADD",
             "relu": "CUDNN_POINTWISE_RELU_FWD"}
    mode_list = ", ".join([modes[m] for m, _ in epilogue] + ["CUDNN_POINTWISE_ADD"])   # + one: never empty
    arg_list = ", ".join([f"'{a}'" if a else "0" for _, a in epilogue] + ["0"])
    n, ints = len(cp.stride), lambda v: ", ".join(map(str, v))    # noqa: E731
    return f"""
// this kernel's {cp.kind.name} on the backend API (pads, strides, dilations in pixels, [D,] H, W;
// conv_geom.py: a conv1d is a 2-D conv of height 1, a transposed conv cuDNN's backward data)
static const bool kStrictFp32 = {"true" if strict else "false"};   // fp32 without TF32: no tensor-core engines
static const bool kNhwc = {"true" if nhwc else "false"};   // x, w, y in NHWC (conv.py transposes around the conv)
static const cudnnDataType_t kDataType = {CUDNN_TYPES[cp.dtype]};
static const int kSpatial = {n};
static const bool kTransposed = {"true" if cp.kind.transposed else "false"};
static const int64_t kPad[{n}] = {{{ints(cp.padding)}}}, kStride[{n}] = {{{ints(cp.stride)}}}, kDilation[{n}] = {{{ints(cp.dilation)}}};
static const int64_t kGroups = {cp.groups};   // implied by the tensors: w is [K, C / kGroups, R, S]
static const int kAlgo = {algo};   // plan the kAlgo-th usable engine (0: the one PyTorch runs)
// the fused epilogue, in fp32 inside cuDNN's kernel: op i = kEpiMode[i](previous, operand kEpiArg[i])
static const int kEpiOps = {len(epilogue)};
static const cudnnPointwiseMode_t kEpiMode[] = {{{mode_list}}};
static const int64_t kEpiArg[] = {{{arg_list}}};
static const cudnnDataType_t kVecType = {vec_type};
{GRAPH_ENTRY}"""
