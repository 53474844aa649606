"""The row mapping's device code (rowwise.py): row_kernel, its passes over the row, and outer_finish.

A group of TPR threads owns a row; each pass over the row folds one reduction (or a merged online
softmax / Welford pair) into a thread's running state (rows.cuh: the fold functions), merged over
the group by group_reduce. Python emits only what varies per region: the expression code of each
pass (cuda.Emitter), the loads of the row's inputs and the stores of its outputs. FOLDS is the op
table of reductions: adding a reduction kind is a row there (and its fold in rows.cuh).

    >>> g = RowGen(prog, RowParams(tpr=32, rows_per_block=4, vec=4, nv=8), low_precision=False)
    >>> src = g.kernel()
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_htam.proposers.expert.cuda import CTYPE, DT, Emitter
from torch_htam.proposers.expert.ir import TRANSCENDENTAL, ExprProgram, program_value_type, stored, walk


@dataclass(frozen=True)
class Fold:
    """How one reduction family folds a row (C++ in rows.cuh / prelude.cuh): the state's type, its
    empty value (also group_reduce's identity: a float, or a struct's (field, value) pairs), the
    statement adding value {v} at column c to state {s}, the functor merging two states, and the
    row results the state gives (R{k}, R{k + 1}, ..: a merged pair gives two); index: an arg
    reduction's column (RI{k})."""
    state: str
    empty: str | tuple[tuple[str, str], ...]
    add: str
    op: str
    results: tuple[str, ...]
    index: str = ""


    def declare(self, name: str) -> str:
        """C++ declaring `name` as the empty state."""
        if isinstance(self.empty, str):
            return f"{self.state} {name} = {self.empty};"
        return f"{self.state} {name}; " + " ".join(f"{name}.{a} = {v};" for a, v in self.empty)

    def identity(self) -> tuple[str, str]:
        """(C++ declaring group_reduce's identity, its name); a float's is its literal."""
        return ("", self.empty) if isinstance(self.empty, str) else (self.declare("id"), "id")


def _plain(op: str, empty: str) -> Fold:
    return Fold("float", empty, f"{{s}} = {op}()({{s}}, {{v}});", op, ("{s}",))


# NOTE: these two folds are written out inline, not called as rows.cuh functions: ptxas scheduled
# the called forms differently (a few moved instructions in the streamed argmax / LayerNorm).
# columns come in increasing order, so ties keep the first
_ARG_ADD = "if ({s}.i < 0 || {v} CMP {s}.v || ({v} != {v} && {s}.v == {s}.v)) {{ {s}.v = {v}; {s}.i = c; }}"
_ARG_EMPTY = (("v", "0.f"), ("i", "-1"))
_WELFORD_ADD = ("{s}.n += 1.f; const float d_ = {v} - {s}.mean; {s}.mean += d_ / {s}.n; "
                "{s}.m2 += d_ * ({v} - {s}.mean);")
# reduction kind (ir.Reduction.kind) or merged pair (ir.Reduction.pair[0]) -> its fold
FOLDS = {
    "sum": _plain("SumOp", "0.f"), "max": _plain("MaxOp", "(-INFINITY)"),
    "min": _plain("MinOp", "INFINITY"), "prod": _plain("ProdOp", "1.f"),
    # (value, first column) states; NaN counts as the largest value, as in torch
    "argmax": Fold("ArgState", _ARG_EMPTY, _ARG_ADD.replace("CMP", ">"), "ArgMaxOp", ("{s}.v",), "{s}.i"),
    "argmin": Fold("ArgState", _ARG_EMPTY, _ARG_ADD.replace("CMP", "<"), "ArgMinOp", ("{s}.v",), "{s}.i"),
    # one pass: max and sum of exp(x - max); mean * n (the sum) and the sum of squared deviations
    "softmax": Fold("SoftmaxState", (("m", "-INFINITY"), ("s", "0.f")), "softmax_add<{fast}>({s}, {v});", "SmOp", ("{s}.m", "{s}.s")),
    "welford": Fold("WelfordState", (("n", "0.f"), ("mean", "0.f"), ("m2", "0.f")), _WELFORD_ADD, "WfOp",
                    ("{s}.mean * {s}.n", "{s}.m2")),
}


def fold_at(prog: ExprProgram, k: int, merge) -> Fold:
    """The fold computing reduction k, and k + 1 too where they are the halves of a pair (softmax,
    welford) that merge(pair kind) allows in one pass."""
    reds = prog.reductions
    red, nxt = reds[k], (reds[k + 1] if k + 1 < len(reds) else None)
    if red.pair and red.pair[1] == 0 and nxt is not None and nxt.pair == (red.pair[0], 1) and merge(red.pair[0]):
        return FOLDS[red.pair[0]]
    return FOLDS[red.kind]


def fold_results(f: Fold, k: int, s: str = "acc") -> str:
    """C++ setting R{k}.. (and RI{k}) from the merged state s."""
    out = " ".join(f"R{k + j} = {r.format(s=s)};" for j, r in enumerate(f.results))
    return out + (f" RI{k} = {f.index.format(s=s)};" if f.index else "")


def fold_decl(f: Fold, k: int) -> str:
    names = ", ".join(f"R{k + j}" for j in range(len(f.results)))
    return f"float {names};" + (f" int RI{k};" if f.index else "")


def indent(lines, pad: str) -> str:
    return "\n".join(pad + ln for ln in lines)


class RowGen:
    """Device code of one row program under one RowParams."""

    def __init__(self, prog: ExprProgram, p, low_precision: bool):
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
        self.nc = "true" if p.nc else "false"

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

    def setup(self, pad: str = "  ") -> str:
        """Declares cs (and cso, cm for two-dim rows) from sp."""
        if not self.row2:
            return (f"{pad}int64_t cs[NACC];\n#pragma unroll\n"
                    f"{pad}for (int a = 0; a < NACC; ++a) cs[a] = sp.st[a][sp.ndim - 1];")
        return (f"{pad}int64_t cs[NACC], cso[NACC]; bool cm[NACC];\n#pragma unroll\n"
                f"{pad}for (int a = 0; a < NACC; ++a) {{\n"
                f"{pad}  cs[a] = sp.st[a][sp.ndim - 1];\n"
                f"{pad}  cso[a] = inner > 0 ? sp.st[a][sp.ndim - 2] : 0;\n"
                f"{pad}  cm[a] = inner == 0 || cso[a] == cs[a] * inner;\n{pad}}}")

    @property
    def kept_top(self) -> str:
        """The last kept dim of sp (the dims after it are the row)."""
        return "sp.ndim - 2 - (inner > 0)" if self.row2 else "sp.ndim - 2"

    @property
    def ncol_params(self) -> str:
        return "int ncol, int inner" if self.row2 else "int ncol"

    def params(self) -> str:
        """The kernels' pointer parameters: accesses p*, outputs o*."""
        prog = self.prog
        ps = [f"const {self.dt(i)}::raw* __restrict__ p{i}" for i in range(len(prog.accesses))]
        return ", ".join(ps + [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)])

    def dt(self, i: int) -> str:
        return DT[self.prog.inputs[self.prog.accesses[i].input][1]][0]

    def words(self, i: int) -> str:
        """C size of input i's packed chunk: VEC values in 32-bit words."""
        return f"(VEC + {self.dt(i)}::PER_WORD - 1) / {self.dt(i)}::PER_WORD"

    def packed_late(self, i: int) -> bool:
        """Late (final-pass) loads of 2-byte inputs stay raw words too when packed."""
        return self.p.packed and self.dt(i) != "F32"

    def merges(self, pair: str) -> bool:
        """The row mapping folds a softmax / Welford pair in one pass (online, welford)."""
        return self.p.online if pair == "softmax" else self.p.welford

    def passes(self) -> list[list[tuple]]:
        """The expressions each pass over the row evaluates per column, in order (a merged
        online-softmax / Welford pair is one pass; the final pass computes the full-row outputs)."""
        out, k, reds = [], 0, self.prog.reductions
        while k < len(reds):
            out.append([reds[k].expr])    # a merged pair's second value needs the first's result
            k += len(fold_at(self.prog, k, self.merges).results)
        return out + [[stored(o.expr, o.dtype) for o in self.prog.outputs if not o.row and not o.total]]

    def emitter(self, regs: bool, at: int | None = None) -> Emitter:
        """at: the pass being emitted; memoized values computed in an earlier pass are read back."""
        # NOTE: bool values (masks, comparisons) are declared bool; a bool input's float-lane load
        # (0.f / 1.f) converts to the same bool where one is used
        em = Emitter(lambda a: self.load_name(a, regs), red=lambda k: f"R{k}", fast=self.p.fast,
                     low_precision=self.lowp, vt=self.vt)
        if regs and at is not None:
            for k, (e, first) in enumerate(self.memo):
                if first < at:
                    em.names[e] = f"m{k}[q][e]"
        return em

    def load_name(self, a: int, regs: bool) -> str:
        """The C++ value of access a at column c inside a loop body."""
        if a in self.fixed:
            return f"s{a}"
        t = self.dt(a)
        if regs and a in self.late and self.packed_late(a):
            return f"{t}::from_word(x{a}[e / {t}::PER_WORD], e % {t}::PER_WORD)"
        if not regs or a in self.late:
            return f"x{a}[e]"
        return (f"{t}::from_word(x{a}[g][q][e / {t}::PER_WORD], e % {t}::PER_WORD)" if self.p.packed
                else f"x{a}[g][q][e]")

    def memo_stores(self, em: Emitter, at: int) -> str:
        return "".join(f"\n          m{k}[q][e] = {em.emit(e)};" for k, (e, first) in enumerate(self.memo)
                       if first == at)

    # ---- loops over the columns a thread owns ----
    def loop(self, regs: bool, body: str, after: str = "", late: bool = False) -> str:
        """Runs body for every column c owned by this thread (x*[..][e] hold the inputs at c), then
        `after` once per chunk of VEC columns starting at c0. late: load the late inputs per chunk."""
        if regs:
            return self._reg_loop(body, after, self._late_loads() if late and self.late else "")
        if self.p.su > 1:
            return self._stream_loop(body, after)
        loads = "\n".join(self.load_chunk(i, f"x{i}", "c0") for i in self.varying)
        decl = " ".join(f"float x{i}[VEC];" for i in self.varying)
        return f"""
    for (int c0 = lane * VEC; c0 < ncol; c0 += TPR * VEC) {{
      {decl}
{loads}
{self._columns(body, "      ")}
{after}
    }}"""

    def _late_loads(self) -> str:
        decl = " ".join((f"unsigned x{i}[{self.words(i)}];" if self.packed_late(i) else f"float x{i}[VEC];")
                        for i in self.late)
        return decl + "\n" + "\n".join(self.load_chunk(i, f"x{i}", "c0", self.packed_late(i)) for i in self.late)

    @staticmethod
    def _columns(body: str, pad: str) -> str:
        """body for the VEC columns c = c0 + e of a chunk. NOTE: no bounds test per element: VEC > 1
        only where the host saw ncol % VEC == 0 (a chunk is all in or all out)."""
        return (f"#pragma unroll\n{pad}for (int e = 0; e < VEC; ++e) {{\n"
                f"{pad}  const int c = c0 + e;\n{pad}  (void)c;\n{body}\n{pad}}}")

    def _reg_loop(self, body: str, after: str, late_loads: str) -> str:
        return f"""
#pragma unroll
    for (int q = 0; q < NV; ++q) {{
      const int c0 = (q * TPR + lane) * VEC;
      if (c0 < ncol) {{
{late_loads}
{self._columns(body, "        ")}
{after}
      }}
    }}"""

    def _stream_loop(self, body: str, after: str) -> str:
        """The streaming loop with SU chunks per step: a thread's SU chunks (columns c0, c0 + TPR *
        VEC, ..) are all loaded before the first is reduced, so SU loads are in flight where the
        one-chunk loop has one (its next load waits for the reduction of the current chunk).
        Chunks are still reduced in column order."""
        su = self.p.su
        loads = "\n".join(self.load_chunk(i, f"x{i}_[s_]", "c0") for i in self.varying)
        decl = " ".join(f"float x{i}_[{su}][VEC];" for i in self.varying)
        alias = " ".join(f"float (&x{i})[VEC] = x{i}_[s_];" for i in self.varying)
        head = f"""
    for (int cb_ = lane * VEC; cb_ < ncol; cb_ += TPR * VEC * {su}) {{
      {decl}
#pragma unroll
      for (int s_ = 0; s_ < {su}; ++s_) {{
        const int c0 = cb_ + s_ * TPR * VEC;
        if (c0 < ncol) {{
{loads}
        }}
      }}"""
        return head + f"""
#pragma unroll
      for (int s_ = 0; s_ < {su}; ++s_) {{
        const int c0 = cb_ + s_ * TPR * VEC;
        if (c0 < ncol) {{
          {alias}
{self._columns(body, "          ")}
{after}
        }}
      }}
    }}"""

    def load_chunk(self, i: int, dst: str, c0: str, packed: bool = False, ro: str = "ro") -> str:
        """VEC values of access i at columns c0.. into dst: floats, or 32-bit words of raw bits
        (PER_WORD values each) when packed. ro: the row's element offsets (one per access)."""
        t, nc = self.dt(i), self.nc
        at = f"p{i}[{ro}[{i}] + {self.coff(i, c0 + ' + e')}]"
        if packed:
            shift = "(8 * (e % 4))" if t == "B8" else "16"
            return (f"      if (VEC > 1 && {self.unit(i)}) ldw<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                    f"      else for (int e = 0; e < VEC; ++e) {{\n"
                    f"        const unsigned b = (VEC == 1 || {c0} + e < ncol) ? {t}::bits({at}) : 0u;\n"
                    f"        if (e % {t}::PER_WORD == 0) {dst}[e / {t}::PER_WORD] = b;\n"
                    f"        else {dst}[e / {t}::PER_WORD] |= b << {shift}; }}")
        return (f"      if (VEC > 1 && {self.unit(i)}) ldv<{t}, VEC, {nc}>(p{i} + {ro}[{i}] + {c0}, {dst});\n"
                f"      else for (int e = 0; e < VEC; ++e) {dst}[e] = (VEC == 1 || {c0} + e < ncol) ? "
                f"ld1<{t}, {nc}>(p{i} + {ro}[{i}] + {self.coff(i, c0 + ' + e')}) : 0.f;")

    # ---- the passes of one row ----
    def fold_body(self, f: Fold, v: str, lines: str) -> str:
        """A loop body adding v (computed by lines) to the state acc."""
        return f"{lines}\n          {f.add.format(s='acc', v=v, fast='true' if self.p.fast else 'false')}"

    def reduction_pass(self, k: int, regs: bool, at: int) -> tuple[str, int]:
        """Code computing R{k} (and R{k+1} for merged pairs) as pass `at`; returns (code,
        reductions consumed)."""
        f = fold_at(self.prog, k, self.merges)
        em = self.emitter(regs, at)
        v = em.emit(self.prog.reductions[k].expr)
        lines = indent(em.lines, "          ") + (self.memo_stores(em, at) if regs else "")
        code = f"""
    {fold_decl(f, k)}
    {{
      {f.declare("acc")}
{self.loop(regs, self.fold_body(f, v, lines))}
      {f.identity()[0]}
      acc = group_reduce<TPR>(acc, {f.op}(), {f.identity()[1]});
      {fold_results(f, k)}
    }}"""
        return code, len(f.results)

    def final_pass(self, regs: bool, at: int) -> str:
        em = self.emitter(regs, at)
        full = [(k, o) for k, o in enumerate(self.prog.outputs) if not o.row and not o.total]
        if not full:
            return ""
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in full]
        sets = "\n".join(f"          y{k}[e] = {n};" for (k, _), n in zip(full, names))
        # outputs are contiguous: row r starts at r * ncol; VEC > 1 only when the host checked
        # ncol % VEC == 0 and 16-byte alignment of every output.
        stores = "\n".join(self.store(k, o) for k, o in full)
        decl = " ".join(f"float y{k}[VEC];" for k, _ in full)
        body = indent(em.lines, "          ") + "\n" + sets
        return f"    {{\n    {decl}\n{self.loop(regs, body, stores, late=True)}\n    }}"

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

    def row_offsets(self, ro: str, r: str, pad: str) -> str:
        """C++ setting ro[a], the element offset of row r's first column for every access a: r's
        coordinates along the kept dims of sp (the last fastest) times their strides."""
        lines = [f"int64_t rem = {r};", "#pragma unroll", f"for (int a = 0; a < NACC; ++a) {ro}[a] = 0;",
                 f"for (int d = {self.kept_top}; d >= 0; --d) {{", "  const int64_t i = rem % sp.size[d];",
                 "  rem /= sp.size[d];", "#pragma unroll", f"  for (int a = 0; a < NACC; ++a) {ro}[a] += i * sp.st[a][d];",
                 "}"]
        return "\n".join(ln if ln.startswith("#") else pad + ln for ln in lines)

    def fixed_type(self, i: int) -> str:
        """C++ type of a per-row load of access i: integers (a per-row index) stay long long."""
        return "long long" if self.dt(i) in ("I64", "I32") else "float"

    def fixed_load(self, i: int, ptr: str, nc: str = "false") -> str:
        if self.dt(i) in ("I64", "I32"):
            return f"{self.dt(i)}::to_v(*({ptr}))"
        return f"ld1<{self.dt(i)}, {nc}>({ptr})"

    def fixed_loads(self, pad: str) -> str:
        """The row's per-row values s*, read at the row's offsets ro."""
        return "\n".join(f"{pad}const {self.fixed_type(i)} s{i} = {self.fixed_load(i, f'p{i} + ro[{i}]')};"
                         for i in self.fixed)

    def load_at(self, i: int, col: str) -> str:
        """Access i of this row at column `col` (a gather's index): NaN outside the row, where torch
        raises (an index out of range)."""
        return (f"(({col}) >= 0 && ({col}) < ncol ? ld1<{self.dt(i)}, false>(p{i} + ro[{i}] + "
                f"{self.coff(i, f'({col})')}) : NAN)")

    def row_outputs(self, cond: str = "valid && lane == 0") -> str:
        """Per-row outputs and this group's sums over rows, by one thread of the row (cond)."""
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
        stores = "\n".join(f"      o{k}[r] = {self.converted(o, n, direct=o.expr[0] == 'idx')};"
                           for (k, o), n in zip(rows, names))
        return f"\n    if ({cond}) {{\n{indent(em.lines, '      ')}\n{stores}{adds}\n    }}"

    @staticmethod
    def converted(o, n: str, direct: bool = False) -> str:
        """Value n as output o's element type."""
        t = DT[o.dtype][0]
        return n if direct else f"{t}::from_v({n})" if t in ("I64", "I32") else f"{t}::from_f({n})"

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

    # ---- row_kernel<VEC, NV>: NV > 0 holds the row in registers, 0 streams it ----
    def kernel(self) -> str:
        prog, p = self.prog, self.p
        bounds = f"BLOCK, {max(1, p.occ // p.block)}" if p.occ > 0 else "BLOCK"
        head = f"""
#define NACC {len(prog.accesses) + len(self.ostride)}
#define TPR {p.tpr}
#define BLOCK {p.block}
#define RPG {p.rpg}
template <int VEC, int NV>
__global__ void __launch_bounds__({bounds}) row_kernel(Space<NACC> sp, int64_t rows, {self.ncol_params},
    {self.params()}{", void* __restrict__ ows" if prog.outer else ""}) {{
  const int lane = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int64_t rpb = BLOCK / TPR * RPG;     // rows per block and trip
{self.setup()}{self.outer_decl()}"""
        return head + f"""
  // NOTE: the trip count is uniform over the block (rows past the end are clamped to the last row
  // and store nothing), so every thread reaches every shuffle and __syncthreads.
  for (int64_t rb = (int64_t)blockIdx.x * rpb; rb < rows; rb += (int64_t)gridDim.x * rpb) {{
{self._group_rows()}
    if (NV > 0) {{
{self._reg_rows()}
    }} else {{
{self._rows(False)}
    }}
  }}{self.outer_store()}
}}
"""

    def _group_rows(self) -> str:
        """The RPG rows of this thread group: r_, valid_, their offsets ro_ and per-row values s*_."""
        nc = self.nc
        fixed = "\n".join(f"      s{i}_[g] = {self.fixed_load(i, f'p{i} + ro_[g][{i}]', nc)};" for i in self.fixed)
        fixed_decl = " ".join(f"{self.fixed_type(i)} s{i}_[RPG];" for i in self.fixed)
        flat = "sp.ndim - (inner > 0) == 2" if self.row2 else "sp.ndim == 2"
        return f"""    int64_t r_[RPG], ro_[RPG][NACC];
    bool valid_[RPG];
    {fixed_decl}
#pragma unroll
    for (int g = 0; g < RPG; ++g) {{
      valid_[g] = rb + group * RPG + g < rows;
      r_[g] = valid_[g] ? rb + group * RPG + g : rows - 1;
      if ({flat}) {{    // rows x columns after collapsing: no 64-bit division (a call) per row
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro_[g][a] = r_[g] * sp.st[a][0];
      }} else {{
{self.row_offsets("ro_[g]", "r_[g]", "        ")}
      }}
{fixed}
    }}"""

    def _reg_rows(self) -> str:
        """Register path: every row's held inputs are loaded before any row is reduced."""
        p = self.p
        reg_loads = "\n".join(self.load_chunk(i, f"x{i}[g][q]", "c0", p.packed, ro="ro_[g]")
                              .replace("\n", "\n    ") for i in self.held)
        reg_decl = " ".join((f"unsigned x{i}[RPG][NV > 0 ? NV : 1][{self.words(i)}];" if p.packed
                             else f"float x{i}[RPG][NV > 0 ? NV : 1][VEC];") for i in self.held)
        return f"""      {reg_decl}
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
{self._rows(True)}"""

    def _rows(self, regs: bool) -> str:
        # NOTE: each row of the group runs the single-row body under the names it was written with
        # (r, valid, ro, s*); g is a compile-time index after unrolling, so nothing leaves registers.
        alias = " ".join(f"const {self.fixed_type(i)} s{i} = s{i}_[g];" for i in self.fixed)
        return f"""#pragma unroll
      for (int g = 0; g < RPG; ++g) {{
      const int64_t r = r_[g]; const bool valid = valid_[g]; int64_t ro[NACC];
#pragma unroll
      for (int a = 0; a < NACC; ++a) ro[a] = ro_[g][a];
      {alias}
{self.body(regs)}
      }}"""

    # ---- sums over rows (ir.ExprProgram.outer): each thread group's lane 0 adds its rows' values in
    # row order; after its last row it writes the partial to slot (block, group) of the workspace
    # (8 bytes a slot, one run of slots per sum); outer_finish adds the slots in order.
    def _outer_ct(self, j: int) -> str:
        return CTYPE["f" if self.vt(self.prog.outer[j].expr) == "f" else "i"]

    def outer_decl(self) -> str:
        return "".join(f"\n  {self._outer_ct(j)} oacc{j} = 0;" for j in range(len(self.prog.outer)))

    def outer_store(self) -> str:
        if not self.prog.outer:
            return ""
        st = "".join(f"\n    (({self._outer_ct(j)}*)((char*)ows + {j} * slots * 8))[slot] = oacc{j};"
                     for j in range(len(self.prog.outer)))
        return (f"\n  {{\n    const int64_t slots = (int64_t)gridDim.x * (BLOCK / TPR);\n"
                f"    const int64_t slot = (int64_t)blockIdx.x * (BLOCK / TPR) + group;\n"
                f"    if (lane == 0) {{{st}\n    }}\n  }}")

    def outer_finish(self) -> str:
        """One block of 1024 threads: each sum's slots added in a fixed order (rows.cuh:
        outer_total), then the total outputs, computed and stored by thread 0."""
        prog = self.prog
        params = [f"{DT[o.dtype][0]}::raw* __restrict__ o{k}" for k, o in enumerate(prog.outputs)]
        sums = "".join(f"\n  const {self._outer_ct(j)} T{j} = outer_total<{self._outer_ct(j)}, {j}>(ows, slots);"
                       for j in range(len(prog.outer)))
        em = Emitter(lambda a: "0.f", red=lambda k: "0.f", prefix="v", vt=self.vt, outer=lambda j: f"T{j}")
        totals = [(k, o) for k, o in enumerate(prog.outputs) if o.total]
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in totals]
        stores = "\n".join(f"    o{k}[0] = {self.converted(o, n)};" for (k, o), n in zip(totals, names))
        return f"""
__global__ void __launch_bounds__(1024) outer_finish(int64_t slots, int64_t rows, const void* __restrict__ ows,
    {", ".join(params)}) {{{sums}
  if (threadIdx.x == 0) {{
{indent(em.lines, "    ")}
{stores}
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
