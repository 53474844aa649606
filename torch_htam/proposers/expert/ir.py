"""Aten graph -> ExprProgram, a small fused-kernel program: expressions per output element, row
reductions, accesses.

The program says *what* one thread computes; elementwise.py / rowwise.py say *how* threads are mapped.
Every value is addressed relative to the iteration space `shape` (the output shape for elementwise
programs; for row programs the reduced tensor's shape with its kept dims first and its reduced dims
last, the last `nred` dims being the row: sum over dim 1 of [B, C, HW] iterates [B, HW, C], a
GroupNorm [N, G, C / G, pixels]). Each read of
an input is an Access: which input dims line up with which iteration dims (broadcast dims -> -1),
or "flat" (contiguous input read in iteration order through a reshape), or "suffix" (contiguous
input repeating along the flat order, e.g. a bias after a reshape). The kernel turns accesses into
per-iteration-dim strides at run time from the real sizes, so nothing of the example shape is baked
in except what the graph's own view ops fix.

Expressions are hash-consed tuples (CSE for free):
    ("in", access_id)  ("const", float)  ("red", reduction_id)  ("ncol",) (row length at run time)
    ("round", dtype, e)  (op, e1, e2...)

    >>> prog = lower(task.graph)          # raises Unsupported("aten.permute: ...") when it can't
    >>> prog.kind, prog.shape, len(prog.reductions)
    ('rowwise', (8, 512, 768), 2)
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_htam import ops
from torch_htam.proposers.expert import simplify as simp

aten = torch.ops.aten

SUPPORTED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                    # NOTE: bool values (masks, comparisons) are 0 / 1, exact in the fp32 math
                    torch.bool: "bool"}
# int64 is only ever an index a row program writes (argmax, max.dim's indices): never math on it
INDEX_DTYPES = {torch.int64: "int64"}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


# The row length, read at run time (never the captured size): mean = sum / NCOL.
NCOL = ("ncol",)


class Unsupported(Exception):
    """The graph uses something the expert generator does not handle; the message says what."""


@dataclass(frozen=True)
class Access:
    """One way an input is read. mode: "dims" (dims[k] = iteration dim of input dim k, -1 = size-1
    broadcast), "flat" (contiguous, numel == iteration numel, read at the linear index),
    "suffix" (contiguous, read at linear index % numel) or "span" (contiguous, its elements in
    order over iteration dims dims[0]..dims[1]: a GroupNorm's per-channel weight over (group,
    channel in group))."""
    input: int
    mode: str
    dims: tuple[int, ...] = ()

    def column_varying(self, ndim: int, nred: int = 1) -> bool:
        """The access moves along the row (the last nred iteration dims)."""
        return self.mode != "dims" or any(d >= ndim - nred for d in self.dims)


@dataclass(frozen=True)
class Reduction:
    """A reduction over the row (the last nred iteration dims). kind: sum | max | min | prod |
    argmax | argmin (the arg kinds also give the first index of the extreme: ("idx", k)). pair:
    ("softmax"|"welford", role 0|1) when this reduction and the next one form an online-softmax or
    Welford pair."""
    kind: str
    expr: tuple
    pair: tuple[str, int] | None = None


@dataclass
class Output:
    """row=True: one value per row (shape = the kept dims, keepdim or not). dims: None when the
    output is contiguous in iteration order; else the iteration dim of each output dim (a full
    output of a row program whose reduced dims are not the trailing ones: stored strided)."""
    expr: tuple
    dtype: str
    row: bool
    numel_static: int
    dims: tuple[int, ...] | None = None


@dataclass
class ExprProgram:
    """The lowered program of a fused elementwise or row region: per-element output expressions over
    input accesses, and the row reductions they read (what lower returns)."""
    kind: str                          # "elementwise" | "rowwise"
    shape: tuple[int, ...]             # iteration shape at capture (sizes are read at run time)
    inputs: list[tuple[tuple[int, ...], str]]   # (shape, dtype) per task input
    accesses: list[Access] = field(default_factory=list)
    reductions: list[Reduction] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    # tensor whose run-time sizes give the iteration shape: (kind, index) read in order, or
    # (kind, index, dims) with dims[k] the iteration dim of the tensor's dim k
    size_source: tuple = ("out", 0)
    nred: int = 1                      # rowwise: the row is the last nred iteration dims
    dropped: list[str] = field(default_factory=list)   # no-op ops removed by simplify
    has_transcendental: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def strided_outputs(self) -> list[int]:
        """Indices of the outputs stored through strides (Output.dims), in order."""
        return [k for k, o in enumerate(self.outputs) if o.dims is not None]


# ---- op tables ------------------------------------------------------------------------------------

def _lowered(operands: int) -> dict:
    """aten overload -> expression op name (cuda.py gives each its C++), from the op registry."""
    return {getattr(getattr(aten, name), o): row.expr for name, row in ops.OPS.items()
            if row.expr and row.operands == operands for o in row.overloads}


UNARY = {**_lowered(1),
         # NOTE: conv blocks' in-place activations (nn.ReLU(inplace=True)), as graphs that did not
         # go through capture.functionalize still hold them; the kernel writes a new output
         **{getattr(aten, f"{name}_").default: ops.OPS[name].expr for name in ("relu", "silu")}}
BINARY = _lowered(2)
TERNARY = _lowered(3)      # where(cond, a, b), masked_fill(x, mask, value)
BOOL_VALUED = {"eq", "ne", "lt", "le", "gt", "ge", "not", "and", "or"}
# ops that only relabel elements (same order for contiguous data) or do nothing in eval
VIEWS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
    aten.expand.default, aten.alias.default, aten.clone.default, aten.contiguous.default,
    aten.detach.default, aten.dropout.default, aten.lift_fresh_copy.default,
}
CASTS = {aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default}
ROW_REDUCE = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "max",
              aten.amin.default: "min", aten.sum.default: "sum", aten.mean.default: "mean",
              aten.prod.dim_int: "prod", aten.prod.default: "prod", aten.max.default: "max",
              aten.min.default: "min", aten.argmax.default: "argmax", aten.argmin.default: "argmin",
              aten.var.dim: "var", aten.var.correction: "var", aten.std.dim: "std",
              aten.std.correction: "std", aten.logsumexp.default: "logsumexp",
              aten.linalg_vector_norm.default: "norm"}
# (values, indices) pairs read through getitem
ROW_PAIRS = {aten.max.dim: "argmax", aten.min.dim: "argmin"}
NORMS = {aten.layer_norm.default, aten.rms_norm.default, aten.instance_norm.default,
         aten.group_norm.default}
ROW_OPS = {aten.softmax.int, aten._softmax.default, aten.log_softmax.int,
           aten._log_softmax.default, *NORMS}
IGNORED = {aten._assert_tensor_metadata.default}
TRANSCENDENTAL = {"gelu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "log", "erf", "sin",
                  "cos", "log1p", "expm1", "pow", "powc"}


def meta_of(node) -> Any:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if val is None:
        raise Unsupported(f"node {node} has no meta['val'] (shape/dtype unknown)")
    return val


def shape_of(node) -> tuple[int, ...]:
    return tuple(int(s) for s in meta_of(node).shape)


def dtype_of(node, index_ok: bool = False) -> str:
    """The value's dtype name; index_ok: an int64 index (arg reductions) is allowed here."""
    dt = meta_of(node).dtype
    if index_ok and dt in INDEX_DTYPES:
        return INDEX_DTYPES[dt]
    if dt not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {dt} of {node} (only float32/bfloat16/float16/bool)")
    return SUPPORTED_DTYPES[dt]


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def _strip1(shape) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def is_row_op(node) -> bool:
    return node.op == "call_function" and (node.target in ROW_OPS or node.target in ROW_REDUCE
                                           or node.target in ROW_PAIRS)


def reduced_dims(node) -> tuple[int, ...]:
    """The dims of its input (sorted, non-negative) a row op reduces over.

        >>> reduced_dims(mean(x[B, C, H, W], dim=(2, 3)))   # (2, 3); layer_norm([C, H, W]): (1, 2, 3)
    """
    t, nd = node.target, len(shape_of(node.args[0]))
    args = list(node.args) + [None] * 4
    if t in (aten.softmax.int, aten._softmax.default, aten.log_softmax.int, aten._log_softmax.default):
        dims = [args[1]]
    elif t in (aten.layer_norm.default, aten.rms_norm.default):
        dims = list(range(nd - len(args[1]), nd))
    elif t is aten.instance_norm.default:
        dims = list(range(2, nd))
    elif t is aten.linalg_vector_norm.default:     # (x, ord, dim, keepdim)
        d = args[2] if args[2] is not None else node.kwargs.get("dim")
        dims = list(range(nd)) if d is None or d == [] else list(d)
    elif t in ROW_PAIRS or t in (aten.argmax.default, aten.argmin.default, aten.prod.dim_int):
        d = args[1] if args[1] is not None else node.kwargs.get("dim")
        dims = list(range(nd)) if d is None else [d]
    else:
        d = args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = list(range(nd)) if d is None or d == [] or t in (aten.sum.default, aten.mean.default,
                                                                 aten.prod.default, aten.max.default,
                                                                 aten.min.default) else list(d)
    return tuple(sorted({int(d) % max(nd, 1) for d in dims}))


# ---- lowering -------------------------------------------------------------------------------------

class Lowerer:
    """Walks from the outputs back to the inputs, carrying how each value is indexed (an amap):
    ("dims", t) with t[k] = iteration dim of the value's dim k (-1: broadcast size-1 dim),
    ("flat", shape) value in iteration linear order, ("suffix", shape) repeating contiguous block."""

    def __init__(self, gm, shape: tuple[int, ...], kind: str, simplify: bool = True, leaves=None,
                 perm: tuple[int, ...] | None = None, nred: int = 1, flat_rows: tuple | None = None):
        self.gm, self.shape, self.kind, self.simplify = gm, shape, kind, simplify
        # rows: perm[j] = the row op input's dim at iteration dim j (kept dims in order, then the
        # reduced ones); shape is that input's shape permuted so
        self.perm = tuple(perm) if perm is not None else tuple(range(len(shape)))
        self.nred = nred
        # GroupNorm: the row op's input (this shape) is read flat over (N, G, C / G, pixels)
        self.flat_rows = flat_rows
        self.leaves = leaves or {}       # node -> fn(lowerer, node, amap) -> expr (e.g. a GEMM result)
        self.input_dtypes: list[str] = []
        self.dropped: list[str] = []
        self.D = len(shape)
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.accesses: list[Access] = []
        self.reductions: list[Reduction] = []
        self.memo: dict = {}
        self.red_memo: dict = {}
        self.ops_seen: set[str] = set()

    # -- helpers
    def stored_as(self, e: tuple) -> str | None:
        """dtype of a plain input load (already representable in it: no rounding needed)."""
        if e[0] != "in":
            return None
        return self.input_dtypes[self.accesses[e[1]].input]

    def identity(self) -> tuple:
        return ("dims", tuple(range(self.D)))

    def base(self) -> tuple:
        """The amap of a value shaped like the row op's input (its dims -> iteration dims)."""
        if self.flat_rows is not None:
            return ("flat", self.flat_rows)
        return ("dims", tuple(self.perm.index(k) for k in range(self.D)))

    def row_map(self, keepdim: bool) -> tuple:
        """The amap of a per-row value: the kept dims in order (and -1 at reduced dims, keepdim)."""
        if not keepdim:
            return ("dims", tuple(range(self.D - self.nred)))
        red = set(self.perm[self.D - self.nred:])
        return ("dims", tuple(-1 if k in red else self.perm.index(k) for k in range(self.D)))

    def normalize(self, amap, shape) -> tuple:
        """("flat", S) with S equal to the iteration shape (modulo size-1 dims) is plain identity."""
        if amap[0] == "flat" and _strip1(shape) == _strip1(self.shape) and len(shape) == self.D:
            return self.identity()
        return amap

    def access(self, idx: int, mode: str, dims: tuple = ()) -> tuple:
        acc = Access(idx, mode, dims)
        if acc not in self.accesses:
            self.accesses.append(acc)
        return ("in", self.accesses.index(acc))

    def operand_map(self, amap, v_shape, u_shape) -> tuple:
        """How operand u (broadcast against value v) is indexed, given v's amap."""
        if amap[0] == "dims":
            off = len(v_shape) - len(u_shape)
            if off < 0:
                raise Unsupported(f"operand of rank {len(u_shape)} > result rank {len(v_shape)}")
            dims = tuple(-1 if (u_shape[k] == 1 and v_shape[k + off] != 1) or amap[1][k + off] == -1
                         else amap[1][k + off] for k in range(len(u_shape)))
            return ("dims", dims)
        if tuple(u_shape) == tuple(v_shape):
            return (amap[0], tuple(u_shape))
        if numel(u_shape) == 1:
            return ("dims", (-1,) * len(u_shape))
        su, sv = _strip1(u_shape), _strip1(amap[1])
        if amap[0] == "flat" and len(su) <= len(sv) and sv[len(sv) - len(su):] == su:
            return ("suffix", tuple(u_shape))
        raise Unsupported(f"broadcast of {tuple(u_shape)} against reshaped {tuple(v_shape)}")

    # -- main entry
    def val(self, node, amap) -> tuple:
        if not hasattr(node, "op"):            # python scalar
            if isinstance(node, bool) or not isinstance(node, (int, float)):
                raise Unsupported(f"non-numeric constant {node!r}")
            return ("const", float(node))
        amap = self.normalize(amap, shape_of(node))
        key = (node, amap)
        if key not in self.memo:
            e = self._val(node, amap)
            self.memo[key] = simp.fold(e, self.dropped) if self.simplify else e
        return self.memo[key]

    def _val(self, node, amap) -> tuple:
        if node in self.leaves:
            return self.leaves[node](self, node, amap)
        if node.op == "placeholder":
            idx = self.placeholders.index(node)
            if amap[0] in ("dims", "span"):
                return self.access(idx, amap[0], amap[1])
            return self.access(idx, amap[0])
        if node.op != "call_function":
            raise Unsupported(f"node kind {node.op} ({node.target})")
        t = node.target
        self.ops_seen.add(str(t))
        if t is operator.getitem and getattr(node.args[0], "target", None) in ROW_PAIRS:
            return self.row_pair(node, amap)
        out_dt = dtype_of(node, index_ok=t in (aten.argmax.default, aten.argmin.default))
        if t in simp.PERMUTES:
            src = simp.permute_source(node) if self.simplify else None
            if src is not None:
                self.dropped.append(f"{t} chain (identity)")
                e = self.val(src, amap)
            elif amap[0] == "dims":
                # a transposed view read in place: source dim p[k] steps with value dim k
                p = simp.permutation(node)
                dims = [0] * len(p)
                for k, d in enumerate(p):
                    dims[d] = amap[1][k]
                e = self.val(node.args[0], ("dims", tuple(dims)))
            else:
                raise Unsupported(f"{t} of a reshaped value (only permutes of whole values)")
        elif t in VIEWS:
            e = self.view(node, amap)
        elif t in CASTS:
            e = self.val(node.args[0], amap)
        elif t in UNARY:
            e = self.unary(node, amap)
        elif t in BINARY:
            e = self.binary(node, amap)
        elif t in (aten.pow.Tensor_Scalar,):
            x = self.val(node.args[0], self.operand_map(amap, shape_of(node), shape_of(node.args[0])))
            p = float(node.args[1])
            e = ("sq", x) if p == 2.0 else ("sqrt", x) if p == 0.5 else ("mul", x, ("const", 1.0)) \
                if p == 1.0 else ("powc", x, ("const", p))
        elif t in (aten.clamp_min.Tensor, aten.clamp_max.Tensor):     # max / min with a tensor bound
            vs = shape_of(node)
            x, b = (self.val(a, self.operand_map(amap, vs, shape_of(a))) for a in node.args[:2])
            e = ("max" if t is aten.clamp_min.Tensor else "min", x, b)
        elif t in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
                   aten.hardtanh.default, aten.hardtanh_.default, aten.relu6.default):
            e = self.clamp(node, amap)
        elif t in ROW_REDUCE or t in ROW_OPS:
            e = self.row(node, amap)
        elif t in TERNARY:
            e = self.ternary(node, amap)
        else:
            raise Unsupported(f"op {t} is not in the expert generator's vocabulary")
        # NOTE: torch rounds every intermediate to its dtype; doing the same keeps us within the
        # bf16 tolerance even where a fused fp32 chain would drift from the eager reference.
        if out_dt != "float32" and e[0] != "idx" and not self.representable(e, out_dt):
            e = ("round", out_dt, e)
        return e

    def representable(self, e: tuple, dt: str) -> bool:
        """True when e's value is already a `dt` value, so rounding it to dt changes nothing: a dt
        input, a rounded value, or neg / abs / relu / max / min of such, or such times a power of
        two (softmax's scores * 0.125 in bf16). Saves ~2 instructions per element per use.

        NOTE: a power-of-two product of a bf16 value is exact unless it leaves the normal range:
        scaled into subnormals it can lose low bits (an absolute error below 2^-126, far inside
        every tolerance), and past the top it is inf in fp32 as in bf16 (same exponent range).
        fp16 is left out: 60000 * 2 is an fp32 value, but inf in fp16.
        """
        op = e[0]
        if dt == "bool":       # comparisons and logical ops give 0 / 1 already
            return op in BOOL_VALUED or (op == "in" and self.stored_as(e) == "bool")
        if op == "where":
            return all(self.representable(a, dt) for a in e[2:])
        if op == "round":
            return e[1] == dt
        if op == "in":
            return self.stored_as(e) == dt
        if op in ("neg", "abs", "relu"):
            return self.representable(e[1], dt)
        if op in ("max", "min"):
            return all(self.representable(a, dt) for a in e[1:])
        if op == "mul" and dt != "float16":   # fp16's narrow range makes scaled values leave it
            for x, c in ((e[1], e[2]), (e[2], e[1])):
                if c[0] == "const" and _power_of_two(c[1]) and self.representable(x, dt):
                    return True
        if op == "const":
            return dt == "bfloat16" and _bf16_exact(e[1])
        return False

    def view(self, node, amap) -> tuple:
        src = node.args[0]
        if node.target is aten.dropout.default:
            if (node.args[2] if len(node.args) > 2 else node.kwargs.get("train", False)):
                raise Unsupported("dropout in training mode (random)")
            self.dropped.append("aten.dropout.default (eval: identity)")
        vs, us = shape_of(node), shape_of(src)
        if vs == us:
            return self.val(src, amap)
        if node.target is aten.expand.default:
            return self.val(src, self.operand_map(amap, vs, us))
        if _strip1(vs) == _strip1(us):
            if amap[0] != "dims":
                return self.val(src, (amap[0], us))
            it = iter([amap[1][k] for k in range(len(vs)) if vs[k] != 1])
            return self.val(src, ("dims", tuple(-1 if s == 1 else next(it) for s in us)))
        if numel(vs) == numel(us):
            if amap[0] == "dims" and amap == self.identity() and vs == self.shape:
                return self.val(src, ("flat", us))
            if amap[0] in ("flat", "suffix"):
                return self.val(src, (amap[0], us))
        raise Unsupported(f"reshape {us} -> {vs} of a broadcast value")

    def unary(self, node, amap) -> tuple:
        name = UNARY[node.target]
        x = self.val(node.args[0], amap)
        if name == "gelu":
            approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
            name = "gelu_tanh" if approx == "tanh" else "gelu_erf"
        return (name, x)

    def binary(self, node, amap) -> tuple:
        name = BINARY[node.target]
        vs = shape_of(node)
        args = []
        for a in node.args[:2]:
            if hasattr(a, "op"):
                args.append(self.val(a, self.operand_map(amap, vs, shape_of(a))))
            else:
                args.append(self.val(a, amap))
        if node.target in (aten.div.Tensor,) and node.kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"div with rounding_mode={node.kwargs['rounding_mode']}")
        alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
        if alpha != 1:
            args[1] = ("mul", args[1], ("const", float(alpha)))
        if name == "rsub":
            return ("sub", args[1], args[0])
        return (name, *args)

    def clamp(self, node, amap) -> tuple:
        x = self.val(node.args[0], amap)
        t = node.target
        if t in (aten.hardtanh.default, aten.hardtanh_.default):
            lo, hi = (list(node.args[1:3]) + [-1.0, 1.0][len(node.args) - 1:])[:2]
        elif t is aten.relu6.default:
            lo, hi = 0.0, 6.0
        elif t is aten.clamp_min.default:
            lo, hi = node.args[1], None
        elif t is aten.clamp_max.default:
            lo, hi = None, node.args[1]
        else:
            lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
            hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        if hasattr(lo, "op") or hasattr(hi, "op"):
            raise Unsupported("clamp with tensor bounds")
        if lo is not None:
            x = ("max", x, ("const", float(lo)))
        if hi is not None:
            x = ("min", x, ("const", float(hi)))
        return x

    def ternary(self, node, amap) -> tuple:
        """where(cond, a, b) and masked_fill(x, mask, value) as ("where", cond, a, b)."""
        vs = shape_of(node)

        def arg(a):
            return self.val(a, self.operand_map(amap, vs, shape_of(a))) if hasattr(a, "op") else self.val(a, amap)
        if TERNARY[node.target] == "masked_fill":
            x, mask, value = node.args[:3]
            return ("where", arg(mask), arg(value), arg(x))
        cond, a, b = node.args[:3]
        return ("where", arg(cond), arg(a), arg(b))

    # -- row ops: reductions over the row (the last nred iteration dims)
    def red(self, kind: str, expr: tuple, pair=None) -> tuple:
        key = (kind, expr, pair)
        if key not in self.red_memo:
            self.reductions.append(Reduction(kind, expr, pair))
            self.red_memo[key] = ("red", len(self.reductions) - 1)
        return self.red_memo[key]

    def row_source(self, node) -> tuple:
        """The row op's input read over the iteration space; checks it reduces the program's row."""
        if self.kind != "rowwise":
            raise Unsupported("row op in an elementwise program")
        src = node.args[0]
        xs = shape_of(src)
        if self.flat_rows is not None or node.target is aten.group_norm.default:
            if node.target is not aten.group_norm.default or xs != self.flat_rows:
                raise Unsupported(f"{node.target} next to a group_norm: one row space per program")
            return self.val(src, self.base())
        want = tuple(sorted(self.perm[self.D - self.nred:]))
        if len(xs) != self.D or tuple(xs[k] for k in self.perm) != self.shape or reduced_dims(node) != want:
            raise Unsupported(f"row op over {xs} dims {reduced_dims(node)}; the program's rows are "
                              f"dims {want} of {tuple(self.shape[self.perm.index(k)] for k in range(self.D))}")
        return self.val(src, self.base())

    def row_pair(self, node, amap) -> tuple:
        """getitem 0 / 1 of max.dim / min.dim: the values or their int64 indices."""
        pair = node.args[0]
        self.check_row_use(pair, amap)
        r = self.red(ROW_PAIRS[pair.target], self.row_source(pair))
        if node.args[1] == 1:
            return ("idx", r[1])
        return r

    def row(self, node, amap) -> tuple:
        t = node.target
        x_row = self.row_source(node)
        args = list(node.args) + [None] * 8
        if t in ROW_REDUCE:
            self.check_row_use(node, amap)
            kind = ROW_REDUCE[t]
            if kind in ("var", "std"):
                if t in (aten.var.dim, aten.std.dim):
                    unbiased = args[2] if args[2] is not None else node.kwargs.get("unbiased", True)
                    corr = 1.0 if unbiased else 0.0
                else:
                    c = node.kwargs.get("correction")
                    corr = 1.0 if c is None else float(c)
                mean = ("div", self.red("sum", x_row, ("welford", 0)), NCOL)
                m2 = self.red("sum", ("sq", ("sub", x_row, mean)), ("welford", 1))
                var = ("div", m2, ("max", ("sub", NCOL, ("const", corr)), ("const", 0.0)))
                return ("sqrt", var) if kind == "std" else var
            if kind in ("argmax", "argmin"):
                return ("idx", self.red(kind, x_row)[1])
            if kind == "logsumexp":     # log(sum(exp(x - max))) + max, as softmax's statistics
                m = self.red("max", x_row, ("softmax", 0))
                s = self.red("sum", ("exp", ("sub", x_row, m)), ("softmax", 1))
                return ("add", ("log", s), m)
            if kind == "norm":
                o = args[1] if args[1] is not None else node.kwargs.get("ord", 2)
                o = float(o)
                if o == 2.0:
                    return ("sqrt", self.red("sum", ("sq", x_row)))
                if o == 1.0:
                    return self.red("sum", ("abs", x_row))
                if o == math.inf:
                    return self.red("max", ("abs", x_row))
                raise Unsupported(f"vector norm of order {o}")
            r = self.red("sum" if kind == "mean" else kind, x_row)
            return ("div", r, NCOL) if kind == "mean" else r
        self.check_full_use(node, amap)
        if t in (aten.softmax.int, aten._softmax.default, aten.log_softmax.int,
                 aten._log_softmax.default):
            if t in (aten._softmax.default, aten._log_softmax.default) and node.args[2]:
                raise Unsupported("_softmax with half_to_float=True")
            m = self.red("max", x_row, ("softmax", 0))
            s = self.red("sum", ("exp", ("sub", x_row, m)), ("softmax", 1))
            if t in (aten.log_softmax.int, aten._log_softmax.default):
                return ("sub", ("sub", x_row, m), ("log", s))
            return ("div", ("exp", ("sub", x_row, m)), s)
        xs = shape_of(node.args[0])
        if t is aten.group_norm.default:
            # (x, num_groups, weight, bias, eps, cudnn): weight [C] runs over (group, channel)
            w, b, eps = args[2], args[3], args[4] if args[4] is not None else 1e-5
            affine = ("span", (1, 2))
        elif t is aten.instance_norm.default:
            # (x, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn)
            if not args[5]:
                raise Unsupported("instance_norm with running stats (use_input_stats=False)")
            w, b, eps = args[1], args[2], args[7] if args[7] is not None else 1e-5
            affine = ("dims", (self.base()[1][1],))       # [C] along the input's dim 1
        else:
            w, b = args[2], (args[3] if t is aten.layer_norm.default else None)
            nd = len(args[1])
            # the weight [*normalized_shape] lines up with the input's trailing dims
            affine = ("dims", tuple(self.base()[1][len(xs) - nd:]))
        if t is aten.rms_norm.default:
            eps = args[3] if args[3] is not None else node.kwargs.get("eps")
            # NOTE: aten uses epsilon of the opmath type (float) when eps is None, also for bf16.
            eps = float(torch.finfo(torch.float32).eps) if eps is None else float(eps)
            ms = self.red("sum", ("sq", x_row))
            y = ("mul", x_row, ("rsqrt", ("add", ("div", ms, NCOL), ("const", eps))))
        else:
            if t is aten.layer_norm.default:
                eps = args[4] if args[4] is not None else node.kwargs.get("eps", 1e-5)
            s1 = self.red("sum", x_row, ("welford", 0))
            mean = ("div", s1, NCOL)
            xc = ("sub", x_row, mean)
            m2 = self.red("sum", ("sq", xc), ("welford", 1))
            y = ("mul", xc, ("rsqrt", ("add", ("div", m2, NCOL), ("const", float(eps)))))
        if w is not None:
            y = ("mul", y, self.val(w, affine))
        if b is not None:
            y = ("add", y, self.val(b, affine))
        return y

    def check_full_use(self, node, amap) -> None:
        if amap != self.base():
            raise Unsupported(f"{node.target} result used reshaped/broadcast ({amap})")

    def check_row_use(self, node, amap) -> None:
        lead = [d for d in amap[1] if d != -1] if amap[0] == "dims" else None
        if lead != list(range(self.D - self.nred)):
            raise Unsupported(f"{node.target} result used with layout {amap}; need one per row")


def _graph_outputs(gm) -> list:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    vals = out.args[0]
    return list(vals) if isinstance(vals, (tuple, list)) else [vals]


def check_single_output(gm, shape: tuple[int, ...], dtype: str, what: str) -> None:
    """Library-anchored regions (GEMM, conv) write one output of the anchor's shape and dtype."""
    outs = _graph_outputs(gm)
    if len(outs) != 1 or shape_of(outs[0]) != shape or dtype_of(outs[0]) != dtype:
        raise Unsupported(f"{what} epilogue must produce one output of the {what}'s shape and dtype")


@dataclass(frozen=True)
class Space:
    """The iteration space of a region: kind, shape (the row op's input permuted by perm: kept dims
    in order, then the nred reduced ones) and, for rows, xs (that input's own shape)."""
    kind: str
    shape: tuple[int, ...]
    perm: tuple[int, ...]
    nred: int
    xs: tuple[int, ...]
    groups: int = 0          # GroupNorm: shape is (N, groups, C / groups, pixels), xs read flat


def _iteration_space(gm) -> Space:
    rows = [n for n in gm.graph.nodes if is_row_op(n)]
    if rows and rows[0].target is aten.group_norm.default:
        xs, g = shape_of(rows[0].args[0]), int(rows[0].args[1])
        if len(xs) < 2 or xs[1] % g:
            raise Unsupported(f"group_norm of {xs} in {g} groups")
        shape = (xs[0], g, xs[1] // g, math.prod(xs[2:]))
        return Space("rowwise", shape, (0, 1, 2, 3), 2, xs, groups=g)
    if rows:
        xs = shape_of(rows[0].args[0])
        red = reduced_dims(rows[0])
        perm = tuple(k for k in range(len(xs)) if k not in red) + red
        return Space("rowwise", tuple(xs[k] for k in perm), perm, max(len(red), 1), xs)
    outs = _graph_outputs(gm)
    if not outs:
        raise Unsupported("the region has no output")
    shape = shape_of(outs[0])
    return Space("elementwise", shape, tuple(range(len(shape))), 1, shape)


def _size_source(prog: ExprProgram, gm, base: tuple[int, ...], sp: Space) -> tuple:
    """A tensor whose run-time sizes are the iteration sizes: an output or an input read whole,
    in iteration order, or (rows reduced over leading or middle dims) through base, the iteration
    dim of each of the row op input's dims."""
    ident = tuple(range(prog.ndim))
    if sp.groups:     # (N, G, C / G, pixels) from a GroupNorm input's [N, C, *pixels]
        for a in prog.accesses:
            if a.mode == "flat" and prog.inputs[a.input][0] == sp.xs:
                return ("group", a.input, sp.groups, len(sp.xs))
    for i, o in enumerate(_graph_outputs(gm)):
        if shape_of(o) == prog.shape and (base == ident or prog.outputs[i].dims is None):
            return ("out", i)
    for a in prog.accesses:
        if a.mode == "dims" and a.dims == ident and prog.inputs[a.input][0] == prog.shape:
            return ("in", a.input)
    if base != ident:
        for i, o in enumerate(prog.outputs):
            if o.dims == base:
                return ("out", i, base)
        for a in prog.accesses:
            if a.mode == "dims" and a.dims == base and len(prog.inputs[a.input][0]) == prog.ndim:
                return ("in", a.input, base)
    raise Unsupported("no input or output has the iteration shape; sizes can't be read at run time")


def _output(low: Lowerer, sp: Space, o) -> Output:
    """The output node o of the region as a program Output (how it is indexed and stored)."""
    os_, dt = shape_of(o), dtype_of(o, index_ok=True)
    shape, ident = sp.shape, sp.perm == tuple(range(len(sp.perm)))
    row_shapes = {}
    if sp.kind == "rowwise":
        red = set(sp.perm[len(shape) - sp.nred:])
        row_shapes = {tuple(s for k, s in enumerate(sp.xs) if k not in red): False,
                      tuple(1 if k in red else s for k, s in enumerate(sp.xs)): True}
    if dt == "int64" and os_ not in row_shapes:
        raise Unsupported(f"int64 output of shape {os_}: only per-row indices")
    if not ident and os_ == sp.xs:     # (first: a square input's shape equals its permutation)
        base = low.base()
        return Output(low.val(o, base), dt, False, numel(os_), dims=base[1])
    if os_ == shape:
        return Output(low.val(o, low.identity()), dt, False, numel(os_))
    if numel(os_) == numel(shape) and ident:
        return Output(low.val(o, ("flat", os_)), dt, False, numel(os_))
    if os_ in row_shapes:
        e = low.val(o, low.row_map(keepdim=row_shapes[os_]))
        if dt == "int64" and e[0] != "idx":
            raise Unsupported("an int64 output that is not an arg reduction's index")
        return Output(e, dt, True, numel(os_))
    raise Unsupported(f"output of shape {os_} next to iteration shape {shape}")


def lower(gm, simplify: bool = True, leaves=None, extra_inputs=()) -> ExprProgram:
    """Lower an aten GraphModule (placeholders = task inputs, output tuple) to an ExprProgram.

    >>> prog = lower(task.graph); prog.kind
    'elementwise'
    """
    sp = _iteration_space(gm)
    kind, shape = sp.kind, sp.shape
    if not shape:
        raise Unsupported("0-dim iteration space")
    low = Lowerer(gm, shape, kind, simplify, leaves, sp.perm, sp.nred, sp.xs if sp.groups else None)
    inputs = [(shape_of(p), dtype_of(p)) for p in low.placeholders] + list(extra_inputs)
    low.input_dtypes = [dt for _, dt in inputs]
    outputs = []
    for o in _graph_outputs(gm):
        if not hasattr(o, "op"):
            raise Unsupported(f"constant output {o!r}")
        outputs.append(_output(low, sp, o))
    if kind == "elementwise" and any(o.dtype == "int64" for o in outputs):
        raise Unsupported("int64 outputs (index math)")
    dropped = low.dropped + (simp.unused_ops(gm) if simplify else [])
    prog = ExprProgram(kind, shape, inputs, low.accesses, low.reductions, outputs, dropped=dropped,
                       nred=sp.nred)
    for o in prog.outputs:
        if o.row and column_dependent(o.expr, prog):
            raise Unsupported("a per-row output depends on a column")
        if not o.row and any(x[0] == "idx" for x in walk(o.expr)):
            raise Unsupported("an arg reduction's index used in elementwise math")
    prog.size_source = _size_source(prog, gm, low.base()[1] if low.base()[0] == "dims" else ident_dims(prog), sp)
    prog.has_transcendental = any(op in TRANSCENDENTAL for op in low_ops(prog))
    return prog


def ident_dims(prog: ExprProgram) -> tuple[int, ...]:
    return tuple(range(prog.ndim))


def _power_of_two(v: float) -> bool:
    m, _ = math.frexp(abs(v)) if math.isfinite(v) and v != 0 else (0.0, 0)
    return m == 0.5


def _bf16_exact(v: float) -> bool:
    """v is a bfloat16 value (no bits below bf16's 8-bit significand)."""
    return not math.isfinite(v) or float(torch.tensor(v, dtype=torch.bfloat16)) == v


def stored(expr: tuple, dtype: str) -> tuple:
    """The expression a store of `dtype` needs: a final round to dtype is dropped, because the store
    rounds to nearest-even itself and rounding twice that way is rounding once.

        >>> stored(("round", "bfloat16", ("mul", ("in", 0), ("in", 1))), "bfloat16")
        ('mul', ('in', 0), ('in', 1))
    """
    return expr[2] if expr[0] == "round" and expr[1] == dtype else expr


def walk(e: tuple):
    """Yield every sub-expression of e (pre-order, repeats included)."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if x[0] in ("in", "const", "red", "ncol", "idx"):
            continue
        stack.extend(a for a in x[1:] if isinstance(a, tuple))


def low_ops(prog: ExprProgram) -> set[str]:
    exprs = [o.expr for o in prog.outputs] + [r.expr for r in prog.reductions]
    return {x[0] for e in exprs for x in walk(e)}


def column_dependent(e: tuple, prog: ExprProgram) -> bool:
    return any(x[0] == "in" and prog.accesses[x[1]].column_varying(prog.ndim, prog.nred) for x in walk(e))

