"""Conv regions: cuDNN convolution with inference batch norm folded in, plus the elementwise epilogue.

A region aten.conv2d -> [aten.batch_norm (eval)] -> elementwise epilogue (residual add, ReLU, ...)
runs one of three ways (params["fused"], params["graph"]):

  fused=False, graph=True (default)
         the cuDNN backend ("graph") API writes the raw conv into the output (one cudnnBackendExecute
         of an execution plan built once per shape), then one in-place elementwise kernel computes
         out = epilogue((out - center[k]) * scale[k] + beta[k], other inputs).
  fused=False, graph=False
         the same, with the legacy cudnnConvolutionForward for the conv.
  fused=True (graph is ignored: always the legacy API)
         the weights are pre-scaled into scratch (w' = w * scale[k]) and
         cudnnConvolutionBiasActivationForward computes out = act(conv(x, w') + residual + shift)
         in one library call. Only when the epilogue is exactly [+ residual] [ReLU].
  nhwc=True (backend API, unfused, groups 1)
         x and w are copied to NHWC / KRSC (to_nhwc: a shared-memory transpose), cuDNN's conv runs
         in NHWC, the layout its tensor-core engines compute in (on NCHW tensors it transposes in
         and out itself: 16.6 + 10.7 us around a 24 us conv, bf16 [32, 64, 56, 56] 3x3, H100,
         scripts/probe_conv_kernels.py), and pwconv.nhwc_epilogue's kernel reads the result back
         a tile at a time, folds batch norm, applies the epilogue and writes NCHW.
(and params["tiled"]: a 1x1 conv as our own tiled tensor-core kernel, pwconv.py)
A region whose task is channels-last (a plain conv2d with [BN] [+ residual] [ReLU], as
extract.channels_last_boundary lays out a model's conv regions for Inductor) takes none of these:
render_cl runs it as one cuDNN graph with the epilogue fused into the conv, or (fused=False) as
cuDNN's conv alone and one in-place epilogue kernel, Inductor's split; or (params["igemm"], bf16 /
fp16, input channels a multiple of 32) as our implicit-GEMM kernel in one launch, conv_igemm.py.

Conv kinds (conv_geom.py): conv1d runs as a 2-D conv of height 1 on every cuDNN path; conv3d and
conv_transpose1d/2d/3d (cuDNN's backward data) on the backend API, unfused; grouped and depthwise
convs take every cuDNN path but NHWC; the tiled kernel and NHWC copies are conv2d's alone.

Why the backend API: in cuDNN 9 the legacy calls cost host time. A whole conv+BN+ReLU kernel call
took 383 us of host time on the legacy path, 53 us on this one, and eager PyTorch (conv, BN, ReLU)
79 us (bf16, scripts/host_probe.py, H100); in ResNet-50 bf16 the legacy kernels made the swapped
model host-bound (10.99 ms against 6.14 ms eager) although each conv was faster on the GPU. The
backend path plans once per shape (tensor, convolution, operation graph, heuristics, execution
prog) and per call only binds the pointers (a variant pack, kept per set of pointers: each site
of a shape has its own) and executes. Its engines are the ones PyTorch runs: the ranking of
heuristics mode A (CUDNN_HEUR_MODE_FALLBACK if A gives nothing usable), filtered by numerical notes as
ATen's Conv_v8.cpp does; params["algo"] picks the algo-th engine that plans (0: PyTorch's choice).

Batch norm folds to scale = gamma * rsqrt(var + eps) and center = mean - bias per output channel k
(the fused call needs shift = beta + (bias - mean) * scale instead, which cancels badly when a tiny
var makes the scale large). Weights and running statistics are task inputs, so a tiny kernel folds
them on the device at every call (K threads; K * C/g * R * S when it also scales the weights).

Precision: strict fp32 runs with CUDNN_FMA_MATH (CUDNN_DEFAULT_MATH would allow TF32 on sm_80+) on the
legacy API and drops tensor-core engines on the backend API; TF32 (CUDNN_DEFAULT_MATH / tensor-core
engines allowed) only when the policy allows it and params["tf32"]; bf16/fp16 use tensor-op math with
fp32 compute. On the legacy API the algorithm is the params["algo"]-th of
cudnnGetConvolutionForwardAlgorithm_v7's ranking; one cuDNN declines at run time is skipped for the
next (likewise the next usable engine on the backend API).

NOTE: the cuDNN handle, the workspace, a scratch buffer and each shape's descriptors + algorithm/plan
are created lazily on the first call per device/shape (cudnnCreate, cudaMalloc): make the first call
for a shape outside CUDA-graph capture (verification always does). Buffers only grow, and an outgrown
one is never freed because a captured graph may still point at it.

C++: the kernels' skeletons are .cuh templates, conv_fold.cuh (the batch-norm fold), conv_epi_cl.cuh
(render_cl's split epilogue), conv_nhwc.cuh (the NHWC copies) and the cuDNN ones cudnn_conv.py
pastes; this module emits what a region changes (the fold kernels' parameter lists and expressions,
the channels-last epilogue's Epi) and htam_run.

    >>> cp = match(task.graph, policy); src = render(cp, defaults(cp))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_htam.proposers.expert import conv_cutlass, conv_geom, conv_igemm, elementwise, host, pwconv
from torch_htam.proposers.expert.conv_match import BatchNorm, ConvMatch, Fold, g_only
from torch_htam.proposers.expert.cudnn_conv import CUDNN_TYPES, graph_entry, legacy_entry, legacy_run
from torch_htam.proposers.expert.cuda import DT, PRELUDE, c_float, cuh
from torch_htam.proposers.expert.ir import (
    VT, Unsupported, channels_last, check_single_output, dense_row_major, dtype_of, lower, shape_of,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target

aten = torch.ops.aten
# the handle, workspace and scratch buffers, grow(), out_size(), not_supported(): no params in them
CUDNN_STATE = cuh("cudnn.cuh")
ENTRY_CACHE = cuh("conv_entry_cache.cuh")     # after the API path's ConvEntry and plan_entry
BATCH_SLICE = cuh("batch_slice.cuh")          # a ranged batch's slices (render_cl)
RELUS = (aten.relu.default, aten.relu_.default)
HARDSWISHES = (aten.hardswish.default, aten.hardswish_.default)
# the tiled pointwise kernel's own params (pwconv.py), and those only cuDNN's paths read
TILE_KEYS = {"bm", "bn", "stages", "ju", "split", "minb", "pre", "persist"}
CUDNN_KEYS = {"fused", "graph", "algo", "tf32", "nhwc"}
IGEMM_KEYS = {"igemm", "ig_bm", "ig_bn", "ig_stages"}     # conv_igemm.py's (channels-last conv2d)
# strategy ids whose presence tags() decides from the params
TAG_IDS = ("fold_batchnorm", "fuse_elementwise_chain", "gemm_plus_epilogue_kernel", "tf32_tensor_cores",
           "bf16_tensor_cores", "smem_tiling", "coalesced_layout_access")


def has_conv(gm) -> bool:
    """Whether the graph has any convolution op (routes the region here instead of GEMM)."""
    return any(n.op == "call_function" and "conv" in str(n.target) for n in gm.graph.nodes)


def _arg(node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _conv_node(gm):
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and "conv" in str(n.target)]
    if len(convs) != 1:
        raise Unsupported(f"{[str(n.target) for n in convs]} (need exactly one conv)")
    return convs[0]


def _batch_norm(conv, ph) -> tuple[object, BatchNorm | None]:
    """(anchor node whose value the epilogue reads, the folded batch norm or None)."""
    users = list(conv.users)
    if not (len(users) == 1 and users[0].target is aten.batch_norm.default and users[0].args[0] is conv):
        if any(u.target is aten.batch_norm.default for u in users):
            raise Unsupported("conv result used besides its batch norm")
        return conv, None
    bn = users[0]
    if _arg(bn, 5, "training", True):
        raise Unsupported("batch_norm in training mode (statistics depend on the batch)")
    idx = []
    for i, name in ((1, "weight"), (2, "bias"), (3, "running_mean"), (4, "running_var")):
        v = _arg(bn, i, name, None)
        if v is not None and v not in ph:
            raise Unsupported(f"batch_norm {name} must be a region input")
        idx.append(ph.index(v) if v is not None else None)
    if idx[2] is None or idx[3] is None:
        raise Unsupported("batch_norm without running statistics")
    return bn, BatchNorm(idx[0], idx[1], idx[2], idx[3], float(_arg(bn, 7, "eps", 1e-5)))


def _fused_tail(gm, anchor, ph, shape, dt) -> tuple[bool, int | None, bool, bool]:
    """(fits, residual input, relu, hardswish): whether the epilogue is exactly [+ residual] [ReLU]
    over the anchor (the chain cuDNN fuses), and whether it is [+ residual] hardswish instead."""
    node, residual, relu, hardswish = anchor, None, False, False
    users = list(node.users)
    if len(users) == 1 and users[0].target is aten.add.Tensor and _arg(users[0], 2, "alpha", 1) == 1:
        add = users[0]
        other = add.args[1] if add.args[0] is node else add.args[0]
        if other in ph and other is not node and shape_of(other) == shape and dtype_of(other) == dt:
            residual, node = ph.index(other), add
            users = list(node.users)
    if len(users) == 1 and users[0].target in RELUS:
        relu, node = True, users[0]
    elif len(users) == 1 and users[0].target in HARDSWISHES:
        hardswish, node = True, users[0]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    ends = len(outs) == 1 and outs[0] is node
    return ends and not hardswish, residual, relu, ends and hardswish


def match(gm, policy) -> ConvMatch:
    """Match a single-conv2d region with optional eval batch norm and an elementwise epilogue.

    >>> cp = match(task.graph, policy_for(task)); cp.bn, cp.fusable
    (BatchNorm(gamma=2, beta=3, mean=4, var=5, eps=1e-05), True)
    """
    if not has_conv(gm):
        raise Unsupported("no convolution")
    conv = _conv_node(gm)
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    geo = conv_geom.parse(conv)
    x, w, b, kind = geo.x, geo.w, geo.bias, geo.kind
    for v, what in ((x, "input"), (w, "weight"), (b, "bias")):
        if v is not None and v not in ph:
            raise Unsupported(f"{kind.name} {what} must be a region input (no prologue ops before the conv)")
    if len(shape_of(x)) != kind.rank or len(shape_of(w)) != kind.rank:
        raise Unsupported(f"{kind.name} needs a {kind.rank}-D (batched) input and a {kind.rank}-D filter")
    stride, padding, dilation, groups = geo.stride, geo.padding, geo.dilation, geo.groups
    # a channels-last x takes render_cl (w either way); otherwise the kernels read contiguous NCHW
    # and check it (HTAM_ERR_SHAPE), so any other layout is refused here, not candidate by candidate
    cl = channels_last(x) and kind.plain2d and groups == 1
    for v, what in ((x, "input"), (w, "weight")):
        if not (dense_row_major(v) or (cl and channels_last(v))):
            raise Unsupported(f"{kind.name} {what} in a layout the conv kernels do not read (contiguous NCHW; "
                              "channels-last for a plain conv2d's input)")
    dt = dtype_of(conv)
    if any(dtype_of(v) != dt for v in (x, w) + ((b,) if b is not None else ())):
        raise Unsupported(f"mixed-dtype {kind.name}")
    anchor, bn = _batch_norm(conv, ph)
    yshape = shape_of(anchor)
    check_single_output(gm, yshape, dt, "conv")
    g = len(ph)

    def leaf(low, node, amap):
        if amap[0] != "dims":
            raise Unsupported("conv result read through a reshape")
        ch = ("dims", (amap[1][1],))
        e = low.access(g, "dims", amap[1])
        if bn is not None:
            # NOTE: (y - center) * scale + beta, torch's order, not y * scale + (beta - center *
            # scale): a tiny running var makes scale large, and the folded shift then cancels
            # against y * scale where y is near the mean.
            e = ("mul", ("sub", e, low.access(g + 2, *ch)), low.access(g + 1, *ch))
            if bn.beta is not None:
                e = ("add", e, low.access(bn.beta, *ch))
        elif b is not None:
            e = ("add", e, low.val(b, ch))
        # NOTE: torch rounds the conv / batch norm result to bf16/fp16 before the epilogue ops.
        return ("round", dt, e) if dt != "float32" and e[0] != "in" else e

    extra = [(yshape, dt)] + ([((yshape[1],), "float32")] * 2 if bn is not None else [])
    prog = lower(gm, leaves={anchor: leaf}, extra_inputs=extra)
    if prog.kind != "elementwise":
        raise Unsupported("row ops after a conv")
    if any(VT[d] != "f" for _, d in prog.inputs):   # pwconv's epilogues load floats only
        raise Unsupported("integer/bool inputs in a conv epilogue")
    ident = tuple(range(prog.ndim))
    if any(a.input == g and a.dims != ident for a in prog.accesses):
        raise Unsupported("conv result read broadcast/reshaped in the epilogue")
    fits, residual, relu, hardswish = _fused_tail(gm, anchor, ph, yshape, dt)
    if cl and not (fits or hardswish):
        raise Unsupported("channels-last conv: the epilogue must be [batch norm] [+ residual] [ReLU or "
                          "hardswish]")
    if cl and residual is not None and not channels_last(ph[residual]):
        raise Unsupported("channels-last conv: the residual is not channels-last")
    fits = fits and (bn is not None or b is not None or residual is not None or relu)
    fits = fits and legacy_reason(kind) is None      # cuDNN's fused call is on the legacy API
    cp = ConvMatch(ph.index(x), ph.index(w), ph.index(b) if b is not None else None, stride, padding,
                  dilation, groups, dt, bn, prog, g, residual, relu, fits, bool(policy and policy.allow_tf32),
                  kind=kind, channels_last=cl, in_channels=shape_of(x)[1], hardswish=cl and hardswish)
    lib_tiles = (tuple(range(len(conv_cutlass.TILES)))
                 if cl and conv_cutlass.reason(cp) is None and conv_cutlass.library_ready() else ())
    cp.facts = TaskFacts("conv", yshape[1], 16 // DT[dt][2], has_transcendental=prog.has_transcendental,
                       low_precision=dt != "float32", allow_tf32=cp.allow_tf32, fp32=dt == "float32",
                       has_batchnorm=bn is not None, epilogue_fits_cudnn=fits and not cl,
                       tiled_conv=not cl and pwconv.reason(cp) is None,
                       nhwc_conv=not cl and nhwc_reason(cp, {"graph": True}) is None,
                       igemm_tiles=conv_igemm.IG_TILES if cl and conv_igemm.reason(cp) is None else (),
                       cutlass_tiles=lib_tiles)
    return cp


# ---- CUDA text ------------------------------------------------------------------------------------

# the fold kernels' bodies (fold_channels, fold_cl_channels): conv.py emits their parameter lists
FOLD = cuh("conv_fold.cuh")
# epi_cl_kernel and launch_epi_cl: render_cl's split epilogue over the Epi struct _epi_cl emits
EPI_CL = cuh("conv_epi_cl.cuh")
# to_nhwc and nhwc_copies: the NHWC path's copies of x and w (after CUDNN_STATE)
NHWC = cuh("conv_nhwc.cuh")


def _fold_kernel(cp: ConvMatch, shift_t: str, center: bool) -> tuple[str, list[tuple[str, int]]]:
    """fold_kernel (conv_fold.cuh's fold_channels on this region's vectors): scale[k] / shift[k] per
    output channel (center: mean - bias for our epilogue, else cuDNN's bias for the fused call), and
    w2 = w * scale[k] when w2 != nullptr; with the (name, input index) vectors it takes."""
    f, wt = Fold(cp), DT[cp.dtype][0]
    if cp.bn is None:
        shift = f.ld("bias", "i")
    elif center:               # our epilogue: the channel's center, (y - center) * scale + beta
        shift = f.center("i")
    else:                      # cuDNN's bias after the pre-scaled weights
        shift = f"{f.ld('beta', 'i')} + ({f.ld('bias', 'i')} - {f.ld('mean', 'i')}) * s"
    return f"""
// Folds batch norm (and the conv bias) per output channel k: scale[k] = gamma * rsqrt(var + eps) and
// shift[k] = mean - bias (our epilogue: (conv - shift) * scale + beta) or, for cuDNN's fused call
// on weights pre-scaled into w2, shift[k] = beta + (bias - mean) * scale.
__global__ void fold_kernel({f.params()}float eps, int64_t K, int64_t per, int64_t n,
    float* __restrict__ scale, {shift_t}::raw* __restrict__ shift, const {wt}::raw* __restrict__ w,
    {wt}::raw* __restrict__ w2) {{
  fold_channels<{wt}>(K, per, n, scale, w, w2, [=](int64_t i) {{ return {f.scale("i")}; }},
                      [=](int64_t i, float s) {{ shift[i] = {shift_t}::from_f({shift}); }});
}}
""", list(f.present.items())


def _math(cp: ConvMatch, params: dict) -> tuple[str, bool]:
    """(cuDNN math type to plan with, strict fp32)."""
    if cp.dtype != "float32":
        return "CUDNN_TENSOR_OP_MATH", False
    if params.get("tf32") and cp.allow_tf32:
        return "CUDNN_DEFAULT_MATH", False       # NOTE: DEFAULT permits TF32 tensor cores on sm_80+
    return "CUDNN_FMA_MATH", True


def legacy_reason(kind: conv_geom.ConvKind) -> str | None:
    """Why cuDNN's legacy API (and its fused call) cannot run this conv kind (None: it can)."""
    if kind.transposed or kind.spatial == 3:
        return f"{kind.name}: on cuDNN's backend API only (graph=True, unfused)"
    return None


def nhwc_reason(cp: ConvMatch, params: dict) -> str | None:
    """Why the NHWC path (x and w transposed, cuDNN's conv in NHWC, the tiled kernel's epilogue
    reading it back to NCHW) cannot run this setting (None: it can)."""
    if params.get("fused") or not params.get("graph"):
        return "nhwc: only on the backend API, unfused"
    if not cp.kind.plain2d:
        return f"nhwc: conv2d only, not {cp.kind.name}"
    if cp.groups != 1:
        return "nhwc: groups != 1"
    if cp.epilogue.ndim != 4:
        return "nhwc: the epilogue is not over the 4-D conv output"
    return None


@dataclass(frozen=True)
class _Path:
    """How render runs an NCHW conv (the module docstring's ways) and what that implies."""
    fused: bool       # cudnnConvolutionBiasActivationForward: the whole region in one legacy call
    graph: bool       # the backend API, else the legacy one
    nhwc: bool        # NHWC copies, cuDNN's conv in NHWC, pwconv's epilogue kernel writing NCHW
    epilogue: bool    # an elementwise epilogue kernel runs in place after the conv
    fold: bool        # fold_kernel runs (nhwc: pwconv's epilogue kernel folds batch norm itself)
    scale_w: bool     # the fused call on weights pre-scaled into scratch, w2 = w * scale[k]
    math: str         # cuDNN's math type
    strict: bool      # fp32 without TF32


def _path(cp: ConvMatch, params: dict) -> _Path:
    """params' path for an NCHW conv (Unsupported: one this conv cannot take)."""
    nhwc = bool(params.get("nhwc"))
    if nhwc and (why := nhwc_reason(cp, params)):
        raise Unsupported(why)
    fused = bool(params.get("fused")) and cp.fusable
    graph = bool(params.get("graph")) and not fused   # the fused call exists on the legacy API only
    if not graph and (why := legacy_reason(cp.kind)):
        raise Unsupported(why)
    math, strict = _math(cp, params)
    return _Path(fused, graph, nhwc, epilogue=not fused and not g_only(cp.epilogue, cp.g),
                 fold=(fused or cp.bn is not None) and not nhwc, scale_w=fused and cp.bn is not None,
                 math=math, strict=strict)


def _mode(p: _Path) -> str:
    """The path in words, for the source's first line."""
    if p.fused:
        return "cudnnConvolutionBiasActivationForward"
    if p.nhwc:
        return "NHWC copies + cudnnBackendExecute + tiled epilogue to NCHW"
    return ("cudnnBackendExecute" if p.graph else "cudnnConvolutionForward") + (" + epilogue kernel" * p.epilogue)


def _epilogue_src(cp: ConvMatch, params: dict, p: _Path) -> str:
    """The kernel after the conv: pwconv's NHWC epilogue (to NCHW), else the in-place elementwise one."""
    if p.nhwc:
        return pwconv.nhwc_epilogue(cp, params)
    if not p.epilogue:
        return ""
    ew = {k: v for k, v in params.items() if k in elementwise.EwParams.__dataclass_fields__}
    ew["nc"] = False         # NOTE: the epilogue overwrites the conv result in place
    return elementwise.generate(cp.epilogue, elementwise.EwParams(**ew), cp.facts.low_precision,
                                entry="static int epilogue_run", restrict=False, prelude=False)


def _vector_checks(cp: ConvMatch, inputs) -> list[str]:
    """htam_run's checks of the [K] per-channel inputs (batch norm, bias) among `inputs`."""
    return [f"  if (in[{i}].ndim != 1 || in[{i}].sizes[0] != K || !htam_contiguous(in[{i}]) || "
            f"in[{i}].dtype != {DT[cp.epilogue.inputs[i][1]][1]} || in[{i}].data == nullptr) return HTAM_ERR_SHAPE;"
            for i in sorted(inputs)]


def _checks(cp: ConvMatch, p: _Path, vectors: set[int]) -> str:
    """htam_run's checks of the inputs besides x and w (conv_geom.host_dims checks those)."""
    lines = _vector_checks(cp, vectors | ({cp.bias} if cp.bias is not None else set()))
    if cp.residual is not None and p.fused:
        r, rank = cp.residual, cp.kind.rank
        lines += [f"  if (in[{r}].dtype != {DT[cp.dtype][1]} || in[{r}].ndim != {rank} || !htam_contiguous(in[{r}]) ||"
                  f" in[{r}].data == nullptr) return HTAM_ERR_SHAPE;",
                  f"  for (int i = 0; i < {rank}; ++i) if (in[{r}].sizes[i] != Y.sizes[i]) return HTAM_ERR_SHAPE;"]
    if not p.graph:
        lines += ["  // the legacy cuDNN API takes int sizes and indexes with 32 bits",
                  "  if (htam_numel(&X) > INT32_MAX || htam_numel(&Y) > INT32_MAX || htam_numel(&Wt) > INT32_MAX) "
                  "return HTAM_ERR_SHAPE;"]
    return "\n".join(lines)


def _scratch(cp: ConvMatch, p: _Path) -> str:
    """htam_run from the checks to the fold: cuDNN's state and entry, the scratch and its pointers."""
    w2_bytes = f"((size_t)htam_numel(&Wt) * {DT[cp.dtype][2]} + 255) / 256 * 256" if p.scale_w else "0"
    ptrs = "\n".join(line for line, used in (
        ("  float* scale = (float*)st->scratch;", p.fold and not p.fused),
        ("  void* shift = (char*)st->scratch + vec_bytes;", p.fold),
        ("  void* w2 = (char*)st->scratch + 2 * vec_bytes;", p.scale_w)) if used)
    return f"""  if (htam_numel(&Y) == 0) return HTAM_OK;
  DnnState* st = nullptr;
  int rc = dnn_state(&st);
  if (rc) return rc;
  CD(cudnnSetStream(st->handle, stream));
  ConvEntry* e = nullptr;
  if ((rc = conv_entry(st, d, P, Q, &e))) return rc;
  // scratch: scale[K] fp32 | shift[K] (fp32 center, or cuDNN's bias in the output dtype) | scaled weights
  const size_t vec_bytes = ((size_t)K * 4 + 255) / 256 * 256;
  if ((rc = grow(&st->scratch, &st->scratch_bytes, 2 * vec_bytes + {w2_bytes}))) return rc;
{ptrs}"""


def _fold_launch(cp: ConvMatch, p: _Path, present: list[tuple[str, int]], shift_t: str) -> str:
    """fold_kernel's launch: K threads, or one a weight when it also scales them."""
    if not p.fold:
        return ""
    dt = DT[cp.dtype][0]
    ptrs = "".join(f"(const {DT[cp.epilogue.inputs[i][1]][0]}::raw*)in[{i}].data, " for _, i in present)
    return f"""  {{
    const int64_t per = htam_numel(&Wt) / K, n = {"htam_numel(&Wt)" if p.scale_w else "K"};
    const int blocks = (int)std::min<int64_t>((n + 255) / 256, 4096);
    fold_kernel<<<blocks, 256, 0, stream>>>({ptrs}{c_float(cp.bn.eps if cp.bn else 0.0)}, K, per, n,
        {"nullptr" if p.fused else "scale"}, ({shift_t}::raw*)shift, (const {dt}::raw*)Wt.data,
        {"(" + dt + "::raw*)w2" if p.scale_w else "nullptr"});
    HTAM_CHECK_LAUNCH();
  }}"""


def _conv_call(cp: ConvMatch, params: dict, p: _Path) -> tuple[str, str]:
    """(the per-shape entry and its planning, htam_run's conv call) on the path's cuDNN API."""
    algo = int(params.get("algo", 0))
    if p.nhwc:     # x and w to NHWC / KRSC in `lay`, cuDNN's conv writes y there NHWC
        run = f"""  void *xl = nullptr, *wl = nullptr, *yl = nullptr;
  if ((rc = nhwc_copies<{DT[cp.dtype][0]}::raw>(st, X, Wt, Y, d, K, stream, &xl, &wl, &yl))) return rc;
  if ((rc = graph_conv(st, e, xl, wl, yl, nullptr))) return rc;"""
        return graph_entry(cp, p.strict, algo, nhwc=True), run
    if p.graph:
        return graph_entry(cp, p.strict, algo), ("  if ((rc = graph_conv(st, e, X.data, Wt.data, Y.data, nullptr)))"
                                                 " return rc;")
    return legacy_entry(cp, p.math, p.strict, p.fused, algo), legacy_run(cp, p.fused, p.scale_w)


def _tail(cp: ConvMatch, params: dict, p: _Path) -> str:
    """htam_run's end: the epilogue kernel's launch on the task's inputs + the conv result."""
    n_ext, dt = len(cp.epilogue.inputs), DT[cp.dtype][0]
    if p.nhwc:
        vec = 16 // DT[cp.dtype][2]
        ext = host.extend_inputs(n_ext, pwconv.UNREAD_BN if cp.bn is not None else None, "    ")
        return (f"  {{\n{ext}\n    return pw_launch(ext, {n_ext}, out, n_out, stream, (const {dt}::raw*)yl, nullptr,"
                f" 0, K, d[0], P * Q, K % {vec} == 0);\n  }}")
    if p.epilogue:
        ext = host.extend_inputs(n_ext, ("scale", "shift") if cp.bn is not None else None, "    ")
        return f"  {{\n{ext}\n    return epilogue_run(ext, {n_ext}, out, n_out, stream);\n  }}"
    return "  return HTAM_OK;"


def render(cp: ConvMatch, params: dict) -> str:
    """The kernel source for params: render_cl (channels-last), pwconv's tiled kernel, else a cuDNN
    path (_Path): the fold and epilogue kernels, the cuDNN skeletons, and htam_run."""
    if cp.channels_last:
        return render_cl(cp, params)
    if params.get("tiled"):
        return pwconv.render(cp, params)
    p = _path(cp, params)
    shift_t = DT[cp.dtype][0] if p.fused else "F32"   # cuDNN's bias has the output dtype; our epilogue reads fp32
    fold_src, present = _fold_kernel(cp, shift_t, center=not p.fused) if p.fold else ("", [])
    vectors = {i for _, i in present} | set(Fold(cp).present.values() if p.nhwc else ())
    entry_src, run_conv = _conv_call(cp, params, p)
    align = "256" if p.nhwc else "(uintptr_t)X.data | (uintptr_t)Wt.data | (uintptr_t)Y.data" if p.graph else "0"
    dims = conv_geom.host_dims(cp.kind, cp.stride, cp.padding, cp.dilation, cp.groups, DT[cp.dtype][1], align)
    head = f"""// torch_htam expert: cuDNN {cp.kind.name} ({_mode(p)}) params={sorted(params.items())}
{PRELUDE}
#include <algorithm>
#include <cudnn.h>
{_epilogue_src(cp, params, p)}
{FOLD if p.fold else ""}{fold_src}
{CUDNN_STATE}
{NHWC if p.nhwc else ""}{host.EPILOGUE_INPUTS}
{entry_src}
{ENTRY_CACHE}"""
    body = (_run_head(cp), dims, _checks(cp, p, vectors), _scratch(cp, p), _fold_launch(cp, p, present, shift_t),
            run_conv, _tail(cp, params, p))
    return "\n".join((head,) + body) + "\n}\n"


def _run_head(cp: ConvMatch) -> str:
    """htam_run's opening on every cuDNN path: the arity check and the x (X), w (Wt), y (Y) operands."""
    return f"""HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {cp.n_inputs} || n_out != 1) return HTAM_ERR_SHAPE;
  const HtamTensor& X = in[{cp.x}];
  const HtamTensor& Wt = in[{cp.w}];
  HtamTensor& Y = out[0];"""


def _cl_ops(cp: ConvMatch) -> list[tuple[str, str]]:
    """The channels-last epilogue as (op, operand) steps on the conv result, in fp32: operand 'c'
    (center), 's' (scale), 'b' (beta or the conv bias) [K], 'z' (the residual) or '' (unary)."""
    ops: list[tuple[str, str]] = []
    if cp.bn is not None:
        ops += [("sub", "c"), ("mul", "s")] + [("add", "b")] * (cp.bn.beta is not None)
    elif cp.bias is not None:
        ops.append(("add", "b"))
    return ops + [("add", "z")] * (cp.residual is not None) + [("relu", "")] * cp.relu + [("hardswish", "")] * cp.hardswish


def _cl_words(ops: list[tuple[str, str]]) -> str:
    """The channels-last epilogue in words: 'sub(c) mul(s) add(b) relu'."""
    return " ".join(f"{m}{'(' + a + ')' if a else ''}" for m, a in ops) or "none"


def _epi_cl(ops: list[tuple[str, str]], dt: str, vt: str) -> str:
    """conv_epi_cl.cuh after its Epi: the channels-last ops on one element v of channel k (z: the
    residual's element; cen, scl, bet: the [K] vectors in vt)."""
    step = {"sub": "v -= {vt}::to_f({a}[k]);", "mul": "v *= {vt}::to_f({a}[k]);", "add": "v += {vt}::to_f({a}[k]);",
            "relu": "v = v < 0.f ? 0.f : v;",
            "hardswish": "v = v * fminf(fmaxf(v + 3.f, 0.f), 6.f) * (1.f / 6.f);"}
    name = {"c": "cen", "s": "scl", "b": "bet"}
    body = "\n".join("    " + (f"v += {dt}::to_f(z);" if a == "z" else step[m].format(vt=vt, a=name.get(a)))
                     for m, a in ops)
    return f"""
// The epilogue after a conv-only cuDNN graph (params fused=False): y = {_cl_words(ops)}
struct Epi {{
  static constexpr bool kResidual = {"true" if any(a == "z" for _, a in ops) else "false"};
  __device__ __forceinline__ float operator()(float v, int64_t k, {dt}::raw z, const {vt}::raw* cen,
                                              const {vt}::raw* scl, const {vt}::raw* bet) const {{
{body}
    return v;
  }}
}};
{EPI_CL}"""


def _fold_cl_kernel(cp: ConvMatch, dt: str, vt: str, used: set[str]) -> str:
    """fold_cl_kernel (conv_fold.cuh's fold_cl_channels on this region's vectors); used: the
    operands among 'c', 's', 'b' the epilogue reads."""
    f = Fold(cp)
    beta = f.ld("beta", "i") if cp.bn is not None else f.ld("bias", "i") if cp.bias is not None else "0.f"
    return f"""
// The per-channel vectors of the epilogue (center = mean - bias, scale = gamma * rsqrt(var + eps),
// beta; a null one is not written) and, when w2 != nullptr, w (KCRS) copied to KRSC.
__global__ void fold_cl_kernel({f.params()}float eps, int64_t K, int64_t C, int64_t RS,
    {vt}::raw* __restrict__ cen, {vt}::raw* __restrict__ scl, {vt}::raw* __restrict__ bet,
    const {dt}::raw* __restrict__ w, {dt}::raw* __restrict__ w2) {{
  fold_cl_channels<{vt}, {dt}>(K, C, RS, cen, scl, bet, w, w2, [=](int64_t i) {{ return {f.center("i")}; }},
                               [=](int64_t i) {{ return {f.scale("i")}; }},
                               [=](int64_t i) {{ return {beta if "b" in used else "0.f"}; }});
}}
"""


def _cl_checks(cp: ConvMatch, f: Fold) -> str:
    """render_cl's htam_run: the checks of the vectors and the residual (channels-last, y's sizes)."""
    lines = _vector_checks(cp, f.present.values())
    if (r := cp.residual) is not None:
        lines += [f"  if (in[{r}].dtype != {DT[cp.dtype][1]} || !htam_channels_last(in[{r}]) || "
                  f"in[{r}].data == nullptr) return HTAM_ERR_SHAPE;",
                  f"  for (int i = 0; i < 4; ++i) if (in[{r}].sizes[i] != Y.sizes[i]) return HTAM_ERR_SHAPE;"]
    return "\n".join(lines)


def _cl_scratch(cp: ConvMatch, vt: str, vsz: int, used: set[str]) -> str:
    """render_cl's htam_run from the checks to the fold: cuDNN's state, the scratch (the vectors the
    epilogue reads, w's KRSC copy), the entry (a sliced batch's are _cl_conv's, one per slice)."""
    entry = "" if cp.batch_ranged else """  ConvEntry* e = nullptr;
  if ((rc = conv_entry(st, d, P, Q, &e))) return rc;
"""
    vecs = "\n".join(f"  void* {v} = " + (f"(char*)st->scratch + {j} * vec_bytes;" if a in used else "nullptr;")
                     for j, (a, v) in enumerate((("c", "cen"), ("s", "scl"), ("b", "bet"))))
    return f"""  if (htam_numel(&Y) == 0) return HTAM_OK;
  DnnState* st = nullptr;
  int rc = dnn_state(&st);
  if (rc) return rc;
  // scratch: center, scale, beta [K] ({vt}) | the KRSC copy of w
  const int64_t RS = Wt.sizes[2] * Wt.sizes[3];
  const size_t vec_bytes = ((size_t)K * {vsz} + 255) / 256 * 256;
  if ((rc = grow(&st->scratch, &st->scratch_bytes, 3 * vec_bytes + (w_krsc ? 0 : (size_t)htam_numel(&Wt) * {DT[cp.dtype][2]}))))
    return rc;
  void* w2 = w_krsc ? nullptr : (char*)st->scratch + 3 * vec_bytes;
  const void* w = w_krsc ? Wt.data : w2;
  CD(cudnnSetStream(st->handle, stream));
{entry}{vecs}"""


def _cl_fold_launch(cp: ConvMatch, f: Fold, vt: str) -> str:
    """fold_cl_kernel's launch (when it has a vector or w's copy to write): K threads, or one a weight."""
    dt = DT[cp.dtype][0]
    ptrs = "".join(f"(const {DT[cp.epilogue.inputs[i][1]][0]}::raw*)in[{i}].data, " for i in f.present.values())
    return f"""  if (cen != nullptr || scl != nullptr || bet != nullptr || w2 != nullptr) {{
    const int64_t n = w2 != nullptr ? std::max(K * RS * Wt.sizes[1], K) : K;
    const int blocks = (int)std::min<int64_t>((n + 255) / 256, 4096);
    fold_cl_kernel<<<blocks, 256, 0, stream>>>({ptrs}{c_float(cp.bn.eps if cp.bn else 0.0)}, K, Wt.sizes[1], RS,
        ({vt}::raw*)cen, ({vt}::raw*)scl, ({vt}::raw*)bet, (const {dt}::raw*)Wt.data, ({dt}::raw*)w2);
    HTAM_CHECK_LAUNCH();
  }}"""


def _cl_conv(cp: ConvMatch, ops: list[tuple[str, str]], fused: bool, vt: str) -> str:
    """render_cl's htam_run from the conv to its end: the graph (with the epilogue's operands when
    fused), else the conv and then the epilogue kernel in place."""
    r = cp.residual
    z = f"in[{r}].data" if r is not None else "nullptr"
    arg = {"c": "cen", "s": "scl", "b": "bet", "z": z, "": "nullptr"}
    if cp.batch_ranged:   # x, y and the residual are N, H, W, C: a slice of images is a pointer offset
        arg["z"] = f"(const char*)in[{r}].data + n0 * y_img" if r is not None else "nullptr"
    args = ", ".join(arg[a] for _, a in ops) if fused and ops else "nullptr"
    run = f"""  const void* args[] = {{{args}}};
  if ((rc = graph_conv(st, e, X.data, w, Y.data, args))) return rc;"""
    if cp.batch_ranged:
        esz = DT[cp.dtype][2]
        run = f"""  // the batch, a served range, runs in slices of the sizes batch_slice() plans (batch_slice.cuh)
  const size_t x_img = (size_t)(htam_numel(&X) / d[0]) * {esz}, y_img = (size_t)(htam_numel(&Y) / d[0]) * {esz};
  for (int64_t n0 = 0; n0 < d[0];) {{
    int64_t ds[kConvDims];
    std::copy(d, d + kConvDims, ds);
    ds[0] = batch_slice(d[0] - n0);
    // the slice's alignment, as host_dims gives d[7]: its pointers are n0 images past the tensors'
    const uintptr_t sb = bits | (uintptr_t)(n0 * x_img) | (uintptr_t)(n0 * y_img);
    ds[7] = sb % 16 == 0 ? 16 : sb % 8 == 0 ? 8 : sb % 4 == 0 ? 4 : 2;
    ConvEntry* e = nullptr;
    if ((rc = conv_entry(st, ds, P, Q, &e))) return rc;
    const void* args[] = {{{args}}};
    if ((rc = graph_conv(st, e, (const char*)X.data + n0 * x_img, w, (char*)Y.data + n0 * y_img, args))) return rc;
    n0 += ds[0];
  }}"""
    if not fused:
        run += (f"\n  if ((rc = launch_epi_cl<{DT[cp.dtype][0]}, {vt}, Epi>(Y, {z}, cen, scl, bet, K, stream)))"
                " return rc;")
    return run + "\n  return HTAM_OK;\n}\n"


def render_cl(cp: ConvMatch, params: dict) -> str:
    """A channels-last conv2d region (x, the residual and y stored N, H, W, C; w as the model holds
    it) as one cuDNN graph whose pointwise ops cuDNN's runtime-fusion engines compile into the conv
    kernel itself, so the conv result is never stored and read back (Inductor runs cuDNN's conv,
    then a Triton kernel for batch norm, the add and the ReLU):

        y = [relu]((conv(x, w) - center[k]) * scale[k] + beta[k] [+ residual])   (batch norm)
        y = [relu](conv(x, w) [+ bias[k]] [+ residual])                          (without)

    in fp32 on the conv's accumulators. NOTE: batch norm stays torch's (y - center) * scale, not
    folded into the weights: w * scale + (beta - mean * scale) cancels badly when a tiny running
    var makes the scale large (verification's random statistics do), and rounding w * scale to
    bf16 adds error torch does not have. A small kernel first writes the per-channel vectors and,
    for a KCRS weight other than 1x1, its KRSC copy (cuDNN's NHWC engines take KRSC).
    params: algo (the algo-th usable engine of the heuristic's ranking), tf32 (fp32, where the
    policy allows TF32), vec32 (the vectors in fp32, else in the data type), fused (False: a
    conv-only graph, then epi_cl_kernel in place, as Inductor splits it: cuDNN's precompiled conv
    engines, where its runtime-fusion ones are slow, e.g. a stem's 3 channels); igemm (with
    ig_bm, ig_bn, ig_stages): no cuDNN, our implicit-GEMM kernel in one launch (conv_igemm.py)."""
    if cutlass(cp, params):
        return conv_cutlass.render(cp, params)
    if igemm(cp, params):
        return conv_igemm.render(cp, params)
    _, strict = _math(cp, params)
    dt, dtc, esz = DT[cp.dtype]
    vec32 = bool(params.get("vec32", True)) or cp.dtype == "float32"
    vt, vsz = ("F32", 4) if vec32 else (dt, esz)
    f, ops = Fold(cp), _cl_ops(cp)
    fused = (bool(params.get("fused", True)) and not cp.hardswish) or not ops
    used = {a for _, a in ops}
    # the KRSC copy of w starts 256-aligned in the scratch
    align = ("(uintptr_t)X.data | (uintptr_t)(w_krsc ? Wt.data : nullptr) | (uintptr_t)Y.data | 256"
             + (f" | (uintptr_t)in[{cp.residual}].data" if cp.residual is not None else ""))
    dims = conv_geom.host_dims(cp.kind, cp.stride, cp.padding, cp.dilation, 1, dtc, align, channels_last=True)
    entry = graph_entry(cp, strict, int(params.get("algo", 0)), nhwc=True, epilogue=tuple(ops) if fused else (),
                        vec_type="CUDNN_DATA_FLOAT" if vec32 else CUDNN_TYPES[cp.dtype])
    how = "epilogue fused" if fused else "conv, then the epilogue kernel"
    head = f"""// torch_htam expert: cuDNN {cp.kind.name}, channels-last, {how}: {_cl_words(ops)} params={sorted(params.items())}
{PRELUDE}
#include <algorithm>
#include <cudnn.h>
{FOLD}{_fold_cl_kernel(cp, dt, vt, used)}{"" if fused else _epi_cl(ops, dt, vt)}
{CUDNN_STATE}
{entry}
{ENTRY_CACHE}{BATCH_SLICE if cp.batch_ranged else ""}"""
    w_krsc = """  // cuDNN's NHWC engines take the weight KRSC: a channels-last (or 1x1) one as it is, else a copy
  const bool w_krsc = htam_channels_last(Wt);"""
    return "\n".join((head, _run_head(cp), w_krsc, dims, _cl_checks(cp, f), _cl_scratch(cp, vt, vsz, used),
                      _cl_fold_launch(cp, f, vt), _cl_conv(cp, ops, fused, vt)))


# ---- the conv target (target.Target) ---------------------------------------------------------------

# NOTE: cuDNN's legacy ranking for fp32 convs under TF32 puts algorithms first that fail the TF32
# tolerance (bench/sweep.py, H100: 12 of 16 settings of conv+BN+ReLU mismatched; the fastest that
# verified was the 5th ranked), so the grid goes down the ranking on every path.


def defaults(cp: ConvMatch) -> dict:
    p = elementwise.epilogue_params(16 // DT[cp.dtype][2])
    # the backend API (far less host time per call, module docstring) at algo 0: the top
    # heuristic engine, the one PyTorch runs; the grid moves down the ranking
    p.update(fused=False, graph=True, tf32=cp.allow_tf32 and cp.dtype == "float32", algo=0, nhwc=False)
    # our own tiled kernel for 1x1 convs (pwconv.py) where its tensor-core math is allowed: the
    # fastest of bench/sweep.py's grid on an H100 (docs/RESULTS_LOG.md) for
    # [32, 64 -> 256, 56, 56]: fp32 (3xTF32) 64x256 tiles, one per block, 0.0985 ms; bf16 with
    # the residual prefetched, 3 stages, persistent, 0.0545 ms (minb=3: 0.0540, within noise;
    # cuDNN + epilogue: 0.163 / 0.094).
    # NOTE: 64-channel tiles: at 128, 3xTF32's fragments spill (128 registers, ptxas)
    p.update(tiled=False, bm=64, bn=128, stages=2, ju=4, split=True, minb=2, pre=True, persist=True)
    if cp.channels_last:   # render_cl: its knobs algo, tf32, vec32 and fused (the epilogue in cuDNN's graph)
        # NOTE: under 16 bytes of channels a pixel (a stem's 3) cuDNN's runtime-fusion engines are
        # slow and its conv alone is not: ResNet-50's stem, batch 32, H100 (bench/sweep.py on
        # bench/tasks/conv_stem_cl_*.py): bf16 0.271 ms split against 0.405-0.423 fused, fp32
        # (TF32) 0.288 against 0.586-0.836
        # NOTE: cuDNN's pointwise ops have no hardswish: that epilogue runs after its conv, always
        p = dict(p, vec32=True, fused=cp.in_channels * DT[cp.dtype][2] >= 16 and not cp.hardswish)
        if cp.facts is not None and cp.facts.cutlass_tiles:    # one launch, the fastest on the GPU: conv_cutlass.py
            n, k, ph, pw = cp.epilogue.inputs[cp.g][0]
            p.update(cutlass=True, ct_tile=conv_cutlass.default_tile(n * ph * pw, k))
        return p
    if pwconv.reason(cp) is None:
        tile = dict(bn=256, ju=8, pre=False, persist=False) if cp.dtype == "float32" else dict(stages=3)
        # the grid still offers the tiled kernel where its tiles would leave most SMs idle
        p.update(tile, tiled=pwconv.tiles(cp, dict(p, **tile)) >= PW_MIN_TILES)
    return p


# The fewest output tiles (pwconv.tiles) for which the tiled 1x1 kernel is the default. NOTE: a
# squeeze-excite FC as a 1x1 conv ([32, 672 -> 168, 1, 1] bf16: 3 tiles) ran at 0.24x of eager
# tiled, 1.54-3.57x through cuDNN; [32, 64 -> 256, 56, 56] (3136 tiles) is fastest tiled (H100,
# bench/results/anytime_table-*, docs/RESULTS_LOG.md). 16 tiles: an H100's 132 SMs mostly idle.
PW_MIN_TILES = 16

def canonical(cp: ConvMatch, params: dict) -> dict:
    """params with the knobs of the path not taken at their defaults: the tiled kernel reads no
    cuDNN setting, cuDNN's paths read no tile setting.

        >>> canonical(cp, dict(defaults(cp), tiled=True, fused=True))["fused"]
        False
    """
    d = defaults(cp)
    keys = CUDNN_KEYS if tiled(cp, params) else TILE_KEYS
    if cp.channels_last:    # render_cl reads algo, tf32, vec32 and fused (where there is an epilogue) alone
        keys = (CUDNN_KEYS | TILE_KEYS | {"tiled"}) - {"algo", "tf32"} - ({"fused"} if _cl_ops(cp) else set())
        # the path render_cl takes (CUTLASS's before the implicit GEMM's, else cuDNN's) and its own knobs
        own = conv_cutlass.KEYS if cutlass(cp, params) else IGEMM_KEYS if igemm(cp, params) else set()
        if own:   # conv_cutlass.py / conv_igemm.py read their tile alone
            keys = CUDNN_KEYS | TILE_KEYS | {"tiled", "vec32"}
        params = {k: v for k, v in params.items() if k not in (IGEMM_KEYS | conv_cutlass.KEYS) - own}
    out = dict(params, **{k: d[k] for k in keys if k in params})
    if out.get("fused") and (cp.hardswish or (not cp.channels_last and not cp.fusable)):   # runs unfused: the same kernel
        out["fused"] = False
    return out

def cutlass(cp: ConvMatch, params: dict) -> bool:
    """Whether params select the CUTLASS library's kernel and this conv allows it (conv_cutlass.reason)."""
    return bool(params.get("cutlass")) and conv_cutlass.reason(cp) is None


def igemm(cp: ConvMatch, params: dict) -> bool:
    """Whether params select the implicit-GEMM kernel and this conv allows it (conv_igemm.reason)."""
    return bool(params.get("igemm")) and conv_igemm.reason(cp) is None


def tiled(cp: ConvMatch, params: dict) -> bool:
    """Whether params select the tiled pointwise kernel and this conv and policy allow it."""
    return bool(params.get("tiled")) and pwconv.reason(cp) is None

def tags(cp: ConvMatch, params: dict) -> list[str]:
    """Strategy ids the setting embodies (they follow the path actually taken)."""
    if cp.channels_last and (cutlass(cp, params) or igemm(cp, params)):
        return ["fold_batchnorm"] * (cp.bn is not None) + ["fuse_elementwise_chain", "coalesced_layout_access",
                                                            "smem_tiling", "bf16_tensor_cores"]
    if cp.channels_last:
        tags = ["fold_batchnorm"] * (cp.bn is not None) + ["fuse_elementwise_chain", "coalesced_layout_access"]
        if _math(cp, params)[0] == "CUDNN_DEFAULT_MATH":
            tags.append("tf32_tensor_cores")
        if not params.get("fused", True) and _cl_ops(cp):
            tags.append("gemm_plus_epilogue_kernel")
        return tags + ["bf16_tensor_cores"] * (cp.dtype != "float32")
    if tiled(cp, params):
        tags = ["fold_batchnorm"] * (cp.bn is not None) + ["smem_tiling", "fuse_elementwise_chain"]
        return tags + ["tf32_tensor_cores" if cp.dtype == "float32" else "bf16_tensor_cores"]
    fused = bool(params.get("fused")) and cp.fusable
    epilogue = fused or not g_only(cp.epilogue, cp.g)
    tags = ["fold_batchnorm"] if cp.bn is not None else []
    if epilogue:
        tags.append("fuse_elementwise_chain")
    if epilogue and not fused:
        tags.append("gemm_plus_epilogue_kernel")
    if _math(cp, params)[0] == "CUDNN_DEFAULT_MATH":
        tags.append("tf32_tensor_cores")
    if cp.dtype != "float32":
        tags.append("bf16_tensor_cores")
    if params.get("nhwc") and nhwc_reason(cp, params) is None:
        tags.append("coalesced_layout_access")
    return tags


def retag(cp: ConvMatch, params: dict, tags_: list[str]) -> list[str]:
    """Conv tags follow the path actually used."""
    return [t for t in tags_ if t not in TAG_IDS] + tags(cp, params)


def refit(cp: ConvMatch, p: dict, moved: dict) -> dict:
    """A move of cuDNN's knobs (fused, graph, algo, tf32) leaves our own kernels (tiled, implicit
    GEMM, CUTLASS's) for cuDNN's path; a move to the implicit-GEMM kernel leaves CUTLASS's."""
    if CUDNN_KEYS & set(moved):
        if "tiled" not in moved:
            p = dict(p, tiled=False)
        if "igemm" not in moved and p.get("igemm"):
            p = dict(p, igemm=False)
    if (CUDNN_KEYS | IGEMM_KEYS) & set(moved) and "cutlass" not in moved and p.get("cutlass"):
        p = dict(p, cutlass=False)
    return p


def grid(cp: ConvMatch, base: dict) -> list[dict]:
    """cuDNN's ranked algorithms on each path (fused, backend, legacy, NHWC), then tiled settings;
    channels-last: the ranked engines of its one path, under TF32 and without where fp32 may."""
    facts, lib = cp.facts, dict(base, tiled=False)
    if cp.channels_last:   # vec32 matters in half types only (render_cl); the defaults' form first
        split = [dict(base, fused=False, algo=a) for a in range(4)] if _cl_ops(cp) else []
        if cp.hardswish:    # render_cl runs it unfused only
            fused = []
        elif facts.fp32:
            tf32 = (True, False) if facts.allow_tf32 else (base["tf32"],)
            fused = [dict(base, fused=True, tf32=t, algo=a) for t in tf32 for a in range(6)]
        else:
            fused = [dict(base, fused=True, vec32=v, algo=a) for v in (True, False) for a in range(5)]
        # our implicit-GEMM kernel, one launch a call (conv_igemm.py), last: at batch 16 cuDNN's conv is
        # 2-5x faster on the GPU (docs/experiments/igemm_tiles), at batch 1 level or faster
        off = {"cutlass": False} if base.get("cutlass") else {}    # the others leave CUTLASS's default
        own = [dict(base, igemm=True, ig_bm=bm, ig_bn=bn, ig_stages=st, **off)
               for bm, bn, st in conv_igemm.IG_TILES if conv_igemm.reason(cp) is None]
        # CUTLASS's one launch (conv_cutlass.py), first: the fastest on the GPU at most shapes
        lib = [dict(base, cutlass=True, ct_tile=t) for t in facts.cutlass_tiles]
        cudnn = [dict(q, **off) for q in (fused + split if base["fused"] or not split else split + fused)]
        return lib + cudnn + own
    out = [dict(lib, fused=v, algo=algo) for v in (base["fused"], not base["fused"]) for algo in range(8)]
    # the unfused path through cuDNN's graph API, then the legacy one
    out += [dict(lib, fused=False, graph=graph, algo=algo) for graph in (True, False) for algo in range(6)]
    if facts.nhwc_conv and not facts.tiled_conv:    # on NHWC copies, the epilogue transposing back
        out += [dict(lib, fused=False, graph=True, nhwc=True, algo=algo) for algo in range(3)]
    if facts.tiled_conv:   # our tiled 1x1 kernel
        for bm, bn in ((base["bm"], 128), (192 - base["bm"], 128), (64, 256), (64, 64)):
            for pre in (True, False):
                for stages, ju in ((2, 4), (3, 4), (2, 8)):
                    out.append(dict(base, tiled=True, bm=bm, bn=bn, stages=stages, ju=ju, pre=pre))
        out += [dict(base, tiled=True, minb=minb) for minb in (1, 3)]
        out += [dict(base, tiled=True, persist=False), dict(base, tiled=True, pre=False, persist=False),
                dict(base, tiled=True, bn=256, pre=False, persist=False)]
        if facts.fp32 and facts.allow_tf32:      # plain TF32: a third of 3xTF32's MMAs
            out.append(dict(base, tiled=True, split=False))
    return out


def alternates(cp: ConvMatch, base: dict) -> list[dict]:
    """cuDNN's default beside CUTLASS's. NOTE: CUTLASS's one launch is the default for the host it
    saves (served batches 1-16, #36), but on the GPU alone neither wins everywhere: ResNet-50 bf16 at
    batch 32 under CUDA graphs, CUTLASS's default ran 0.70-1.14x of Inductor's code at its conv sites
    and the cuDNN graph 1.08-1.58x where searched (zoo-20261130-053957, -051953)."""
    return [canonical(cp, dict(base, cutlass=False))] if base.get("cutlass") else []


TARGET = Target(
    kind="conv", match=match, defaults=defaults, tags=tags, retag=retag,
    start_order=("smem_tiling", "coalesced_layout_access", "fold_batchnorm", "fuse_elementwise_chain",
                 "tf32_tensor_cores", "bf16_tensor_cores"),
    grid=grid, render=lambda cp, params: render(cp, params), refit=refit, canonical=canonical,
    alternates=alternates,
    libraries=lambda cp: (conv_cutlass.LIBRARY,) if cp.channels_last and conv_cutlass.reason(cp) is None else ())
