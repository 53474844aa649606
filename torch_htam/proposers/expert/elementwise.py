"""Fused elementwise/broadcast kernel: one thread computes VEC consecutive outputs, UNROLL times.

Every input access gets run-time strides over the (collapsed) iteration dims, so any broadcast the
graph allows works for any sizes; when all tensors are contiguous and same-shape the space
collapses to one dim and the index math is a multiply. 16-byte vector loads/stores are used only
when the host has checked alignment and divisibility; otherwise the VEC=1 instantiation runs.

    >>> src = generate(prog, EwParams(block=256, vec=4, unroll=2))
    >>> m = TARGET.match(task.graph, policy); src = TARGET.render(m, TARGET.defaults(m))
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import CTYPE, DT, PRELUDE, Emitter
from torch_htam.proposers.expert.ir import VT, ExprProgram, Unsupported, lower, program_value_type, stored
from torch_htam.proposers.expert.target import ProgramMatch, Target, access_tags, drop_scalar_tag, program_facts


@dataclass(frozen=True)
class EwParams:
    block: int = 256       # threads per block
    vec: int = 4           # elements per vector access (1 = scalar only)
    unroll: int = 1        # vectors per thread per loop trip (ILP)
    waves: int = 0         # 0: one vector per thread; k > 0: grid capped at k blocks per SM (grid-stride)
    nc: bool = False       # loads through the read-only (non-coherent) cache path
    fast: bool = False     # SFU intrinsics (__expf, __fdividef)


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
    return "\n".join(head + [_kernel(prog, p, low_precision, restrict), _host(prog, p, entry)])


# ---- the elementwise target (target.Target) --------------------------------------------------------

def match(gm, policy) -> ProgramMatch:
    """An elementwise region; raises Unsupported for anything else (row reductions included)."""
    prog = lower(gm, strided=True)
    if prog.kind != "elementwise":
        raise Unsupported("row reductions (the rowwise target's)")
    if not prog.accesses:
        raise Unsupported("the region reads no input")
    return ProgramMatch(prog, program_facts(prog, policy))


def defaults(m: ProgramMatch) -> dict:
    # NOTE: half-precision outputs take SFU math by default (tanh.approx: ~2^-11 relative
    # error under bf16's 2^-8 rounding): bias + GELU bf16 went 25.4 -> 21.9 us (bench/sweep.py,
    # H100, docs/RESULTS_LOG.md); fp32 keeps the exact functions (its 1e-4 tolerance).
    return dataclasses.asdict(EwParams(vec=m.facts.vec16, fast=m.facts.sfu_math))


def tags(m: ProgramMatch, params: dict) -> list[str]:
    return ["single_kernel_launch", "fuse_elementwise_chain"] + access_tags(params, m.facts)


def grid(m: ProgramMatch, base: dict) -> list[dict]:
    out = [dict(base, block=block, unroll=unroll, waves=waves)
           for block in (128, 256, 512) for unroll in (1, 2, 4) for waves in (0, 8)]
    exact = any(VT[o.dtype] != "f" for o in m.program.outputs)   # integer results: no approximations
    if m.facts.has_transcendental and not exact:   # SFU intrinsics (tanh.approx for half outputs) or not
        out += [dict(base, fast=not base["fast"], unroll=unroll) for unroll in (1, 2)]
    return out


TARGET = Target(
    kind="elementwise", match=match, defaults=defaults, tags=tags,
    retag=lambda m, params, tags: drop_scalar_tag(params, tags),
    start_order=("ilp_unroll", "grid_stride_loop", "read_only_cache_loads", "fast_math_intrinsics"),
    grid=grid, render=lambda m, params: generate(m.program, EwParams(**params), m.facts.low_precision))
