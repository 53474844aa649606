"""Layouts around a GEMM: operands and outputs that are views of a tensor (view, transpose, split...).

A GEMM region's output often reaches the graph through layout ops: GPT-2's c_attn addmm + view +
split into q, k, v; BERT's q linear + view + transpose(1, 2) to heads; MinGPT's (att @ v)
.transpose(1, 2).contiguous().view(B, T, C). And a batched matmul's operands are often views of a
region input: q @ k.transpose(-2, -1) with q, k heads of a [B, T, C] tensor. Every such chain
(ops.py's VIEW and NOOP rows, plus cat with empty constants: HF's empty key/value cache) selects
elements of its source at fixed offsets, so this module replays it on a tensor of element indices
(torch.arange) and reads the affine map it applies: element i of the result is element
base + sum_j i_j * stride_j of its source (a strided view; a dim that steps two ways, c of
[B, T, H * d] merged from heads, is split into finer dims). Sizes are the captured ones; the kernel
checks them at run time.

The GEMM result Y is seen as [batch, M, N] (row-major); an output is then a box of Y: a range of
each of batch (b), rows (m), columns (n), and each (fine) dim steps exactly one of them
(`OutBox.dims`: (axis, step in units of that axis)). cuBLASLt can write such a box straight into
the output when the output's strides make it a (batched) column-major matrix; otherwise the GEMM
writes Y into a scratch buffer and a kernel writes each output through this index map.

    >>> lay = output_layouts(gm, epilogue_value, batch=1, M=16, N=96)   # GPT-2's c_attn split
    >>> lay[0].box.lo, lay[0].box.hi          # q: all rows, columns 0..31
    ((0, 0, 0), (1, 16, 32))
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from torch_htam import ops
from torch_htam.partition import op_name
from torch_htam.proposers.expert.ir import Unsupported, shape_of

@dataclass(frozen=True)
class Strided:
    """A strided view of a contiguous source: element i = base + sum_j i_j * strides[j]."""
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    base: int
    groups: tuple[int, ...] = ()     # fine dims per tensor dim (all 1: sizes are the tensor's)

    def fine_of(self, dim: int) -> range:
        """The fine dims tensor dim `dim` became."""
        g = self.groups or (1,) * len(self.sizes)
        start = sum(g[:dim])
        return range(start, start + g[dim])


@dataclass(frozen=True)
class OutBox:
    """The box of Y = [batch, M, N] one output covers: lo..hi per axis (b, m, n), and per output dim
    (axis index 0..2, step in units of that axis; -1 for a size-1 or repeated dim). repeats: some
    dim repeats the box (Llama's k/v heads repeated for grouped-query attention): no library call
    writes that, the store kernel does."""
    lo: tuple[int, int, int]
    hi: tuple[int, int, int]
    dims: tuple[tuple[int, int], ...]
    repeats: bool = False

    @property
    def extent(self) -> tuple[int, int, int]:
        return tuple(h - l for l, h in zip(self.lo, self.hi))


@dataclass(frozen=True)
class OutLayout:
    """One region output: its shape, its strided map into Y, and the box it covers."""
    shape: tuple[int, ...]
    view: Strided
    box: OutBox

    def fine_dst(self) -> list[tuple[int, int]]:
        """Per fine dim: (the output dim it belongs to, its step in that dim's index): its stride
        in the output is that multiple of the output dim's stride."""
        out = []
        for j in range(len(self.shape)):
            dims = list(self.view.fine_of(j))
            for f in dims:
                out.append((j, math.prod(self.view.sizes[g] for g in dims if g > f)))
        return out

    def identity(self, y_numel: int) -> bool:
        """The output is Y itself in Y's element order (a pure reshape of a contiguous Y)."""
        return self.view.base == 0 and math.prod(self.shape) == y_numel and _row_major(self.view)


def _row_major(v: Strided) -> bool:
    acc = 1
    for size, st in reversed(list(zip(v.sizes, v.strides))):
        if size != 1 and st != acc:
            return False
        acc *= size
    return True


# ---- which nodes are layout ops ---------------------------------------------------------------

def _empty_const(n) -> bool:
    """A value with no elements (HF's empty key/value cache, as lift_fresh_copy + detach)."""
    v = n.meta.get("val") if hasattr(n, "meta") else None
    return isinstance(v, torch.Tensor) and v.numel() == 0


def is_layout(n) -> bool:
    """n only selects/reorders elements of one source: a VIEW/NOOP op (eval dropout), getitem of a
    split, or a cat whose other operands are empty."""
    if n.op != "call_function":
        return False
    name = op_name(n)
    row = ops.info(name)
    if name == "cat":
        parts = n.args[0]
        return sum(not _empty_const(p) for p in parts) == 1
    if row is None or row.category not in ops.FREE:
        return False
    if name in ("dropout", "feature_dropout", "alpha_dropout"):
        train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", False)
        return not train
    return True


def layout_source(n):
    """The value a layout op reads its elements from."""
    if op_name(n) == "cat":
        return next(p for p in n.args[0] if not _empty_const(p))
    return n.args[0]


def chain_source(n):
    """Walk back through layout ops to the first value that is not one."""
    while hasattr(n, "op") and is_layout(n):
        n = layout_source(n)
    return n


# ---- replaying a chain on element indices ------------------------------------------------------

def strided_of(target, source) -> Strided:
    """The strided map from `source` (a node, read contiguous) to `target` (reached from it through
    layout ops only). Unsupported when the chain's result is not a strided view (e.g. a reshape of
    an expanded value repeats elements in a pattern no stride gives)."""
    env = {source: torch.arange(math.prod(shape_of(source)), dtype=torch.int64).view(shape_of(source))}

    def value(n):
        if n in env:
            return env[n]
        if not hasattr(n, "op"):
            return n
        if n.op == "placeholder" or not is_layout(n):
            if _empty_const(n):
                return torch.empty(shape_of(n), dtype=torch.int64)
            raise Unsupported(f"layout chain reads {n} besides its source")
        name = op_name(n)
        if ops.info(name) is not None and ops.info(name).category == ops.NOOP:
            env[n] = value(n.args[0]) if name not in ("contiguous", "clone") else value(n.args[0]).contiguous()
        elif n.target is operator.getitem:
            env[n] = value(n.args[0])[n.args[1]]
        else:
            args = torch.fx.node.map_aggregate(n.args, value)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, value)
            env[n] = n.target(*args, **kwargs)
        return env[n]

    idx = value(target)
    if not isinstance(idx, torch.Tensor):
        raise Unsupported(f"layout chain to {target} gives no tensor")
    return _affine(idx)


def _affine(idx: torch.Tensor) -> Strided:
    """Read base and strides off an index tensor and check it is exactly that strided map. A dim
    that steps two ways (c of a [B, T, H * d] view of [B, H, T, d] data: heads, then columns) is
    split into its factors (sizes outer to inner): Strided.sizes are then the finer dims, and
    Strided.groups says how many of them each tensor dim became."""
    sizes = tuple(idx.shape)
    if idx.numel() == 0:
        raise Unsupported("empty output of a GEMM layout chain")
    base = int(idx.flatten()[0])
    fine, groups = [], []
    for j, s in enumerate(sizes):
        at = [0] * len(sizes)
        at[j] = slice(None)
        f = _factors((idx[tuple(at)] - base).tolist())
        fine += f
        groups.append(len(f))
    fsizes = tuple(s for s, _ in fine)
    fstrides = tuple(st for _, st in fine)
    ok = all(st >= 0 for st in fstrides) and len(fine) <= 8
    if ok:
        want = torch.as_strided(torch.arange(int(idx.max()) + 1, dtype=torch.int64), fsizes, fstrides, base)
        ok = torch.equal(want.reshape(sizes), idx)
    if not ok:
        raise Unsupported("a GEMM operand/output layout that is not a strided view")
    return Strided(fsizes, fstrides, base, tuple(groups))


def _factors(v: list[int]) -> list[tuple[int, int]]:
    """(size, stride) factors, outer to inner, of a sequence of offsets that starts at 0 and steps
    by one stride within runs that repeat at another stride: [0, 1, 8, 9] -> [(2, 8), (2, 1)]."""
    n = len(v)
    if n == 1:
        return [(1, 0)]
    st, p = v[1] - v[0], 1
    while p < n and v[p] == p * st:
        p += 1
    if p == n:
        return [(n, st)]
    if n % p:
        raise Unsupported("a GEMM operand/output layout that is not a strided view")
    outer = _factors(v[::p])
    return outer + [(p, st)]


# ---- outputs as boxes of Y ---------------------------------------------------------------------

def box_of(view: Strided, batch: int, M: int, N: int) -> OutBox:
    """Which box of Y = [batch, M, N] a strided view of Y covers, each output dim stepping one axis
    in mixed radix (so the box is covered exactly once, or once per index of the dims that step 0:
    a repeat). Unsupported otherwise (a dim that steps across rows and columns at once)."""
    unit = (M * N, N, 1)
    extent = (batch, M, N)
    lo = (view.base // (M * N), view.base // N % M, view.base % N)
    dims, per_axis, repeats = [], {0: [], 1: [], 2: []}, False
    for size, st in zip(view.sizes, view.strides):
        if size == 1 or st == 0:
            dims.append((-1, 0))
            repeats = repeats or size > 1
            continue
        axis = next((a for a in range(3) if st % unit[a] == 0 and (a == 0 or st // unit[a] < extent[a])), None)
        if axis is None:
            raise Unsupported("a GEMM output dim that steps across rows and columns")
        dims.append((axis, st // unit[axis]))
        per_axis[axis].append((st // unit[axis], size))
    hi = []
    for a in range(3):
        span = 1
        for step, size in sorted(per_axis[a]):
            if step != span:
                raise Unsupported("a GEMM output that skips or repeats elements of the result")
            span *= size
        if lo[a] + span > extent[a]:
            raise Unsupported("a GEMM output that wraps around a row of the result")
        hi.append(lo[a] + span)
    return OutBox(lo, tuple(hi), tuple(dims), repeats)


def output_layouts(gm, source, batch: int, M: int, N: int) -> list[OutLayout]:
    """Every graph output as a layout of `source` (the epilogue's result, Y's shape)."""
    from torch_htam.proposers.expert.ir import _graph_outputs
    out = []
    for o in _graph_outputs(gm):
        if not hasattr(o, "op") or chain_source(o) is not source:
            raise Unsupported("GEMM outputs must all be layouts (view/transpose/split) of one "
                              "epilogue value of the GEMM's shape")
        view = strided_of(o, source)
        out.append(OutLayout(shape_of(o), view, box_of(view, batch, M, N)))
    return out


# ---- batched-matmul operands -------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """A matmul operand [..., R, C] as a strided view of a contiguous region input: the input's
    index, the batch count and stride of cuBLASLt's batch (0 = broadcast), row and column strides
    (elements), and the count and stride of an outer batch the kernel loops over (heads of a
    [B, T, C] input are one strided batch per b, but b and h together are not)."""
    input: int
    batch: int
    s_batch: int
    s_row: int
    s_col: int
    outer: int = 1
    s_outer: int = 0


def operand_of(node, placeholders: list, lead_shape: tuple[int, ...]) -> Operand:
    """A bmm/matmul operand: a region input or a layout chain of one (k.transpose(-2, -1)), whose
    leading dims are the product's (lead_shape) or all 1 (broadcast)."""
    src = chain_source(node)
    if src not in placeholders:
        raise Unsupported("GEMM operands must be region inputs or views of them")
    if src is not node and not is_row_major(src):
        raise Unsupported("a matmul operand that is a view of a non-contiguous input")
    v = strided_of(node, src) if src is not node else Strided(shape_of(node), memory_strides(node), 0,
                                                              (1,) * len(shape_of(node)))
    if len(v.sizes) < 2 or any(g != 1 for g in v.groups):
        raise Unsupported("a matmul operand of rank < 2 or not a strided view of its input")
    if v.base != 0:
        raise Unsupported("a matmul operand that starts inside its input")
    lead = v.sizes[:-2]
    if math.prod(lead) == 1:
        return Operand(placeholders.index(src), 1, 0, v.strides[-2], v.strides[-1])
    if tuple(lead) != tuple(lead_shape[len(lead_shape) - len(lead):]) or len(lead) != len(lead_shape):
        raise Unsupported("matmul batch dims broadcast other than one operand's all-1")
    dims = [(s, st) for s, st in zip(lead, v.strides[:-2]) if s != 1]
    one = _one_stride(dims)
    if one is not None:
        return Operand(placeholders.index(src), math.prod(lead), one, v.strides[-2], v.strides[-1])
    # the last batch dim is cuBLASLt's batch, the ones before it one outer stride the kernel loops over
    inner_n, inner_st = lead[-1], v.strides[-3]
    outer = _one_stride([(s, st) for s, st in zip(lead[:-1], v.strides[:-3]) if s != 1])
    if outer is None or inner_n == 1:
        raise Unsupported("matmul batch dims that are neither one strided batch nor an outer loop "
                          "over one")
    return Operand(placeholders.index(src), inner_n, inner_st, v.strides[-2], v.strides[-1],
                   math.prod(lead[:-1]), outer)


def _one_stride(dims: list[tuple[int, int]]) -> int | None:
    """The one stride that steps (size, stride) dims (outer to inner) as a single index, or None."""
    for (_, st_out), (s_in, st_in) in zip(dims, dims[1:]):
        if st_out != st_in * s_in:
            return None
    return dims[-1][1] if dims else 0


def memory_strides(n) -> tuple[int, ...]:
    """A node's captured strides (its meta value's; row-major where it has none)."""
    v = n.meta.get("val")
    return tuple(v.stride()) if isinstance(v, torch.Tensor) else _contiguous(shape_of(n)).strides


def is_row_major(n) -> bool:
    """Whether a node's captured value is contiguous (assumed where it has none)."""
    v = n.meta.get("val")
    return not isinstance(v, torch.Tensor) or v.is_contiguous()


def _contiguous(shape) -> Strided:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc if s != 1 else 0)
        acc *= s
    return Strided(tuple(shape), tuple(reversed(strides)), 0, (1,) * len(shape))
