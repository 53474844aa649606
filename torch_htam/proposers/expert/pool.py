"""Pooling regions: max / average / adaptive-average pooling (1-, 2-, 3-D) with the elementwise
prologue before the pool (e.g. batch norm + ReLU) and the epilogue after it (flatten, activation)
in one kernel.

A region (partition: a pooling op is a windowed row reduction, ops.OpInfo.window) is
    [elementwise prologue over x] -> pool -> [elementwise epilogue / views over the pooled value]
Each output element is one window: TPR threads (params["tpr"]: 1 for small windows, a warp for a
global average) walk its taps, compute the prologue at each tap from the region's inputs (read
through run-time strides over [N, C, (D,) (H,) W]), reduce in fp32 (max keeps the first maximum's
index, as torch does; average divides by torch's divisor), shuffle-reduce across the TPR lanes,
round to the pool's dtype, apply the epilogue and store. max_pool*_with_indices writes the indices
(flat within the input plane, int64) only where the region outputs them.

An average over a channels-last input (PoolMatch.channels_last) takes another mapping instead
(params["cl"]: warps per block, pool_body_cl): 32 lanes over 32 adjacent channels' windows, so
each tap is one coalesced read, and the warps share the taps.

Geometry (kernel_size, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override,
adaptive output_size) is baked in; N, C and the input's spatial sizes are read at run time.

The kernel's loop is pool_body (pool.cuh), a template over the pool kind, dtype and threads per
window; this module emits per region the struct it is instantiated with (PoolRegion: the prologue
at one tap, the epilogue and stores), the __global__ stub holding the pointers, and the host entry.

    >>> pm = match(task.graph, policy); src = render(pm, defaults(pm))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_htam import ops
from torch_htam.partition import op_name
from torch_htam.proposers.expert.cuda import DT, PRELUDE, Emitter, cuh
from torch_htam.proposers.expert.ir import (
    Access, Lowerer, Unsupported, dtype_of, shape_of, stored, TRANSCENDENTAL,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target
from torch_htam.task import TensorSpec

aten = torch.ops.aten
MAX_TPR = 32           # threads per window: at most a warp (the lanes reduce by shuffles)
WARP_WINDOW = 32       # windows of at least this many taps get a warp by default (global pooling)


@dataclass(frozen=True)
class Window:
    """One pooling op's geometry, padded to 3 spatial dims (D, H, W; unit dims for 1-D / 2-D).
    op: "max" | "avg" | "adaptive_avg"; out: adaptive output sizes (else computed at run time)."""
    op: str
    spatial: int
    kernel: tuple[int, int, int] = (1, 1, 1)
    stride: tuple[int, int, int] = (1, 1, 1)
    padding: tuple[int, int, int] = (0, 0, 0)
    dilation: tuple[int, int, int] = (1, 1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor: int = 0                  # divisor_override (0: none)
    out: tuple[int, int, int] = (1, 1, 1)

    def taps(self, in_sizes: tuple[int, ...]) -> int:
        """Taps per window at the captured sizes (adaptive: the largest window)."""
        if self.op == "adaptive_avg":
            pad = (1,) * (3 - len(in_sizes)) + tuple(in_sizes)
            n = 1
            for i, o in zip(pad, self.out):
                n *= -(-i // o) + (1 if i % o else 0)
            return n
        return self.kernel[0] * self.kernel[1] * self.kernel[2]


@dataclass
class PoolMatch:
    """A pooling region: the window, the prologue expression over the pool's input (accesses with
    run-time strides over [N, C, spatial...]), the epilogue outputs over the pooled value."""
    window: Window
    dtype: str                                  # the pool's dtype (input and pooled value)
    inputs: list[tuple[tuple[int, ...], str]]   # (shape, dtype) per region input
    pro_expr: tuple                             # the pool input's value at one tap
    pro_accesses: list[Access]
    size_src: int                               # region input whose sizes are the pool input's
    in_shape: tuple[int, ...]
    outputs: list[tuple[str, tuple | None]]     # per region output: (dtype, expr) or ("int64", None) = indices
    facts: TaskFacts | None = None
    channels_last: bool = False                 # the captured pool input is stored channels-last

    @property
    def rank(self) -> int:
        return self.window.spatial + 2


def _arg(node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _ints(v, n: int, what: str, default: int) -> tuple[int, ...]:
    v = [default] * n if v is None or v == [] else ([v] if isinstance(v, int) else list(v))
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(a, int) for a in v):
        raise Unsupported(f"pooling {what}={v!r} (need {n} ints)")
    return tuple(v)


def _pad3(v: tuple[int, ...], unit: int) -> tuple[int, int, int]:
    return (unit,) * (3 - len(v)) + tuple(v)


def window_of(node) -> Window:
    """The geometry of one pooling node (ops.OpInfo.window says which kind of pool it is)."""
    name = op_name(node)
    kind = ops.info(name).window
    spatial = int(name.split("pool")[1][0])
    if kind == "adaptive_avg":
        out = _ints(node.args[1], spatial, "output_size", 1)
        return Window(kind, spatial, out=_pad3(out, 1))
    k = _ints(node.args[1], spatial, "kernel_size", 1)
    s = _ints(_arg(node, 2, "stride", None) or k, spatial, "stride", 1)
    p = _ints(_arg(node, 3, "padding", 0), spatial, "padding", 0)
    if any(2 * pi > ki for pi, ki in zip(p, k)):
        raise Unsupported(f"{name} padding {p} over half the kernel {k} (torch refuses it too)")
    if kind == "max":
        d = _ints(_arg(node, 4, "dilation", 1), spatial, "dilation", 1)
        return Window(kind, spatial, _pad3(k, 1), _pad3(s, 1), _pad3(p, 0), _pad3(d, 1),
                      bool(_arg(node, 5, "ceil_mode", False)))
    ceil, inc = bool(_arg(node, 4, "ceil_mode", False)), bool(_arg(node, 5, "count_include_pad", True))
    div = _arg(node, 6, "divisor_override", None) if spatial > 1 else None
    if div is not None and (not isinstance(div, int) or div <= 0):
        raise Unsupported(f"{name} divisor_override={div!r}")
    return Window(kind, spatial, _pad3(k, 1), _pad3(s, 1), _pad3(p, 0), (1, 1, 1), ceil, inc, div or 0)


def _pool_nodes(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and (row := ops.info(op_name(n))) is not None and row.window is not None]


def _outputs(gm) -> list:
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def match(gm, policy) -> PoolMatch:
    """Match a region of one pooling op with its elementwise prologue and epilogue."""
    pools = _pool_nodes(gm)
    if len(pools) != 1:
        raise Unsupported("no pooling op" if not pools else f"{len(pools)} pooling ops (need one)")
    pool = pools[0]
    win = window_of(pool)
    src = pool.args[0]
    in_shape, dt = shape_of(src), dtype_of(src)
    if len(in_shape) != win.spatial + 2:
        raise Unsupported(f"{op_name(pool)} on a {len(in_shape)}-D input (need batched [N, C, ...])")
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the pooled value: the pool node, or getitem 0 of max_pool*_with_indices; its indices, getitem 1
    value, index = pool, None
    if isinstance(pool.meta.get("val"), (tuple, list)):
        items = {u.args[1]: u for u in pool.users if u.target.__name__ == "getitem"}
        value, index = items.get(0), items.get(1)
    # prologue: the pool input's value at one input element, from the region's inputs
    bns = {n: _batch_norm_leaf for n in gm.graph.nodes if n.op == "call_function"
           and n.target is aten.batch_norm.default}
    pro = Lowerer(gm, in_shape, "elementwise", leaves=bns)
    pro.input_dtypes = [dtype_of(p) for p in ph]
    pro_expr = pro.val(src, pro.identity())
    ident = tuple(range(len(in_shape)))
    if any(a.mode != "dims" for a in pro.accesses):
        raise Unsupported("pool prologue reads an input through a reshape")
    size_src = next((a.input for a in pro.accesses if a.dims == ident and shape_of(ph[a.input]) == in_shape), None)
    if size_src is None:
        raise Unsupported("no region input has the pool input's shape (sizes can't be read at run time)")
    # epilogue: each output from the pooled value alone
    pool_shape = shape_of(value) if value is not None else None
    g = len(ph)

    def leaf(low, node, amap):
        if amap != low.identity():
            raise Unsupported("pooled value read broadcast/reshaped in the epilogue")
        return low.access(g, "dims", amap[1])

    outs = []
    for o in _outputs(gm):
        if o is index and index is not None:
            outs.append(("int64", None))
            continue
        if value is None or not hasattr(o, "op"):
            raise Unsupported("pool region output that is not the pooled value")
        if shape_of(o) != pool_shape and _numel(shape_of(o)) != _numel(pool_shape):
            raise Unsupported(f"pool region output of shape {shape_of(o)} beside the pooled {pool_shape}")
        low = Lowerer(gm, pool_shape, "elementwise", leaves={value: leaf})
        low.input_dtypes = [dtype_of(p) for p in ph] + [dt]
        e = low.val(o, low.identity() if shape_of(o) == pool_shape else ("flat", shape_of(o)))
        if any(a.input != g for a in low.accesses):
            raise Unsupported("pool epilogue reads another tensor besides the pooled value")
        outs.append((dtype_of(o), stored(e, dtype_of(o))))
    inputs = [(shape_of(p), dtype_of(p)) for p in ph]
    pm = PoolMatch(win, dt, inputs, pro_expr, list(pro.accesses), size_src, in_shape, outs,
                   channels_last=_channels_last(ph[size_src]))
    low_p = dt != "float32" or any(d != "float32" for _, d in inputs)
    trans = any(x[0] in TRANSCENDENTAL for e in [pro_expr] + [e for _, e in outs if e] for x in _walk(e))
    pm.facts = TaskFacts("pool", win.taps(in_shape[2:]), 16 // DT[dt][2], has_transcendental=trans,
                         low_precision=low_p, fp32=not low_p, single_pass=True)
    return pm


def _channels_last(node) -> bool:
    """Whether a captured [N, C, H, W] tensor is stored channels-last (TensorSpec.channels_last)."""
    val = node.meta.get("val")
    return val is not None and TensorSpec.of(val).channels_last


def _batch_norm_leaf(low, node, amap) -> tuple:
    """Eval batch norm in the prologue, in torch's order: (x - mean[c]) * rsqrt(var[c] + eps) *
    gamma[c] + beta[c] (fp32 math, rounded to the dtype by the lowering like any op)."""
    args = list(node.args) + [None] * 8
    if _arg(node, 5, "training", True):
        raise Unsupported("batch_norm in training mode (statistics depend on the batch)")
    x, gamma, beta, mean, var = (args[i] if i < len(node.args) else node.kwargs.get(k) for i, k in
                                 ((0, "input"), (1, "weight"), (2, "bias"), (3, "running_mean"), (4, "running_var")))
    if mean is None or var is None or amap[0] != "dims":
        raise Unsupported("batch_norm without running statistics, or read reshaped")
    eps = float(_arg(node, 7, "eps", 1e-5))
    ch = ("dims", (amap[1][1],))
    e = ("mul", ("sub", low.val(x, amap), low.val(mean, ch)), ("rsqrt", ("add", low.val(var, ch), ("const", eps))))
    if gamma is not None:
        e = ("mul", e, low.val(gamma, ch))
    if beta is not None:
        e = ("add", e, low.val(beta, ch))
    dt = dtype_of(node)      # NOTE: torch rounds the batch norm's result to bf16/fp16 (as conv.py does)
    return ("round", dt, e) if dt != "float32" else e


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _walk(e):
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if x[0] not in ("in", "const", "red", "ncol"):
            stack.extend(a for a in x[1:] if isinstance(a, tuple))


# ---- CUDA text ------------------------------------------------------------------------------------

POOL = cuh("pool.cuh")     # PoolShape, pool_body (the kernel's loop), the host's helpers
_OPS = {"max": "POOL_MAX", "avg": "POOL_AVG", "adaptive_avg": "POOL_ADAPTIVE_AVG"}


def _c3(v) -> str:
    return "{" + ", ".join(str(int(a)) for a in v) + "}"


def _pointers(pm: PoolMatch) -> list[tuple[str, str]]:
    """(C++ type, name) of the kernel's pointers: p<i> per prologue access, then o<k> per output
    (int64 for max pooling's indices)."""
    ptrs = [(f"const {DT[pm.inputs[a.input][1]][0]}::raw*", f"p{i}") for i, a in enumerate(pm.pro_accesses)]
    return ptrs + [("int64_t*" if dt == "int64" else f"{DT[dt][0]}::raw*", f"o{k}")
                   for k, (dt, _) in enumerate(pm.outputs)]


def _region(pm: PoolMatch, params: dict) -> str:
    """PoolRegion<IDX>, pool_body's R: the prologue at one tap, the epilogue and stores."""
    nacc = len(pm.pro_accesses)
    nc = "true" if params.get("nc") else "false"
    taps = [f"const float x{i} = ld1<{DT[pm.inputs[a.input][1]][0]}, {nc}>(p{i} + b[{i}] + "
            f"(IDX)id * (IDX)s.st[{i}][2] + (IDX)ih * (IDX)s.st[{i}][3] + (IDX)iw * (IDX)s.st[{i}][4]);"
            for i, a in enumerate(pm.pro_accesses)]
    pro = Emitter(load=lambda a: f"x{a}", red=None, prefix="u")
    v = pro.emit(pm.pro_expr)
    epi = Emitter(load=lambda a: "pv", red=None, prefix="t")
    stores = [f"o{k}[o] = arg;" if e is None else f"o{k}[o] = {DT[dt][0]}::from_f({epi.emit(e)});"
              for k, (dt, e) in enumerate(pm.outputs)]
    lines = ["template <class IDX>", "struct PoolRegion {"] + [f"  {t} {n};" for t, n in _pointers(pm)]
    lines.append(f"  __device__ __forceinline__ float tap(const PoolShape<{nacc}>& s, const IDX* b, int id, "
                 "int ih, int iw) const {")
    lines += ["    " + ln for ln in taps + pro.lines + [f"return {v};"]] + ["  }"]
    lines.append("  __device__ __forceinline__ void store(IDX o, float pv, int64_t arg) const {")
    lines += ["    " + ln for ln in epi.lines + stores] + ["  }", "};"]
    return "\n".join(lines)


def _kernel(pm: PoolMatch, params: dict) -> str:
    """The region struct and the kernel instantiating pool_body: its pointers as __restrict__
    parameters (where the read-only path and alias analysis see them)."""
    w, nacc = pm.window, len(pm.pro_accesses)
    ptrs = _pointers(pm)
    index = any(e is None for _, e in pm.outputs)
    pad = str(w.count_include_pad).lower()
    if params.get("cl"):
        body = f"pool_body_cl<{DT[pm.dtype][0]}, {_OPS[w.op]}, {pad}, {w.divisor}, {params['cl']}>"
    else:
        body = f"pool_body<{DT[pm.dtype][0]}, {_OPS[w.op]}, {str(index).lower()}, {pad}, {w.divisor}, {params['tpr']}>"
    return f"""
{_region(pm, params)}

// {w.op} pooling, {w.spatial}-D
template <typename IDX>
__global__ void __launch_bounds__({_threads(params)})
pool_kernel(PoolShape<{nacc}> s, IDX total, {", ".join(f"{t} __restrict__ {n}" for t, n in ptrs)}) {{
  {body}(s, total, PoolRegion<IDX>{{{", ".join(n for _, n in ptrs)}}});
}}
"""


def _threads(params: dict) -> int:
    """Threads per block: 32 per warp of the channels-last mapping, else tpr x rows_per_block."""
    return 32 * params["cl"] if params.get("cl") else params["tpr"] * params["rows_per_block"]


def _checks(pm: PoolMatch) -> list[str]:
    """Host lines: the inputs' and outputs' dtypes, the outputs contiguous with `total` elements,
    then every prologue access bound (its strides into s)."""
    out = [f"  if (n_out != {len(pm.outputs)}) return HTAM_ERR_SHAPE;"]
    out += [f"  if (in[{i}].dtype != {DT[dt][1]} || in[{i}].data == nullptr) return HTAM_ERR_SHAPE;"
            for i, (_, dt) in enumerate(pm.inputs)]
    out += [f"  if (out[{k}].dtype != {'HTAM_INT64' if dt == 'int64' else DT[dt][1]} || out[{k}].data == nullptr "
            f"|| !htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != total) return HTAM_ERR_SHAPE;"
            for k, (dt, _) in enumerate(pm.outputs)]
    for i, a in enumerate(pm.pro_accesses):
        out.append(f"  {{ static const int dm[] = {{{', '.join(str(d) for d in a.dims) or '0'}}};\n"
                   f"    if (!pool_bind<{pm.window.spatial}>(s, {i}, in[{a.input}], dm, {len(a.dims)}, it)) "
                   "return HTAM_ERR_SHAPE; }")
    return out


def _host(pm: PoolMatch, params: dict) -> str:
    w, r = pm.window, pm.rank
    threads = _threads(params)
    rpb = 32 if params.get("cl") else params["rows_per_block"]     # windows a block takes a trip
    geom = "kK, kS, kP, kDil"
    osz = (f"  {{ static const int64_t out3[3] = {_c3(w.out)};\n"
           "    for (int q = 0; q < 3; ++q) s.O[q] = (int)out3[q]; }"
           if w.op == "adaptive_avg" else
           f"  if (!pool_out_sizes<{str(w.ceil_mode).lower()}>(s, {geom})) return HTAM_ERR_SHAPE;")
    ptrs = [f"({DT[pm.inputs[a.input][1]][0]}::raw*)in[{a.input}].data" for a in pm.pro_accesses]
    ptrs += [f"(int64_t*)out[{k}].data" if dt == "int64" else f"({DT[dt][0]}::raw*)out[{k}].data"
             for k, (dt, _) in enumerate(pm.outputs)]
    def launch(I: str) -> str:
        return f"pool_kernel<{I}><<<(unsigned)blocks, {threads}, 0, stream>>>(s, ({I})total, {', '.join(ptrs)});"
    head = f"""
// {w.op} pooling geometry, padded to (D, H, W)
static const int64_t kK[3] = {_c3(w.kernel)}, kS[3] = {_c3(w.stride)}, kP[3] = {_c3(w.padding)},
                     kDil[3] = {_c3(w.dilation)};

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {len(pm.inputs)}) return HTAM_ERR_SHAPE;
  const HtamTensor& szt = in[{pm.size_src}];    // the pool input's sizes
  if (szt.ndim != {r}) return HTAM_ERR_SHAPE;
  int64_t it[HTAM_MAX_DIMS];
  for (int d = 0; d < {r}; ++d) it[d] = szt.sizes[d];
  PoolShape<{len(pm.pro_accesses)}> s;
  if (!pool_shape<{w.spatial}>(s, it, {geom})) return HTAM_ERR_SHAPE;
{osz}
  const int64_t total = s.N * s.C * s.O[0] * s.O[1] * s.O[2];"""
    return head + "\n" + "\n".join(_checks(pm)) + f"""
  if (total == 0) return HTAM_OK;
  for (int q = 0; q < 3; ++q) if (s.I[q] == 0) return HTAM_ERR_SHAPE;    // an empty window
  const int64_t blocks = pool_blocks<{rpb}, {params.get("waves", 0)}>(total);
  if (pool_idx32(s, total, (int64_t){max(threads, rpb)} * blocks)) {launch("int32_t")}
  else {launch("int64_t")}
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}}
"""


def render(pm: PoolMatch, params: dict) -> str:
    if not valid(params):
        raise Unsupported(f"pool params {params} (tpr a power of two <= {MAX_TPR}, <= 1024 threads)")
    if params.get("cl") and pm.window.op == "max":
        raise Unsupported("the channels-last mapping (cl) averages only; max pooling keeps a window per lane")
    return "\n".join([f"// torch_htam expert: {pm.window.op} pool params={sorted(params.items())}", PRELUDE,
                      "#include <algorithm>", POOL, _kernel(pm, params), _host(pm, params)])


# ---- the pool target (target.Target) ---------------------------------------------------------------

def defaults(pm: PoolMatch) -> dict:
    # a thread per window for small windows (a 3x3 max pool: 9 taps, neighbours share cache lines);
    # a warp per window for global pooling (7x7 = 49 taps read coalesced, then shuffled); an average
    # over a channels-last input: lanes over the channels (pool_body_cl), 8 warps sharing a large
    # window's taps, one warp walking a small one's
    base = {"tpr": 1, "rows_per_block": 256, "nc": False, "waves": 0, "cl": 0}
    if cl_ok(pm):
        return dict(base, cl=8 if pm.facts.ncol >= WARP_WINDOW else 1)
    if pm.facts.ncol >= WARP_WINDOW:
        return dict(base, tpr=32, rows_per_block=8)
    return base


def cl_ok(pm: PoolMatch) -> bool:
    """Whether the channels-last mapping (params "cl": warps per block) applies: an average pool
    whose captured input is channels-last."""
    return pm.channels_last and pm.window.op != "max"


def valid(params: dict) -> bool:
    tpr, rpb, cl = params.get("tpr", 1), params.get("rows_per_block", 1), params.get("cl", 0)
    if cl:      # 32 * cl threads a block; tpr and rows_per_block do not apply
        return 0 < cl <= 32 and not cl & (cl - 1)
    return 0 < tpr <= MAX_TPR and not tpr & (tpr - 1) and 32 <= tpr * rpb <= 1024


def refit(pm: PoolMatch, p: dict, moved: dict) -> dict:
    """A move of tpr keeps about 256 threads a block (rows_per_block follows unless moved too)."""
    if "tpr" in moved and "rows_per_block" not in moved:
        return dict(p, rows_per_block=max(1, 256 // p["tpr"]))
    return p


def tags(pm: PoolMatch, params: dict) -> list[str]:
    out = ["single_kernel_launch"]
    if any(e is not None and e != ("in", 0) for _, e in pm.outputs) or pm.pro_expr[0] != "in":
        out.append("fuse_row_prologue_epilogue")
    if params.get("tpr", 1) > 1 and not params.get("cl"):
        out.append("warp_shuffle_reduction")
    if params.get("cl"):
        out.append("coalesced_layout_access")
    if params.get("nc"):
        out.append("read_only_cache_loads")
    if params.get("waves"):
        out.append("grid_stride_loop")
    return out


def grid(pm: PoolMatch, base: dict) -> list[dict]:
    plain = dict(base, cl=0)
    out = [dict(plain, tpr=t, rows_per_block=max(1, b // t)) for t in (1, 4, 8, 16, 32) for b in (128, 256, 512)]
    if cl_ok(pm):
        out += [dict(base, cl=w) for w in (1, 2, 4, 8, 16) if w != base.get("cl")]
    return out + [dict(base, nc=True), dict(base, waves=8), dict(base, waves=4)]


TARGET = Target(
    kind="pool", match=match, defaults=defaults, tags=tags,
    retag=lambda pm, params, tags_: [t for t in tags_ if t in tags(pm, params)],
    start_order=("warp_shuffle_reduction", "read_only_cache_loads", "grid_stride_loop", "warp_per_row"),
    grid=grid, render=render, valid=valid, refit=refit, region_kinds=("rowwise",),
    claims=lambda gm: bool(_pool_nodes(gm)))
