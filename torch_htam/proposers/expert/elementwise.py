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

The kernels are C++ templates over the knobs: ew_flat, the flat kernel's loop (elementwise.cuh),
and ew_tiled (ew_tiled.cuh). Per region this module emits the structs they are instantiated with
(EwFlat: one vector's loads, expression program and stores; EwTiled: one element's), the flat
kernel's __global__ stub (its pointers and arrays) and the host entry.

    >>> src = generate(prog, EwParams(block=256, vec=4, unroll=2))
    >>> m = TARGET.match(task.graph, policy); src = TARGET.render(m, TARGET.defaults(m))
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import CTYPE, DT, PRELUDE, Emitter, cuh
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


FLAT = cuh("elementwise.cuh")         # ew_flat: the flat kernel's loop; ew_blocks: its grid
TILED = cuh("ew_tiled.cuh")           # ew_tiled: the transposing kernel; ew_tile_plan, ew_tiled_launch
TILE_DIMS = cuh("ew_tile_dims.cuh")   # htam_tile_dims: the (r, w) dims of a tiled launch


def _pointers(prog: ExprProgram) -> list[tuple[str, str]]:
    """(C++ type, name) of the kernels' pointers, in the order the host passes them: p<i> per
    access, then o<k> per output."""
    ptrs = [(f"const {DT[prog.inputs[a.input][1]][0]}::raw*", f"p{i}") for i, a in enumerate(prog.accesses)]
    return ptrs + [(f"{DT[o.dtype][0]}::raw*", f"o{k}") for k, o in enumerate(prog.outputs)]


def _region(name: str, template: str, prog: ExprProgram, members: list[str]) -> str:
    """A per-region struct the kernels are instantiated with: the kernel's pointers, then members."""
    fields = [f"  {t} {n};" for t, n in _pointers(prog)]
    return "\n".join([f"template <{template}>", f"struct {name} {{"] + fields + members + ["};"])


def _method(signature: str, lines: list[str]) -> str:
    """A const, inlined member function of a region struct."""
    return "\n".join([f"  __device__ __forceinline__ {signature} const {{"] + ["    " + ln for ln in lines] + ["  }"])


def _flat_load(prog: ExprProgram, i: int, nc: str) -> str:
    """Access i's VEC values of vector u into x<i>[u]."""
    a = prog.accesses[i]
    dt = prog.inputs[a.input][1]
    t = DT[dt][0]
    inner = f"const IDX inner = (IDX)sp.st[{i}][sp.ndim - 1];"
    if a.window:      # a cat operand: element loads inside its window only (outside it: 0)
        c, lo, hi = prog.coords.index(a.window[0]), a.window[1], a.window[2]
        ld = f"ld1<{t}, {nc}>(p{i} + off[{i}] + (IDX)e * inner)" if VT[dt] == "f" else \
            f"{t}::to_v(p{i}[off[{i}] + (IDX)e * inner])"
        return (f"{{ {inner}\n#pragma unroll\n      for (int e = 0; e < VEC; ++e) x{i}[u][e] = "
                f"(k{c}[u][e] >= {lo}LL && k{c}[u][e] < {hi}LL) ? {ld} : 0; }}")
    if VT[dt] != "f":     # integers and bools: element loads in their own type (no float trip)
        return (f"{{ {inner}\n#pragma unroll\n      for (int e = 0; e < VEC; ++e) "
                f"x{i}[u][e] = {t}::to_v(p{i}[off[{i}] + e * inner]); }}")
    return (f"if (VEC > 1 && sp.st[{i}][sp.ndim - 1] == 1) ldv<{t}, VEC, {nc}>(p{i} + off[{i}], x{i}[u]);\n"
            f"    else {{ const float s = ld1<{t}, {nc}>(p{i} + off[{i}]);\n"
            f"#pragma unroll\n      for (int e = 0; e < VEC; ++e) x{i}[u][e] = s; }}")


def _store(k: int, dtype: str) -> str:
    """Contiguous output k's VEC values of vector u at element lin."""
    t = DT[dtype][0]
    if VT[dtype] != "f":      # int64 / int32 / bool (one byte) outputs, element by element
        return f"#pragma unroll\n    for (int e = 0; e < VEC; ++e) o{k}[lin + e] = {t}::from_v(y{k}[u][e]);"
    return f"if (VEC > 1) stv<{t}, VEC>(o{k} + lin, y{k}[u]);\n    else o{k}[lin] = {t}::from_f(y{k}[u][0]);"


def _store_strided(k: int, j: int, entry: int, dtype: str) -> str:
    """Output k stored at its own offsets so[u][j] (Space entry `entry`): vector stores where it
    steps by one along the last dim (the host checked alignment), else element by element (an
    expanded dim steps 0: the values, all equal, land on one element)."""
    t = DT[dtype][0]
    conv = f"{t}::from_v" if VT[dtype] != "f" else f"{t}::from_f"
    vec = f"if (VEC > 1 && inner == 1) stv<{t}, VEC>(o{k} + so[u][{j}], y{k}[u]);\n      else " \
        if VT[dtype] == "f" else ""
    return (f"{{ const IDX inner = (IDX)sp.st[{entry}][sp.ndim - 1];\n      {vec}"
            f"for (int e = 0; e < VEC; ++e) o{k}[so[u][{j}] + e * inner] = {conv}(y{k}[u][e]); }}")


def _flat_regs(prog: ExprProgram) -> list[tuple[str, str, str]]:
    """One loop trip's arrays, (C++ type, name, inner extent) each [UNROLL][extent]: x<i> per
    access, y<k> per output, k<c> per coordinate, so: the strided outputs' element offsets."""
    x = [(CTYPE[VT[prog.inputs[a.input][1]]], f"x{i}", "VEC") for i, a in enumerate(prog.accesses)]
    y = [(CTYPE[VT[o.dtype]], f"y{k}", "VEC") for k, o in enumerate(prog.outputs)]
    k = [("long long", f"k{c}", "VEC") for c in range(len(prog.coords))]
    return x + y + k + ([("IDX", "so", str(len(prog.strided_outputs)))] if prog.strided_outputs else [])


def _flat_kernel(prog: ExprProgram, p: EwParams, restrict: bool) -> str:
    """ew_kernel<VEC, IDX>: its pointers as parameters (__restrict__ there, where the read-only
    path and alias analysis see them), the trip's arrays in the order ew_flat's NOTE asks for, and
    one ew_flat call with EwFlat over them."""
    rs = "__restrict__ " if restrict else ""
    params = [f"{t} {rs}{n}" for t, n in _pointers(prog)]
    regs, U = _flat_regs(prog), p.unroll
    decls = [f"{t} {n}[{U}][{e}];" for t, n, e in regs if n != "so"] + [f"IDX lin[{U}];", f"bool ok[{U}];"]
    decls += [f"{t} {n}[{U}][{e}];" for t, n, e in regs if n == "so"] + ["IDX off[NACC];"]
    names = [n for _, n in _pointers(prog)] + [n for _, n, _ in regs]
    return "\n".join([
        "template <int VEC, typename IDX>",
        f"__global__ void __launch_bounds__({p.block}) ew_kernel(Space<NACC> sp, IDX nvec, {', '.join(params)}) {{",
        "  " + " ".join(decls),
        f"  ew_flat<VEC, {U}>(sp, nvec, lin, ok, off, EwFlat<VEC, {U}, IDX>{{{', '.join(names)}}});",
        "}"])


def _flat_region(prog: ExprProgram, p: EwParams, low_precision: bool) -> str:
    """EwFlat<VEC, UNROLL, IDX>, ew_flat's region (elementwise.cuh). Space entries: the accesses,
    the coordinates (host.bind_accesses), then the outputs stored through strides (an expanded
    output, ir.Output.broadcast)."""
    nacc, ncoord = len(prog.accesses), len(prog.coords)
    so_base, nc = nacc + ncoord, "true" if p.nc else "false"
    # off[nacc + c]: the index along iteration dim prog.coords[c] of the vector's first element
    loads = [f"#pragma unroll\n    for (int e = 0; e < VEC; ++e) k{c}[u][e] = (long long)(off[{nacc + c}] + "
             f"(IDX)e * (IDX)sp.st[{nacc + c}][sp.ndim - 1]);" for c in range(ncoord)]
    loads += [_flat_load(prog, i, nc) for i in range(nacc)]
    loads += [f"so[u][{j}] = off[{so_base + j}];" for j in range(len(prog.strided_outputs))]
    em = Emitter(load=lambda a: f"x{a}[u][e]", red=None, fast=p.fast, low_precision=low_precision,
                 vt=program_value_type(prog), coord=lambda d: f"k{prog.coords.index(d)}[u][e]")
    outs = [em.emit(stored(o.expr, o.dtype)) for o in prog.outputs]
    so = {k: j for j, k in enumerate(prog.strided_outputs)}
    stores = [_store(k, o.dtype) if k not in so else _store_strided(k, so[k], so_base + so[k], o.dtype)
              for k, o in enumerate(prog.outputs)]
    region = _region("EwFlat", "int VEC, int UNROLL, class IDX", prog, [
        *[f"  {t} (&{n})[UNROLL][{e}];" for t, n, e in _flat_regs(prog)],
        _method("void load(const Space<NACC>& sp, int u, const IDX* off)", loads),
        _method("void compute(int u, int e)", em.lines + [f"y{k}[u][e] = {v};" for k, v in enumerate(outs)]),
        _method("void store(const Space<NACC>& sp, int u, IDX lin)", stores)])
    return f"#define NACC {so_base + len(so)}\n{region}\n"


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


def _tiled_stage(prog: ExprProgram, p: EwParams) -> str:
    """EW_TILED_STAGE (ew_tiled.cuh): per stageable access, when staged, the loop reading its
    patch into shared memory."""
    nc = "true" if p.nc else "false"
    lines = ["#define EW_TILED_STAGE"]
    for i in stageable(prog):
        t = DT[prog.inputs[prog.accesses[i].input][1]][0]
        lines += [f"  if (staged >> {i} & 1u) {{",
                  f"    float* tl = tile + __popc(staged & ((1u << {i}) - 1u)) * (TILE * (TILE + 1));",
                  '    _Pragma("unroll")',
                  "    for (int q = 0; q < TILE / ROWS; ++q) {",
                  "      const int j = ty + q * ROWS;",
                  f"      if (rr < nR && w0 + j < nW) tl[j * (TILE + 1) + tx] = ld1<{t}, {nc}>(reg.p{i} + base[{i}] + "
                  f"rr * stR[{i}] + (w0 + j) * stW[{i}]);",
                  "    }",
                  "  }"]
    return " \\\n".join(lines) + "\n"


def _tiled_region(prog: ExprProgram, p: EwParams, low_precision: bool) -> str:
    """EwTiled<TILE, ROWS, IDX>, ew_tiled's region (ew_tiled.cuh). Space entries: accesses,
    coordinates, then every output (a contiguous one with its row-major strides over the
    iteration dims)."""
    nacc, ncoord = len(prog.accesses), len(prog.coords)
    nc = "true" if p.nc else "false"
    loads = [f"const long long k{c} = (long long)off[{nacc + c}];" for c in range(ncoord)]
    for i, a in enumerate(prog.accesses):
        dt = prog.inputs[a.input][1]
        t, ct = DT[dt][0], CTYPE[VT[dt]]
        ld = f"ld1<{t}, {nc}>(p{i} + off[{i}])" if VT[dt] == "f" else f"{t}::to_v(p{i}[off[{i}]])"
        if a.window:      # a cat operand: loads inside its window only (outside it: 0)
            c, lo, hi = prog.coords.index(a.window[0]), a.window[1], a.window[2]
            loads.append(f"const {ct} x{i} = (k{c} >= {lo}LL && k{c} < {hi}LL) ? {ld} : 0;")
        elif i in stageable(prog):
            loads.append(f"const float x{i} = (staged >> {i} & 1u) ? ew_staged<TILE, {i}>(tile, staged, tx, j) : {ld};")
        else:
            loads.append(f"const {ct} x{i} = {ld};")
    em = Emitter(load=lambda a: f"x{a}", red=None, fast=p.fast, low_precision=low_precision,
                 vt=program_value_type(prog), coord=lambda d: f"k{prog.coords.index(d)}")
    outs = [em.emit(stored(o.expr, o.dtype)) for o in prog.outputs]
    stores = [f"o{k}[off[{nacc + ncoord + k}]] = {DT[o.dtype][0]}::{'from_v' if VT[o.dtype] != 'f' else 'from_f'}"
              f"({outs[k]});" for k, o in enumerate(prog.outputs)]
    return _region("EwTiled", "int TILE, int ROWS, class IDX", prog, [
        _method("void element(const float* tile, unsigned staged, const IDX* off, int tx, int j)",
                loads + em.lines + stores)]) + "\n"


def _args(prog: ExprProgram) -> str:
    """The kernels' pointer arguments from the host's in[] / out[], typed as the region's."""
    return ", ".join([host.access_ptr(prog, i, const=True) for i in range(len(prog.accesses))] +
                     [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(prog.outputs)])


def _tiled_host(prog: ExprProgram, p: EwParams, restrict: bool) -> str:
    """Host lines that run the tiled kernel and return where the run-time layouts call for it
    (ew_tile_plan); otherwise they fall through to the flat kernel."""
    nacc, ncoord = len(prog.accesses), len(prog.coords)
    nt = nacc + ncoord + len(prog.outputs)
    so = {k: j for j, k in enumerate(prog.strided_outputs)}
    outs = []
    for k in range(len(prog.outputs)):
        e = nacc + ncoord + k
        if k in so:     # bound already, at its Space entry after the coordinates
            outs.append(f"    for (int d = 0; d < {prog.ndim}; ++d) ts.st[{e}][d] = sp.st[{nacc + ncoord + so[k]}][d];")
        else:           # contiguous in iteration order
            outs.append(f"    {{ int64_t acc = 1; for (int d = {prog.ndim} - 1; d >= 0; --d) "
                        f"{{ ts.st[{e}][d] = acc; acc *= it[d]; }} }}")
    def launch(I: str) -> str:
        return (f"ew_tiled_launch<{p.tile}, {p.block // p.tile}, {I}, EwTiled, {str(restrict).lower()}>"
                f"(pl, stream, ts, {_args(prog)});")
    return f"""  {{   // the transposing kernel (EwParams.tile)
    Space<{nt}> ts;
    ew_tile_space(sp, {nacc + ncoord}, ts);
{chr(10).join(outs)}
    htam_collapse<{nt}>(ts, {nt}, false);
    EwTilePlan pl;
    if (ew_tile_plan<{p.tile}>(ts, n, {sum(1 << i for i in stageable(prog))}u, {nacc}, {nacc + ncoord}, &pl)) {{
      if (pl.idx32) {launch("int32_t")}
      else {launch("int64_t")}
      HTAM_CHECK_LAUNCH();
      return HTAM_OK;
    }}
  }}"""


def _memory_order(prog: ExprProgram) -> str:
    """The host line that walks the flat kernel in the first output's memory order
    (htam_order_by), where every output is stored through its strides (Output.dims) and none
    repeats elements (broadcast); "" where some output is stored at its index in iteration order,
    which fixes the order."""
    if not prog.outputs or len(prog.strided_outputs) != len(prog.outputs) or any(o.broadcast for o in prog.outputs):
        return ""
    first = len(prog.accesses) + len(prog.coords)    # Space entries: accesses, coordinates, outputs
    return f"\n  htam_order_by<NACC>(sp, {first});   // the first output's memory order"


def _host(prog: ExprProgram, p: EwParams, entry: str, restrict: bool) -> str:
    nacc = len(prog.accesses)
    nall = nacc + len(prog.coords) + len(prog.strided_outputs)   # Space entries (_flat_region)
    outputs = """  for (int k = 0; k < n_out; ++k)
    if (!htam_contiguous(out[k]) || htam_numel(&out[k]) != n) return HTAM_ERR_SHAPE;"""
    idx32 = "max_off < (int64_t(1) << 30)"
    if prog.strided_outputs:    # checked per output: the strided ones are bound (their sizes checked) instead
        outputs = host.bind_outputs(prog) + "\n" + "\n".join(
            f"  if (!htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != n) return HTAM_ERR_SHAPE;"
            for k, o in enumerate(prog.outputs) if o.dims is None)
        idx32 = f"std::max<int64_t>(max_off, htam_max_off<NACC>(sp, {nall})) < (int64_t(1) << 30)"
    def launch(V: int, I: str) -> str:      # the kernel instantiation for vector width V, index type I
        return f"ew_kernel<{V}, {I}><<<blocks, {p.block}, 0, stream>>>(sp, ({I})(n / {V}), {_args(prog)});"
    head = f"""
{entry}(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{host.prologue(prog)}
  Space<NACC> sp;
{host.bind_accesses(prog)}
{outputs}
  if (n == 0) return HTAM_OK;
{_tiled_host(prog, p, restrict) if p.tile else ""}{_memory_order(prog)}
  htam_collapse<NACC>(sp, {nall}, false);
  const int V = {p.vec};
  bool vec_ok = V > 1 && sp.size[sp.ndim - 1] % V == 0;
{host.vector_checks(prog, "V")}"""
    return head + f"""
  const bool idx32 = n < (int64_t(1) << 29) && {idx32};   // g0 + step * UNROLL stays < 2^31
  const int64_t blocks = ew_blocks<{p.block}, {p.unroll}, {p.waves}>(n, vec_ok ? V : 1);
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
    """CUDA source (kernel ABI) for an elementwise prog: the kernels (elementwise.cuh, and
    ew_tiled.cuh with EwParams.tile), the region structs they are instantiated with, and the host
    entry. entry/restrict/prelude let gemm.py and conv.py embed it as an in-place epilogue (no
    __restrict__: the result is read and overwritten)."""
    assert prog.kind == "elementwise", prog.kind
    head = [f"// torch_htam expert: elementwise {p}", PRELUDE, "#include <algorithm>"] if prelude else []
    tiled = [TILE_DIMS, _tiled_stage(prog, p), TILED, _tiled_region(prog, p, low_precision)] if p.tile else []
    flat = [_flat_region(prog, p, low_precision), _flat_kernel(prog, p, restrict)]
    return "\n".join(head + [FLAT] + tiled + flat + [_host(prog, p, entry, restrict)])


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
