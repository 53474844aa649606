"""The cuDNN calls of a conv kernel, as C text for conv.render: the legacy API and the backend
("graph") API. Each gives the per-shape cache entry with its planning (`*_entry`: this conv's
constants and descriptors, then the planning skeleton of cudnn_legacy.cuh + conv_legacy_plan.cuh or
cudnn_graph.cuh); the legacy API's per-call conv is `legacy_run`, the backend API's the skeleton's
graph_conv(). conv.py holds the matching, the BN fold and the epilogue.

    >>> src = graph_entry(cp, strict=True, algo=0)     # cp: conv.match(...)     # C: struct ConvEntry, plan_entry, bind
"""
from __future__ import annotations

from torch_htam.proposers.expert.conv_match import ConvMatch
from torch_htam.proposers.expert.cuda import cuh

# ConvEntry, release(), use_algo(): the legacy path's cache entry, no params in it
LEGACY_ENTRY = cuh("cudnn_legacy.cuh")
# plan_entry(): the legacy path's ranking, after this conv's constants and set_descriptors()
LEGACY_PLAN = cuh("conv_legacy_plan.cuh")
CUDNN_TYPES = {"float32": "CUDNN_DATA_FLOAT", "bfloat16": "CUDNN_DATA_BFLOAT16", "float16": "CUDNN_DATA_HALF"}


def _c_bool(v: bool) -> str:
    return "true" if v else "false"


def legacy_entry(cp: ConvMatch, math: str, strict: bool, fused: bool, algo: int) -> str:
    """Legacy API: the per-shape cache entry (descriptors + ranked algorithms) and its planning.
    2-D forward convs only (a conv1d is one of height 1, conv_geom.py)."""
    cudnn_t = CUDNN_TYPES[cp.dtype]
    (sh, sw), (ph_, pw), (dh, dw), G = cp.stride, cp.padding, cp.dilation, cp.groups
    fused_descs = ""
    if fused:
        act = "CUDNN_ACTIVATION_RELU" if cp.relu else "CUDNN_ACTIVATION_IDENTITY"
        fused_descs = f"""
  CD(cudnnCreateTensorDescriptor(&e->b));
  CD(cudnnSetTensor4dDescriptor(e->b, CUDNN_TENSOR_NCHW, {cudnn_t}, 1, K, 1, 1));
  CD(cudnnCreateActivationDescriptor(&e->act));
  CD(cudnnSetActivationDescriptor(e->act, {act}, CUDNN_NOT_PROPAGATE_NAN, 0.0));"""
    consts = f"""
// this conv on the legacy API: how plan_entry ranks its algorithms
static const bool kStrictFp32 = {_c_bool(strict)};   // fp32 without TF32: FMA math, each algorithm once
static const bool kIdentityOnly = {_c_bool(fused and not cp.relu)};   // the fused call without ReLU
static const cudnnMathType_t kMath = {math};
static const int kAlgo = {algo};   // run the kAlgo-th usable algorithm of cuDNN's ranking"""
    descriptors = f"""
// x, y, the filter and the conv (created by plan_entry) for problem d; pads, strides, dilations H, W
static int set_descriptors(ConvEntry* e, const int64_t* d, int64_t P, int64_t Q) {{
  const int K = (int)d[4];
  CD(cudnnSetTensor4dDescriptor(e->x, CUDNN_TENSOR_NCHW, {cudnn_t}, (int)d[0], (int)d[1], (int)d[2], (int)d[3]));
  CD(cudnnSetTensor4dDescriptor(e->y, CUDNN_TENSOR_NCHW, {cudnn_t}, (int)d[0], K, (int)P, (int)Q));
  CD(cudnnSetFilter4dDescriptor(e->f, {cudnn_t}, CUDNN_TENSOR_NCHW, K, (int)(d[1] / {G}), (int)d[5], (int)d[6]));
  CD(cudnnSetConvolution2dDescriptor(e->conv, {ph_}, {pw}, {sh}, {sw}, {dh}, {dw}, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CD(cudnnSetConvolutionGroupCount(e->conv, {G}));
  // NOTE: set before ranking so the heuristic only proposes algorithms valid under this math type.
  CD(cudnnSetConvolutionMathType(e->conv, {math}));{fused_descs}
  return 0;
}}
"""
    return "\n" + LEGACY_ENTRY + consts + descriptors + LEGACY_PLAN


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
    geometry = f"""
// this kernel's {cp.kind.name} on the backend API (pads, strides, dilations in pixels, [D,] H, W;
// conv_geom.py: a conv1d is a 2-D conv of height 1, a transposed conv cuDNN's backward data)
static const bool kStrictFp32 = {_c_bool(strict)};   // fp32 without TF32: no tensor-core engines
static const bool kNhwc = {_c_bool(nhwc)};   // x, w, y in NHWC (conv.py transposes around the conv)
static const cudnnDataType_t kDataType = {CUDNN_TYPES[cp.dtype]};
static const int kSpatial = {n};
static const bool kTransposed = {_c_bool(cp.kind.transposed)};
static const int64_t kPad[{n}] = {{{ints(cp.padding)}}}, kStride[{n}] = {{{ints(cp.stride)}}}, kDilation[{n}] = {{{ints(cp.dilation)}}};
static const int64_t kGroups = {cp.groups};   // implied by the tensors: w is [K, C / kGroups, R, S]
static const int kAlgo = {algo};   // plan the kAlgo-th usable engine (0: the one PyTorch runs)"""
    fused = f"""
// the fused epilogue, in fp32 inside cuDNN's kernel: op i = kEpiMode[i](previous, operand kEpiArg[i])
static const int kEpiOps = {len(epilogue)};
static const cudnnPointwiseMode_t kEpiMode[] = {{{mode_list}}};
static const int64_t kEpiArg[] = {{{arg_list}}};
static const cudnnDataType_t kVecType = {vec_type};
"""
    return geometry + fused + GRAPH_ENTRY
