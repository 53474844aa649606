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
    ("in", access_id)  ("const", float)  ("iconst", int)  ("bconst", bool)  ("red", reduction_id)
    ("ncol",) (row length at run time)  ("round", dtype, e)  ("cast", vt, e)  (op, e1, e2...)
    ("idx", reduction_id) (the int64 index an argmax / argmin / max.dim reduction gives)
    ("coord", d) (the int64 index along iteration dim d: a cat picks its operand by it)

Every value has a value type (value_type): "f" (computed in fp32, stored as fp32/bf16/fp16), "i"
(int64 and int32 values, computed exactly in 64-bit integers) or "b" (bool, stored as one byte).
Row programs hold "f" and "b" values (a bool mask or comparison inside a masked softmax) and one "i"
value, an arg reduction's index stored as a per-row output.
The lowering inserts ("cast", vt, e) wherever torch's type promotion converts, so the operands of an
op always share one type: index arithmetic (position ids, relative-position buckets) never takes a
float round trip.

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

SUPPORTED_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# what an elementwise program's values may be stored as, and each one's value type
VALUE_DTYPES = {**SUPPORTED_DTYPES, torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}
VT = {"float32": "f", "bfloat16": "f", "float16": "f", "int64": "i", "int32": "i", "bool": "b"}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")


# The row length, read at run time (never the captured size): mean = sum / NCOL.
NCOL = ("ncol",)
# The number of rows, read at run time: a mean over rows of per-row values = outer sum / NROWS.
NROWS = ("nrows",)


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
    # a sliced read ("dims" mode; empty: none): per input dim the first index and the step, so
    # iteration index i reads input index starts[k] + i * steps[k] (x[:, :, :T, :T], pos_emb[:, :t])
    starts: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    # a cat operand's read (elementwise only; empty: none): (iteration dim d, lo, hi, size) reads
    # only where lo <= i_d < hi, at index i_d - lo of the input dim on d; size is d's whole size
    window: tuple[int, int, int, int] = ()
    # the input read as if reshaped to this shape (contiguous; empty: its own shape): a conv's
    # [B, C, H, W] output seen as [B, C, H * W] before a permute
    view: tuple[int, ...] = ()

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
    # one value for the whole program (a loss's mean over rows of per-row values): an expression
    # of outer reductions ("outer", j, vt) and constants, stored once after every row is done
    total: bool = False
    # an expanded view (mask.expand_as(scores)): the kernel is handed the tensor before the expand
    # (TensorSpec.kernel_shape: size 1 at the expanded dims) and stores through its strides, so
    # the steps along those dims land on one element; the caller returns the expand of it
    broadcast: bool = False


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
    # (kind, index, dims) with dims[k] the iteration dim of the tensor's dim k, or ("split", 0,
    # groups, shape): output 0's dim j merges iteration dims groups[j], all but the first of them
    # the captured shape's (an output that reshapes a repeat: split_groups)
    size_source: tuple = ("out", 0)
    nred: int = 1                      # rowwise: the row is the last nred iteration dims
    # rowwise: sums over all rows of per-row expressions (("outer", j, vt) in total outputs)
    outer: list[Reduction] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)   # no-op ops removed by simplify
    has_transcendental: bool = False
    # iteration dims whose index the kernel computes (("coord", d) and windowed accesses), in order
    coords: tuple[int, ...] = ()
    # elementwise: (r, w) when, at the captured layouts, some float input is read contiguously
    # along iteration dim r while the first output is written contiguously along w != r (a
    # permuted read: x.permute(0, 2, 1) + pos); elementwise.py then stages such reads through a
    # shared-memory tile so both sides stay coalesced (transposed_dims). None: no such pair.
    tile_dims: tuple[int, int] | None = None

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
    rows = list(ops.OPS.items()) + list(ops.OVERLOADS.items())
    return {getattr(getattr(aten, name.split(".")[0]), o): row.expr for name, row in rows
            if row.expr and row.operands == operands for o in row.overloads}


UNARY = {**_lowered(1),
         # NOTE: conv blocks' in-place activations (nn.ReLU(inplace=True)), as graphs that did not
         # go through capture.functionalize still hold them; the kernel writes a new output
         **{getattr(aten, f"{name}_").default: ops.OPS[name].expr for name in ("relu", "silu")}}
BINARY = _lowered(2)
TERNARY = _lowered(3)
# results of these are bool; comparisons compute in the promoted type of their operands
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
BOOL_OPS = COMPARE | {"and", "or", "xor", "not", "isnan", "isinf"}
# ops whose result has their first operand's value type (exact on integers too)
SAME_TYPE = {"add", "sub", "mul", "neg", "abs", "max", "min", "sq", "relu", "sign", "band", "bor",
             "bxor", "bnot", "floordiv", "mod", "fmod"}
# on integer values these are the identity (torch returns the input)
INT_IDENTITY = {"floor", "ceil", "trunc", "rint"}
BATCH_NORMS = {aten.batch_norm.default}
# x -> a constant of x's shape: the fill value (node -> python scalar)
FILLS = {aten.full_like.default: lambda n: n.args[1], aten.zeros_like.default: lambda n: 0,
         aten.ones_like.default: lambda n: 1, aten.scalar_tensor.default: lambda n: n.args[0]}
# ops that only relabel elements (same order for contiguous data) or do nothing in eval
VIEWS = {
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
    aten.expand.default, aten.expand_as.default, aten.alias.default, aten.clone.default,
    aten.contiguous.default, aten.detach.default, aten.dropout.default, aten.lift_fresh_copy.default,
}
CASTS = {aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.type_as.default}
# x ** constant (pow.Tensor_Tensor is BINARY's)
POWS = {aten.pow.Tensor_Scalar}
# min(max(x, lo), hi), either bound optional (relu6: [0, 6]; hardtanh: [-1, 1] unless given)
CLAMPS = {aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
          aten.clamp_min.Tensor, aten.clamp_max.Tensor, aten.hardtanh.default, aten.hardtanh_.default,
          aten.relu6.default}
ROW_REDUCE = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "max",
              aten.amin.default: "min", aten.sum.default: "sum", aten.mean.default: "mean",
              aten.prod.dim_int: "prod", aten.prod.default: "prod", aten.max.default: "max",
              aten.min.default: "min", aten.argmax.default: "argmax", aten.argmin.default: "argmin",
              aten.var.dim: "var", aten.var.correction: "var", aten.std.dim: "std",
              aten.std.correction: "std", aten.logsumexp.default: "logsumexp",
              aten.linalg_vector_norm.default: "norm"}
# (values, indices) pairs read through getitem
ROW_PAIRS = {aten.max.dim: "argmax", aten.min.dim: "argmin"}
# ops whose results are read through getitem as pieces along one dim: each piece is a slice
# (rotate_half's x.chunk(2, -1), a fused projection's split)
SPLITS = {aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default}
NORMS = {aten.layer_norm.default, aten.rms_norm.default, aten.instance_norm.default,
         aten.group_norm.default}
SOFTMAXES = {aten.softmax.int, aten._softmax.default, aten.log_softmax.int, aten._log_softmax.default}
ROW_OPS = SOFTMAXES | NORMS
IGNORED = {aten._assert_tensor_metadata.default}
TRANSCENDENTAL = {"gelu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "log", "erf", "sin",
                  "cos", "log1p", "expm1", "pow", "powc", "exp2", "log2", "tan", "erfc", "xlogy"}


def meta_of(node) -> Any:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if val is None:
        raise Unsupported(f"node {node} has no meta['val'] (shape/dtype unknown)")
    return val


def shape_of(node) -> tuple[int, ...]:
    return tuple(int(s) for s in meta_of(node).shape)


def dtype_of(node) -> str:
    dt = meta_of(node).dtype
    if dt not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {dt} of {node} (only float32/bfloat16/float16)")
    return SUPPORTED_DTYPES[dt]


def value_dtype_of(node) -> str:
    """The dtype name of a value inside an elementwise program (floats, int64, int32, bool)."""
    dt = meta_of(node).dtype
    if dt not in VALUE_DTYPES:
        raise Unsupported(f"dtype {dt} of {node} (only float32/bfloat16/float16/int64/int32/bool)")
    return VALUE_DTYPES[dt]


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
    if t in SOFTMAXES:
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


def value_type(e: tuple, load_vt, memo: dict | None = None) -> str:
    """The value type ("f" | "i" | "b") of expression e; load_vt(access_id) gives the inputs'.

        >>> value_type(("lt", ("in", 0), ("iconst", 3)), lambda a: "i")
        'b'
    """
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    op = e[0]
    if op == "in":
        r = load_vt(e[1])
    elif op in ("const", "red", "ncol", "nrows"):
        r = "f"
    elif op == "outer":         # ("outer", j, vt): a sum over rows, exact in "i" for counts
        r = e[2]
    elif op in ("iconst", "idx", "coord"):   # idx: an arg reduction's int64 index
        r = "i"
    elif op == "bconst" or op in BOOL_OPS:
        r = "b"
    elif op == "cast":
        r = e[1]
    elif op == "round":
        r = VT[e[1]]
    elif op == "select":
        r = value_type(e[2], load_vt, memo)
    elif op == "gather":
        r = value_type(e[1], load_vt, memo)
    elif op in SAME_TYPE:
        r = value_type(e[1], load_vt, memo)
    else:
        r = "f"
    memo[e] = r
    return r


def program_value_type(prog: "ExprProgram"):
    """value_type over prog's expressions (one memo for the whole program)."""
    memo: dict = {}
    return lambda e: value_type(e, lambda a: VT[prog.inputs[prog.accesses[a].input][1]], memo)


def _promoted(a, b) -> torch.dtype:
    """torch's promoted dtype of two operands (nodes or python scalars): what a comparison of them
    computes in."""
    vals = [meta_of(x) if hasattr(x, "op") else x for x in (a, b)]
    return torch.result_type(*vals)


def _scalar_args(node) -> list:
    """node's arguments after the first, with keyword arguments in schema order."""
    schema = node.target._schema.arguments
    out = list(node.args[1:])
    for arg in schema[1 + len(out):]:
        out.append(node.kwargs.get(arg.name, arg.default_value))
    if any(hasattr(a, "op") for a in out):
        raise Unsupported(f"{node.target} with tensor parameters")
    return out


def _c(v) -> tuple:
    return ("const", float(v))


def _elu(x: tuple, alpha: float, scale: float, input_scale: float) -> tuple:
    # torch: x <= 0 ? expm1(x * input_scale) * (alpha * scale) : x * scale
    neg = ("mul", ("expm1", ("mul", x, _c(input_scale))), _c(alpha * scale))
    return ("select", ("le", x, _c(0)), neg, ("mul", x, _c(scale)))


def _hard(x: tuple) -> tuple:
    """min(max(x + 3, 0), 6): hardsigmoid's and hardswish's ramp (times 1/6, torch's order)."""
    return ("min", ("max", ("add", x, _c(3)), _c(0)), _c(6))


def _logit(x: tuple, eps) -> tuple:
    z = x if eps is None else ("min", ("max", x, _c(eps)), _c(1 - eps))
    return ("log", ("div", z, ("sub", _c(1), z)))


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
# activations spelled out in expression ops, as torch's CUDA kernels compute them (fp32 opmath):
# name -> fn(x, the op's other arguments with defaults)
COMPOSITE = {
    "leaky_relu": lambda x, a: ("select", ("gt", x, _c(0)), x, ("mul", x, _c(a[0]))),
    "hardsigmoid": lambda x, a: ("mul", _hard(x), _c(1 / 6)),
    "hardswish": lambda x, a: ("mul", ("mul", x, _hard(x)), _c(1 / 6)),
    "mish": lambda x, a: ("mul", x, ("tanh", ("log1p", ("exp", x)))),
    "softplus": lambda x, a: ("select", ("gt", ("mul", x, _c(a[0])), _c(a[1])), x,
                              ("div", ("log1p", ("exp", ("mul", x, _c(a[0])))), _c(a[0]))),
    "elu": lambda x, a: _elu(x, *a[:3]),
    "selu": lambda x, a: _elu(x, SELU_ALPHA, SELU_SCALE, 1.0),
    "celu": lambda x, a: _elu(x, a[0], 1.0, 1.0 / a[0]),
    "logit": lambda x, a: _logit(x, a[0] if a else None),
}


# ---- lowering -------------------------------------------------------------------------------------

class Lowerer:
    """Walks from the outputs back to the inputs, carrying how each value is indexed (an amap):
    ("dims", t) with t[k] = iteration dim of the value's dim k (-1: broadcast size-1 dim),
    ("flat", shape) value in iteration linear order, ("suffix", shape) repeating contiguous block.
    An op node is lowered by its family's method (HANDLERS: permute, view, unary, row, ...)."""

    def __init__(self, gm, shape: tuple[int, ...], kind: str, simplify: bool = True, leaves=None,
                 strided: bool = False, perm: tuple[int, ...] | None = None, nred: int = 1,
                 flat_rows: tuple | None = None):
        self.gm, self.shape, self.kind, self.simplify = gm, shape, kind, simplify
        self.strided = strided           # the kernel binds sliced and permuted reads (elementwise.py)
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
        self.outer: list[Reduction] = []
        self.memo: dict = {}
        self.red_memo: dict = {}
        self.ops_seen: set[str] = set()
        self.vt_memo: dict = {}
        # the cat operand being lowered: (iteration dim, lo, hi, size) (Access.window), or ()
        self.window: tuple = ()

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

    def access(self, idx: int, mode: str, dims: tuple = (), view: tuple = ()) -> tuple:
        if self.window:
            if mode != "dims":
                raise Unsupported("a cat operand read through a reshape")
            return self.windowed(Access(idx, mode, dims, view=view), (0,) * len(dims), (1,) * len(dims))
        acc = Access(idx, mode, dims, view=view)
        if acc not in self.accesses:
            self.accesses.append(acc)
        return ("in", self.accesses.index(acc))

    def windowed(self, acc: Access, starts: tuple, steps: tuple) -> tuple:
        """acc (a "dims" read, sliced by starts/steps) inside the current cat window: read at
        i_d - lo along the window's iteration dim d, only inside the window."""
        d, lo = self.window[0], self.window[1]
        starts = tuple(s - lo * st if dim == d else s for s, st, dim in zip(starts, steps, acc.dims))
        acc = Access(acc.input, "dims", acc.dims, starts, steps, self.window, acc.view)
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
            if isinstance(node, bool):
                return ("bconst", node)
            if isinstance(node, int):
                return ("iconst", node)
            if not isinstance(node, float):
                raise Unsupported(f"non-numeric constant {node!r}")
            return ("const", node)
        amap = self.normalize(amap, shape_of(node))
        key = (node, amap, self.window)
        if key not in self.memo:
            e = self._val(node, amap)
            self.memo[key] = simp.gelu_tanh(simp.fold(e, self.dropped), self.dropped) if self.simplify else e
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
        if t is operator.getitem:
            pair = getattr(node.args[0], "target", None)
            if pair in ROW_PAIRS:
                return self.row_pair(node, amap)
            if pair in SPLITS:
                return self.typed(t, self.slice(node, amap, VT[value_dtype_of(node)]), value_dtype_of(node))
            if pair is aten.broadcast_tensors.default:
                # broadcast_tensors(a, b)[i]: operand i expanded to the common shape (a loss's inputs)
                src = node.args[0].args[0][node.args[1]]
                return self.val(src, self.operand_map(amap, shape_of(node), shape_of(src)))
        out_dt = value_dtype_of(node)
        handler = HANDLERS.get(t)
        if handler is None:
            raise Unsupported(f"op {t} is not in the expert generator's vocabulary")
        return self.typed(t, handler(self, node, amap, VT[out_dt]), out_dt)

    def typed(self, t, e: tuple, out_dt: str) -> tuple:
        """e, the value of an op t whose node holds out_dt values, rounded to out_dt as torch
        stores it."""
        if self.vt(e) != VT[out_dt]:      # every op's value has its node's type (casts coerce)
            raise Unsupported(f"{t} on {out_dt} values")
        # NOTE: torch rounds every intermediate to its dtype; doing the same keeps us within the
        # bf16 tolerance even where a fused fp32 chain would drift from the eager reference.
        if out_dt in ("bfloat16", "float16") and not self.representable(e, out_dt):
            return ("round", out_dt, e)
        if out_dt == "int32" and not (e[0] == "in" and self.stored_as(e) == "int32"):
            return ("round", out_dt, e)          # int32 arithmetic wraps at 32 bits, as torch's does
        return e

    # -- value types
    def vt(self, e: tuple) -> str:
        return value_type(e, lambda a: VT[self.input_dtypes[self.accesses[a].input]], self.vt_memo)

    def coerce(self, e: tuple, vt: str) -> tuple:
        """e converted to value type vt as torch converts (float -> int truncates, x -> bool is
        x != 0); constants are converted here, not in the kernel."""
        have = self.vt(e)
        if have == vt:
            return e
        if e[0] in ("const", "iconst", "bconst"):
            v = e[1]
            return {"f": ("const", float(v)), "i": ("iconst", int(v)), "b": ("bconst", bool(v))}[vt]
        return ("cast", vt, e)

    def operand(self, node, a, amap) -> tuple:
        """Operand a (a node or a python scalar) of node, indexed for node's amap."""
        if hasattr(a, "op"):
            return self.val(a, self.operand_map(amap, shape_of(node), shape_of(a)))
        return self.val(a, amap)

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

    def view(self, node, amap, vt: str) -> tuple:
        src = node.args[0]
        if node.target is aten.dropout.default:
            if (node.args[2] if len(node.args) > 2 else node.kwargs.get("train", False)):
                raise Unsupported("dropout in training mode (random)")
            self.dropped.append("aten.dropout.default (eval: identity)")
        vs, us = shape_of(node), shape_of(src)
        if vs == us:
            return self.val(src, amap)
        if node.target in (aten.expand.default, aten.expand_as.default):
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
            base = _reshape_source(src)
            if amap[0] == "dims" and self.strided and base is not None:
                # NOTE: a task input read in another order after a reshape (ViT's patch conv output
                # [B, C, H, W] -> [B, C, H * W] -> permute): the host checks it is contiguous and
                # binds it with the reshape's shape (the graph fixes that shape)
                return self.access(self.placeholders.index(base), "dims", amap[1], view=vs)
        raise Unsupported(f"reshape {us} -> {vs} of a broadcast value")

    def cast(self, node, amap, vt: str) -> tuple:
        return self.coerce(self.val(node.args[0], amap), vt)

    def fill(self, node, amap, vt: str) -> tuple:
        """A constant of the input's shape (full_like, zeros_like...)."""
        return self.coerce(self.val(FILLS[node.target](node), amap), vt)

    def pow_scalar(self, node, amap, vt: str) -> tuple:
        """x ** p for a constant p, as the cheapest op that computes it."""
        x = self.coerce(self.operand(node, node.args[0], amap), "f")
        p = float(node.args[1])
        if p == 2.0:
            return ("sq", x)
        if p == 0.5:
            return ("sqrt", x)
        return ("mul", x, ("const", 1.0)) if p == 1.0 else ("powc", x, ("const", p))

    def unary(self, node, amap, vt: str) -> tuple:
        name = UNARY[node.target]
        x = self.val(node.args[0], amap)
        if name in ("isnan", "isinf"):
            return (name, self.coerce(x, "f")) if self.vt(x) == "f" else ("bconst", False)
        if name in ("not", "bnot") and vt == "b":
            return ("not", self.coerce(x, "b"))
        if vt == "i" and name in INT_IDENTITY:
            return x
        if vt == "i" and name in SAME_TYPE | {"bnot"}:
            return (name, self.coerce(x, "i"))
        if vt != "f":
            raise Unsupported(f"{node.target} on integer/bool values")
        x = self.coerce(x, "f")
        if name == "gelu":
            approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
            name = "gelu_tanh" if approx == "tanh" else "gelu_erf"
        if name in COMPOSITE:
            return COMPOSITE[name](x, _scalar_args(node))
        return (name, x)

    def binary(self, node, amap, vt: str) -> tuple:
        name = BINARY[node.target]
        if node.target in (aten.div.Tensor,) and node.kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"div with rounding_mode={node.kwargs['rounding_mode']}")
        args = [self.operand(node, a, amap) for a in node.args[:2]]
        if name in COMPARE:
            cvt = VT[VALUE_DTYPES.get(_promoted(*node.args[:2]), "float32")]
            return (name, *(self.coerce(a, cvt) for a in args))
        if name in ("and", "or", "xor") or (vt == "b" and name in ("band", "bor", "bxor")):
            return ({"band": "and", "bor": "or", "bxor": "xor"}.get(name, name),
                    *(self.coerce(a, "b") for a in args))
        if vt != "f" and name not in SAME_TYPE | {"rsub"}:
            raise Unsupported(f"{node.target} on integer/bool values")
        if vt == "b":
            raise Unsupported(f"{node.target} on bool values")
        args = [self.coerce(a, vt) for a in args]
        alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
        if alpha != 1:
            args[1] = ("mul", args[1], self.coerce(self.val(alpha, amap), vt))
        if name == "rsub":
            return ("sub", args[1], args[0])
        return (name, *args)

    def ternary(self, node, amap, vt: str) -> tuple:
        """where(cond, a, b) and masked_fill(x, mask, value), both as ("select", cond, a, b)."""
        name = TERNARY[node.target]
        c, a, b = [self.operand(node, x, amap) for x in node.args[:3]]
        if name in ("addcmul", "addcdiv", "lerp"):
            return self.fma_like(node, name, amap, vt, c, a, b)
        if name == "masked_fill":
            c, a, b = a, b, c
        return ("select", self.coerce(c, "b"), self.coerce(a, vt), self.coerce(b, vt))

    def fma_like(self, node, name: str, amap, vt: str, x, t1, t2) -> tuple:
        """addcmul: x + value * t1 * t2; addcdiv: x + value * t1 / t2; lerp(start, end, w) as
        torch computes it: w < 0.5 ? start + w * (end - start) : end - (end - start) * (1 - w)."""
        if vt != "f":
            raise Unsupported(f"{node.target} on integer/bool values")
        x, t1, t2 = (self.coerce(v, "f") for v in (x, t1, t2))
        if name == "lerp":
            d = ("sub", t1, x)
            return ("select", ("lt", ("abs", t2), ("const", 0.5)), ("add", x, ("mul", t2, d)),
                    ("sub", t1, ("mul", d, ("sub", ("const", 1.0), t2))))
        value = self.coerce(self.val(node.kwargs.get("value", 1), amap), "f")
        prod = ("mul", t1, t2) if name == "addcmul" else ("div", t1, t2)
        return ("add", x, ("mul", value, prod))

    def batch_norm(self, node, amap, vt: str) -> tuple:
        """Eval-mode batch norm over dim 1: (x - mean[c]) * rsqrt(var[c] + eps) * w[c] + b[c]."""
        x, w, b, mean, var, training = node.args[:6]
        eps = float(node.args[7] if len(node.args) > 7 else node.kwargs.get("eps", 1e-5))
        if training:
            raise Unsupported("batch_norm in training mode (statistics depend on the batch)")
        if mean is None or var is None:
            raise Unsupported("batch_norm without running statistics")
        if amap[0] != "dims" or len(shape_of(node)) < 2:
            raise Unsupported("batch_norm read through a reshape")
        ch = ("dims", (amap[1][1],))

        def vec(v):
            return self.coerce(self.val(v, ch), "f")
        y = ("mul", ("sub", self.coerce(self.val(x, amap), "f"), vec(mean)),
             ("rsqrt", ("add", vec(var), ("const", eps))))
        if w is not None:
            y = ("mul", y, vec(w))
        if b is not None:
            y = ("add", y, vec(b))
        return y

    def slice(self, node, amap, vt: str) -> tuple:
        """A chain of slices of a task input, read in place (start and step per dim; the count is
        the iteration's, which the host checks fits in the input)."""
        if not (self.strided or self.kind == "rowwise"):
            raise Unsupported("slice (only the elementwise and row kernels bind sliced inputs)")
        if amap[0] != "dims":
            raise Unsupported("slice read through a reshape")
        nd = len(shape_of(node))
        starts, steps, src = [0] * nd, [1] * nd, node
        # walking from node in to the input: element j of what is read so far is element
        # starts + steps * j of src, and src, a slice (start, step) of the next, is element
        # start + step * i of it
        while (cut := _slice_step(src, nd)) is not None:
            src, dim, start, step = cut
            if not isinstance(start, int) or start < 0 or not isinstance(step, int) or step < 1:
                raise Unsupported(f"slice start {start} step {step} (constant, non-negative)")
            starts[dim], steps[dim] = start + step * starts[dim], step * steps[dim]
        if not (hasattr(src, "op") and src.op == "placeholder"):
            raise Unsupported("slice of a computed value (only task inputs are read sliced)")
        dims = tuple(-1 if (shape_of(node)[k] == 1 and amap[1][k] == -1) else amap[1][k] for k in range(nd))
        acc = Access(self.placeholders.index(src), "dims", dims, tuple(starts), tuple(steps))
        if self.window:
            return self.windowed(acc, acc.starts, acc.steps)
        if acc not in self.accesses:
            self.accesses.append(acc)
        return ("in", self.accesses.index(acc))

    def cat(self, node, amap, vt: str) -> tuple:
        """cat along dim k: each element from the operand whose range along k's iteration dim d
        holds it, ("select", i_d < hi, operand, rest); each operand is read at i_d - lo and only
        inside its range (Access.window: no load outside the tensor). Empty operands (HF's empty
        key/value cache) are dropped, as torch drops them."""
        nd = len(shape_of(node))
        k = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % nd
        parts = [p for p in node.args[0] if numel(shape_of(p)) != 0]
        if len(parts) == 1:
            return self.val(parts[0], amap)
        if not self.strided or self.kind != "elementwise":
            raise Unsupported("cat (only the elementwise kernel reads concatenated operands)")
        if amap[0] != "dims" or amap[1][k] < 0:
            raise Unsupported("cat read through a reshape")
        if self.window:
            raise Unsupported("cat of a cat's operand (one window per read)")
        d, size = amap[1][k], shape_of(node)[k]
        exprs, lo = [], 0
        for p in parts:
            hi = lo + shape_of(p)[k]
            self.window = (d, lo, hi, size)
            try:
                exprs.append((hi, self.val(p, amap)))
            finally:
                self.window = ()
            lo = hi
        e = exprs[-1][1]
        for hi, x in reversed(exprs[:-1]):
            e = ("select", ("lt", ("coord", d), ("iconst", hi)), x, e)
        return e

    def permute(self, node, amap, vt: str) -> tuple:
        """A permute/transpose read in iteration order: the source's dim p[k] is the value's dim
        k, so it takes that dim's iteration dim (a strided read; the host binds the strides). A
        chain of them that composes to the identity is dropped (simplify)."""
        src = simp.permute_source(node) if self.simplify else None
        if src is not None:
            self.dropped.append(f"{node.target} chain (identity)")
            return self.val(src, amap)
        # NOTE: row programs bind every "dims" access through the input's real strides
        # (rowwise.py), so a permuted read is theirs too (layer_norm after a permute)
        if amap[0] != "dims" or not (self.strided or self.kind == "rowwise"):
            raise Unsupported(f"{node.target} changes element order (only identity permute chains fold"
                              " outside elementwise and row kernels)")
        nd = len(shape_of(node))
        p = simp.perm_of(node)
        if p is None:
            raise Unsupported(f"{node.target}: permutation unknown")
        dims = [0] * nd
        for k in range(nd):
            dims[p[k]] = amap[1][k]
        return self.val(node.args[0], ("dims", tuple(dims)))

    def clamp(self, node, amap, vt: str) -> tuple:
        x = self.val(node.args[0], amap)
        t = node.target
        if t in (aten.hardtanh.default, aten.hardtanh_.default):
            lo, hi = (list(node.args[1:3]) + [-1.0, 1.0][len(node.args) - 1:])[:2]
        elif t is aten.relu6.default:
            lo, hi = 0.0, 6.0
        elif t in (aten.clamp_min.default, aten.clamp_min.Tensor):
            lo, hi = node.args[1], None
        elif t in (aten.clamp_max.default, aten.clamp_max.Tensor):
            lo, hi = None, node.args[1]
        else:
            lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
            hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        if vt == "b":
            raise Unsupported("clamp of bool values")
        x = self.coerce(x, vt)
        if lo is not None:       # a tensor bound broadcasts like any operand (clamp.Tensor)
            x = ("max", x, self.coerce(self.operand(node, lo, amap), vt))
        if hi is not None:
            x = ("min", x, self.coerce(self.operand(node, hi, amap), vt))
        return x

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

    def row(self, node, amap, vt: str) -> tuple:
        """A row op: a reduction (one value per row), a softmax or a norm (one per element)."""
        if self.is_outer(node):
            return self.outer_sum(node)
        x_row = self.row_source(node)
        if node.target in ROW_REDUCE:
            self.check_row_use(node, amap)
            return self.reduce(node, x_row)
        self.check_full_use(node, amap)
        if node.target in SOFTMAXES:
            return self.softmax(node, x_row)
        return self.norm(node, x_row)

    def reduce(self, node, x_row: tuple) -> tuple:
        """The per-row value of a ROW_REDUCE op over x_row."""
        kind = ROW_REDUCE[node.target]
        if kind in ("var", "std"):
            var = self.variance(node, x_row)
            return ("sqrt", var) if kind == "std" else var
        if kind in ("argmax", "argmin"):
            return ("idx", self.red(kind, x_row)[1])
        if kind == "logsumexp":     # log(sum(exp(x - max))) + max, as softmax's statistics
            m = self.red("max", x_row, ("softmax", 0))
            s = self.red("sum", ("exp", ("sub", x_row, m)), ("softmax", 1))
            return ("add", ("log", s), m)
        if kind == "norm":
            return self.vector_norm(node, x_row)
        r = self.red("sum" if kind == "mean" else kind, x_row)
        return ("div", r, NCOL) if kind == "mean" else r

    def variance(self, node, x_row: tuple) -> tuple:
        """var / std's variance: Welford's mean and M2, M2 / max(n - correction, 0)."""
        args = list(node.args) + [None] * 3
        if node.target in (aten.var.dim, aten.std.dim):
            unbiased = args[2] if args[2] is not None else node.kwargs.get("unbiased", True)
            corr = 1.0 if unbiased else 0.0
        else:
            c = node.kwargs.get("correction")
            corr = 1.0 if c is None else float(c)
        mean = ("div", self.red("sum", x_row, ("welford", 0)), NCOL)
        m2 = self.red("sum", ("sq", ("sub", x_row, mean)), ("welford", 1))
        return ("div", m2, ("max", ("sub", NCOL, ("const", corr)), ("const", 0.0)))

    def vector_norm(self, node, x_row: tuple) -> tuple:
        """linalg_vector_norm of order 2, 1 or inf."""
        o = node.args[1] if len(node.args) > 1 and node.args[1] is not None else node.kwargs.get("ord", 2)
        o = float(o)
        if o == 2.0:
            return ("sqrt", self.red("sum", ("sq", x_row)))
        if o == 1.0:
            return self.red("sum", ("abs", x_row))
        if o == math.inf:
            return self.red("max", ("abs", x_row))
        raise Unsupported(f"vector norm of order {o}")

    def softmax(self, node, x_row: tuple) -> tuple:
        """softmax / log_softmax from the online-softmax pair (row max, sum of exp(x - max))."""
        t = node.target
        if t in (aten._softmax.default, aten._log_softmax.default) and node.args[2]:
            raise Unsupported("_softmax with half_to_float=True")
        m = self.red("max", x_row, ("softmax", 0))
        s = self.red("sum", ("exp", ("sub", x_row, m)), ("softmax", 1))
        if t in (aten.log_softmax.int, aten._log_softmax.default):
            return ("sub", ("sub", x_row, m), ("log", s))
        return ("div", ("exp", ("sub", x_row, m)), s)

    def norm(self, node, x_row: tuple) -> tuple:
        """layer / rms / instance / group norm of x_row, times the weight plus the bias (affine: how
        they line up with the iteration dims)."""
        t, xs = node.target, shape_of(node.args[0])
        args = list(node.args) + [None] * 8
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

    def kept_shape(self) -> tuple[int, ...]:
        """The shape of a per-row value (the kept dims in order, not keepdim)."""
        return tuple(self.shape[:self.D - self.nred])

    def is_outer(self, node) -> bool:
        """A sum / mean over every element of a per-row value (a loss's mean over its rows)."""
        kept = self.kept_shape()
        return (self.kind == "rowwise" and self.flat_rows is None and len(kept) > 0
                and node.target in (aten.sum.default, aten.mean.default, aten.sum.dim_IntList, aten.mean.dim)
                and shape_of(node.args[0]) == kept and reduced_dims(node) == tuple(range(len(kept)))
                and numel(shape_of(node)) == 1)

    def outer_sum(self, node) -> tuple:
        """("outer", j, vt): per-row values summed over the rows, after the row kernel (a second,
        one-block kernel adds the per-group partials in a fixed order); a sum of bools or integers
        stays an exact integer (nll_loss's count of targets), a mean divides by the row count."""
        x = self.val(node.args[0], ("dims", tuple(range(self.D - self.nred))))
        vt = "f" if self.vt(x) == "f" else "i"
        red = Reduction("sum", self.coerce(x, vt))
        if red not in self.outer:
            self.outer.append(red)
        e = ("outer", self.outer.index(red), vt)
        if node.target in (aten.mean.default, aten.mean.dim):
            if vt != "f":
                raise Unsupported("mean over rows of integer values")
            e = ("div", e, NROWS)
        return e

    def gather(self, node, amap, vt: str) -> tuple:
        """gather(src, row dim, index) with one index per row (nll_loss's pick of the target's
        log-probability): ("gather", src over its row, the index). The row kernel reads src's
        expression at that column once per row (a per-row epilogue)."""
        src, dim, index = node.args[:3]
        xs = shape_of(src)
        if self.kind != "rowwise" or self.nred != 1 or self.flat_rows is not None:
            raise Unsupported("gather outside a program of single-dim rows")
        d = int(dim) % len(xs)
        if len(xs) != self.D or tuple(xs[k] for k in self.perm) != self.shape or self.perm[-1] != d:
            raise Unsupported(f"gather along dim {d} of {xs}: only along the program's row")
        if shape_of(index) != tuple(1 if k == d else n for k, n in enumerate(xs)):
            raise Unsupported(f"gather of {shape_of(index)} indices from {xs}: one index per row")
        self.check_row_use(node, amap)
        return ("gather", self.val(src, self.base()), self.coerce(self.val(index, amap), "i"))

    def check_full_use(self, node, amap) -> None:
        if amap != self.base():
            raise Unsupported(f"{node.target} result used reshaped/broadcast ({amap})")

    def check_row_use(self, node, amap) -> None:
        lead = [d for d in amap[1] if d != -1] if amap[0] == "dims" else None
        if lead != list(range(self.D - self.nred)):
            raise Unsupported(f"{node.target} result used with layout {amap}; need one per row")


def _handlers(families) -> dict:
    """aten overload -> the Lowerer method that lowers it, from (overloads, method) rows."""
    table: dict = {}
    for overloads, handler in families:
        for t in overloads:
            if t in table:
                raise ValueError(f"{t} is lowered by both {table[t].__name__} and {handler.__name__}")
            table[t] = handler
    return table


# One row per op family: its aten overloads and the Lowerer method that lowers them, called as
# handler(lowerer, node, amap, vt) -> expression (vt: the node's value type; Lowerer.typed then
# checks and rounds the result). Most elementwise ops reach UNARY / BINARY / TERNARY from the op
# registry (torch_htam/ops.py: OpInfo.expr); an op of a new family is a new row and method.
HANDLERS = _handlers((
    (simp.PERMUTES, Lowerer.permute),
    (VIEWS, Lowerer.view),
    ({aten.slice.Tensor}, Lowerer.slice),
    ({aten.cat.default}, Lowerer.cat),
    (CASTS, Lowerer.cast),
    (UNARY, Lowerer.unary),
    (BINARY, Lowerer.binary),
    (TERNARY, Lowerer.ternary),
    (BATCH_NORMS, Lowerer.batch_norm),
    (FILLS, Lowerer.fill),
    (POWS, Lowerer.pow_scalar),
    (CLAMPS, Lowerer.clamp),
    (ROW_REDUCE.keys() | ROW_OPS, Lowerer.row),
    ({aten.gather.default}, Lowerer.gather),
))


def _keeps_order(n) -> bool:
    """n is a view or no-op that keeps a contiguous value's element order (ops.OpInfo.keeps_order:
    reshape, unsqueeze, eval dropout...)."""
    if not (hasattr(n, "op") and n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)):
        return False
    row = ops.info(n.target.overloadpacket.__name__)
    if row is None or not row.keeps_order:
        return False
    return not (n.target is aten.dropout.default and (n.args[2] if len(n.args) > 2 else n.kwargs.get("train", False)))


def _reshape_source(n):
    """The placeholder n reshapes through order-keeping views only, else None."""
    while _keeps_order(n):
        n = n.args[0]
    return n if hasattr(n, "op") and n.op == "placeholder" else None


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


def _iteration_space(gm, strided: bool = False) -> Space:
    rows = [n for n in gm.graph.nodes if is_row_op(n)]
    if rows and rows[0].target is aten.group_norm.default:
        xs, g = shape_of(rows[0].args[0]), int(rows[0].args[1])
        if not meta_of(rows[0].args[0]).is_contiguous():     # its rows are read flat
            raise Unsupported("group_norm of a channels-last or strided input (gn_cl.py takes channels-last)")
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
    rep = _repeat_source(outs[0]) if strided and len(outs) == 1 else None
    if rep is not None:
        # NOTE: the output is a reshape of a broadcast (GQA's k/v heads: [B, KV, T, d] ->
        # expand [B, KV, R, T, d] -> reshape [B, KV * R, T, d]): iterate over the broadcast's
        # shape, where the repeat is a stride-0 read, and store in that (row-major) order
        shape = shape_of(rep)
    return Space("elementwise", shape, tuple(range(len(shape))), 1, shape)


def _repeat_source(o):
    """The expand that output o reshapes (through order-keeping views) when o's dims group that
    expand's (split_groups), else None."""
    x = o
    while _keeps_order(x):
        x = x.args[0]
    if not (hasattr(x, "op") and x.op == "call_function" and x.target is aten.expand.default):
        return None
    if shape_of(x) == shape_of(o) or split_groups(shape_of(o), shape_of(x)) is None:
        return None
    return x


def split_groups(outer: tuple[int, ...], fine: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    """The dims of `fine` each dim of `outer` merges, in order ([1, 4, 16, 8] of [1, 2, 2, 16, 8]:
    ((0,), (1, 2), (3,), (4,))), or None when outer is no such merge of fine."""
    groups, d = [], 0
    for s in outer:
        g, p = [], 1
        while d < len(fine) and (p < s or not g):
            g.append(d)
            p *= fine[d]
            d += 1
        if p != s:
            return None
        groups.append(tuple(g))
    while d < len(fine) and fine[d] == 1 and groups:
        groups[-1] += (d,)
        d += 1
    return tuple(groups) if d == len(fine) else None


def _size_source(prog: ExprProgram, gm, base: tuple[int, ...], sp: Space) -> tuple:
    """A tensor whose run-time sizes are the iteration sizes: an output or an input read whole,
    in iteration order, or (rows reduced over leading or middle dims) through base, the iteration
    dim of each of the row op input's dims."""
    ident = tuple(range(prog.ndim))
    if sp.groups:     # (N, G, C / G, pixels) from a GroupNorm input's [N, C, *pixels]
        for a in prog.accesses:
            if a.mode == "flat" and prog.inputs[a.input][0] == sp.xs:
                return ("group", a.input, sp.groups, len(sp.xs))
    for i, o in enumerate(_graph_outputs(gm)):    # (an expanded output's sizes are 1 at its expanded dims)
        if shape_of(o) == prog.shape and (base == ident or prog.outputs[i].dims is None) \
                and not prog.outputs[i].broadcast:
            return ("out", i)
    for a in prog.accesses:
        if a.mode == "dims" and a.dims == ident and prog.inputs[a.input][0] == prog.shape and not a.view:
            return ("in", a.input)
    outs = _graph_outputs(gm)
    if sp.kind == "elementwise" and len(outs) == 1 and prog.outputs[0].dims is None:
        groups = split_groups(shape_of(outs[0]), prog.shape)
        if groups is not None:     # the output's dims merge iteration dims (a repeat's reshape)
            return ("split", 0, groups, tuple(prog.shape))
    if base != ident:
        for i, o in enumerate(prog.outputs):
            if o.dims == base and not o.broadcast:
                return ("out", i, base)
        for a in prog.accesses:
            if a.mode == "dims" and a.dims == base and len(prog.inputs[a.input][0]) == prog.ndim:
                return ("in", a.input, base)
    raise Unsupported("no input or output has the iteration shape; sizes can't be read at run time")


def expanded(o) -> bool:
    """o's value is an expanded view: some dim of size > 1 has stride 0 (TensorSpec.broadcast_dims)."""
    val = meta_of(o)
    return val.numel() > 0 and any(n > 1 and st == 0 for n, st in zip(val.shape, val.stride()))


def channels_last(o) -> bool:
    """o's value is a 4-D [N, C, H, W] tensor stored N, H, W, C (and not also row-major)."""
    val = meta_of(o)
    return val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last) and not dense_row_major(o)


def dense_row_major(o) -> bool:
    """o's value is laid out contiguously in row-major order (sizes-1 dims ignored)."""
    val = meta_of(o)
    return val.numel() <= 1 or val.is_contiguous()


def _output(low: Lowerer, sp: Space, o) -> Output:
    """The output node o of the region as a program Output (how it is indexed and stored)."""
    os_, dt = shape_of(o), value_dtype_of(o)
    shape, ident = sp.shape, sp.perm == tuple(range(len(sp.perm)))
    row_shapes = {}
    if sp.kind == "rowwise":
        red = set(sp.perm[len(shape) - sp.nred:])
        row_shapes = {tuple(s for k, s in enumerate(sp.xs) if k not in red): False,
                      tuple(1 if k in red else s for k, s in enumerate(sp.xs)): True}
    bcast = expanded(o)
    if sp.kind == "rowwise" and numel(os_) == 1 and len(shape) > sp.nred and os_ not in row_shapes:
        # one value for the program: sums over rows of per-row values (outer reductions)
        return Output(low.val(o, ("dims", (-1,) * len(os_))), dt, False, 1, total=True)
    if not ident and os_ == sp.xs:     # (first: a square input's shape equals its permutation)
        base = low.base()
        return Output(low.val(o, base), dt, False, numel(os_), dims=base[1], broadcast=bcast)
    if os_ == shape:
        # NOTE: torch gives an elementwise result the layout of its inputs: a permuted input makes
        # a permuted, dense output (Whisper's conv output.permute(0, 2, 1) + pos), which verification
        # allocates as torch does; such an output is stored through its strides too
        through = bcast or (sp.kind == "elementwise" and not dense_row_major(o))
        return Output(low.val(o, low.identity()), dt, False, numel(os_),
                      dims=tuple(range(len(shape))) if through else None, broadcast=bcast)
    if bcast:
        raise Unsupported(f"expanded output of shape {os_} next to iteration shape {shape}")
    src, p = _permute_chain(o)
    if sp.kind == "rowwise" and p is not None and shape_of(src) == sp.xs:
        # a permute of a full-shape value (ViT's layer_norm then transpose back to [T, B, C]):
        # output dim k is the value's dim p[k], stored through the output's strides
        base = low.base()[1]
        dims = tuple(base[p[k]] for k in range(len(p)))
        return Output(low.val(o, ("dims", dims)), dt, False, numel(os_), dims=dims)
    if numel(os_) == numel(shape) and ident:
        return Output(low.val(o, ("flat", os_)), dt, False, numel(os_))
    if os_ in row_shapes:
        # (integer values in a row program: an arg reduction's index alone, _check_row_types)
        return Output(low.val(o, low.row_map(keepdim=row_shapes[os_])), dt, True, numel(os_))
    raise Unsupported(f"output of shape {os_} next to iteration shape {shape}")


def _permute_chain(o):
    """(source, p) when o is a chain of permutes / transposes of source (o's dim k is source's dim
    p[k]), else (None, None)."""
    p, x = None, o
    while hasattr(x, "op") and x.op == "call_function" and x.target in simp.PERMUTES:
        q = simp.perm_of(x)
        if q is None:
            return None, None
        p = q if p is None else [q[k] for k in p]
        x = x.args[0]
    return (x, p) if p is not None else (None, None)


def lower(gm, simplify: bool = True, leaves=None, extra_inputs=(), strided: bool = False) -> ExprProgram:
    """Lower an aten GraphModule (placeholders = task inputs, output tuple) to an ExprProgram.

    >>> prog = lower(task.graph); prog.kind
    'elementwise'
    """
    sp = _iteration_space(gm, strided)
    kind, shape = sp.kind, sp.shape
    if not shape:
        raise Unsupported("0-dim iteration space")
    low = Lowerer(gm, shape, kind, simplify, leaves, strided, sp.perm, sp.nred,
                  sp.xs if sp.groups else None)
    inputs = [(shape_of(p), value_dtype_of(p)) for p in low.placeholders] + list(extra_inputs)
    low.input_dtypes = [dt for _, dt in inputs]
    outputs = []
    for o in _graph_outputs(gm):
        if not hasattr(o, "op"):
            raise Unsupported(f"constant output {o!r}")
        outputs.append(_output(low, sp, o))
    dropped = low.dropped + (simp.unused_ops(gm) if simplify else [])
    prog = ExprProgram(kind, shape, inputs, low.accesses, low.reductions, outputs, dropped=dropped,
                       nred=sp.nred, outer=low.outer)
    for o in prog.outputs:
        if o.row and column_dependent(o.expr, prog):
            raise Unsupported("a per-row output depends on a column")
        if o.total and any(x[0] in ("in", "red", "idx", "gather", "ncol") for x in walk(o.expr)):
            raise Unsupported("a value for the whole program that reads a row (only sums over rows)")
        if any(x[0] == "outer" for x in walk(o.expr)) and not o.total:
            raise Unsupported("a sum over rows used per row or per column")
    for r in prog.outer:
        if column_dependent(r.expr, prog) or any(x[0] in ("outer", "idx") for x in walk(r.expr)):
            raise Unsupported("a sum over rows of a value that varies along the row")
    for o in prog.outputs:
        if o.total:
            continue
        if not o.row and any(x[0] == "gather" for x in walk(o.expr)):
            raise Unsupported("a gathered value used per column (only per-row outputs read one)")
        if not o.row and any(x[0] == "idx" for x in walk(o.expr)):
            raise Unsupported("an arg reduction's index used in elementwise math")
    if kind == "rowwise":
        _check_row_types(prog)
    prog.size_source = _size_source(prog, gm, low.base()[1] if low.base()[0] == "dims" else ident_dims(prog), sp)
    prog.has_transcendental = any(op in TRANSCENDENTAL for op in low_ops(prog))
    exprs = [o.expr for o in prog.outputs] + [r.expr for r in prog.reductions]
    prog.coords = tuple(sorted({x[1] for e in exprs for x in walk(e) if x[0] == "coord"}
                               | {a.window[0] for a in prog.accesses if a.window}))
    if kind == "elementwise" and strided:     # (the elementwise target's own regions)
        prog.tile_dims = transposed_dims(prog, [meta_of(n) for n in low.placeholders], meta_of(_graph_outputs(gm)[0]))
    return prog


def _unit_dim(shape, strides) -> int | None:
    """The last dim along which a tensor's elements are adjacent (stride 1, size > 1), or None."""
    return next((k for k in reversed(range(len(shape))) if shape[k] > 1 and strides[k] == 1), None)


def write_dim(prog: ExprProgram, out0) -> int | None:
    """The iteration dim along which the first output is written contiguously (out0: its captured
    value), or None (a broadcast output, none that steps by one element)."""
    o = prog.outputs[0]
    if o.broadcast:
        return None
    if o.dims is None:     # stored in iteration order
        return _unit_dim(prog.shape, [1] * prog.ndim)
    k = _unit_dim(tuple(out0.shape), out0.stride())
    return None if k is None else o.dims[k]


def read_dim(prog: ExprProgram, a: Access, val) -> int | None:
    """The iteration dim along which access a reads its input contiguously (val: the input's
    captured value), or None: integer and windowed reads (element loads), flat/suffix/span reads
    (iteration order), stepped slices, broadcasts."""
    if a.mode != "dims" or a.window or VT[prog.inputs[a.input][1]] != "f":
        return None
    k = _unit_dim(a.view, [1] * len(a.view)) if a.view else _unit_dim(tuple(val.shape), val.stride())
    if k is None or k >= len(a.dims) or a.dims[k] < 0 or (a.steps and a.steps[k] != 1):
        return None
    return a.dims[k]


def transposed_dims(prog: ExprProgram, input_vals: list, out0) -> tuple[int, int] | None:
    """ExprProgram.tile_dims: (r, w) for the first access read contiguously along a dim r other
    than the dim w the first output is written along, and that varies along w (a read broadcast
    along w is one address per warp: no tile needed), at the captured layouts (input_vals: the
    task inputs' values; an epilogue's extra inputs have none and are skipped)."""
    w = write_dim(prog, out0)
    if w is None or prog.ndim < 2:
        return None
    for a in prog.accesses:
        if a.input >= len(input_vals):
            continue
        r = read_dim(prog, a, input_vals[a.input])
        shape = a.view or tuple(input_vals[a.input].shape)
        along_w = any(d == w and shape[k] > 1 for k, d in enumerate(a.dims))
        if r is not None and r != w and along_w:
            return r, w
    return None


def _check_row_types(prog: ExprProgram) -> None:
    """Row programs load floats and bools along the row and compute float and bool values there
    (rowwise.py's loads are float-lane traits: a bool input arrives as 0.f / 1.f, which C++ reads
    as the bool it stores). Integers are per-row values: an arg reduction's index, stored whole,
    and per-row int64 / int32 inputs (nll_loss's target: the gather index, the ignore_index test)
    read once per row in the per-row outputs."""
    vt = program_value_type(prog)
    why = "int64/int32 values in a row program (it loads floats and bools along the row; integers " \
          "are per-row: an arg reduction's index, a per-row index input)"
    D, nr = prog.ndim, prog.nred
    if any(VT[prog.inputs[a.input][1]] not in "fb" and a.column_varying(D, nr) for a in prog.accesses):
        raise Unsupported(why)
    exprs = [o.expr for o in prog.outputs if not o.row and not o.total] + [r.expr for r in prog.reductions]
    if any(vt(x) not in "fb" for e in exprs for x in walk(e)):
        raise Unsupported(why)
    # an arg reduction's index is stored as it is, never computed with
    if any(x[0] == "idx" for o in prog.outputs if o.row and o.expr[0] != "idx" for x in walk(o.expr)):
        raise Unsupported(why)
    # a gather's source is read along the row: floats and bools only
    srcs = [x[1] for e in [o.expr for o in prog.outputs if o.row] + [r.expr for r in prog.outer]
            for x in walk(e) if x[0] == "gather"]
    if any(vt(x) not in "fb" for e in srcs for x in walk(e)):
        raise Unsupported(why)
    if any(vt(r.expr) != "f" for r in prog.reductions):
        raise Unsupported("a reduction over bool values")


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


def walk(e: tuple, into_gather: bool = True):
    """Yield every sub-expression of e (pre-order, repeats included); into_gather=False leaves out
    the sources of gathers (their index is walked)."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        if x[0] in ("in", "const", "iconst", "bconst", "red", "ncol", "idx", "outer", "nrows", "coord"):
            continue
        if x[0] == "gather" and not into_gather:
            stack.append(x[2])
            continue
        stack.extend(a for a in x[1:] if isinstance(a, tuple))


def low_ops(prog: ExprProgram) -> set[str]:
    exprs = [o.expr for o in prog.outputs] + [r.expr for r in prog.reductions] + [r.expr for r in prog.outer]
    return {x[0] for e in exprs for x in walk(e)}


def column_dependent(e: tuple, prog: ExprProgram) -> bool:
    """e varies along the row (a gather's source is read at one column per row: it does not)."""
    return any(x[0] == "in" and prog.accesses[x[1]].column_varying(prog.ndim, prog.nred)
               for x in walk(e, into_gather=False))


def _slice_step(node, nd: int) -> tuple | None:
    """node as one slice of another value: (source, dim, start, step) for aten.slice and for a
    piece of chunk / split (getitem i: a step-1 slice starting after the pieces before it), None
    for anything else. nd: node's rank (a slice or a piece has its source's)."""
    if not (hasattr(node, "op") and node.op == "call_function"):
        return None
    if node.target is aten.slice.Tensor:
        start = node.args[2] if len(node.args) > 2 else 0
        return (node.args[0], (node.args[1] if len(node.args) > 1 else 0) % nd, 0 if start is None else start,
                node.args[4] if len(node.args) > 4 else 1)
    split = node.args[0] if node.target is operator.getitem else None
    if getattr(split, "target", None) not in SPLITS:
        return None
    src, i = split.args[0], node.args[1]
    dim = (split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) % nd
    arg = split.args[1]
    if split.target is aten.chunk.default:        # pieces of ceil(n / chunks), the last one short
        n = shape_of(src)[dim]
        return src, dim, i * -(-n // arg), 1
    if split.target is aten.split.Tensor:         # pieces of split_size
        return src, dim, i * arg, 1
    return src, dim, sum(arg[:i]), 1               # split_with_sizes
