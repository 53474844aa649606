"""Symbolic sizes: graphs that serve a range of batch or sequence sizes without recompiling.

Where sizes are declared dynamic (OptimizeConfig.dynamic, or torch.compile's own dynamic shapes),
Dynamo hands over graphs whose sizes are symbols (s0) with a range, plus the symbols themselves
as int inputs. This module is the one place that reads them:

- `export_plan` / `SizedCall`: a Dynamo graph re-exported with those dims dynamic (torch.export
  dynamic_shapes), taking only its tensors: each size input is read off a tensor that carries it,
  so views and reshapes keep `x.size(1)` instead of the example's 16.
- `region_sizes`: a region's size inputs (a view's SymInt argument) as sizes of its tensor inputs,
  so its task's source takes them from its inputs and runs at any size.
- `region_dims`: which dims of a region's boundary follow a symbol, and over what range (k * the
  symbol's range: B, or B * S flattened with S static); a region that follows two symbols, or a
  size that is not k * one symbol (s0 + 1, s0 // 2), gets no task.

    >>> plan = export_plan(gm, example_inputs)          # None: static
    >>> ep = torch.export.export(SizedCall(gm, plan), plan.tensors(example_inputs),
    ...                          dynamic_shapes=plan.dynamic_shapes())
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx as fx

# torch.compile specializes sizes 0 and 1 (a size-1 call compiles a graph of its own, where the
# static task at size 1 serves it): a dynamic graph never sees them, so no range starts below 2.
SERVED_LOW = 2


def served_range(low: int, high: int) -> tuple[int, int]:
    """The part of a declared range that a dynamic graph serves."""
    return max(low, SERVED_LOW), high


def _sym(v) -> sympy.Expr | None:
    """The sympy expression of a SymInt (None for a plain int)."""
    return v.node.expr if isinstance(v, torch.SymInt) else None


def _range_of(v: torch.SymInt, symbol: sympy.Symbol) -> tuple[int, int]:
    from torch.utils._sympy.numbers import int_oo
    r = v.node.shape_env.var_to_range[symbol]
    high = None if r.upper in (int_oo, sympy.oo) else int(r.upper)   # Dynamo's own dynamic dims: [2, oo]
    return served_range(int(r.lower), high)


# ---- Dynamo graph -> an export with dynamic dims ----------------------------------------------

@dataclass
class ExportPlan:
    """How a Dynamo graph's inputs map onto the tensors it is exported with. args[k]: ("t", j)
    the j-th tensor, or ("size", j, d) the j-th tensor's size d (a SymInt input). dims: per
    tensor j, {dim: symbol name}; ranges: {symbol name: (low, high)}."""
    args: list[tuple]
    dims: list[dict[int, str]]
    ranges: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def tensors(self, example_inputs) -> tuple:
        return tuple(x for x in example_inputs if isinstance(x, torch.Tensor))

    def dynamic_shapes(self, refinable: bool = False) -> tuple:
        """export's dynamic_shapes: a named Dim per symbol over its range, so export fails where the
        graph's code narrows a range; refinable: Dim.DYNAMIC over the same range instead, which
        lets export narrow it (it still fails where the code fixes the size)."""
        from torch.export import Dim

        def dim(name: str, lo: int, hi: int | None):
            if refinable:
                return Dim.DYNAMIC(min=lo, max=hi) if hi is not None else Dim.DYNAMIC(min=lo)
            return Dim(name, min=lo, max=hi) if hi is not None else Dim(name, min=lo)
        made = {name: dim(name, lo, hi) for name, (lo, hi) in self.ranges.items()}
        # one entry: SizedCall.forward takes the tensors as one *args
        return (tuple({d: made[name] for d, name in dims.items()} or None for dims in self.dims),)


def export_plan(gm: fx.GraphModule, example_inputs) -> ExportPlan | str | None:
    """None for a graph with static sizes; an ExportPlan; or why it cannot be exported with its
    dims dynamic (a size input no tensor carries, a tensor dim that is an expression)."""
    vals = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    if len(vals) != len(example_inputs):
        return "its inputs do not match its placeholders"
    if not any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and _symbolic(v)) for v in vals):
        return None
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    plan = ExportPlan([], [{} for _ in tensors])
    for j, t in enumerate(tensors):
        for d, n in enumerate(t.shape):
            e = _sym(n)
            if e is None:
                continue
            if not isinstance(e, sympy.Symbol):
                return f"tensor input {j} has size {e} in dim {d}, not one symbol"
            plan.dims[j][d] = str(e)
            plan.ranges[str(e)] = _range_of(n, e)
    j = 0
    for v in vals:
        if isinstance(v, torch.Tensor):
            plan.args.append(("t", j))
            j += 1
            continue
        where = _carrier(tensors, _sym(v)) if isinstance(v, torch.SymInt) else None
        if where is None:
            return f"a size input ({v}) that no tensor input carries"
        plan.args.append(("size", *where))
    return plan


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(n, torch.SymInt) for n in t.shape)


def _carrier(tensors, expr) -> tuple[int, int] | None:
    for j, t in enumerate(tensors):
        for d, n in enumerate(t.shape):
            if _sym(n) == expr:
                return j, d
    return None


class SizedCall(torch.nn.Module):
    """The Dynamo graph called with tensors only: its size inputs read off the tensors (plan)."""

    def __init__(self, gm: fx.GraphModule, plan: ExportPlan):
        super().__init__()
        self.gm, self.plan = gm, plan

    def forward(self, *tensors):
        args = [tensors[a[1]] if a[0] == "t" else tensors[a[1]].size(a[2]) for a in self.plan.args]
        return self.gm(*args)


def with_size_inputs(sub: fx.GraphModule, example_inputs) -> fx.GraphModule:
    """`sub` (tensor inputs only) taking Dynamo's whole input list again: an unused placeholder
    for each size input, where Dynamo passes it."""
    holders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    it = iter(holders)
    anchor = holders[0] if holders else next(iter(sub.graph.nodes))
    for k, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            anchor = next(it)
            continue
        with sub.graph.inserting_before(anchor) if k == 0 else sub.graph.inserting_after(anchor):
            anchor = sub.graph.placeholder(f"htam_size_{k}")
        anchor.meta["val"] = x
    sub.graph.lint()
    sub.recompile()
    return sub


# ---- a region's symbolic sizes ---------------------------------------------------------------

def is_size(n) -> bool:
    return isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.SymInt)


def region_sizes(inputs: list[fx.Node]) -> tuple[dict[fx.Node, tuple[int, int, int]], str]:
    """({size input: (tensor input index, dim, k)}, why not): each SymInt input of a region as k
    times a dim of one of its tensor inputs (index among the tensor inputs only)."""
    tensors = [a for a in inputs if not is_size(a)]
    out = {}
    for a in inputs:
        if not is_size(a):
            continue
        found = _as_multiple(_sym(a.meta["val"]), tensors)
        if found is None:
            return {}, f"its size argument {a.meta['val']} is no multiple of an input's size"
        out[a] = found
    return out, ""


def _as_multiple(expr, tensors: list[fx.Node]) -> tuple[int, int, int] | None:
    """(input index, dim, k) with expr == k * that dim's size, k a positive integer."""
    if expr is None:
        return None
    for j, a in enumerate(tensors):
        v = a.meta.get("val")
        for d, n in enumerate(v.shape if isinstance(v, torch.Tensor) else ()):
            f = _sym(n)
            if f is None:
                continue
            k = sympy.simplify(expr / f)
            if k.is_Integer and k > 0:
                return j, d, int(k)
    return None


def region_dims(nodes: list[fx.Node]) -> tuple[dict[fx.Node, dict[int, tuple[int, int]]], str]:
    """({boundary node: {dim: (low, high)}}, why not) of the dims that are k * one symbol, k a
    positive integer, over k * the symbol's served range. Empty for a static region; why not
    (and no dims) where a dim is another expression or a second symbol shows up."""
    dims: dict[fx.Node, dict[int, tuple[int, int]]] = {}
    seen: set = set()
    for n in nodes:
        v = n.meta.get("val")
        for d, size in enumerate(v.shape if isinstance(v, torch.Tensor) else ()):
            e = _sym(size)
            if e is None:
                continue
            free = e.free_symbols
            k = sympy.simplify(e / next(iter(free))) if len(free) == 1 else None
            if k is None or not (k.is_Integer and k > 0):
                return {}, f"its size {e} is not a multiple of one dynamic size"
            seen |= free
            if len(seen) > 1:
                return {}, f"it varies with two dynamic sizes ({', '.join(sorted(map(str, seen)))})"
            low, high = _range_of(size, next(iter(free)))
            if high is None:
                return {}, (f"the dynamic size {e} has no upper bound (a size torch.compile made dynamic "
                            "after a recompile): declare its range, OptimizeConfig(dynamic=...)")
            dims.setdefault(n, {})[d] = (int(k) * low, int(k) * high)
    return dims, ""


def size_node(graph: fx.Graph, tensor: fx.Node, dim: int, k: int) -> fx.Node:
    """k * tensor.size(dim) as graph nodes (inserted at the graph's insertion point)."""
    n = graph.call_function(torch.ops.aten.sym_size.int, (tensor, dim))
    return n if k == 1 else graph.call_function(operator.mul, (n, k))


def strides(graph: fx.Graph, x: fx.Node, example_strides: tuple[int, ...]) -> list:
    """Strides laying x out in the order of `example_strides` (a spec's: contiguous, or
    channels-last), over x's own sizes: ints where they are static (the example's strides as
    they are), k * x.size(d) nodes where a size is symbolic (S * H for a [B, S, H] tensor's
    first dim)."""
    v = x.meta.get("val")
    if not isinstance(v, torch.Tensor) or not _symbolic(v):
        return list(example_strides)
    order = sorted(range(v.dim()), key=lambda d: (example_strides[d], -d))   # innermost first
    out: list = [0] * v.dim()
    acc = 1   # the next stride: an int, or a node once a symbolic size is in it
    for d in order:
        out[d] = acc
        size = int(v.shape[d]) if _sym(v.shape[d]) is None else size_node(graph, x, d, 1)
        both_int = isinstance(acc, int) and isinstance(size, int)
        acc = acc * size if both_int else graph.call_function(operator.mul, (acc, size))
    return out
