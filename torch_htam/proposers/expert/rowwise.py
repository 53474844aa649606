"""Fused row kernel: reductions over the last dim with their elementwise prologue/epilogue.

A group of TPR threads owns one row (TPR <= 32: a warp or sub-warp per row, several rows per block;
TPR >= 64: the block is the row). Each reduction of the plan is one pass over the row; the row's
inputs are either kept in registers (loaded once, NV chunks of VEC per thread) or re-read per pass
(streaming, for rows longer than the register capacity; L1/L2 serve the re-reads). Online softmax
and Welford merge a pair of passes into one. The host picks register vs streaming and vector vs
scalar at run time from the real row length and alignment, so every instantiation is always valid.

Register budget (what decides bandwidth here): an SM has 64K registers, so 2048 resident threads
get 32 each. A row held as fp32 costs one register per value; `packed` keeps 2-byte inputs as raw
bits (two values per register, converted at use) and `lazy` loads inputs that no reduction reads
(a norm's weight and bias) in the final pass instead of holding them across the reductions. Both
free registers for more resident threads, hence more bytes in flight per SM; neither wins on every
row (bench/sweep.py), so the search tries both ways.

    >>> src = generate(plan, RowParams(tpr=32, rows_per_block=4, vec=4, nv=8))
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import DT, PRELUDE, Emitter
from torch_htam.proposers.expert.ir import TRANSCENDENTAL, Plan, stored, walk

INIT = {"sum": "0.f", "max": "(-INFINITY)", "min": "INFINITY"}
COMBINE = {"sum": "acc + {v}", "max": "htam_max(acc, {v})", "min": "htam_min(acc, {v})"}
OPS = {"sum": "SumOp", "max": "MaxOp", "min": "MinOp"}


@dataclass(frozen=True)
class RowParams:
    tpr: int = 32              # threads per row (power of two, <= 1024)
    rows_per_block: int = 4    # rows per block when tpr <= 32
    vec: int = 4               # elements per vector access along the row
    nv: int = 4                # register chunks per thread (row in registers up to tpr*vec*nv); 0 = stream
    online: bool = False       # online softmax: max and sum in one pass
    welford: bool = False      # Welford mean/var: one pass instead of two
    nc: bool = False           # read-only cache loads
    fast: bool = False         # SFU intrinsics
    waves: int = 0             # 0: one row group per row; k: grid capped at k blocks per SM
    lazy: bool = True          # inputs only the final pass reads are loaded there, not held in registers
    packed: bool = False       # register-held 2-byte inputs stay raw bf16/fp16 bits until used
    rpg: int = 1               # rows per thread group in flight: their loads all issue before any
                               # row is reduced (latency hiding for short rows)
    occ: int = 0               # resident threads per SM to ask of the compiler (__launch_bounds__
                               # min blocks = occ / block; 0: let it choose). 2048 caps 32 registers.
    memo: bool = True          # keep a transcendental value a later pass reads again (softmax's
                               # exp(x - max)) in registers instead of computing it twice

    @property
    def block(self) -> int:
        return self.tpr * self.rows_per_block if self.tpr <= 32 else self.tpr


class _Gen:
    def __init__(self, plan: Plan, p: RowParams, low_precision: bool):
        self.plan, self.p, self.lowp = plan, p, low_precision
        D = plan.ndim
        self.varying = [i for i, a in enumerate(plan.accesses) if a.column_varying(D)]
        self.fixed = [i for i, a in enumerate(plan.accesses) if not a.column_varying(D)]
        reduced = {x[1] for r in plan.reductions for x in walk(r.expr) if x[0] == "in"}
        # held: loaded once into registers (register path); late: loaded per chunk in the final pass
        self.held = [i for i in self.varying if i in reduced or not p.lazy]
        self.late = [i for i in self.varying if i not in self.held]
        # memo[k]: (expression, first pass) kept in m{k}[q][e] on the register path
        self.memo = memo_values(self.passes()) if p.memo else []

    def dt(self, i: int) -> str:
        return DT[self.plan.inputs[self.plan.accesses[i].input][1]][0]

    def words(self, i: int) -> str:
        """C size of input i's packed chunk: VEC values in 32-bit words."""
        return f"(VEC + {self.dt(i)}::PER_WORD - 1) / {self.dt(i)}::PER_WORD"

    def packed_late(self, i: int) -> bool:
        """Late (final-pass) loads of 2-byte inputs stay raw words too when packed."""
        return self.p.packed and self.dt(i) != "F32"

    def passes(self) -> list[list[tuple]]:
        """The expressions each pass over the row evaluates per column, in order (a merged
        online-softmax / Welford pair is one pass; the final pass computes the full-row outputs)."""
        out, k, reds, p = [], 0, self.plan.reductions, self.p
        while k < len(reds):
            nxt = reds[k + 1] if k + 1 < len(reds) else None
            merged = (reds[k].pair and nxt is not None and nxt.pair == (reds[k].pair[0], 1)
                      and reds[k].pair[1] == 0 and (p.online if reds[k].pair[0] == "softmax" else p.welford))
            out.append([reds[k].expr])    # a merged pair's second value needs the first's result
            k += 2 if merged else 1
        return out + [[stored(o.expr, o.dtype) for o in self.plan.outputs if not o.row]]

    def emitter(self, regs: bool, at: int | None = None) -> Emitter:
        """at: the pass being emitted; memoized values computed in an earlier pass are read back."""
        em = self._emitter(regs)
        if regs and at is not None:
            for k, (e, first) in enumerate(self.memo):
                if first < at:
                    em.names[e] = f"m{k}[q][e]"
        return em

    def memo_stores(self, em: Emitter, at: int) -> str:
        return "".join(f"\n          m{k}[q][e] = {em.emit(e)};" for k, (e, first) in enumerate(self.memo)
                       if first == at)

    def _emitter(self, regs: bool) -> Emitter:
        def load(a):
            if a in self.fixed:
                return f"s{a}"
            if regs and a in self.late and self.packed_late(a):
                t = self.dt(a)
                return f"{t}::from_word(x{a}[e / {t}::PER_WORD], e % {t}::PER_WORD)"
            if not regs or a in self.late:
                return f"x{a}[e]"
            t = self.dt(a)
            return (f"{t}::from_word(x{a}[g][q][e / {t}::PER_WORD], e % {t}::PER_WORD)" if self.p.packed
                    else f"x{a}[g][q][e]")
        return Emitter(load, red=lambda k: f"R{k}", fast=self.p.fast, low_precision=self.lowp)

    def loop(self, regs: bool, body: str, after: str = "", late: bool = False) -> str:
        """Runs body for every column c owned by this thread (x*[..][e] hold the inputs at c), then
        `after` once per chunk of VEC columns starting at c0. late: load the late inputs per chunk."""
        nc = "true" if self.p.nc else "false"
        if regs:
            late_loads = ""
            if late and self.late:
                late_loads = " ".join((f"unsigned x{i}[{self.words(i)}];" if self.packed_late(i) else f"float x{i}[VEC];")
                                      for i in self.late) + "\n" + "\n".join(
                    self.load_chunk(i, f"x{i}", "c0", nc, self.packed_late(i)) for i in self.late)
            return f"""
#pragma unroll
    for (int q = 0; q < NV; ++q) {{
      const int c0 = (q * TPR + lane) * VEC;
      if (c0 < ncol) {{
{late_loads}
#pragma unroll
        for (int e = 0; e < VEC; ++e) {{
          // NOTE: no bounds test per element: VEC > 1 only where the host saw ncol % VEC == 0
          const int c = c0 + e;
          (void)c;
{body}
        }}
{after}
      }}
    }}"""
        loads = "\n".join(self.load_chunk(i, f"x{i}", "c0", nc) for i in self.varying)
        decl = " ".join(f"float x{i}[VEC];" for i in self.varying)
        return f"""
    for (int c0 = lane * VEC; c0 < ncol; c0 += TPR * VEC) {{
      {decl}
{loads}
#pragma unroll
      for (int e = 0; e < VEC; ++e) {{
        // (VEC > 1 only where ncol % VEC == 0: a chunk is all in or all out)
        const int c = c0 + e;
        (void)c;
{body}
      }}
{after}
    }}"""

    def load_chunk(self, i: int, dst: str, c0: str, nc: str, packed: bool = False, ro: str = "ro") -> str:
        """VEC values of access i at columns c0.. into dst: floats, or 32-bit words of raw bits
        (PER_WORD values each) when packed. ro: the row's element offsets (one per access)."""
        t = self.dt(i)
        if packed:
            return (f"      if (VEC > 1 && cs[{i}] == 1) ldw<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                    f"      else for (int e = 0; e < VEC; ++e) {{\n"
                    f"        const unsigned b = (VEC == 1 || {c0} + e < ncol) ? "
                    f"{t}::bits(p{i}[{ro}[{i}] + (int64_t)({c0} + e) * cs[{i}]]) : 0u;\n"
                    f"        if (e % {t}::PER_WORD == 0) {dst}[e / {t}::PER_WORD] = b;\n"
                    f"        else {dst}[e / {t}::PER_WORD] |= b << 16; }}")
        return (f"      if (VEC > 1 && cs[{i}] == 1) ldv<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                f"      else for (int e = 0; e < VEC; ++e) {dst}[e] = (VEC == 1 || {c0} + e < ncol) ? "
                f"ld1<{t}, {nc}>(p{i} + {ro}[{i}] + (int64_t)({c0} + e) * cs[{i}]) : 0.f;")

    def reduction_pass(self, k: int, regs: bool, at: int) -> tuple[str, int]:
        """Code computing R{k} (and R{k+1} for merged pairs) as pass `at`; returns (code,
        reductions consumed)."""
        plan, p = self.plan, self.p
        red = plan.reductions[k]
        nxt = plan.reductions[k + 1] if k + 1 < len(plan.reductions) else None
        em = self.emitter(regs, at)
        v = em.emit(red.expr)
        lines = "\n".join("          " + ln for ln in em.lines) + (self.memo_stores(em, at) if regs else "")
        pair = red.pair and nxt is not None and nxt.pair == (red.pair[0], 1) and red.pair[1] == 0
        if pair and red.pair[0] == "softmax" and p.online:
            exp = "__expf" if p.fast else "expf"
            body = f"""{lines}
          if ({v} > st.m) {{ st.s = st.s * {exp}(st.m - {v}) + 1.f; st.m = {v}; }}
          else if ({v} > -INFINITY) st.s += {exp}({v} - st.m);"""
            code = f"""
    float R{k}, R{k + 1};
    {{
      SoftmaxState st; st.m = -INFINITY; st.s = 0.f;
{self.loop(regs, body)}
      SoftmaxState id; id.m = -INFINITY; id.s = 0.f;
      st = group_reduce<TPR>(st, SmOp(), id);
      R{k} = st.m; R{k + 1} = st.s;
    }}"""
            return code, 2
        if pair and red.pair[0] == "welford" and p.welford:
            body = f"""{lines}
          w.n += 1.f;
          const float d_ = {v} - w.mean;
          w.mean += d_ / w.n;
          w.m2 += d_ * ({v} - w.mean);"""
            code = f"""
    float R{k}, R{k + 1};
    {{
      WelfordState w; w.n = 0.f; w.mean = 0.f; w.m2 = 0.f;
{self.loop(regs, body)}
      WelfordState id; id.n = 0.f; id.mean = 0.f; id.m2 = 0.f;
      w = group_reduce<TPR>(w, WfOp(), id);
      R{k} = w.mean * w.n; R{k + 1} = w.m2;   // sum and sum of squared deviations
    }}"""
            return code, 2
        body = f"{lines}\n          acc = {COMBINE[red.kind].format(v=v)};"
        code = f"""
    float R{k};
    {{
      float acc = {INIT[red.kind]};
{self.loop(regs, body)}
      R{k} = group_reduce<TPR>(acc, {OPS[red.kind]}(), {INIT[red.kind]});
    }}"""
        return code, 1

    def final_pass(self, regs: bool, at: int) -> str:
        em = self.emitter(regs, at)
        full = [(k, o) for k, o in enumerate(self.plan.outputs) if not o.row]
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in full]
        lines = "\n".join("          " + ln for ln in em.lines)
        sets = "\n".join(f"          y{k}[e] = {n};" for (k, _), n in zip(full, names))
        # outputs are contiguous: row r starts at r * ncol; VEC > 1 only when the host checked
        # ncol % VEC == 0 and 16-byte alignment of every output.
        stores = "\n".join(
            f"        if (valid) {{ if (VEC > 1) stv<{DT[o.dtype][0]}, VEC>(o{k} + r * ncol + c0, y{k});\n"
            f"          else o{k}[r * ncol + c0] = {DT[o.dtype][0]}::from_f(y{k}[0]); }}"
            for k, o in full)
        decl = " ".join(f"float y{k}[VEC];" for k, _ in full)
        if not full:
            return ""
        return f"    {{\n    {decl}\n{self.loop(regs, lines + chr(10) + sets, stores, late=True)}\n    }}"

    def row_outputs(self) -> str:
        em = Emitter(lambda a: f"s{a}", red=lambda k: f"R{k}", fast=self.p.fast,
                     low_precision=self.lowp, prefix="u")
        rows = [(k, o) for k, o in enumerate(self.plan.outputs) if o.row]
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in rows]
        if not rows:
            return ""
        lines = "\n".join("      " + ln for ln in em.lines)
        stores = "\n".join(f"      o{k}[r] = {DT[o.dtype][0]}::from_f({n});" for (k, o), n in zip(rows, names))
        return f"""
    if (valid && lane == 0) {{
{lines}
{stores}
    }}"""

    def body(self, regs: bool) -> str:
        out, k, at = [], 0, 0
        if regs:
            out += [f"    float m{j}[NV > 0 ? NV : 1][VEC];" for j in range(len(self.memo))]
        while k < len(self.plan.reductions):
            code, used = self.reduction_pass(k, regs, at)
            out.append(code)
            k, at = k + used, at + 1
        out.append(self.final_pass(regs, at))
        out.append(self.row_outputs())
        return "\n".join(out)

    def kernel(self) -> str:
        plan, p = self.plan, self.p
        nc = "true" if p.nc else "false"
        params = [f"const {self.dt(i)}::raw* __restrict__ p{i}" for i in range(len(plan.accesses))]
        params += [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(plan.outputs)]
        fixed = "\n".join(f"      s{i}_[g] = ld1<{self.dt(i)}, {nc}>(p{i} + ro_[g][{i}]);" for i in self.fixed)
        fixed_decl = " ".join(f"float s{i}_[RPG];" for i in self.fixed)
        fixed_alias = " ".join(f"const float s{i} = s{i}_[g];" for i in self.fixed)
        reg_loads = "\n".join(self.load_chunk(i, f"x{i}[g][q]", "c0", nc, p.packed, ro="ro_[g]")
                              .replace("\n", "\n    ") for i in self.held)
        reg_decl = " ".join((f"unsigned x{i}[RPG][NV > 0 ? NV : 1][{self.words(i)}];" if p.packed
                             else f"float x{i}[RPG][NV > 0 ? NV : 1][VEC];") for i in self.held)
        bounds = f"BLOCK, {max(1, p.occ // p.block)}" if p.occ > 0 else "BLOCK"
        # NOTE: each row of the group runs the single-row body under the names it was written with
        # (r, valid, ro, s*); g is a compile-time index after unrolling, so nothing leaves registers.
        alias = ("const int64_t r = r_[g]; const bool valid = valid_[g]; int64_t ro[NACC];\n"
                 "#pragma unroll\n      for (int a = 0; a < NACC; ++a) ro[a] = ro_[g][a];\n      " + fixed_alias)
        return f"""
#define NACC {len(plan.accesses)}
#define TPR {p.tpr}
#define BLOCK {p.block}
#define RPG {p.rpg}
template <int VEC, int NV>
__global__ void __launch_bounds__({bounds}) row_kernel(Space<NACC> sp, int64_t rows, int ncol,
    {", ".join(params)}) {{
  const int lane = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int64_t rpb = BLOCK / TPR * RPG;     // rows per block and trip
  int64_t cs[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a) cs[a] = sp.st[a][sp.ndim - 1];
  // NOTE: the trip count is uniform over the block (rows past the end are clamped to the last row
  // and store nothing), so every thread reaches every shuffle and __syncthreads.
  for (int64_t rb = (int64_t)blockIdx.x * rpb; rb < rows; rb += (int64_t)gridDim.x * rpb) {{
    int64_t r_[RPG], ro_[RPG][NACC];
    bool valid_[RPG];
    {fixed_decl}
#pragma unroll
    for (int g = 0; g < RPG; ++g) {{
      valid_[g] = rb + group * RPG + g < rows;
      r_[g] = valid_[g] ? rb + group * RPG + g : rows - 1;
      if (sp.ndim == 2) {{    // rows x columns after collapsing: no 64-bit division (a call) per row
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro_[g][a] = r_[g] * sp.st[a][0];
      }} else {{
        int64_t rem = r_[g];
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro_[g][a] = 0;
        for (int d = sp.ndim - 2; d >= 0; --d) {{
          const int64_t i = rem % sp.size[d];
          rem /= sp.size[d];
#pragma unroll
          for (int a = 0; a < NACC; ++a) ro_[g][a] += i * sp.st[a][d];
        }}
      }}
{fixed}
    }}
    if (NV > 0) {{
      {reg_decl}
#pragma unroll
      for (int g = 0; g < RPG; ++g) {{
#pragma unroll
        for (int q = 0; q < NV; ++q) {{
          const int c0 = (q * TPR + lane) * VEC;
          if (c0 < ncol) {{
    {reg_loads}
          }}
        }}
      }}
#pragma unroll
      for (int g = 0; g < RPG; ++g) {{
      {alias}
{self.body(True)}
      }}
    }} else {{
#pragma unroll
      for (int g = 0; g < RPG; ++g) {{
      {alias}
{self.body(False)}
      }}
    }}
  }}
}}
"""


def memo_values(passes: list[list[tuple]]) -> list[tuple[tuple, int]]:
    """(expression, first pass) of the values worth keeping per column between passes: a
    transcendental sub-expression that reads the row and that a later pass evaluates again, the
    largest such (what it contains comes with it). Softmax: exp(x - max) from the sum pass, read
    back by the output pass, instead of a second expf per element.

        >>> memo_values([[x], [exp(x - R0)], [exp(x - R0) / R1]])
        [(exp(x - R0), 1)]
    """
    subs = [{x for e in es for x in walk(e)} for es in passes]
    found: dict[tuple, int] = {}
    for a in range(len(passes)):
        for b in range(a + 1, len(passes)):
            for x in subs[a] & subs[b]:
                if x not in found and _transcendental(x) and any(y[0] == "in" for y in walk(x)):
                    found[x] = a
    return [(x, a) for x, a in found.items()
            if not any(y != x and x in set(walk(y)) for y in found)]


def _transcendental(e: tuple) -> bool:
    return any(x[0] in TRANSCENDENTAL for x in walk(e))


def _host(plan: Plan, p: RowParams) -> str:
    nacc = len(plan.accesses)
    args = ", ".join([f"({DT[plan.inputs[a.input][1]][0]}::raw*)in[{a.input}].data"
                      for a in plan.accesses] +
                     [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(plan.outputs)])
    launch = "row_kernel<{V}, {NV}><<<blocks, BLOCK, 0, stream>>>(sp, rows, (int)ncol, " + args + ");"
    out_checks = "\n".join(
        f"  if (!htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != {'rows' if o.row else 'n'}) return HTAM_ERR_SHAPE;"
        for k, o in enumerate(plan.outputs))
    cap = p.tpr * p.vec * p.nv
    return f"""
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{host.prologue(plan)}
  const int64_t ncol = it[{plan.ndim - 1}];
  if (ncol <= 0 || ncol > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;
  const int64_t rows = n / ncol;
  Space<NACC> sp;
{host.bind_accesses(plan)}
  (void)max_off;
{out_checks}
  if (rows == 0) return HTAM_OK;
  htam_collapse<NACC>(sp, {nacc}, true);
  const int V = {p.vec};
  bool vec_ok = V > 1 && ncol % V == 0;
{host.vector_checks(plan, "V", full_outputs_only=True)}
  int64_t blocks = (rows + BLOCK / TPR * RPG - 1) / (BLOCK / TPR * RPG);
  if ({p.waves} > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * {p.waves});
  blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
  const bool regs = {p.nv} > 0 && ncol <= {cap};
  if (regs && vec_ok) {launch.format(V=p.vec, NV=max(p.nv, 1))}
  else if (regs) {launch.format(V=1, NV=max(p.nv * p.vec, 1))}
  else if (vec_ok) {launch.format(V=p.vec, NV=0)}
  else {launch.format(V=1, NV=0)}
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}}
"""


def generate(plan: Plan, p: RowParams, low_precision: bool = False) -> str:
    """CUDA source (kernel ABI) for a row plan."""
    assert plan.kind == "rowwise", plan.kind
    g = _Gen(plan, p, low_precision)
    return "\n".join([f"// torch_htam expert: rowwise {p}", PRELUDE, "#include <algorithm>",
                      g.kernel(), _host(plan, p)])
