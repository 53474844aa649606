"""Fused row kernel: reductions over the last dim with their elementwise prologue/epilogue.

A group of TPR threads owns one row (TPR <= 32: a warp or sub-warp per row, several rows per block;
TPR >= 64: the block is the row). Each reduction of the program is one pass over the row; the row's
inputs are either kept in registers (loaded once, NV chunks of VEC per thread) or re-read per pass
(streaming, for rows longer than the register capacity; L1/L2 serve the re-reads). Online softmax
and Welford merge a pair of passes into one. The host picks register vs streaming and vector vs
scalar at run time from the real row length and alignment, so every instantiation is always valid.

Rows are any set of reduced dims (ir.py orders the iteration space kept dims first, reduced dims
last, with run-time strides), so the same program meets rows that are contiguous (this mapping),
rows whose columns are strided but whose rows are adjacent (mean over dim 1 of [B, C, HW], a
layer_norm of a transposed view: the column mapping, col_kernel, 32 rows a block), and a few very
long rows (a full reduction: split_kernel + split_finish, partials combined in order, no atomics).
The host picks among those the source carries from the real sizes and strides.

Per-row outputs may read the row at one more column, an int64 index per row (nll_loss's target:
("gather", src, index), read once by the row's lane 0), and sums over rows of per-row values (a
loss's mean over tokens: ExprProgram.outer) end the program: each thread group adds its rows in
order, writes its partial to the split-rows workspace, and outer_finish (one block) adds the
partials in a fixed order and stores the program's single values (Output.total).

Register budget (what decides bandwidth here): an SM has 64K registers, so 2048 resident threads
get 32 each. A row held as fp32 costs one register per value; `packed` keeps 2-byte inputs as raw
bits (two values per register, converted at use) and `lazy` loads inputs that no reduction reads
(a norm's weight and bias) in the final pass instead of holding them across the reductions. Both
free registers for more resident threads, hence more bytes in flight per SM; neither wins on every
row (bench/sweep.py), so the search tries both ways.

    >>> src = generate(prog, RowParams(tpr=32, rows_per_block=4, vec=4, nv=8))
    >>> m = TARGET.match(task.graph, policy); src = TARGET.render(m, TARGET.defaults(m))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import CTYPE, DT, PRELUDE, Emitter, cuh
from torch_htam.proposers.expert.ir import (
    TRANSCENDENTAL, ExprProgram, Unsupported, lower, program_value_type, stored, walk,
)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import (
    ProgramMatch, Target, access_tags, drop_scalar_tag, pow2_vec, program_facts,
)

INIT = {"sum": "0.f", "max": "(-INFINITY)", "min": "INFINITY", "prod": "1.f"}
COMBINE = {"sum": "acc + {v}", "max": "htam_max(acc, {v})", "min": "htam_min(acc, {v})", "prod": "acc * {v}"}
OPS = {"sum": "SumOp", "max": "MaxOp", "min": "MinOp", "prod": "ProdOp"}
# argmax / argmin: (value, first column) states; NaN counts as the largest value, as in torch
ARG = {"argmax": ("ArgMaxOp", ">"), "argmin": ("ArgMinOp", "<")}
ROWS_CUH = cuh("rows.cuh")


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
    su: int = 1                # streaming: chunks of VEC a thread loads together before it reduces
                               # them (loads in flight per thread on the streaming path)
    col_unroll: int = 4        # column mapping: steps along the row whose loads a lane issues
                               # together (bytes in flight), and the staged output tile's width / CK
    col_onepass: bool = True   # column mapping: Welford / online-softmax pairs in one pass (one
                               # read of the row instead of two)

    @property
    def block(self) -> int:
        return self.tpr * self.rows_per_block if self.tpr <= 32 else self.tpr


class _Gen:
    def __init__(self, prog: ExprProgram, p: RowParams, low_precision: bool):
        self.prog, self.p, self.lowp = prog, p, low_precision
        self.vt = program_value_type(prog)      # expression -> "f" | "b" | "i" (ir.value_type)
        D, nr = prog.ndim, prog.nred
        self.varying = [i for i, a in enumerate(prog.accesses) if a.column_varying(D, nr)]
        self.fixed = [i for i, a in enumerate(prog.accesses) if not a.column_varying(D, nr)]
        # Space entry of each output stored through strides (after the accesses')
        self.ostride = {k: len(prog.accesses) + j for j, k in enumerate(prog.strided_outputs)}
        reduced = {x[1] for r in prog.reductions for x in walk(r.expr) if x[0] == "in"}
        # held: loaded once into registers (register path); late: loaded per chunk in the final pass
        self.held = [i for i in self.varying if i in reduced or not p.lazy]
        self.late = [i for i in self.varying if i not in self.held]
        # memo[k]: (expression, first pass) kept in m{k}[q][e] on the register path
        self.memo = memo_values(self.passes()) if p.memo else []

    # ---- a row of two dims (prog.nred > 1 whose dims do not merge at run time: a GroupNorm's
    # weight steps per channel inside its group's row): `inner` > 0 is the last dim's size, cso[a]
    # the stride of the dim before it, cm[a] whether access a steps through both as one dim.
    @property
    def row2(self) -> bool:
        return self.prog.nred > 1

    def coff(self, i: int, x: str) -> str:
        """Element offset of column x along the row for Space entry i."""
        if not self.row2:
            return f"(int64_t)({x}) * cs[{i}]"
        return (f"(cm[{i}] ? (int64_t)({x}) * cs[{i}] : "
                f"(int64_t)(({x}) / inner) * cso[{i}] + (int64_t)(({x}) % inner) * cs[{i}])")

    def unit(self, i: int) -> str:
        """Entry i steps by one element along the whole row (vector access is possible)."""
        return f"cs[{i}] == 1 && cm[{i}]" if self.row2 else f"cs[{i}] == 1"

    def setup(self, indent: str = "  ") -> str:
        """Declares cs (and cso, cm for two-dim rows) from sp."""
        if not self.row2:
            return (f"{indent}int64_t cs[NACC];\n#pragma unroll\n"
                    f"{indent}for (int a = 0; a < NACC; ++a) cs[a] = sp.st[a][sp.ndim - 1];")
        return (f"{indent}int64_t cs[NACC], cso[NACC]; bool cm[NACC];\n#pragma unroll\n"
                f"{indent}for (int a = 0; a < NACC; ++a) {{\n"
                f"{indent}  cs[a] = sp.st[a][sp.ndim - 1];\n"
                f"{indent}  cso[a] = inner > 0 ? sp.st[a][sp.ndim - 2] : 0;\n"
                f"{indent}  cm[a] = inner == 0 || cso[a] == cs[a] * inner;\n{indent}}}")

    @property
    def kept_top(self) -> str:
        """The last kept dim of sp (the dims after it are the row)."""
        return "sp.ndim - 2 - (inner > 0)" if self.row2 else "sp.ndim - 2"

    @property
    def ncol_params(self) -> str:
        return "int ncol, int inner" if self.row2 else "int ncol"

    def dt(self, i: int) -> str:
        return DT[self.prog.inputs[self.prog.accesses[i].input][1]][0]

    def words(self, i: int) -> str:
        """C size of input i's packed chunk: VEC values in 32-bit words."""
        return f"(VEC + {self.dt(i)}::PER_WORD - 1) / {self.dt(i)}::PER_WORD"

    def packed_late(self, i: int) -> bool:
        """Late (final-pass) loads of 2-byte inputs stay raw words too when packed."""
        return self.p.packed and self.dt(i) != "F32"

    def passes(self) -> list[list[tuple]]:
        """The expressions each pass over the row evaluates per column, in order (a merged
        online-softmax / Welford pair is one pass; the final pass computes the full-row outputs)."""
        out, k, reds, p = [], 0, self.prog.reductions, self.p
        while k < len(reds):
            nxt = reds[k + 1] if k + 1 < len(reds) else None
            merged = (reds[k].pair and nxt is not None and nxt.pair == (reds[k].pair[0], 1)
                      and reds[k].pair[1] == 0 and (p.online if reds[k].pair[0] == "softmax" else p.welford))
            out.append([reds[k].expr])    # a merged pair's second value needs the first's result
            k += 2 if merged else 1
        return out + [[stored(o.expr, o.dtype) for o in self.prog.outputs if not o.row and not o.total]]

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
        # NOTE: bool values (masks, comparisons) are declared bool; a bool input's float-lane load
        # (0.f / 1.f) converts to the same bool where one is used
        return Emitter(load, red=lambda k: f"R{k}", fast=self.p.fast, low_precision=self.lowp,
                       vt=self.vt)

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
        if self.p.su > 1:
            return self._stream_loop(body, after, nc)
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

    def _stream_loop(self, body: str, after: str, nc: str) -> str:
        """The streaming loop with SU chunks per step: a thread's SU chunks (columns c0, c0 + TPR *
        VEC, ..) are all loaded before the first is reduced, so SU loads are in flight where the
        one-chunk loop has one (its next load waits for the reduction of the current chunk).
        Chunks are still reduced in column order."""
        su = self.p.su
        loads = "\n".join(self.load_chunk(i, f"x{i}_[s_]", "c0", nc) for i in self.varying)
        decl = " ".join(f"float x{i}_[{su}][VEC];" for i in self.varying)
        alias = " ".join(f"float (&x{i})[VEC] = x{i}_[s_];" for i in self.varying)
        return f"""
    for (int cb_ = lane * VEC; cb_ < ncol; cb_ += TPR * VEC * {su}) {{
      {decl}
#pragma unroll
      for (int s_ = 0; s_ < {su}; ++s_) {{
        const int c0 = cb_ + s_ * TPR * VEC;
        if (c0 < ncol) {{
{loads}
        }}
      }}
#pragma unroll
      for (int s_ = 0; s_ < {su}; ++s_) {{
        const int c0 = cb_ + s_ * TPR * VEC;
        if (c0 < ncol) {{
          {alias}
#pragma unroll
          for (int e = 0; e < VEC; ++e) {{
            // (VEC > 1 only where ncol % VEC == 0: a chunk is all in or all out)
            const int c = c0 + e;
            (void)c;
{body}
          }}
{after}
        }}
      }}
    }}"""

    def load_chunk(self, i: int, dst: str, c0: str, nc: str, packed: bool = False, ro: str = "ro") -> str:
        """VEC values of access i at columns c0.. into dst: floats, or 32-bit words of raw bits
        (PER_WORD values each) when packed. ro: the row's element offsets (one per access)."""
        t = self.dt(i)
        if packed:
            return (f"      if (VEC > 1 && {self.unit(i)}) ldw<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                    f"      else for (int e = 0; e < VEC; ++e) {{\n"
                    f"        const unsigned b = (VEC == 1 || {c0} + e < ncol) ? "
                    f"{t}::bits(p{i}[{ro}[{i}] + {self.coff(i, c0 + ' + e')}]) : 0u;\n"
                    f"        if (e % {t}::PER_WORD == 0) {dst}[e / {t}::PER_WORD] = b;\n"
                    f"        else {dst}[e / {t}::PER_WORD] |= b << {'(8 * (e % 4))' if t == 'B8' else 16}; }}")
        return (f"      if (VEC > 1 && {self.unit(i)}) ldv<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                f"      else for (int e = 0; e < VEC; ++e) {dst}[e] = (VEC == 1 || {c0} + e < ncol) ? "
                f"ld1<{t}, {nc}>(p{i} + {ro}[{i}] + {self.coff(i, c0 + ' + e')}) : 0.f;")

    def reduction_pass(self, k: int, regs: bool, at: int) -> tuple[str, int]:
        """Code computing R{k} (and R{k+1} for merged pairs) as pass `at`; returns (code,
        reductions consumed)."""
        prog, p = self.prog, self.p
        red = prog.reductions[k]
        nxt = prog.reductions[k + 1] if k + 1 < len(prog.reductions) else None
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
        if red.kind in ARG:
            op, cmp = ARG[red.kind]
            body = (f"{lines}\n          if (acc.i < 0 || {v} {cmp} acc.v || ({v} != {v} && acc.v == acc.v)) "
                    f"{{ acc.v = {v}; acc.i = c; }}")
            code = f"""
    float R{k}; int RI{k};
    {{
      ArgState acc; acc.v = 0.f; acc.i = -1;     // columns come in increasing order: ties keep the first
{self.loop(regs, body)}
      ArgState id; id.v = 0.f; id.i = -1;
      acc = group_reduce<TPR>(acc, {op}(), id);
      R{k} = acc.v; RI{k} = acc.i;
    }}"""
            return code, 1
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
        full = [(k, o) for k, o in enumerate(self.prog.outputs) if not o.row and not o.total]
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in full]
        lines = "\n".join("          " + ln for ln in em.lines)
        sets = "\n".join(f"          y{k}[e] = {n};" for (k, _), n in zip(full, names))
        # outputs are contiguous: row r starts at r * ncol; VEC > 1 only when the host checked
        # ncol % VEC == 0 and 16-byte alignment of every output.
        stores = "\n".join(self.store(k, o) for k, o in full)
        decl = " ".join(f"float y{k}[VEC];" for k, _ in full)
        if not full:
            return ""
        return f"    {{\n    {decl}\n{self.loop(regs, lines + chr(10) + sets, stores, late=True)}\n    }}"

    def store(self, k: int, o) -> str:
        """Store y{k}[0..VEC) at columns c0.. of row r: contiguous in iteration order, or through the
        output's strides (Output.dims)."""
        t = DT[o.dtype][0]
        if k not in self.ostride:
            return (f"        if (valid) {{ if (VEC > 1) stv<{t}, VEC>(o{k} + r * ncol + c0, y{k});\n"
                    f"          else o{k}[r * ncol + c0] = {t}::from_f(y{k}[0]); }}")
        j = self.ostride[k]
        return (f"        if (valid) {{ if (VEC > 1 && {self.unit(j)}) stv<{t}, VEC>(o{k} + ro[{j}] + c0, y{k});\n"
                f"          else for (int e = 0; e < VEC; ++e) o{k}[ro[{j}] + {self.coff(j, 'c0 + e')}] = "
                f"{t}::from_f(y{k}[e]); }}")

    def fixed_type(self, i: int) -> str:
        """C++ type of a per-row load of access i: integers (a per-row index) stay long long."""
        return "long long" if self.dt(i) in ("I64", "I32") else "float"

    def fixed_load(self, i: int, ptr: str, nc: str = "false") -> str:
        if self.dt(i) in ("I64", "I32"):
            return f"{self.dt(i)}::to_v(*({ptr}))"
        return f"ld1<{self.dt(i)}, {nc}>({ptr})"

    def load_at(self, i: int, col: str) -> str:
        """Access i of this row at column `col` (a gather's index): NaN outside the row, where torch
        raises (an index out of range)."""
        return (f"(({col}) >= 0 && ({col}) < ncol ? ld1<{self.dt(i)}, false>(p{i} + ro[{i}] + "
                f"{self.coff(i, f'({col})')}) : NAN)")

    def row_outputs(self) -> str:
        em = Emitter(lambda a: f"s{a}", red=lambda k: f"R{k}", fast=self.p.fast,
                     low_precision=self.lowp, prefix="u", vt=self.vt, load_at=self.load_at)
        rows = [(k, o) for k, o in enumerate(self.prog.outputs) if o.row]
        # an arg reduction's index ("idx", j) is stored as the int it is, never through a float
        names = [f"(long long)RI{o.expr[1]}" if o.expr[0] == "idx" else em.emit(stored(o.expr, o.dtype))
                 for _, o in rows]
        # sums over rows: this group's running partial (lane 0's), written out after the last row
        adds = "".join(f"\n      oacc{j} += {em.emit(r.expr)};" for j, r in enumerate(self.prog.outer))
        if not rows and not adds:
            return ""
        lines = "\n".join("      " + ln for ln in em.lines)
        stores = "\n".join(f"      o{k}[r] = {n};" if o.expr[0] == "idx" else
                           f"      o{k}[r] = {DT[o.dtype][0]}::from_v({n});" if DT[o.dtype][0] in ("I64", "I32") else
                           f"      o{k}[r] = {DT[o.dtype][0]}::from_f({n});" for (k, o), n in zip(rows, names))
        return f"""
    if (valid && lane == 0) {{
{lines}
{stores}{adds}
    }}"""

    def body(self, regs: bool) -> str:
        out, k, at = [], 0, 0
        if regs:
            out += [f"    float m{j}[NV > 0 ? NV : 1][VEC];" for j in range(len(self.memo))]
        while k < len(self.prog.reductions):
            code, used = self.reduction_pass(k, regs, at)
            out.append(code)
            k, at = k + used, at + 1
        out.append(self.final_pass(regs, at))
        out.append(self.row_outputs())
        return "\n".join(out)

    def kernel(self) -> str:
        prog, p = self.prog, self.p
        nc = "true" if p.nc else "false"
        params = [f"const {self.dt(i)}::raw* __restrict__ p{i}" for i in range(len(prog.accesses))]
        params += [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)]
        params += ["void* __restrict__ ows"] * bool(prog.outer)
        fixed = "\n".join(f"      s{i}_[g] = {self.fixed_load(i, f'p{i} + ro_[g][{i}]', nc)};" for i in self.fixed)
        fixed_decl = " ".join(f"{self.fixed_type(i)} s{i}_[RPG];" for i in self.fixed)
        fixed_alias = " ".join(f"const {self.fixed_type(i)} s{i} = s{i}_[g];" for i in self.fixed)
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
#define NACC {len(prog.accesses) + len(self.ostride)}
#define TPR {p.tpr}
#define BLOCK {p.block}
#define RPG {p.rpg}
template <int VEC, int NV>
__global__ void __launch_bounds__({bounds}) row_kernel(Space<NACC> sp, int64_t rows, {self.ncol_params},
    {", ".join(params)}) {{
  const int lane = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int64_t rpb = BLOCK / TPR * RPG;     // rows per block and trip
{self.setup()}{self.outer_decl()}
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
      if ({"sp.ndim - (inner > 0) == 2" if self.row2 else "sp.ndim == 2"}) {{    // rows x columns after collapsing: no 64-bit division (a call) per row
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro_[g][a] = r_[g] * sp.st[a][0];
      }} else {{
        int64_t rem = r_[g];
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro_[g][a] = 0;
        for (int d = {self.kept_top}; d >= 0; --d) {{
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
  }}{self.outer_store()}
}}
"""

    # ---- sums over rows (ir.ExprProgram.outer): each thread group's lane 0 adds its rows' values in
    # row order; after its last row it writes the partial to slot (block, group) of the workspace
    # (8 bytes a slot, one run of slots per sum); outer_finish adds the slots in order.
    def _outer_vt(self, j: int) -> str:
        return "f" if self.vt(self.prog.outer[j].expr) == "f" else "i"

    def outer_decl(self) -> str:
        return "".join(f"\n  {CTYPE[self._outer_vt(j)]} oacc{j} = 0;" for j in range(len(self.prog.outer)))

    def outer_store(self) -> str:
        if not self.prog.outer:
            return ""
        st = "".join(f"\n    (({CTYPE[self._outer_vt(j)]}*)((char*)ows + {j} * slots * 8))[slot] = oacc{j};"
                     for j in range(len(self.prog.outer)))
        return (f"\n  {{\n    const int64_t slots = (int64_t)gridDim.x * (BLOCK / TPR);\n"
                f"    const int64_t slot = (int64_t)blockIdx.x * (BLOCK / TPR) + group;\n"
                f"    if (lane == 0) {{{st}\n    }}\n  }}")

    def outer_finish(self) -> str:
        """One block of 1024 threads: each sum's slots added in a fixed order (a strided pass per
        thread, then a tree), then the total outputs, computed and stored by thread 0."""
        prog = self.prog
        params = [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)]
        sums = []
        for j in range(len(prog.outer)):
            ct = CTYPE[self._outer_vt(j)]
            sums.append(f"""
  {ct} T{j};
  {{
    __shared__ {ct} sm[1024];
    {ct} acc = 0;
    for (int64_t s = threadIdx.x; s < slots; s += 1024) acc += ((const {ct}*)((const char*)ows + {j} * slots * 8))[s];
    __syncthreads();
    sm[threadIdx.x] = acc;
    __syncthreads();
    for (int h = 512; h > 0; h >>= 1) {{
      if ((int)threadIdx.x < h) sm[threadIdx.x] += sm[threadIdx.x + h];
      __syncthreads();
    }}
    T{j} = sm[0];
  }}""")
        em = Emitter(lambda a: "0.f", red=lambda k: "0.f", prefix="v", vt=self.vt, outer=lambda j: f"T{j}")
        totals = [(k, o) for k, o in enumerate(prog.outputs) if o.total]
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in totals]
        lines = "\n".join("    " + ln for ln in em.lines)
        stores = "\n".join(f"    o{k}[0] = {DT[o.dtype][0]}::from_v({n});" if DT[o.dtype][0] in ("I64", "I32") else
                           f"    o{k}[0] = {DT[o.dtype][0]}::from_f({n});" for (k, o), n in zip(totals, names))
        return f"""
__global__ void __launch_bounds__(1024) outer_finish(int64_t slots, int64_t rows, const void* __restrict__ ows,
    {", ".join(params)}) {{{"".join(sums)}
  if (threadIdx.x == 0) {{
{lines}
{stores}
  }}
}}
"""

    def col_kernel(self) -> str:
        """The column mapping of the same program: a block is 32 consecutive rows (threadIdx.x %
        32) times CK lanes along the row (threadIdx.x / 32); lane ty walks columns ty, ty + CK, ..
        and col_reduce combines the CK lanes. For rows whose columns are strided and whose rows are
        adjacent (sum over dim 1 of [B, C, HW]): a warp reads 32 adjacent elements per step where
        the row mapping reads one per row.

        Bandwidth (NOTE: one 2-4 byte load per lane per step is 64-128 bytes a warp, too few bytes
        in flight to cover DRAM latency): each lane issues col_unroll steps' loads before it
        combines them (in column order, so results do not depend on col_unroll). Welford and
        online-softmax pairs are one pass (col_onepass): each pass is one more read of the
        block's [32 x ncol] tile.
        Full-row outputs stored contiguously ([rows, ncol], the row mapping's layout, a permuted
        LayerNorm's) would be written one element per row by a warp (a 2-byte store per 768-byte
        row): they go through a shared [steps * CK columns x 32 rows] tile instead (steps:
        _col_final_unroll), written back along the row (the tiled transpose), so a block stores
        steps * CK contiguous values a row."""
        prog, p, na = self.prog, self.p, len(self.prog.accesses)
        U = p.col_unroll
        params = [f"const {self.dt(i)}::raw* __restrict__ p{i}" for i in range(na)]
        params += [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)]
        fixed = "\n".join(f"    const {self.fixed_type(i)} s{i} = {self.fixed_load(i, f'p{i} + ro[{i}]')};"
                          for i in self.fixed)

        def ld(i: int, c: str) -> str:
            return f"ld1<{self.dt(i)}, false>(p{i} + ro[{i}] + {self.coff(i, c)})"

        def step(body: str) -> str:
            """body at column c = c0 + u * ck, its inputs read from the u-th loaded values."""
            bind = " ".join(f"float x{i}[1] = {{xu{i}[u]}};" for i in self.varying)
            return (f"#pragma unroll\n        for (int u = 0; u < {U}; ++u) {{\n"
                    f"          const int c = c0 + u * ck; (void)c; const int e = 0; (void)e;\n"
                    f"          {bind}\n{body}\n        }}")

        def loop(body: str, tail_body: str | None = None, pre: str = "", post: str = "") -> str:
            """body over this lane's columns in increasing order: col_unroll loads in flight, then a
            tail (tail_body, default body); pre / post: code around each group of col_unroll steps."""
            decl = " ".join(f"float xu{i}[{U}];" for i in self.varying)
            loads = "\n".join(f"#pragma unroll\n        for (int u = 0; u < {U}; ++u) xu{i}[u] = {ld(i, 'c0 + u * ck')};"
                              for i in self.varying)
            tail = "\n".join(f"        x{i}[0] = {ld(i, 'c')};" for i in self.varying)
            return (f"      int c0 = ty;\n"
                    f"      for (; c0 + {U - 1} * ck < ncol; c0 += {U} * ck) {{\n        {decl}\n{loads}\n{pre}{step(body)}\n{post}      }}\n"
                    f"      for (int c = c0; c < ncol; c += ck) {{\n"
                    f"        {' '.join(f'float x{i}[1];' for i in self.varying)}\n        const int e = 0; (void)e;\n"
                    f"{tail}\n{tail_body or body}\n      }}")
        passes, k = [], 0
        reds = prog.reductions
        while k < len(reds):
            red, nxt = reds[k], (reds[k + 1] if k + 1 < len(reds) else None)
            pair = (p.col_onepass and red.pair and nxt is not None and nxt.pair == (red.pair[0], 1)
                    and red.pair[1] == 0 and red.pair[0] in ("welford", "softmax"))
            em = self.emitter(False)
            v = em.emit(red.expr)
            lines = "\n".join("          " + ln for ln in em.lines)
            if pair and red.pair[0] == "welford":
                # NOTE: each group of col_unroll values is reduced two-pass (its mean, then its
                # squared deviations) and merged into the lane's Welford state (Chan et al.): one
                # division per group, where Welford's update divides per value. Summing shifted
                # by the lane's first value instead lost digits when that value sat far from the
                # mean: var over dim 1 of [64, 512, 1024] fp32 missed rtol 1e-4 on 3 of 65536
                # values (H100, scripts/stress_verify.py rw_var_dim1_fp32).
                body = f"{lines}\n          cv_[u] = {v};"
                pre = f"        float cv_[{U}];\n"
                post = (f"        {{\n          float cs_ = 0.f, cq_ = 0.f;\n#pragma unroll\n"
                        f"          for (int u = 0; u < {U}; ++u) cs_ += cv_[u];\n"
                        f"          const float cm_ = cs_ * (1.f / {U}.f);\n#pragma unroll\n"
                        f"          for (int u = 0; u < {U}; ++u) {{ const float d_ = cv_[u] - cm_; cq_ += d_ * d_; }}\n"
                        f"          const float nn_ = n_ + {U}.f, dm_ = cm_ - m_;\n"
                        f"          m_ += dm_ * ({U}.f / nn_); q_ += cq_ + dm_ * dm_ * (n_ * ({U}.f / nn_)); n_ = nn_;\n"
                        f"        }}\n")
                tail_body = (f"{lines}\n          n_ += 1.f;\n          const float d_ = {v} - m_;\n"
                             f"          m_ += d_ / n_; q_ += d_ * ({v} - m_);")
                passes.append(f"    float R{k}, R{k + 1};\n    {{\n      float n_ = 0.f, m_ = 0.f, q_ = 0.f;\n"
                              f"{loop(body, tail_body, pre, post)}\n      WelfordState w; w.n = n_; w.mean = m_; w.m2 = q_;\n"
                              f"      w = col_reduce(w, WfOp());\n"
                              f"      R{k} = w.mean * w.n; R{k + 1} = w.m2;   // sum and sum of squared deviations\n    }}")
                k += 2
                continue
            if pair:        # online softmax: max and sum of exp(x - max) in one pass
                exp = "__expf" if p.fast else "expf"
                body = (f"{lines}\n          if ({v} > st.m) {{ st.s = st.s * {exp}(st.m - {v}) + 1.f; st.m = {v}; }}\n"
                        f"          else if ({v} > -INFINITY) st.s += {exp}({v} - st.m);")
                passes.append(f"    float R{k}, R{k + 1};\n    {{\n      SoftmaxState st; st.m = -INFINITY; st.s = 0.f;\n"
                              f"{loop(body)}\n      st = col_reduce(st, SmOp());\n      R{k} = st.m; R{k + 1} = st.s;\n    }}")
                k += 2
                continue
            if red.kind in ARG:
                op, cmp = ARG[red.kind]
                body = (f"{lines}\n          if (acc.i < 0 || {v} {cmp} acc.v || ({v} != {v} && acc.v == acc.v)) "
                        f"{{ acc.v = {v}; acc.i = c; }}")
                passes.append(f"    float R{k}; int RI{k};\n    {{\n      ArgState acc; acc.v = 0.f; acc.i = -1;\n"
                              f"{loop(body)}\n      acc = col_reduce(acc, {op}());\n      R{k} = acc.v; RI{k} = acc.i;\n    }}")
            else:
                body = f"{lines}\n          acc = {COMBINE[red.kind].format(v=v)};"
                passes.append(f"    float R{k};\n    {{\n      float acc = {INIT[red.kind]};\n{loop(body)}\n"
                              f"      R{k} = col_reduce(acc, {OPS[red.kind]}());\n    }}")
            k += 1
        full = [(k, o) for k, o in enumerate(prog.outputs) if not o.row and not o.total]
        if full:
            passes.append(self._col_final(full, _col_final_unroll(prog, U), ld))
        rows = self.row_outputs().replace("lane == 0", "ty == 0")
        return f"""
__global__ void __launch_bounds__(1024) col_kernel(Space<NACC> sp, int64_t rows, {self.ncol_params},
    {", ".join(params)}) {{
  const int lane = threadIdx.x & 31, ty = threadIdx.x >> 5, ck = blockDim.x >> 5;
  extern __shared__ float stg[];    // staged outputs: [steps * ck columns][33] (_col_final_unroll)
  (void)stg;
{self.setup()}
  // NOTE: block-uniform trip count (rows past the end are clamped and store nothing): col_reduce syncs
  for (int64_t rb = (int64_t)blockIdx.x * 32; rb < rows; rb += (int64_t)gridDim.x * 32) {{
    const bool valid = rb + lane < rows;
    const int64_t r = valid ? rb + lane : rows - 1;
    int64_t ro[NACC];
    {{
      int64_t rem = r;
#pragma unroll
      for (int a = 0; a < NACC; ++a) ro[a] = 0;
      for (int d = {self.kept_top}; d >= 0; --d) {{
        const int64_t i = rem % sp.size[d];
        rem /= sp.size[d];
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro[a] += i * sp.st[a][d];
      }}
    }}
{fixed}
{chr(10).join(passes)}
{rows}
  }}
}}
"""

    def _col_final(self, full: list, U: int, ld) -> str:
        """The column mapping's output pass over tiles of U * ck columns (block-uniform trips:
        the staged stores sync). Outputs with their own strides (Output.dims) are stored where
        they are computed; contiguous ones ([rows, ncol]) are staged in stg, then stored along
        the row: thread j of the block writes row j / W, column j % W of the W-column tile."""
        em = self.emitter(False)
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in full]
        lines = "\n".join("          " + ln for ln in em.lines)
        direct, staged = [], []
        for (k, o), n in zip(full, names):
            t = DT[o.dtype][0]
            if k in self.ostride:
                direct.append(f"          if (valid) o{k}[ro[{self.ostride[k]}] + {self.coff(self.ostride[k], 'c')}] = {t}::from_f({n});")
            else:
                staged.append((k, t, n))
        decl = " ".join(f"float xu{i}[{U}];" for i in self.varying)
        loads = "\n".join(f"#pragma unroll\n      for (int u = 0; u < {U}; ++u) xu{i}[u] = cb + u * ck + ty < ncol ? "
                          f"{ld(i, 'cb + u * ck + ty')} : 0.f;" for i in self.varying)
        ydecl = " ".join(f"float y{k}_[{U}];" for k, _, _ in staged)
        sets = "\n".join(f"          y{k}_[u] = {n};" for k, _, n in staged)
        bind = " ".join(f"float x{i}[1] = {{xu{i}[u]}};" for i in self.varying)
        writes = "".join(f"""
      __syncthreads();                 // the previous tile's stores have read stg
#pragma unroll
      for (int u = 0; u < {U}; ++u) stg[(u * ck + ty) * 33 + lane] = y{k}_[u];
      __syncthreads();
      for (int j = threadIdx.x; j < 32 * W; j += blockDim.x) {{
        const int rr = j / W, cc = j % W;
        if (rb + rr < rows && cb + cc < ncol) o{k}[(rb + rr) * ncol + cb + cc] = {t}::from_f(stg[cc * 33 + rr]);
      }}""" for k, t, _ in staged)
        return f"""    {{
      const int W = {U} * ck;          // columns per tile
      for (int cb = 0; cb < ncol; cb += W) {{
        {decl} {ydecl}
{loads}
#pragma unroll
        for (int u = 0; u < {U}; ++u) {{
          const int c = cb + u * ck + ty; const int e = 0; (void)e;
          {bind}
{lines}
{sets}
          if (c < ncol) {{
{chr(10).join(direct)}
          }}
        }}{writes}
      }}
    }}"""

    def split_kernels(self) -> str:
        """A one-reduction program with per-row outputs only, for a few very long rows: blocks of
        256 threads reduce chunks of a row (split_kernel, a grid of splits x rows), split_finish
        combines each row's partials in order and writes the row's outputs."""
        prog, na = self.prog, len(self.prog.accesses)
        red = prog.reductions[0]
        arg = red.kind in ARG
        params = [f"const {self.dt(i)}::raw* __restrict__ p{i}" for i in range(na)]
        params += [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)]
        fixed = "\n".join(f"  const {self.fixed_type(i)} s{i} = {self.fixed_load(i, f'p{i} + ro[{i}]')};"
                          for i in self.fixed)
        decl = " ".join(f"float x{i}[1];" for i in self.varying)
        loads = "\n".join(f"    x{i}[0] = ld1<{self.dt(i)}, false>(p{i} + ro[{i}] + {self.coff(i, 'c')});"
                          for i in self.varying)
        em = self.emitter(False)
        v = em.emit(red.expr)
        lines = "\n".join("    " + ln for ln in em.lines)
        if arg:
            op, cmp = ARG[red.kind]
            state, init = "ArgState", "ArgState acc; acc.v = 0.f; acc.i = -1;"
            combine = f"if (acc.i < 0 || {v} {cmp} acc.v || ({v} != {v} && acc.v == acc.v)) {{ acc.v = {v}; acc.i = c; }}"
            ident, result = "ArgState id; id.v = 0.f; id.i = -1;", "const float R0 = acc.v; const int RI0 = acc.i;"
        else:
            op, state, init = OPS[red.kind], "float", f"float acc = {INIT[red.kind]};"
            combine = f"acc = {COMBINE[red.kind].format(v=v)};"
            ident, result = f"const float id = {INIT[red.kind]};", "const float R0 = acc;"
        head = self.setup() + f"""
  int64_t ro[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a) ro[a] = 0;
  int64_t rem = r;
  for (int d = {self.kept_top}; d >= 0; --d) {{
    const int64_t i = rem % sp.size[d];
    rem /= sp.size[d];
#pragma unroll
    for (int a = 0; a < NACC; ++a) ro[a] += i * sp.st[a][d];
  }}"""
        rows = self.row_outputs().replace("valid && lane == 0", "lane == 0")
        return f"""
__global__ void __launch_bounds__(256) split_kernel(Space<NACC> sp, {self.ncol_params}, int splits, {state}* ws,
    {", ".join(params)}) {{
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.y;
{head}
{fixed}
  const int chunk = (ncol + splits - 1) / splits, c_lo = (int)blockIdx.x * chunk;
  const int c_hi = min(ncol, c_lo + chunk);
  {init}
  for (int c = c_lo + lane; c < c_hi; c += 256) {{
    {decl}
    const int e = 0; (void)e;
{loads}
{lines}
    {combine}
  }}
  {ident}
  acc = group_reduce<256>(acc, {op}(), id);
  if (lane == 0) ws[r * splits + blockIdx.x] = acc;
}}
__global__ void __launch_bounds__(256) split_finish(Space<NACC> sp, {self.ncol_params}, int splits, const {state}* ws,
    {", ".join(params)}) {{
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
{head}
{fixed}
  {ident}
  {state} acc = id;
  for (int j = lane; j < splits; j += 256) acc = {op}()(acc, ws[r * splits + j]);   // fixed order
  acc = group_reduce<256>(acc, {op}(), id);
  {result}
{rows}
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


def _main_access(prog: ExprProgram) -> int:
    """The access the mapping is chosen for: the largest input a reduction reads along the row
    (the data, not a broadcast scale), the lowest such access on ties."""
    reduced = sorted({x[1] for r in prog.reductions for x in walk(r.expr) if x[0] == "in"
                      and prog.accesses[x[1]].column_varying(prog.ndim, prog.nred)})
    if not reduced:
        return 0
    return max(reduced, key=lambda a: (math.prod(prog.inputs[prog.accesses[a].input][0]), -a))


def has_column_mapping(prog: ExprProgram) -> bool:
    """The program may meet rows whose columns are strided (reduced over a middle dim, or read
    through a permute): its source carries the column mapping too, chosen at run time."""
    if not prog.accesses or prog.outer:    # (sums over rows: the row mapping only, any strides)
        return False
    a = prog.accesses[_main_access(prog)]
    return a.mode == "dims" and a.dims != tuple(range(prog.ndim))


def _col_final_unroll(prog: ExprProgram, unroll: int) -> int:
    """Steps per tile of the column mapping's output pass: at most 8 values in flight per lane over
    all the row's inputs (a power of two, at most col_unroll). That pass re-reads the block's
    [32 x ncol] tile, which the statistics pass just brought into L1, so it needs few loads in
    flight; registers decide its occupancy. NOTE: ptxas -v (sm_90a), permuted bf16 LayerNorm (x,
    weight, bias): 8 steps 62 registers (2 blocks of 512 per SM: 375 blocks in 1.4 waves), 4
    steps 44, 2 steps 34 (3 blocks per SM: one wave)."""
    varying = sum(a.column_varying(prog.ndim, prog.nred) for a in prog.accesses)
    u = 1
    while u * 2 <= min(unroll, 8 // max(varying, 1)):
        u *= 2
    return u


def _col_staged(prog: ExprProgram) -> bool:
    """The column mapping stages full-row outputs stored contiguously ([rows, ncol]) in shared memory."""
    return any(not o.row and not o.total and k not in prog.strided_outputs for k, o in enumerate(prog.outputs))


def has_split_rows(prog: ExprProgram) -> bool:
    """A full reduction (or a few long rows) of one reduction with per-row outputs only: its source
    carries the split-rows path too, chosen at run time when rows are too few to fill the GPU."""
    kept = math.prod(prog.shape[:prog.ndim - prog.nred])
    return (len(prog.reductions) == 1 and all(o.row for o in prog.outputs) and kept < 32
            and bool(prog.accesses) and not prog.outer)


def _host(prog: ExprProgram, p: RowParams) -> str:
    na = len(prog.accesses)
    nacc = na + len(prog.strided_outputs)
    outs = [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(prog.outputs)]
    args = ", ".join([host.access_ptr(prog, i) for i in range(len(prog.accesses))]
                     + outs + ["ows"] * bool(prog.outer))
    ncol = "(int)ncol, inner" if prog.nred > 1 else "(int)ncol"

    def launch(V: int, NV: int) -> str:     # the kernel instantiation for vector width V, NV chunks
        return f"row_kernel<{V}, {NV}><<<blocks, BLOCK, 0, stream>>>(sp, rows, {ncol}, {args});"
    out_checks = "\n".join(
        f"  if (htam_numel(&out[{k}]) != 1) return HTAM_ERR_SHAPE;" if o.total else
        ("" if o.broadcast else f"  if (htam_numel(&out[{k}]) != n) return HTAM_ERR_SHAPE;") if o.dims is not None else
        f"  if (!htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != {'rows' if o.row else 'n'}) return HTAM_ERR_SHAPE;"
        for k, o in enumerate(prog.outputs))
    cap = p.tpr * p.vec * p.nv
    D, nr = prog.ndim, prog.nred
    if nr == 1:
        sizes = f"""  const int64_t ncol = it[{D - 1}];
  if (ncol <= 0 || ncol > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;
  const int64_t rows = n / ncol;"""
        collapse = f"  htam_collapse<NACC>(sp, {nacc}, true);"
    else:   # the row is several dims: they must merge into one (contiguous along the row)
        sizes = f"""  int64_t rowlen = 1;
  for (int d = {D - nr}; d < {D}; ++d) rowlen *= it[d];
  if (rowlen <= 0 || rowlen > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;
  const int64_t rows = n / rowlen;"""
        # NOTE: a row that stays two dims after merging (a GroupNorm's channels x pixels, its
        # weight stepping per channel) is walked as one: `inner` is its last dim's size
        collapse = (f"  const int row_nd = htam_collapse<NACC>(sp, {nacc}, true, {nr});\n"
                    f"  if (row_nd > 2) return HTAM_ERR_SHAPE;\n"
                    f"  const int inner = row_nd == 2 ? (int)sp.size[sp.ndim - 1] : 0;\n"
                    f"  const int64_t ncol = row_nd == 2 ? sp.size[sp.ndim - 2] * sp.size[sp.ndim - 1] : sp.size[sp.ndim - 1];")
    binds = "\n" + host.bind_outputs(prog) if prog.strided_outputs else ""
    outer_setup = outer_launch = ""
    if prog.outer:
        # NOTE: every thread group's partial sums take one 8-byte slot per sum in the split-rows
        # workspace: the grid is capped to fit it (the row loop is grid-stride, so every row is
        # still visited)
        outer_setup = f"""
  void* ows = htam_split_ws(stream);
  if (ows == nullptr) return HTAM_ERR_SHAPE;
  blocks = std::min<int64_t>(blocks, (int64_t)(kSplitWs / (8 * {len(prog.outer)} * (BLOCK / TPR))));"""
        outer_launch = f"""
  outer_finish<<<1, 1024, 0, stream>>>(blocks * (BLOCK / TPR), rows, ows, {", ".join(outs)});
  HTAM_CHECK_LAUNCH();"""
    col = ""
    if has_column_mapping(prog):
        m = _main_access(prog)
        # the main input steps along the row by more than one element, and by one between rows
        col_cond = (f"sp.ndim >= 2 && sp.st[{m}][sp.ndim - 1] != 1 && sp.st[{m}][sp.ndim - 2] == 1" if nr == 1 else
                    f"sp.ndim - row_nd >= 1 && !(sp.st[{m}][sp.ndim - 1] == 1 && (row_nd == 1 || "
                    f"sp.st[{m}][sp.ndim - 2] == inner)) && sp.st[{m}][sp.ndim - 1 - row_nd] == 1")
        col = f"""
  // strided columns, adjacent rows: the column mapping (32 rows a block, ck lanes along the row)
  if ({col_cond}) {{
    int64_t cblocks = (rows + 31) / 32;
    const int64_t target = (int64_t)htam_sm_count() * 2048;    // resident threads to fill
    int ck = 1;
    while (ck < 32 && cblocks * 32 * ck * 2 <= target && ck * 2 <= ncol) ck *= 2;
    cblocks = std::max<int64_t>(1, std::min<int64_t>(cblocks, (int64_t)1 << 30));
    // staged full-row outputs: a [steps * ck][33] float tile (_col_final_unroll), at most 128 columns (17 KB): with
    // col_reduce's static buffers (4-12 KB per state type) a block stays within 48 KB
    const bool staged = {"true" if _col_staged(prog) else "false"};
    while (staged && ck > 1 && {_col_final_unroll(prog, p.col_unroll)} * ck > 128) ck /= 2;
    const size_t smem = staged ? (size_t){_col_final_unroll(prog, p.col_unroll)} * ck * 33 * sizeof(float) : 0;
    col_kernel<<<cblocks, 32 * ck, smem, stream>>>(sp, rows, {ncol}, {args});
    HTAM_CHECK_LAUNCH();
    return HTAM_OK;
  }}"""
    if has_split_rows(prog):
        state = "ArgState" if prog.reductions[0].kind in ARG else "float"
        col = f"""
  // a few long rows: split each over many blocks, then combine the partials in order
  {{
    const int64_t sms = htam_sm_count();
    const int splits = (int)std::min<int64_t>(std::min<int64_t>(sms * 8 / rows, ncol / 4096),
                                             (int64_t)(kSplitWs / sizeof({state})) / rows);
    void* ws = (rows <= 65535 && splits >= 2) ? htam_split_ws(stream) : nullptr;
    if (ws != nullptr) {{
      split_kernel<<<dim3(splits, (unsigned)rows), 256, 0, stream>>>(sp, {ncol}, splits, ({state}*)ws, {args});
      HTAM_CHECK_LAUNCH();
      split_finish<<<(unsigned)rows, 256, 0, stream>>>(sp, {ncol}, splits, ({state}*)ws, {args});
      HTAM_CHECK_LAUNCH();
      return HTAM_OK;
    }}
  }}""" + col
    return f"""
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{host.prologue(prog)}
{sizes}
  Space<NACC> sp;
{host.bind_accesses(prog)}{binds}
  (void)max_off;
{out_checks}
  if (rows == 0) return {"HTAM_ERR_SHAPE" if prog.outer else "HTAM_OK"};
{collapse}{col}
  const int V = {p.vec};
  bool vec_ok = V > 1 && ncol % V == 0;
{host.vector_checks(prog, "V", full_outputs_only=True)}
  int64_t blocks = (rows + BLOCK / TPR * RPG - 1) / (BLOCK / TPR * RPG);
  if ({p.waves} > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * {p.waves});
  blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));{outer_setup}
  const bool regs = {p.nv} > 0 && ncol <= {cap};
  if (regs && vec_ok) {launch(p.vec, max(p.nv, 1))}
  else if (regs) {launch(1, max(p.nv * p.vec, 1))}
  else if (vec_ok) {launch(p.vec, 0)}
  else {launch(1, 0)}
  HTAM_CHECK_LAUNCH();{outer_launch}
  return HTAM_OK;
}}
"""


def generate(prog: ExprProgram, p: RowParams, low_precision: bool = False) -> str:
    """CUDA source (kernel ABI) for a row prog."""
    assert prog.kind == "rowwise", prog.kind
    g = _Gen(prog, p, low_precision)
    col, split = has_column_mapping(prog), has_split_rows(prog)
    ext = (col or split or bool(prog.outer) or any(r.kind in ("prod", *ARG) for r in prog.reductions)
           or any(a.mode == "span" for a in prog.accesses))
    return "\n".join([f"// torch_htam expert: rowwise {p}", PRELUDE] + [ROWS_CUH] * ext + ["#include <algorithm>",
                      g.kernel()] + [g.col_kernel()] * col + [g.split_kernels()] * split
                     + [g.outer_finish()] * bool(prog.outer) + [_host(prog, p)])


# ---- the rowwise target (target.Target) ------------------------------------------------------------

def match(gm, policy) -> ProgramMatch:
    """A region of row reductions with their elementwise prologue/epilogue; raises Unsupported."""
    prog = lower(gm)
    if prog.kind != "rowwise":
        raise Unsupported("no row reduction (the elementwise target's)")
    if not prog.accesses:
        raise Unsupported("the region reads no input")
    return ProgramMatch(prog, program_facts(prog, policy))


def defaults(m: ProgramMatch) -> dict:
    return _default_row(m.facts)


def _default_row(facts: TaskFacts) -> dict:
    """Warp per row while the row fits 32 threads' registers, else a block per row; streamed
    (online/Welford, one pass) beyond 16 values per thread of 1024 threads, except 16K-32K-wide
    fp32 rows, held 32 values a thread by one 1024-thread block per SM (_long_row_in_registers).

    Half-precision rows are held packed (two values per register), so a thread holds 32 of them
    where it holds 16 fp32 values. Measured (bench/sweep.py, H100, docs/RESULTS_LOG.md): packed
    took bf16 softmax from 52.6 to 31.1 us, RMSNorm [4096, 4096] from 36.7 to 31.2 us, and a
    768-wide LayerNorm was fastest warp-per-row with 32 values per thread (18.6 us vs 25.1 us).
    """
    n = max(facts.ncol, 1)
    vec = facts.vec16
    while vec > 1 and n % vec:
        vec //= 2
    packed, cap = facts.packs_half, facts.row_cap
    tpr = 32 if n <= 32 * cap else 128 if n <= 128 * 16 else 256 if n <= 256 * 16 else 1024
    mid = _mid_row_threads(facts)
    tpr = mid or tpr
    if facts.single_pass and tpr > 256:     # see _stream_chunks
        tpr = 256
    per_thread = -(-n // tpr)
    while vec > per_thread:           # stays a power of two (vector loads are 2/4/8/16 bytes)
        vec //= 2
    nv = -(-per_thread // vec)     # exact (768 = 32 x 8 x 3): a padded 4th chunk costs registers
    # NOTE: a row read once (mean(silu(x) * s)) gains nothing from registers: streaming it took
    # 12.7 us against 14.3 us held ([4096, 768] fp32, bench/sweep.py, H100, docs/RESULTS_LOG.md).
    stream = facts.single_pass or (nv * vec > 16 and not (packed and (tpr == 32 or mid) and nv * vec <= cap))
    # NOTE: a register-held row asks for 1024 resident threads (at most 64 registers): left alone,
    # ptxas unrolled the 768-wide bf16 LayerNorm into 254 registers with spills (21.2 us), capped it
    # took 14.1 us; bf16 softmax 25.3 -> 23.7 us, fp32 softmax 38.5 -> 38.8 us (bench/sweep.py, H100).
    p = {"tpr": tpr, "rows_per_block": 4, "vec": vec, "nv": 0 if stream else nv,
         "online": stream, "welford": stream, "nc": False, "waves": 0, "fast": facts.sfu_math,
         "lazy": True, "packed": packed, "occ": 0 if stream else 1024, "rpg": 1, "memo": True,
         "col_unroll": _col_unroll(facts), "col_onepass": True}
    su = _stream_chunks(facts, tpr, vec)
    if su > 1:
        p.update(su=su, occ=1024)
    # NOTE: a 32000-wide fp32 log_softmax held this way took 54.2 us against 69.1 streamed
    # (bench/sweep.py, H100, docs/RESULTS_LOG.md): one DRAM read of the row instead of two
    return dict(p, **(_long_row_in_registers(facts) or {}))


def _stream_chunks(facts: TaskFacts, tpr: int, vec: int) -> int:
    """Chunks a thread loads together on a row read once (su): 16 values (64 bytes fp32, 32 bytes
    bf16) where every thread of the row has that many full chunks, else 1. Such rows (argmax over
    a 32000-wide vocabulary, max over 1024 columns) also take blocks of at most 256 threads and
    ask for 1024 resident threads (64 registers).

    NOTE: ptxas -v (sm_90a): the 32000-wide bf16 argmax streamed by 1024 threads used 48
    registers, one resident block per SM: 16 KB in flight, and the SM idles while the block
    reduces its row. 256 threads x 2 chunks (54 registers, no spills) are 4 blocks and 32 KB in
    flight; fp32 256 x 4 chunks, 56 registers. Left to itself (occ=0) ptxas took 95-128 registers
    for 4 chunks; at 32 (occ=2048) it spilled. A row too short for every thread to have su full
    chunks keeps one (the 768-wide mean of silu(x) * s, where loading both of a thread's chunks
    first, held, measured 14.3 us against 12.7 us streamed)."""
    if not facts.single_pass:
        return 1
    return max(1, min(16 // vec, facts.ncol // (tpr * vec)))


def _mid_row_threads(facts: TaskFacts) -> int | None:
    """Threads per row for a register-held row of 4K-8K values that more than one pass reads (a
    GroupNorm's group of channels x pixels): the fewest that hold it, 32 packed 2-byte values or 16
    fp32 values a thread (256 or 512), None elsewhere (1024 then).

    NOTE: at 1024 threads and 64 registers a block per row is one resident block per SM, each
    with one row's 16-32 KB in flight, then two block-wide reductions before its stores; the
    512 rows of GroupNorm(32) on [16, 256, 32, 32] were ~4 such waves. 256-thread blocks (bf16) are
    4 resident per SM: all 512 rows in one wave; 512-thread blocks (fp32) 2 per SM, two waves."""
    n, cap = facts.ncol, facts.row_cap
    if facts.single_pass or not 256 * 16 < n or n % facts.vec16:
        return None
    if facts.packs_half and n <= 256 * cap:
        return 256
    if n <= 512 * 16:
        return 512
    return None


def _col_unroll(facts: TaskFacts) -> int:
    """Column mapping: 16 bytes of the narrowest input in flight per lane (4 fp32 steps, 8 bf16),
    so that 2048 resident lanes keep 32 KB per SM in flight (H100: ~3 TB/s x ~1 us over 132 SMs
    is ~23 KB), where one step's load (64-128 bytes a warp) keeps a quarter to half of that."""
    return max(4, min(8, facts.vec16))


def _long_row_in_registers(facts: TaskFacts) -> dict | None:
    """A row of 16K-32K fp32 values held by one 1024-thread block, 32 values a thread, one block per
    SM (occ=1024 caps 64 registers): read from DRAM once where streaming reads it twice (a softmax's
    statistics pass, then its output pass). ptxas fits the 32000-wide log_softmax in 62 registers
    without spills (-Xptxas -v, sm_90a). None for other rows.

        >>> _long_row_in_registers(facts_of_log_softmax_32000)
        {'tpr': 1024, 'rows_per_block': 1, 'vec': 4, 'nv': 8, 'online': False, 'welford': False, 'occ': 1024}
    """
    n, vec = facts.ncol, 4
    if facts.single_pass or facts.packs_half or not 16 * 1024 < n <= 32 * 1024 or n % vec:
        return None
    return {"tpr": 1024, "rows_per_block": 1, "vec": vec, "nv": -(-n // (1024 * vec)), "online": False,
            "welford": False, "occ": 1024}



def tags(m: ProgramMatch, params: dict) -> list[str]:
    facts = m.facts
    out = ["single_kernel_launch", "fuse_row_prologue_epilogue", "warp_shuffle_reduction",
           "warp_per_row" if params["tpr"] <= 32 else "block_per_row"]
    if params["nv"]:
        out.append("row_in_registers")
    if params["online"] and facts.has_softmax_pair:
        out.append("online_softmax")
    if params["welford"] and facts.has_welford_pair:
        out.append("welford_statistics")
    return out + access_tags(params, facts)


def retag(m: ProgramMatch, params: dict, tags: list[str]) -> list[str]:
    """Mapping tags follow the mapping actually used."""
    wpr, bpr = "warp_per_row", "block_per_row"
    tags = [t for t in tags if t not in (wpr, bpr)] + [wpr if params["tpr"] <= 32 else bpr]
    if not params["nv"]:
        tags = [t for t in tags if t != "row_in_registers"]
    return drop_scalar_tag(params, tags)


def refit(m: ProgramMatch, p: dict, moved: dict) -> dict:
    """A row kernel kept in registers must still hold the whole row after a move changed its
    threads per row or vector width: recompute NV (and narrow VEC) for the new mapping, unless the
    move set NV itself. NOTE: without this, warp_per_row on a 768-column row kept the NV of a
    128-thread row, covered 256 columns and fell back to the streaming path at run time.
    """
    facts = m.facts
    if not p.get("nv") or "nv" in moved:
        return p
    n = max(facts.ncol, 1)
    per_thread = -(-n // p["tpr"])
    vec = moved.get("vec", facts.vec16)      # 16-byte vectors unless the move chose a width
    while vec > 1 and (n % vec or vec > per_thread):
        vec //= 2
    nv = -(-per_thread // vec)
    cap = 16 if p["tpr"] * (p["rows_per_block"] if p["tpr"] <= 32 else 1) > 256 else 32   # values/thread
    if nv * vec > cap:     # too long for this mapping's registers: stream it, one pass where possible
        return dict(p, vec=vec, nv=0, online=facts.has_softmax_pair, welford=facts.has_welford_pair)
    return dict(p, vec=vec, nv=nv)


def valid(p: dict) -> bool:
    return (pow2_vec(p) and p["tpr"] <= 1024 and (p["tpr"] > 32 or p["tpr"] * p["rows_per_block"] <= 1024)
            and p.get("su", 1) >= 1 and p.get("col_unroll", 1) >= 1)


def grid(m: ProgramMatch, base: dict) -> list[dict]:
    """One knob at a time from the defaults first (the grid is cut at its limit), then mappings."""
    facts, out = m.facts, []
    for rpg in (2, 4):       # several rows in flight per group (short rows, few registers)
        out.append(dict(base, rpg=rpg))
    out += [dict(base, lazy=False), dict(base, memo=False), dict(base, occ=0)]
    if facts.has_transcendental:
        out.append(dict(base, fast=True))
    out.append(dict(base, nv=0, online=facts.has_softmax_pair, welford=facts.has_welford_pair))
    if not base["nv"]:       # streamed: chunks in flight per thread
        out += [dict(base, su=su) for su in (1, 2, 4) if su != base.get("su", 1)]
    # (32, 1): a one-warp block per row, the launch shape torch.compile's persistent
    # reductions took for the 768-wide LayerNorm and 512-wide softmax (ncu, H100)
    mappings = [(32, 1), (32, 4), (32, 8), (64, 1), (128, 1), (256, 1), (512, 1), (1024, 1)]
    for tpr, rpb in mappings:
        for packed in ((False, True) if facts.low_precision else (False,)):
            p = refit(m, dict(base, tpr=tpr, rows_per_block=rpb, nv=1, packed=packed), {"tpr": tpr})
            out += [dict(p, occ=occ) for occ in (1024, 0, 2048)]
    if has_column_mapping(m.program):    # (other sources do not read the column mapping's knobs)
        out += [dict(base, col_unroll=u) for u in (1, 2, 8 if base["col_unroll"] != 8 else 4)]
        if facts.has_welford_pair or facts.has_softmax_pair:
            out.append(dict(base, col_onepass=False))
    long_row = _long_row_in_registers(facts)
    if long_row:
        out.append(dict(base, **long_row))
    return out


TARGET = Target(
    kind="rowwise", match=match, defaults=defaults, tags=tags, retag=retag,
    start_order=("occupancy_tuning", "online_softmax", "welford_statistics", "block_per_row", "warp_per_row",
                 "hoist_broadcast_loads", "fp32_math_half_io", "row_in_registers", "read_only_cache_loads"),
    grid=grid, render=lambda m, params: generate(m.program, RowParams(**params), m.facts.low_precision),
    valid=valid, refit=refit)
