"""Pointwise (1x1, stride 1) conv regions as ONE tiled tensor-core kernel with the epilogue fused.

A 1x1 conv over NCHW is a GEMM per image, Y[n] (K x P) = W (K x C) . X[n] (C x P), and in a
ResNet bottleneck's tail (conv 64 -> 256, batch norm, + residual, ReLU) it is memory-bound: 3.3
GFLOP against 231 MB at [32, 64, 56, 56]. The cuDNN path (conv.py) writes the conv result to DRAM
and an epilogue kernel reads it back (437 MB moved); here the conv tile stays in shared memory and
the same epilogue expression (batch norm folded per channel, residual, activation) is applied
before the one store. The main loop is pwconv.cuh (mma.sync: 3xTF32 or TF32 for fp32 under the
tf32 policy, bf16/fp16 tensor cores otherwise), the kernel around it pwconv_kernel.cuh (pw_kernel, a
template over the tile settings and a Region) and its host side pwconv_launch.cuh. This module
emits the Region (the epilogue's inputs, its expression and per-tile hooks, from the op table),
pw_launch (binds the inputs and instantiates pw_kernel for the params) and htam_run.

Each thread block computes BM x BN tiles (output channels x pixels of the flattened batch). By
default it loops over tiles (persist): before one tile's epilogue it issues the next tile's first
X stages and, with pre, its residual tile into shared memory. The epilogue reads the result tile
from shared memory, VEC consecutive pixels of one channel per thread, JU rows at a time with all
their global loads issued before any is used.

Measured on an H100 (docs/RESULTS_LOG.md) for the bottleneck tail:
0.0986 ms fp32 and 0.0545 ms bf16, against 0.164 / 0.094 ms for cuDNN + epilogue: 85% and 84% of
a copy of the same bytes. ncu at b59ed5b had found it issue-bound at 2 blocks of 8 warps per SM
(0.57 instructions issued per scheduler cycle, 43% of cycles with no eligible warp): in fp32 the
3xTF32 operand split's opcodes alone (FSETP, SEL, VIADD, LOP3) were 30% of the instructions
(split_tf32), every tile divided 64-bit pixel and tile indices (pw::Div), and bf16 waited on a
per-row global load of the batch norm's bias (now staged per tile, channel_only). Those three
changes took 0.106 -> 0.099 ms (fp32) and 0.064 -> 0.055 ms (bf16).

The same kernel has an NHWC mode (nhwc_epilogue) for conv.py's cuDNN path: the tile comes from a
conv result cuDNN wrote in NHWC instead of from the main loop, so the epilogue also transposes the
result back to NCHW through shared memory.

    >>> src = render(cp, dict(conv.defaults(cp), tiled=True))      # cp = conv.match(...)
"""
from __future__ import annotations

import math

from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.conv_match import ConvMatch, Fold
from torch_htam.proposers.expert.cuda import DT, PRELUDE, Emitter, c_float, cuh
from torch_htam.proposers.expert.ir import Unsupported, stored

MAIN_LOOP = cuh("pwconv.cuh")
KERNEL = cuh("pwconv_kernel.cuh")        # pw_kernel over a Region the module emits
LAUNCH = cuh("pwconv_launch.cuh")        # its host side: binding, instantiation choice, launch
# tile shapes the main loop supports (2 x 4 warps; BN pixels must leave every thread one X column)
TILES = {(128, 128), (64, 128), (128, 64), (64, 64), (64, 256)}
SMEM_LIMIT = 227 * 1024      # bytes of shared memory one block may have on sm_90
# the batch norm's scale / center inputs of the epilogue prog, bound to the conv output's pointer:
# the kernel folds batch norm from the task's own inputs and never reads them (host.extend_inputs)
UNREAD_BN = ("Y.data", "Y.data")


def unsupported_reason(cp: ConvMatch) -> str | None:
    """Why this conv cannot take the tiled kernel (None: it can, precision permitting)."""
    if not cp.kind.plain2d:
        return f"tiled conv: conv2d only, not {cp.kind.name}"
    if cp.stride != (1, 1) or cp.padding != (0, 0) or cp.dilation != (1, 1) or cp.groups != 1:
        return "tiled conv: only 1x1 convs with stride 1, no padding, no groups"
    if cp.epilogue.ndim != 4:
        return "tiled conv: the epilogue is not over the 4-D conv output"
    return None


def tensor_core_reason(cp: ConvMatch) -> str | None:
    """Why the tiled kernel's tensor-core math is not allowed here (None: it is). fp32 needs the
    tf32 policy. NOTE: 3xTF32 (split=True, the default) is not fp32-exact either: on an H100 its
    rms error was 5x that of cuDNN's fp32 conv (K=64 and 256), which strict fp32 verification
    rejects; plain TF32 (split=False) failed even the tf32 judgement at outlier inputs, where
    cuDNN's engine for the same conv was fp32-accurate (tests/test_pwconv.py, bench/sweep.py)."""
    if cp.dtype == "float32" and not cp.allow_tf32:
        return "tiled conv: fp32 runs on TF32 tensor cores, which the precision policy does not allow"
    return None


def reason(cp: ConvMatch) -> str | None:
    """Why the tiled kernel cannot run this conv under its policy (None: it can)."""
    return unsupported_reason(cp) or tensor_core_reason(cp)


def tiles(cp: ConvMatch, params: dict) -> int:
    """Output tiles of the tiled kernel at the captured shape: ceil(K / bm) x ceil(pixels / bn),
    the output [N, K, H, W] read from the epilogue's iteration space."""
    shape = cp.epilogue.shape
    pixels = math.prod(shape[:1] + shape[2:])
    return -(-shape[1] // params["bm"]) * -(-pixels // params["bn"])


def pixel_varying(prog, i: int) -> bool:
    """Whether access i can differ between pixels (a residual does; a per-channel vector does not)."""
    a = prog.accesses[i]
    return a.mode != "dims" or 2 in a.dims or 3 in a.dims


def channel_only(prog, i: int) -> bool:
    """Whether access i varies with the output channel alone (a bias, a batch-norm weight): the
    block stages its BM values in shared memory once per tile instead of each thread loading them
    per row (a broadcast global load whose latency the epilogue waited on: ncu, docs/RESULTS_LOG.md)."""
    a = prog.accesses[i]
    return a.mode == "dims" and not {0, 2, 3} & set(a.dims)


def smem_bytes(cp: ConvMatch, params: dict) -> int:
    """Shared memory of one block, as the kernel lays it out (pw::smem_bytes, pwconv_kernel.cuh)."""
    e = DT[cp.dtype][2]
    bm, bn = params["bm"], params["bn"]
    up = lambda b: -(-b // 128) * 128      # noqa: E731
    pipe = up(params["stages"] * (bm * (32 + 16 // e) + 32 * (bn + 8)) * e)
    stg = up(bm * (bn + 8) * (e if cp.dtype != "float32" else 4))
    _, ins = epilogue_inputs(cp)
    persist = params.get("persist", True)
    nbuf = 2 if persist else 1        # the next tile's prefetch needs a second buffer
    pre = sum(nbuf * bm * bn * x.size for x in ins if x.prefetched)
    tail = pipe + stg if persist else max(pipe, stg)
    staged = 2 + sum(x.staged for x in ins)     # sS, sT and one row per channel-only input
    return tail + (pre if params.get("pre", True) else 0) + staged * bm * 4


@dataclass(frozen=True)
class EpiInput:
    """An epilogue input the kernel reads from global memory: p{j} / st[j] of the region's Args."""
    j: int
    access: int          # its access id in the epilogue program
    index: int           # the epilogue input it reads (in[index] of pw_launch)
    trait: str           # its dtype trait (F32, BF16, ...)
    size: int            # bytes per element
    staged: bool         # per-channel: staged in shared memory (sC{j}()) once per tile (channel_only)
    prefetched: bool     # pixel-varying: its tile is prefetched into shared memory under PRE


def epilogue_inputs(cp: ConvMatch) -> tuple[dict[int, str], list[EpiInput]]:
    """C++ name per access id (as Region::Epi's code reads it), and the accesses read from global
    memory (the rest are the conv value `cv` and the folded batch norm's scale/center in sS / sT)."""
    prog, g, has_bn = cp.epilogue, cp.g, cp.bn is not None
    names, ins = {}, []
    for i, a in enumerate(prog.accesses):
        if a.input == g:
            names[i] = "cv"
        elif has_bn and a.input == g + 1:
            names[i] = "sS[r]"
        elif has_bn and a.input == g + 2:
            names[i] = "sT[r]"
        else:      # read by the thread per row (x), or staged per tile when per-channel (sC)
            t, _, size = DT[prog.inputs[a.input][1]]
            j = len(ins)
            ins.append(EpiInput(j, i, a.input, t, size, channel_only(prog, i), pixel_varying(prog, i)))
            names[i] = f"sC{j}()[r]" if ins[-1].staged else f"x.x{j}[u][e]"
    return names, ins


def _args(cp: ConvMatch, ins: list[EpiInput]) -> str:
    """Region::Args: the epilogue's global inputs, as pw_launch binds them."""
    ptrs = [f"    const {e.trait}::raw* p{e.j};" for e in ins]
    ptrs += [f"    const {DT[cp.epilogue.inputs[i][1]][0]}::raw* {n};" for n, i in Fold(cp).present.items()]
    return "\n".join(["  // The epilogue's global inputs: pointer and (image, channel, pixel) strides in elements.",
                      "  struct Args {", *ptrs, f"    int64_t st[{max(len(ins), 1)}][3];", "    float eps;", "  };"])


def _state(name: str, fields: list[tuple[str, str, str]]) -> tuple[list[str], str]:
    """A per-tile state type of Epi from (C++ type, field, value) triples: its declaration and
    the value that builds it. One field: the type is that field's own (for a one-member struct
    nvcc allocated the half-type kernels' registers differently than for the scalar)."""
    if len(fields) == 1:
        return [f"    typedef {fields[0][0]} {name};"], fields[0][2]
    return [f"    struct {name} {{ {' '.join(f'{t} {f};' for t, f, _ in fields)} }};"], \
        "{" + ", ".join(v for _, _, v in fields) + "}"


def _field(name: str, field: str, n: int) -> str:
    """How load reads a field of the _state type `name` (n fields) from its argument name.lower()."""
    return name.lower() if n == 1 else f"{name.lower()}.{field}"


def _prefetch(ins: list[EpiInput]) -> list[str]:
    """Epi's PRE buffers: a [BM][BN] tile per pixel-varying input, two (alternate tiles) with
    PERSIST, after the result tile; issue fills buffer buf, select picks tile it's."""
    pre, lines, issue, off = [e for e in ins if e.prefetched], [], [], 0
    for e in pre:
        lines += [f"    static __device__ __forceinline__ {e.trait}::raw* pre{e.j}(unsigned char* tail, int buf) {{",
                  f"      {e.trait}::raw* p = reinterpret_cast<{e.trait}::raw*>(",
                  f"          tail + (size_t)(PERSIST ? 2 : 1) * BM * BN * {off});",
                  "      return buf ? p + (PERSIST ? BM * BN : 0) : p;", "    }"]
        issue.append(f"      pw::prefetch_tile<{e.trait}, BM, BN, IDX>(pre{e.j}(tail, buf), ea.p{e.j}, "
                     f"ea.st[{e.j}][0], ea.st[{e.j}][1], d, m0, q0);")
        off += e.size
    decl, value = _state("Pre", [(f"const {e.trait}::raw*", f"pre{e.j}", f"pre{e.j}(tail, it % 2)") for e in pre]
                         or [("const void*", "none", "nullptr")])
    return [*lines, *decl,
            "    static __device__ __forceinline__ void issue(const Args& ea, const pw::Dims& d, unsigned char* tail,",
            "                                                 int buf, int m0, int64_t q0) {", *issue, "    }",
            "    static __device__ __forceinline__ Pre select(unsigned char* tail, int it) {",
            f"      return {value};", "    }"]


def _stage(cp: ConvMatch, ins: list[EpiInput]) -> list[str]:
    """Epi::stage: channel i's batch norm folded as torch orders it, and its per-channel inputs, each
    into its tile row sC{j}() (pw::channel_row)."""
    fold = Fold(cp)
    lines = [f"    static __device__ __forceinline__ float* sC{e.j}() {{"
             f" return pw::channel_row<Epi, BM, {2 + e.j}>(); }}"
             for e in ins if e.staged]
    lines.append("    static __device__ __forceinline__ void stage(const Args& ea, int64_t i, float* sS, float* sT) {")
    if cp.bn is not None:
        lines += [f"      const auto* {n} = ea.{n};" for n in fold.present]
        lines += ["      const float eps = ea.eps;", f"      sS[threadIdx.x] = {fold.scale('i')};",
                  f"      sT[threadIdx.x] = {fold.center('i')};"]
    lines += [f"      sC{e.j}()[threadIdx.x] = ld1<{e.trait}, false>(ea.p{e.j} + i * ea.st[{e.j}][1]);"
              for e in ins if e.staged]
    return lines + ["    }"]


def _rows(ins: list[EpiInput]) -> list[str]:
    """Epi's per-row inputs: Cols (their offsets at channel 0 of the thread's column), Rows (JJ rows
    of EV pixels each) and load (row u: from the PRE buffer, else from global memory)."""
    rows, npre = [e for e in ins if not e.staged], sum(e.prefetched for e in ins)
    decl, value = _state("Cols", [("IDX", f"b{e.j}", f"n * (IDX)ea.st[{e.j}][0] + p * (IDX)ea.st[{e.j}][2]")
                                  for e in rows] or [("IDX", "none", "0")])
    load = []
    for e in rows:
        direct = (f"pw::load_row<{e.trait}, EV>(ea.p{e.j}, {_field('Cols', f'b{e.j}', len(rows))} + kc * "
                  f"(IDX)ea.st[{e.j}][1], ea.st[{e.j}][2], x.x{e.j}[u]);")
        pre = f"{_field('Pre', f'pre{e.j}', npre)} + r * BN + col"
        load += ([f"      if constexpr (PRE) ldv<{e.trait}, EV, false>({pre}, x.x{e.j}[u]);", f"      else {direct}"]
                 if e.prefetched else [f"      {direct}"])
    return [*decl, "    static __device__ __forceinline__ Cols column(const Args& ea, IDX n, IDX p) {",
            f"      return {value};", "    }",
            "    struct Rows {" + "".join(f" float x{e.j}[JJ][EV];" for e in rows) + (" };" if rows else "};"),
            "    static __device__ __forceinline__ void load(const Args& ea, Rows& x, int u, int r, IDX kc, int col,",
            "                                                Pre pre, Cols cols) {", *load, "    }"]


def _value(cp: ConvMatch, params: dict, names: dict[int, str]) -> list[str]:
    """Epi::value: the epilogue expression at row u, pixel e of the thread's EV."""
    out = cp.epilogue.outputs[0]
    em = Emitter(load=lambda a: names[a], red=None, fast=bool(params.get("fast")),
                 low_precision=cp.dtype != "float32")
    y = em.emit(stored(out.expr, out.dtype))
    # NOTE: the staged conv result is already rounded to the conv's dtype, as torch's is
    return ["    static __device__ __forceinline__ float value(const Rows& x, const float (&cvs)[EV], int u, int e,",
            "                                                  int r, const float* sS, const float* sT) {",
            "      const float cv = cvs[e];", *("      " + ln for ln in em.lines), f"      return {y};", "    }"]


def _region(cp: ConvMatch, params: dict, names: dict[int, str], ins: list[EpiInput], nhwc: bool) -> str:
    """struct Region, pw_kernel's R (pwconv_kernel.cuh says what each member does)."""
    prog, dt = cp.epilogue, DT[cp.dtype][0]
    pre = [e for e in ins if e.prefetched]
    # the result tile's storage type: the conv's dtype (half types: torch rounds the conv result to
    # it) or fp32
    st = dt if cp.dtype != "float32" else "F32"
    tiles = f"pw::load_nhwc_tile<{dt}, ...> reads" if nhwc else f"pw::main_loop<{dt}, ...> computes"
    return "\n".join([
        f"// pw_kernel's R: the epilogue of a conv whose tiles {tiles}", "struct Region {",
        f"  typedef {dt} DT;", f"  typedef {DT[prog.outputs[0].dtype][0]} OT;", f"  typedef {st} STG;",
        _args(cp, ins),
        f"  static constexpr int NPRE = {len(pre)};",
        f"  static constexpr bool STAGED = {_cpp(cp.bn is not None or any(e.staged for e in ins))};",
        f"  static constexpr size_t PRE_BYTES = {sum(e.size for e in pre)};",
        "  template <int BM, int BN, int EV, int JJ, bool PRE, bool PERSIST, typename IDX>", "  struct Epi {",
        *_prefetch(ins), *_stage(cp, ins), *_rows(ins), *_value(cp, params, names), "  };", "};"])


def _cpp(b: bool) -> str:
    return "true" if b else "false"


def _launch(cp: ConvMatch, params: dict, ins: list[EpiInput], nhwc: bool) -> str:
    """pw_launch: binds the epilogue's inputs, then pw_run launches the instantiation that fits them."""
    prog, dt, ot = cp.epilogue, DT[cp.dtype][0], DT[cp.epilogue.outputs[0].dtype]
    bind = [f"  if (!pw_bind<{e.trait}, {_cpp(e.prefetched)}>(in[{e.index}].data, sp.st[{e.access}], it, EV, d, "
            f"&ea.p{e.j}, ea.st[{e.j}], ev_ok)) return HTAM_ERR_SHAPE;" for e in ins]
    bind += [f"  ea.{n} = (const {DT[prog.inputs[i][1]][0]}::raw*)in[{i}].data;" for n, i in Fold(cp).present.items()]
    tile, ju = f"{params['bm']}, {params['bn']}, {params['stages']}", params["ju"]
    persist, pre, split = (_cpp(params.get(k, True)) for k in ("persist", "pre", "split"))
    head = f"Region, {params.get('minb', 2)}, {persist}, {_cpp(nhwc)}, {tile}"
    # the three instantiations: scalar, and 16-byte vectors with 32- or 64-bit epilogue offsets
    fast = [f"pw_kernel<{head}, true, true, {16 // ot[2]}, {ju}, {pre}, {split}, {idx}>"
            for idx in ("int32_t", "int64_t")]
    slow = f"pw_kernel<{head}, false, false, 1, {ju}, false, {split}, int64_t>"
    return "\n".join([
        "// in: the task's inputs, then the conv output Y [, scale, center] as the epilogue program reads them.",
        "// xs, ws: the main loop's X and W, or (NHWC) the conv result in NHWC and nullptr; C, K, N, P:",
        "// channels in and out, images, pixels per image; src_vec: xs and ws take 16-byte vector loads.",
        "static int pw_launch(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream,",
        f"                     const {dt}::raw* xs, const {dt}::raw* ws, int64_t C, int64_t K, int64_t N, int64_t P,",
        "                     bool src_vec) {", host.prologue(prog), "  Space<NACC> sp;", host.bind_accesses(prog),
        "  const HtamTensor& Y = out[0];", f"  const int EV = {16 // ot[2]};",
        "  pw::Dims d;", "  d.C = C; d.K = K; d.P = P; d.NQ = N * P;", "  if (n == 0) return HTAM_OK;",
        "  bool ev_ok = d.P % EV == 0 && htam_aligned(Y.data, 16);", "  Region::Args ea = {};",
        f"  ea.eps = {c_float(cp.bn.eps if cp.bn else 0.0)};", *bind,
        "  // 32-bit epilogue offsets when every one fits (every access's largest, and Y's)",
        "  const bool idx32 = max_off < (int64_t(1) << 31) && htam_numel(&Y) < (int64_t(1) << 31);",
        f"  return pw_run<Region, {persist}, {_cpp(nhwc)}, {tile}, {pre}>(",
        f"      {slow},", f"      {fast[0]},", f"      {fast[1]},",
        f"      ev_ok && src_vec, idx32, xs, ws, ({ot[0]}::raw*)Y.data, d, ea, stream);", "}"])


def _entry(cp: ConvMatch) -> str:
    """htam_run of a 1x1 conv region: checks its tensors, then pw_launch with X and W."""
    prog, (dt, dtc, _) = cp.epilogue, DT[cp.dtype]
    checks = [f"  if (in[{i}].ndim != 1 || in[{i}].sizes[0] != K || !htam_contiguous(in[{i}])) return HTAM_ERR_SHAPE;"
              for i in sorted(Fold(cp).present.values())]
    return "\n".join([
        "HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {",
        f"  if (n_in != {cp.g} || n_out != 1) return HTAM_ERR_SHAPE;",
        f"  const HtamTensor& X = in[{cp.x}];", f"  const HtamTensor& Wt = in[{cp.w}];", "  HtamTensor& Y = out[0];",
        f"  if (!pw_conv_shapes(X, Wt, Y, {dtc})) return HTAM_ERR_SHAPE;", "  const int64_t K = Wt.sizes[0];", *checks,
        host.extend_inputs(len(prog.inputs), UNREAD_BN if cp.bn is not None else None),
        "  const int64_t C = X.sizes[1], P = X.sizes[2] * X.sizes[3];",
        f"  return pw_launch(ext, {len(prog.inputs)}, out, n_out, stream, (const {dt}::raw*)X.data,",
        f"                   (const {dt}::raw*)Wt.data, C, K, X.sizes[0], P, pw_src_vec<{dt}>(X, Wt, C, P));", "}"])


def _source(cp: ConvMatch, params: dict, nhwc: bool) -> list[str]:
    """The kernel, its region and pw_launch (and, for a 1x1 conv region, EPILOGUE_INPUTS and htam_run)."""
    names, ins = epilogue_inputs(cp)
    parts = [MAIN_LOOP, KERNEL, f"#define NACC {len(cp.epilogue.accesses)}", _region(cp, params, names, ins, nhwc),
             LAUNCH]
    if nhwc:
        return parts + [_launch(cp, params, ins, nhwc)]
    return parts + [host.EPILOGUE_INPUTS, _launch(cp, params, ins, nhwc), _entry(cp)]


def nhwc_epilogue(cp: ConvMatch, params: dict) -> str:
    """C++ for conv.py's cuDNN path with an NHWC conv result: pw_kernel in its NHWC mode (one tile
    per block) and pw_launch, which conv.py calls with the NHWC buffer as xs. The epilogue is the
    tiled kernel's (batch norm folded in the block, residual prefetched, NCHW stores), so the
    layout change back to NCHW costs no pass of its own. Tile settings: bm, bn, ju, pre of params.

        >>> src = nhwc_epilogue(cp, conv.defaults(cp))    # after PRELUDE, with host.EPILOGUE_INPUTS before it
    """
    params = dict(params, persist=False, stages=2)
    if (params["bm"], params["bn"]) not in TILES or params["ju"] not in (1, 2, 4, 8):
        raise Unsupported(f"nhwc epilogue: tile {params['bm']}x{params['bn']}, ju {params['ju']} not supported")
    return "\n".join(_source(cp, params, nhwc=True))


def render(cp: ConvMatch, params: dict) -> str:
    """The whole kernel-ABI source; raises Unsupported when the conv or the precision rules it out."""
    why = reason(cp)
    if why:
        raise Unsupported(why)
    if ((params["bm"], params["bn"]) not in TILES or params["stages"] not in (2, 3, 4)
            or params["ju"] not in (1, 2, 4, 8) or params.get("minb", 2) not in (1, 2, 3, 4)):
        raise Unsupported(f"tiled conv: tile {params['bm']}x{params['bn']}, stages {params['stages']}, "
                          f"ju {params['ju']}, minb {params.get('minb')} not supported")
    smem = smem_bytes(cp, params)
    if smem > SMEM_LIMIT:
        raise Unsupported(f"tiled conv: {smem} bytes of shared memory per block "
                          f"(at most {SMEM_LIMIT}); use a smaller tile or pre=False")
    shown = sorted((k, v) for k, v in params.items() if k in ("bm", "bn", "stages", "ju", "fast", "split", "minb", "pre", "persist"))
    return "\n".join([f"// torch_htam expert: tiled pointwise conv + fused epilogue params={shown}",
                      PRELUDE, "#include <algorithm>", *_source(cp, params, nhwc=False)])
