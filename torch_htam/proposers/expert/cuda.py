"""CUDA text shared by the generators: the device prelude (dtype traits, vector loads/stores, group
reductions) and the expression emitter (ir expression tuples -> straight-line fp32 C++).

    >>> em = Emitter(load=lambda a: f"x{a}", red=lambda r: f"R{r}")
    >>> em.emit(("gelu_tanh", ("in", 0))); em.lines
    ['const float t0 = htam_gelu_tanh(x0);']
"""
from __future__ import annotations

import math
from pathlib import Path



def cuh(name: str) -> str:
    """The text of a .cuh file next to this module. Generated sources are single files (the build
    has no include path for these), so a kernel pastes the C++ it needs instead of #including it."""
    return Path(__file__).with_name(name).read_text()


PRELUDE = cuh("prelude.cuh")

# dtype name -> (trait struct in prelude.cuh, HtamDtype code, bytes)
DT = {"float32": ("F32", "HTAM_FLOAT32", 4), "bfloat16": ("BF16", "HTAM_BFLOAT16", 2),
      "float16": ("F16", "HTAM_FLOAT16", 2), "int64": ("I64", "HTAM_INT64", 8),
      "int32": ("I32", "HTAM_INT32", 4), "bool": ("B8", "HTAM_BOOL", 1)}
# value type (ir.value_type) -> the C++ type a kernel computes it in
CTYPE = {"f": "float", "i": "long long", "b": "bool"}

# expression op -> C++ (fp32 in, fp32 out); "fast" variants use the SFU intrinsics
EXACT = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "relu": "({0} < 0.f ? 0.f : {0})", "max": "htam_max({0}, {1})",
    "min": "htam_min({0}, {1})", "gelu_erf": "htam_gelu_erf({0})", "gelu_tanh": "htam_gelu_tanh({0})",
    "silu": "({0} / (1.f + expf(-{0})))", "sigmoid": "(1.f / (1.f + expf(-{0})))",
    "tanh": "tanhf({0})", "exp": "expf({0})", "log": "logf({0})", "sqrt": "sqrtf({0})",
    "rsqrt": "rsqrtf({0})", "abs": "fabsf({0})", "recip": "(1.f / {0})", "erf": "erff({0})",
    "sin": "sinf({0})", "cos": "cosf({0})", "log1p": "log1pf({0})", "expm1": "expm1f({0})",
    "sq": "({0} * {0})", "powc": "powf({0}, {1})", "pow": "powf({0}, {1})",
    "exp2": "exp2f({0})", "log2": "log2f({0})", "tan": "tanf({0})", "erfc": "erfcf({0})",
    "floor": "floorf({0})", "ceil": "ceilf({0})", "trunc": "truncf({0})", "rint": "rintf({0})",
    "sign": "htam_signf({0})", "fmod": "fmodf({0}, {1})", "mod": "htam_modf({0}, {1})",
    "floordiv": "floorf({0} / {1})",
    # torch's xlogy: NaN y gives NaN, else x == 0 gives 0 (even for y == 0)
    "xlogy": "(isnan({1}) ? NAN : {0} == 0.f ? 0.f : {0} * logf({1}))",
    # selection, comparisons and logic (operands of one value type, ir inserts the casts)
    "select": "({0} ? {1} : {2})", "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})",
    "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})", "and": "({0} && {1})",
    "or": "({0} || {1})", "xor": "({0} != {1})", "not": "(!{0})", "isnan": "isnan({0})",
    "isinf": "isinf({0})",
}
# integer operands ("i" values, long long): where the float spelling would be wrong
INT = {
    "max": "htam_imax({0}, {1})", "min": "htam_imin({0}, {1})", "abs": "({0} < 0 ? -{0} : {0})",
    "relu": "({0} < 0 ? 0LL : {0})", "sign": "(long long)(({0} > 0) - ({0} < 0))",
    "mod": "htam_imod({0}, {1})", "floordiv": "htam_ifloordiv({0}, {1})",
    "fmod": "({1} == 0 ? 0LL : {0} % {1})", "band": "({0} & {1})", "bor": "({0} | {1})",
    "bxor": "({0} ^ {1})", "bnot": "(~{0})",
}
CASTS = {"f": "((float)({0}))", "i": "((long long)({0}))", "b": "({0} != 0)"}
FAST = dict(EXACT, **{
    "div": "__fdividef({0}, {1})", "silu": "__fdividef({0}, 1.f + __expf(-{0}))",
    "sigmoid": "__fdividef(1.f, 1.f + __expf(-{0}))", "exp": "__expf({0})", "log": "__logf({0})",
    "gelu_tanh": "htam_gelu_tanh_fast({0})",
})
# NOTE: tanh.approx.f32 has ~2^-11 relative error: fine for bf16/fp16 (2e-2), not for fp32 (1e-4).
FAST_LOWP = dict(FAST, **{"tanh": "htam_tanh_approx({0})",
                          "gelu_tanh": "htam_gelu_tanh_approx({0})"})


def c_float(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    r = repr(float(v))
    return f"{r}f" if ("e" in r or "." in r) else f"{r}.f"


def _row_uniform(e) -> bool:
    """True for an expression of row reductions and constants only, with a reduction in it."""
    def walk(x) -> tuple[bool, bool]:       # (uniform, has a reduction)
        if not isinstance(x, tuple):
            return True, False
        if x[0] == "red":
            return True, True
        if x[0] in ("const", "ncol"):
            return True, False
        if x[0] == "in":
            return False, False
        parts = [walk(a) for a in (x[2:] if x[0] == "round" else x[1:])]
        return all(u for u, _ in parts), any(r for _, r in parts)
    uniform, has_red = walk(e)
    return uniform and has_red


class Emitter:
    """Emits `const float tN = ...;` lines for expressions, once per distinct sub-expression.
    load(access_id) / red(reduction_id) give the C++ names of loaded inputs and row results;
    load_at(access_id, column) the C++ load of an input at another column of the row (a gather's
    source, read at its index: row kernels' per-row outputs)."""

    def __init__(self, load, red, fast: bool = False, low_precision: bool = False, prefix="t", vt=None,
                 coord=None, load_at=None, outer=None):
        # vt: expression -> value type ("f" | "i" | "b", ir.value_type); None: every value is float.
        # coord(d): the C++ name of the index along iteration dim d (elementwise kernels only)
        # outer(j): the C++ name of a sum over rows (a row program's total outputs)
        self.load, self.red, self.prefix, self.coord = load, red, prefix, coord
        self.load_at, self.outer = load_at, outer
        self.vt = vt or (lambda e: "f")
        self.table = (FAST_LOWP if low_precision else FAST) if fast else EXACT
        self.lines: list[str] = []
        self.names: dict[tuple, str] = {}

    def emit(self, e: tuple) -> str:
        if e in self.names:
            return self.names[e]
        op = e[0]
        if op == "const":
            return c_float(e[1])
        if op == "iconst":
            return f"{int(e[1])}LL"
        if op == "bconst":
            return "true" if e[1] else "false"
        if op == "ncol":          # row kernels only: the run-time row length
            return "((float)ncol)"
        if op == "coord":
            if self.coord is None:
                raise ValueError("a coordinate in a kernel without coordinates")
            return self.coord(e[1])
        if op == "nrows":         # row kernels' total outputs: the run-time number of rows
            return "((float)rows)"
        if op == "outer":
            return self.outer(e[1])
        if op == "in":
            name = self.load(e[1])
        elif op == "red":
            name = self.red(e[1])
        elif op == "gather":
            name = self.gather(e)
        else:
            if op == "round" and e[1] == "int32":       # int32 wraps: keep the low 32 bits
                code = f"((long long)(int)({self.emit(e[2])}))"
            elif op == "round":
                code = f"{DT[e[1]][0]}::round({self.emit(e[2])})"
            elif op == "cast":
                code = CASTS[e[1]].format(self.emit(e[2]))
            elif op in INT and self.vt(e[1]) == "i":
                code = INT[op].format(*[self.emit(a) for a in e[1:]])
            elif op == "div" and self.table is EXACT and _row_uniform(e[2]):
                # NOTE: x / R (R a row's sum, norm, ...) as x * (1/R): the reciprocal is loop-
                # invariant and hoisted out of the row loop, where an IEEE divide costs ~10
                # instructions per element (within 1.5 ulp of x / R; every policy allows far more).
                code = f"({self.emit(e[1])} * (1.f / {self.emit(e[2])}))"
            else:
                code = self.table[op].format(*[self.emit(a) for a in e[1:]])
            name = f"{self.prefix}{len(self.lines)}"
            self.lines.append(f"const {CTYPE[self.vt(e)]} {name} = {code};")
        self.names[e] = name
        return name

    def gather(self, e: tuple) -> str:
        """("gather", src, index): src's expression with every load at column `index` (its own
        names: the same sub-expression at the row's columns is another value)."""
        if self.load_at is None:
            raise ValueError("gather needs load_at (a row kernel's per-row outputs)")
        col = self.emit(e[2])
        sub = Emitter(lambda a: self.load_at(a, col), self.red, prefix=f"{self.prefix}g{len(self.lines)}_",
                      vt=self.vt)
        sub.table = self.table
        name = sub.emit(e[1])
        self.lines += sub.lines
        return name
