"""Fused elementwise/broadcast kernel: one thread computes VEC consecutive outputs, UNROLL times.

Every input access gets run-time strides over the (collapsed) iteration dims, so any broadcast the
graph allows works for any sizes; when all tensors are contiguous and same-shape the space
collapses to one dim and the index math is a multiply. 16-byte vector loads/stores are used only
when the host has checked alignment and divisibility; otherwise the VEC=1 instantiation runs.

A permuted read (x.permute(0, 2, 1) + pos: some input steps by one along another dim than the
output, ir.ExprProgram.tile_dims) takes the tiled kernel (EwParams.tile): a block stages that
input's [tile x tile] patch through shared memory, reading along its contiguous dim and writing
along the output's, so neither side strides across rows. The host picks the two dims from the
run-time strides and runs the flat kernel when they do not call for a tile.

    >>> src = generate(prog, EwParams(block=256, vec=4, unroll=2))
    >>> m = TARGET.match(task.graph, policy); src = TARGET.render(m, TARGET.defaults(m))
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import CTYPE, DT, PRELUDE, Emitter
from torch_htam.proposers.expert.ir import VT, ExprProgram, Unsupported, lower, program_value_type, stored
from torch_htam.proposers.expert.target import (ProgramMatch, Target, access_tags, drop_scalar_tag, pow2_vec,
                                               program_facts)


@dataclass(frozen=True)
class EwParams:
    block: int = 256       # threads per block
    vec: int = 4           # elements per vector access (1 = scalar only)
    unroll: int = 1        # vectors per thread per loop trip (ILP)
    waves: int = 0         # 0: one vector per thread; k > 0: grid capped at k blocks per SM (grid-stride)
    nc: bool = False       # loads through the read-only (non-coherent) cache path
    fast: bool = False     # SFU intrinsics (__expf, __fdividef)
    # > 0: tile edge (elements) of the transposing kernel, run when some input steps by one
    # element along another dim than the first output (ir.ExprProgram.tile_dims); 0: never
    tile: int = 0


def _kernel(prog: ExprProgram, p: EwParams, low_precision: bool, restrict: bool) -> str:
    # Space entries: the accesses, the coordinates (host.bind_accesses), then the outputs stored
    # through strides (an expanded output, ir.Output.broadcast), whose element offsets are kept in
    # so[u][j] for the stores
    nacc, ncoord, nso = len(prog.accesses), len(prog.coords), len(prog.strided_outputs)
    so_base = nacc + ncoord
    rs = "__restrict__ " if restrict else ""
    params = [f"const {DT[prog.inputs[a.input][1]][0]}::raw* {rs}p{i}"
              for i, a in enumerate(prog.accesses)]
    params += [f"{DT[o.dtype][0]}::raw* {rs}o{k}" for k, o in enumerate(prog.outputs)]
    nc = "true" if p.nc else "false"
    # NOTE: Space rows nacc.. are the coordinates (host.bind_accesses): off[nacc + c] is the index
    # along iteration dim prog.coords[c] of the vector's first element, + e * its inner step
    loads = [f"#pragma unroll\n        for (int e = 0; e < VEC; ++e) k{c}[u][e] = (long long)(off[{nacc + c}] + "
             f"(IDX)e * (IDX)sp.st[{nacc + c}][sp.ndim - 1]);" for c in range(ncoord)]
    for i, a in enumerate(prog.accesses):
        dt = prog.inputs[a.input][1]
        t = DT[dt][0]
        if a.window:      # a cat operand: element loads inside its window only (outside it: 0)
            c, lo, hi = prog.coords.index(a.window[0]), a.window[1], a.window[2]
            ld = f"ld1<{t}, {nc}>(p{i} + off[{i}] + (IDX)e * inner)" if VT[dt] == "f" else \
                f"{t}::to_v(p{i}[off[{i}] + (IDX)e * inner])"
            loads.append(
                f"{{ const IDX inner = (IDX)sp.st[{i}][sp.ndim - 1];\n"
                f"#pragma unroll\n          for (int e = 0; e < VEC; ++e) x{i}[u][e] = "
                f"(k{c}[u][e] >= {lo}LL && k{c}[u][e] < {hi}LL) ? {ld} : 0; }}")
            continue
        if VT[dt] != "f":     # integers and bools: element loads in their own type (no float trip)
            loads.append(
                f"{{ const IDX inner = (IDX)sp.st[{i}][sp.ndim - 1];\n"
                f"#pragma unroll\n          for (int e = 0; e < VEC; ++e) x{i}[u][e] = {t}::to_v(p{i}[off[{i}] + e * inner]); }}")
            continue
        loads.append(
            f"if (VEC > 1 && sp.st[{i}][sp.ndim - 1] == 1) ldv<{t}, VEC, {nc}>(p{i} + off[{i}], x{i}[u]);\n"
            f"        else {{ const float v = ld1<{t}, {nc}>(p{i} + off[{i}]);\n"
            f"#pragma unroll\n          for (int e = 0; e < VEC; ++e) x{i}[u][e] = v; }}")
    em = Emitter(load=lambda a: f"x{a}[u][e]", red=None, fast=p.fast, low_precision=low_precision,
                 vt=program_value_type(prog), coord=lambda d: f"k{prog.coords.index(d)}[u][e]")
    outs = [em.emit(stored(o.expr, o.dtype)) for o in prog.outputs]
    body = "\n".join("          " + ln for ln in em.lines)
    sets = "\n".join(f"          y{k}[u][e] = {v};" for k, v in enumerate(outs))
    so = {k: j for j, k in enumerate(prog.strided_outputs)}
    stores = "\n".join(_store(k, o.dtype) if k not in so else _store_strided(k, so[k], so_base + so[k], o.dtype)
                       for k, o in enumerate(prog.outputs))
    keep_so = "".join(f"\n      so[u][{j}] = off[{so_base + j}];" for j in range(nso))
    decl_x = " ".join(f"{CTYPE[VT[prog.inputs[a.input][1]]]} x{i}[UNROLL][VEC];"
                      for i, a in enumerate(prog.accesses))
    decl_y = " ".join(f"{CTYPE[VT[o.dtype]]} y{k}[UNROLL][VEC];" for k, o in enumerate(prog.outputs))
    decl_y += "".join(f" long long k{c}[UNROLL][VEC];" for c in range(ncoord))
    return f"""
#define NACC {so_base + nso}
#define UNROLL {p.unroll}
template <int VEC, typename IDX>
__global__ void __launch_bounds__({p.block}) ew_kernel(Space<NACC> sp, IDX nvec,
    {", ".join(params)}) {{
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX g0 = (IDX)blockIdx.x * blockDim.x + threadIdx.x; g0 < nvec; g0 += step * UNROLL) {{
    {decl_x}
    {decl_y}
    IDX lin[UNROLL];
    bool ok[UNROLL];{f"{chr(10)}    IDX so[UNROLL][{nso}];" if nso else ""}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      const IDX g = g0 + (IDX)u * step;
      ok[u] = g < nvec;
      lin[u] = (ok[u] ? g : (IDX)0) * VEC;   // out-of-range lanes read element 0 and store nothing
      IDX off[NACC];
      if (sp.ndim == 1) {{
#pragma unroll
        for (int a = 0; a < NACC; ++a) off[a] = lin[u] * (IDX)sp.st[a][0];
      }} else {{
        IDX rem = lin[u];
#pragma unroll
        for (int a = 0; a < NACC; ++a) off[a] = 0;
        for (int d = sp.ndim - 1; d > 0; --d) {{
          const IDX sz = (IDX)sp.size[d], i = rem % sz;
          rem /= sz;
#pragma unroll
          for (int a = 0; a < NACC; ++a) off[a] += i * (IDX)sp.st[a][d];
        }}
#pragma unroll
        for (int a = 0; a < NACC; ++a) off[a] += rem * (IDX)sp.st[a][0];
      }}
      {chr(10).join("      " + ln for ln in loads).strip()}{keep_so}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
#pragma unroll
      for (int e = 0; e < VEC; ++e) {{
{body}
{sets}
      }}
    }}
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {{
      if (!ok[u]) continue;
{stores}
    }}
  }}
}}
"""


def epilogue_params(vec: int) -> dict:
    """The default knobs of an elementwise epilogue kernel (gemm.py, conv.py): the flat kernel's,
    without `tile` (an epilogue runs over its anchor's contiguous result)."""
    p = dataclasses.asdict(EwParams(vec=vec))
    del p["tile"]
    return p


def stageable(prog: ExprProgram) -> list[int]:
    """The accesses the tiled kernel may stage through shared memory: float loads, windows aside
    (integer, bool and windowed reads are element loads, read where they are used)."""
    return [i for i, a in enumerate(prog.accesses) if VT[prog.inputs[a.input][1]] == "f" and not a.window]


def _tiled_kernel(prog: ExprProgram, p: EwParams, low_precision: bool, restrict: bool) -> str:
    """The transposing kernel: a block takes a [tile x tile] patch of (r, w), two iteration dims,
    at one index of the others. The accesses in `staged` step by one along r: the block reads their
    patch with lanes walking r (coalesced) into shared memory; then lanes walk w, along which the
    first output steps by one, reading the staged values transposed from shared memory and the
    rest from global memory, and store. Space entries: accesses, coordinates, then every output
    (a contiguous one with its row-major strides over the iteration dims)."""
    nacc, ncoord, nout = len(prog.accesses), len(prog.coords), len(prog.outputs)
    T, rows = p.tile, p.block // p.tile
    rs = "__restrict__ " if restrict else ""
    params = [f"const {DT[prog.inputs[a.input][1]][0]}::raw* {rs}p{i}" for i, a in enumerate(prog.accesses)]
    params += [f"{DT[o.dtype][0]}::raw* {rs}o{k}" for k, o in enumerate(prog.outputs)]
    nc = "true" if p.nc else "false"
    stage, loads = [], []
    for i in stageable(prog):
        t = DT[prog.inputs[prog.accesses[i].input][1]][0]
        stage.append(
            f"if (staged >> {i} & 1u) {{\n"
            f"    float* tl = tile + __popc(staged & ((1u << {i}) - 1u)) * (EW_TILE * (EW_TILE + 1));\n"
            f"#pragma unroll\n"
            f"    for (int q = 0; q < EW_TILE / EW_TROWS; ++q) {{\n"
            f"      const int j = ty + q * EW_TROWS;\n"
            f"      if (rr < nR && w0 + j < nW) tl[j * (EW_TILE + 1) + tx] = "
            f"ld1<{t}, {nc}>(p{i} + base[{i}] + rr * stR[{i}] + (w0 + j) * stW[{i}]);\n"
            f"    }}\n"
            f"  }}")
    for i, a in enumerate(prog.accesses):
        dt = prog.inputs[a.input][1]
        t, ct = DT[dt][0], CTYPE[VT[dt]]
        ld = f"ld1<{t}, {nc}>(p{i} + off[{i}])" if VT[dt] == "f" else f"{t}::to_v(p{i}[off[{i}]])"
        if a.window:      # a cat operand: loads inside its window only (outside it: 0)
            c, lo, hi = prog.coords.index(a.window[0]), a.window[1], a.window[2]
            loads.append(f"const {ct} x{i} = (k{c} >= {lo}LL && k{c} < {hi}LL) ? {ld} : 0;")
        elif i in stageable(prog):
            loads.append(f"const float x{i} = (staged >> {i} & 1u) ? tile[__popc(staged & ((1u << {i}) - 1u)) * "
                         f"(EW_TILE * (EW_TILE + 1)) + tx * (EW_TILE + 1) + j] : {ld};")
        else:
            loads.append(f"const {ct} x{i} = {ld};")
    coords = [f"const long long k{c} = (long long)off[{nacc + c}];" for c in range(ncoord)]
    em = Emitter(load=lambda a: f"x{a}", red=None, fast=p.fast, low_precision=low_precision,
                 vt=program_value_type(prog), coord=lambda d: f"k{prog.coords.index(d)}")
    outs = [em.emit(stored(o.expr, o.dtype)) for o in prog.outputs]
    stores = []
    for k, o in enumerate(prog.outputs):
        t = DT[o.dtype][0]
        conv = f"{t}::from_v" if VT[o.dtype] != "f" else f"{t}::from_f"
        stores.append(f"o{k}[off[{nacc + ncoord + k}]] = {conv}({outs[k]});")
    body = "\n      ".join(coords + loads + em.lines + stores)
    return f"""
#define EW_NT {nacc + ncoord + nout}
#define EW_TILE {T}
#define EW_TROWS {rows}
template <typename IDX>
__global__ void __launch_bounds__({p.block}) ew_tiled(Space<EW_NT> sp, int r_dim, int w_dim, unsigned staged,
    IDX n_wt, IDX n_rt, {", ".join(params)}) {{
  // one [EW_TILE][EW_TILE + 1] float patch per staged access, indexed [w][r]: the +1 keeps the
  // transposed reads (lanes stepping w) on 32 distinct banks
  extern __shared__ float tile[];
  IDX b = (IDX)blockIdx.x;
  const IDX w0 = (b % n_wt) * EW_TILE; b /= n_wt;
  const IDX r0 = (b % n_rt) * EW_TILE; b /= n_rt;
  const IDX nR = (IDX)sp.size[r_dim], nW = (IDX)sp.size[w_dim];
  IDX base[EW_NT], stR[EW_NT], stW[EW_NT];
#pragma unroll
  for (int a = 0; a < EW_NT; ++a) {{ base[a] = 0; stR[a] = (IDX)sp.st[a][r_dim]; stW[a] = (IDX)sp.st[a][w_dim]; }}
  for (int d = sp.ndim - 1; d >= 0; --d) {{     // b: the index over the other dims
    if (d == r_dim || d == w_dim) continue;
    const IDX sz = (IDX)sp.size[d], i = b % sz;
    b /= sz;
#pragma unroll
    for (int a = 0; a < EW_NT; ++a) base[a] += i * (IDX)sp.st[a][d];
  }}
  const int tx = threadIdx.x % EW_TILE, ty = threadIdx.x / EW_TILE;
  {{
    const IDX rr = r0 + tx;
  {chr(10).join("  " + ln for ln in stage).strip()}
  }}
  __syncthreads();
#pragma unroll
  for (int q = 0; q < EW_TILE / EW_TROWS; ++q) {{
    const int j = ty + q * EW_TROWS;
    const IDX r = r0 + j, w = w0 + tx;
    if (r < nR && w < nW) {{
      IDX off[EW_NT];
#pragma unroll
      for (int a = 0; a < EW_NT; ++a) off[a] = base[a] + r * stR[a] + w * stW[a];
      {body}
    }}
  }}
}}
"""


def _tiled_host(prog: ExprProgram, p: EwParams) -> str:
    """Host lines that run the tiled kernel and return when the run-time layouts call for it:
    after collapsing, a dim w where output 0 steps by one and another dim r where a stageable
    access does (htam_tile_dims), both at least 16 long, the staged patches within 48 KB of
    shared memory; otherwise they fall through to the flat kernel."""
    nacc, ncoord = len(prog.accesses), len(prog.coords)
    so = {k: j for j, k in enumerate(prog.strided_outputs)}
    args = ", ".join([host.access_ptr(prog, i) for i in range(nacc)] +
                     [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(prog.outputs)])
    mask = sum(1 << i for i in stageable(prog))
    outs = []
    for k in range(len(prog.outputs)):
        e = nacc + ncoord + k
        if k in so:     # bound already, at its Space entry after the coordinates
            outs.append(f"    for (int d = 0; d < {prog.ndim}; ++d) ts.st[{e}][d] = sp.st[{nacc + ncoord + so[k]}][d];")
        else:           # contiguous in iteration order
            outs.append(f"    {{ int64_t acc = 1; for (int d = {prog.ndim} - 1; d >= 0; --d) "
                        f"{{ ts.st[{e}][d] = acc; acc *= it[d]; }} }}")
    def launch(I: str) -> str:
        return (f"ew_tiled<{I}><<<(unsigned)blocks, {p.block}, smem, stream>>>(ts, r_dim, w_dim, staged, "
                f"({I})n_wt, ({I})n_rt, {args});")
    return f"""  {{   // the transposing kernel (EwParams.tile)
    Space<EW_NT> ts;
    ts.ndim = sp.ndim;
    for (int d = 0; d < sp.ndim; ++d) ts.size[d] = sp.size[d];
    for (int a = 0; a < {nacc + ncoord}; ++a)
      for (int d = 0; d < sp.ndim; ++d) ts.st[a][d] = sp.st[a][d];
{chr(10).join(outs)}
    htam_collapse<EW_NT>(ts, EW_NT, false);
    int r_dim = -1, w_dim = -1;
    unsigned staged = 0;
    if (htam_tile_dims<EW_NT>(ts, {nacc + ncoord}, {mask}u, {nacc}, &r_dim, &w_dim, &staged)) {{
      const int64_t n_wt = (ts.size[w_dim] + EW_TILE - 1) / EW_TILE, n_rt = (ts.size[r_dim] + EW_TILE - 1) / EW_TILE;
      const int64_t blocks = n_wt * n_rt * (n / (ts.size[w_dim] * ts.size[r_dim]));
      const size_t smem = (size_t)__builtin_popcount(staged) * EW_TILE * (EW_TILE + 1) * sizeof(float);
      // NOTE: a dim shorter than 16 leaves most lanes of a tile idle: the flat kernel runs
      if (blocks < ((int64_t)1 << 31) && smem <= 48 * 1024 && ts.size[r_dim] >= 16 && ts.size[w_dim] >= 16) {{
        if (n < ((int64_t)1 << 30) && htam_max_off<EW_NT>(ts, EW_NT) < ((int64_t)1 << 30)) {launch("int32_t")}
        else {launch("int64_t")}
        HTAM_CHECK_LAUNCH();
        return HTAM_OK;
      }}
    }}
  }}"""


# Picks the tiled kernel's dims from a collapsed Space (entries: accesses, coordinates, outputs).
TILE_DIMS = """
// w: the last dim where output 0 (entry out0) steps by one; r: a dim other than w where a
// stageable access (bit a of `stageable`) steps by one and along w neither by one nor by zero (a
// read broadcast along w is one address per warp). staged: those accesses.
// false: no such pair, the flat kernel runs.
template <int N>
static inline bool htam_tile_dims(const Space<N>& s, int out0, unsigned stageable, int nacc, int* r,
                                  int* w, unsigned* staged) {
  *w = -1; *r = -1; *staged = 0;
  for (int d = s.ndim - 1; d >= 0 && *w < 0; --d) if (s.size[d] > 1 && s.st[out0][d] == 1) *w = d;
  if (*w < 0) return false;
  for (int a = 0; a < nacc; ++a) {
    if (!(stageable >> a & 1u) || s.st[a][*w] == 1 || s.st[a][*w] == 0) continue;
    for (int d = s.ndim - 1; d >= 0; --d) {
      if (d == *w || s.size[d] <= 1 || s.st[a][d] != 1) continue;
      if (*r < 0) *r = d;
      if (d == *r) *staged |= 1u << a;
      break;
    }
  }
  return *r >= 0;
}
"""


def _store(k: int, dtype: str) -> str:
    t = DT[dtype][0]
    if VT[dtype] != "f":      # int64 / int32 / bool (one byte) outputs, element by element
        return (f"#pragma unroll\n      for (int e = 0; e < VEC; ++e) o{k}[lin[u] + e] = {t}::from_v(y{k}[u][e]);")
    return (f"      if (VEC > 1) stv<{t}, VEC>(o{k} + lin[u], y{k}[u]);\n"
            f"      else o{k}[lin[u]] = {t}::from_f(y{k}[u][0]);")


def _store_strided(k: int, j: int, entry: int, dtype: str) -> str:
    """Output k stored at its own offsets so[u][j] (Space entry `entry`): vector stores where it
    steps by one along the last dim (the host checked alignment), else element by element (an
    expanded dim steps 0: the values, all equal, land on one element)."""
    t = DT[dtype][0]
    conv = f"{t}::from_v" if VT[dtype] != "f" else f"{t}::from_f"
    vec = f"if (VEC > 1 && inner == 1) stv<{t}, VEC>(o{k} + so[u][{j}], y{k}[u]);\n        else " \
        if VT[dtype] == "f" else ""
    return (f"      {{ const IDX inner = (IDX)sp.st[{entry}][sp.ndim - 1];\n        {vec}"
            f"for (int e = 0; e < VEC; ++e) o{k}[so[u][{j}] + e * inner] = {conv}(y{k}[u][e]); }}")


def _host(prog: ExprProgram, p: EwParams, entry: str) -> str:
    nacc = len(prog.accesses)
    nall = nacc + len(prog.coords) + len(prog.strided_outputs)   # Space entries (_kernel)
    args = ", ".join([host.access_ptr(prog, i) for i in range(nacc)] +
                     [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(prog.outputs)])
    def launch(V: int, I: str) -> str:      # the kernel instantiation for vector width V, index type I
        return f"ew_kernel<{V}, {I}><<<blocks, {p.block}, 0, stream>>>(sp, ({I})(n / {V}), {args});"
    waves = f"if ({p.waves} > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * {p.waves});"
    outputs = """  for (int k = 0; k < n_out; ++k)
    if (!htam_contiguous(out[k]) || htam_numel(&out[k]) != n) return HTAM_ERR_SHAPE;"""
    idx32 = "max_off < (int64_t(1) << 30)"
    if prog.strided_outputs:    # checked per output: the strided ones are bound (their sizes checked) instead
        outputs = host.bind_outputs(prog) + "\n" + "\n".join(
            f"  if (!htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != n) return HTAM_ERR_SHAPE;"
            for k, o in enumerate(prog.outputs) if o.dims is None)
        idx32 = f"std::max<int64_t>(max_off, htam_max_off<NACC>(sp, {nall})) < (int64_t(1) << 30)"
    return f"""
{entry}(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{host.prologue(prog)}
  Space<NACC> sp;
{host.bind_accesses(prog)}
{outputs}
  if (n == 0) return HTAM_OK;
{_tiled_host(prog, p) if p.tile else ""}
  htam_collapse<NACC>(sp, {nall}, false);
  const int V = {p.vec};
  bool vec_ok = V > 1 && sp.size[sp.ndim - 1] % V == 0;
{host.vector_checks(prog, "V")}
  const bool idx32 = n < (int64_t(1) << 29) && {idx32};   // g0 + step * UNROLL stays < 2^31
  const int64_t per_block = (int64_t){p.block} * {p.unroll} * (vec_ok ? V : 1);
  int64_t blocks = (n + per_block - 1) / per_block;
  {waves}
  blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
  if (vec_ok && idx32) {launch(p.vec, "int32_t")}
  else if (vec_ok) {launch(p.vec, "int64_t")}
  else if (idx32) {launch(1, "int32_t")}
  else {launch(1, "int64_t")}
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}}
"""


def generate(prog: ExprProgram, p: EwParams, low_precision: bool = False, entry: str = "HTAM_ENTRY htam_run",
             restrict: bool = True, prelude: bool = True) -> str:
    """CUDA source (kernel ABI) for an elementwise prog. entry/restrict/prelude let gemm.py embed
    it as an in-place epilogue (no __restrict__: the GEMM result is read and overwritten)."""
    assert prog.kind == "elementwise", prog.kind
    head = [f"// torch_htam expert: elementwise {p}", PRELUDE, "#include <algorithm>"] if prelude else []
    tiled = [TILE_DIMS, _tiled_kernel(prog, p, low_precision, restrict)] if p.tile else []
    return "\n".join(head + tiled + [_kernel(prog, p, low_precision, restrict), _host(prog, p, entry)])


# ---- the elementwise target (target.Target) --------------------------------------------------------

def match(gm, policy) -> ProgramMatch:
    """An elementwise region; raises Unsupported for anything else (row reductions included)."""
    prog = lower(gm, strided=True)
    if prog.kind != "elementwise":
        raise Unsupported("row reductions (the rowwise target's)")
    if not prog.accesses:
        raise Unsupported("the region reads no input")
    return ProgramMatch(prog, program_facts(prog, policy))


def default_tile(prog: ExprProgram) -> int:
    """The tiled kernel's edge for a program with a permuted read (ir.ExprProgram.tile_dims), else
    0: 64 when the first output is 2 bytes wide (a warp's 32 lanes then store 64 B of a 128 B row
    and the next warp the rest), 32 otherwise. A staged access's mask bit must fit 32 bits."""
    if prog.tile_dims is None or len(prog.accesses) > 32:
        return 0
    # NOTE: the host runs the flat kernel when the staged patches pass 48 KB of shared memory
    # (a 64-edge float patch is 16.6 KB): more than two stageable reads take 32-edge tiles
    return 64 if DT[prog.outputs[0].dtype][2] == 2 and len(stageable(prog)) <= 2 else 32


def defaults(m: ProgramMatch) -> dict:
    # NOTE: half-precision outputs take SFU math by default (tanh.approx: ~2^-11 relative
    # error under bf16's 2^-8 rounding): bias + GELU bf16 went 25.4 -> 21.9 us (bench/sweep.py,
    # H100, docs/RESULTS_LOG.md); fp32 keeps the exact functions (its 1e-4 tolerance).
    # NOTE: a permuted read (Whisper's conv output.permute(0, 2, 1) + pos) takes the tiled
    # kernel: the flat one walks the output's order and reads the other layout 1500 elements
    # apart per lane (0.38 ms for 2 x 30 MB bf16 on an H100, eager 0.12 ms)
    return dataclasses.asdict(EwParams(vec=m.facts.vec16, fast=m.facts.sfu_math, tile=default_tile(m.program)))


def tags(m: ProgramMatch, params: dict) -> list[str]:
    return ["single_kernel_launch", "fuse_elementwise_chain"] + access_tags(params, m.facts)


def grid(m: ProgramMatch, base: dict) -> list[dict]:
    out = [dict(base, block=block, unroll=unroll, waves=waves)
           for block in (128, 256, 512) for unroll in (1, 2, 4) for waves in (0, 8)]
    if base.get("tile"):    # the other tile edge, and the flat kernel alone
        out += [dict(base, tile=32 if base["tile"] == 64 else 64), dict(base, tile=0)]
    exact = any(VT[o.dtype] != "f" for o in m.program.outputs)   # integer results: no approximations
    if m.facts.has_transcendental and not exact:   # SFU intrinsics (tanh.approx for half outputs) or not
        out += [dict(base, fast=not base["fast"], unroll=unroll) for unroll in (1, 2)]
    return out


def valid(params: dict) -> bool:
    """Power-of-two vectors; a tile edge the block's threads cover in whole rows (block = tile *
    rows, rows dividing the tile)."""
    t, b = params.get("tile", 0), params.get("block", 256)
    return pow2_vec(params) and (not t or (b % t == 0 and t % (b // t) == 0))


TARGET = Target(
    kind="elementwise", valid=valid, match=match, defaults=defaults, tags=tags,
    retag=lambda m, params, tags: drop_scalar_tag(params, tags),
    start_order=("ilp_unroll", "grid_stride_loop", "read_only_cache_loads", "fast_math_intrinsics"),
    grid=grid, render=lambda m, params: generate(m.program, EwParams(**params), m.facts.low_precision))
