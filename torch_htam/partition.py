"""Partition: an aten fx graph -> regions worth one kernel each.

A region is one of
  - an anchor op (linear/matmul/bmm/addmm/conv/sdpa) with the elementwise ops after it (epilogue),
  - one row-wise op (softmax, norms, reductions) with the elementwise ops before and after it,
  - a chain of elementwise/broadcast ops,
  - a hand-written attention (q @ k^T, scale, mask, softmax, eval dropout, @ v: attn_pattern.py),
    one "attention" region like an SDPA call.
Views and no-ops (dropout in eval, contiguous, clone, alias) are "free": absorbed into the region
whose data they reshape, never a task of their own. Everything else (embedding, indexing, factory
ops) stays outside, on PyTorch. Which op is which is torch_htam.ops' table.

NOTE: no region can form a cycle with the rest of the graph: a node joins a region only if none of
its other inputs depends on that region. The runtime swaps a region for one kernel call taking
`Region.inputs` in order and producing `Region.outputs` in order.

    >>> for r in partition(gm):
    ...     print(r.kind, [str(n.target) for n in r.nodes])
    gemm ['aten.linear.default', 'aten.gelu.default']
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from torch_htam import attn_pattern, ops
from torch_htam.ops import ANCHOR, COMPUTE, ELEMENTWISE, FREE, NOOP, ROWWISE


@dataclass
class Region:
    """A set of graph nodes to be replaced by one kernel.

    nodes: in graph (topological) order. inputs: nodes outside the region that it reads, in order
    of first use. outputs: its nodes read outside the region or by the graph output, in graph order.
    kind: "gemm" | "conv" | "attention" | "rowwise" | "elementwise". anchor: the anchor or row-wise op.
    """
    nodes: list[fx.Node]
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    kind: str = "elementwise"
    anchor: fx.Node | None = None


def op_name(n: fx.Node) -> str | None:
    """Overload-packet name of an aten call ("linear"), "getitem" for tuple indexing, else None."""
    if n.op != "call_function":
        return None
    if n.target is operator.getitem:
        return "getitem"
    if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "aten":
        return n.target.overloadpacket.__name__
    return None


def category(n: fx.Node) -> str | None:
    """ANCHOR | ROWWISE | ELEMENTWISE | VIEW | NOOP, or None for ops that stay on PyTorch."""
    row = ops.info(op_name(n), _overload(n))
    if row is None or not _has_tensor_input(n):
        return None   # factory ops (arange, full) and non-aten calls are left alone
    return row.category


def _overload(n: fx.Node) -> str | None:
    """The overload name of an aten call ("other" of aten.min.other), else None."""
    return n.target._overloadname if isinstance(n.target, torch._ops.OpOverload) else None


def partition(gm: fx.GraphModule | fx.Graph) -> list[Region]:
    """Cut a captured aten graph into regions (see module doc). Deterministic for a given graph.

        >>> regions = partition(capture(model, (x,)).graphs[0])
        >>> regions[0].inputs, regions[0].outputs      # what the kernel reads / must produce
    """
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    patterns = attn_pattern.find(nodes)
    groups = _group_compute(nodes, order, patterns)
    region_of = {n: g for g in groups for n in g}   # node -> its group (a list, compared by id)
    _absorb_free(nodes, region_of)
    _close_tuples(nodes, region_of)
    attention = {p.pv: p for p in patterns}
    return [_make_region(sorted(g, key=order.get), order, attention) for g in groups
            if any(not ops.info(op_name(n)).cast for n in g if category(n) in COMPUTE)]


# ---- step 1: group compute nodes ------------------------------------------------------------

def _group_compute(nodes: list[fx.Node], order: dict, patterns=()) -> list[list[fx.Node]]:
    """Two greedy passes in graph order, after each hand-written attention (attn_pattern.Pattern)
    has become a group of its own (its intermediates are read inside it alone, so it can form no
    cycle).

    1. Each row-wise op seeds a region and takes its elementwise neighbours: the chain after it
       (epilogue), then the producers of the same size before it (prologue: residual add, casts,
       x*x of RMSNorm). NOTE: "same size" keeps shared broadcast inputs (attention masks, used by
       every layer) out, so every layer's region looks the same.
    2. Each anchor seeds a region; every elementwise op still free joins the region of its first
       producer that can take it, or starts an elementwise chain.
    """
    group_of: dict[fx.Node, list[fx.Node]] = {}
    groups: list[list[fx.Node]] = []

    def add(n, group):
        group_of[n] = group
        group.append(n)

    for pat in patterns:
        if not any(n in group_of for n in pat.nodes):
            group = []
            groups.append(group)
            for n in pat.nodes:
                add(n, group)
    for n in nodes:
        if category(n) == ROWWISE and n not in group_of:
            group: list[fx.Node] = []
            groups.append(group)
            add(n, group)
            _grab_epilogue(n, group, group_of, add, order)
            _grab_prologue(n, group, group_of, add, order)
    for n in nodes:
        cat = category(n)
        if n in group_of or cat not in (ANCHOR, ELEMENTWISE):
            continue
        target = None
        if cat == ELEMENTWISE:
            producers = _unique([group_of[p] for p in _compute_inputs(n) if p in group_of])
            producers = [g for g in producers if not _outside_anchor_epilogue(n, g)]
            target = next((g for g in producers if not _creates_cycle(n, g, order)), None)
        if target is None:
            target = []
            groups.append(target)
        add(n, target)
        if cat == ELEMENTWISE:
            _merge_chains(n, target, producers, groups, group_of, order)
    return [sorted(g, key=order.get) for g in sorted(groups, key=lambda g: min(map(order.get, g)))]


def _outside_anchor_epilogue(n: fx.Node, group: list[fx.Node]) -> bool:
    """n reads the result of group, an anchor's region, in another order (through a view that
    changes it: a permute, slice, broadcast; ops.OpInfo.keeps_order is False) or spread over a
    larger shape (n has more elements than the anchor's result).

    NOTE: an anchor's epilogue runs over the anchor's own iteration space (the GEMM's [M, N], the
    conv's output), so such ops (the rotary embedding after q's transpose to heads, ViT's
    class-token cat after the patch conv's permute, Whisper's positional add after its permute,
    squeeze-excitation's gate [B, C, 1, 1] times the [B, C, H, W] input) start an elementwise
    region instead: it reads the anchor's output (a layout the GEMM writes directly, or the
    output through strides) in the order and shape they need."""
    anchor = next((m for m in group if category(m) == ANCHOR), None)
    if anchor is None or _empty_cat(n):
        return False      # a cat with empty operands only (HF's empty key/value cache) is a layout
    if _numel(n) > _numel(anchor) > 0:
        return True
    members = set(group)
    for a in _all_inputs(n):
        if _free_source(a) in members and _reorders(a):
            return True
    return False


def _empty_cat(n: fx.Node) -> bool:
    """A cat whose operands but one have no elements: it moves nothing (gemm_layout.is_layout)."""
    return op_name(n) == "cat" and sum(_numel(p) != 0 for p in n.args[0]) == 1


def _reorders(a: fx.Node) -> bool:
    """Some free node on the chain from a back to its compute source changes element order."""
    while category(a) in FREE and _all_inputs(a):
        if not ops.info(op_name(a)).keeps_order:
            return True
        a = _all_inputs(a)[0]
    return False


def _chain_only(group: list[fx.Node]) -> bool:
    return all(category(m) == ELEMENTWISE for m in group)


def _merge_chains(n, target, producers, groups, group_of, order) -> None:
    """n (just added to target) also reads other elementwise chains: fold them into target.

    NOTE: a chain starts wherever an op reads no compute node, so `0.5 * x * (1 + tanh(k * (x +
    0.044715 * x**3)))` starts two ((0.5 * x) and (x**3 ...)) that meet at the last mul; without
    this the first became a one-op region of its own and its result a round trip through memory.
    Only chains of elementwise ops of n's size merge (an anchor's or a row op's region keeps its
    own shape; a chain over a broadcast operand, e.g. a bias vector, would be recomputed per
    element and could leave an output of another shape), and only where the union has no path
    leaving it and coming back.
    """
    if not _chain_only(target):
        return
    size = _numel(n)
    for g in producers:
        if g is target or not _chain_only(g) or any(_numel(m) != size and not _cat_part(m, size)
                                                     for m in g):
            continue
        union = target + g
        members = set(union)
        lo, hi = min(order[m] for m in union), max(order[m] for m in union)
        # a path between the two leaves g one way or the other: searching from g's members suffices
        if any(_dirty_path(m, members, lambda x: x.all_input_nodes, lambda x: order[x] >= lo)
               or _dirty_path(m, members, lambda x: list(x.users), lambda x: order[x] <= hi)
               for m in g):
            continue
        for m in g:
            group_of[m] = target
        target.extend(g)
        groups[:] = [x for x in groups if x is not g]


def _cat_part(m: fx.Node, size: int) -> bool:
    """m (smaller than size) only feeds cats of that size: its elements are moved into the cat's
    result, never recomputed per element (rotary's -x2 in cat((-x2, x1), -1))."""
    users = _compute_users(m)
    return bool(users) and all(op_name(u) == "cat" and _numel(u) == size for u in users)


def _grab_epilogue(row, group, group_of, add, order) -> None:
    work = [row]
    while work:
        for u in _compute_users(work.pop(0)):
            if u not in group_of and category(u) == ELEMENTWISE and not _creates_cycle(u, group, order):
                add(u, group)
                work.append(u)


def _grab_prologue(row, group, group_of, add, order) -> None:
    size = _numel(_free_source(row.all_input_nodes[0]))
    work = [row]
    while work:
        for p in _compute_inputs(work.pop(0)):
            if (p not in group_of and category(p) == ELEMENTWISE and _numel(p) == size
                    and not _epilogue_of_keeper(p) and not _creates_cycle(p, group, order)):
                add(p, group)
                work.append(p)


def _epilogue_of_keeper(n: fx.Node) -> bool:
    """n is in the elementwise chain right after an anchor that keeps its epilogue (ops.OpInfo
    .keeps_epilogue): some producer path through elementwise and free nodes reaches one."""
    seen, work = set(), [n]
    while work:
        x = work.pop()
        for p in _compute_inputs(x):
            if p in seen:
                continue
            seen.add(p)
            if category(p) == ANCHOR and ops.info(op_name(p)).keeps_epilogue:
                return True
            if category(p) == ELEMENTWISE:
                work.append(p)
    return False


def _creates_cycle(n: fx.Node, group: list[fx.Node], order: dict) -> bool:
    """Would adding n to group make a path that leaves the group and comes back?

    Paths through free nodes only do not count: those nodes get absorbed into the group.
    """
    members = set(group)
    lo = min(order[m] for m in group)
    hi = max(order[m] for m in group)
    return (_dirty_path(n, members, lambda x: x.all_input_nodes, lambda x: order[x] >= lo)
            or _dirty_path(n, members, lambda x: list(x.users), lambda x: order[x] <= hi))


def _dirty_path(start, members, step, in_range) -> bool:
    stack = [(x, False) for x in step(start) if x not in members]
    seen = set()
    while stack:
        x, dirty = stack.pop()
        if (x, dirty) in seen or not in_range(x):
            continue
        seen.add((x, dirty))
        if x in members:
            if dirty:
                return True
            continue
        dirty = dirty or category(x) not in FREE
        stack.extend((y, dirty) for y in step(x))
    return False


def _compute_users(n: fx.Node) -> list[fx.Node]:
    """The consumers of n, looking through free nodes."""
    out = []
    for u in n.users:
        out.extend(_compute_users(u) if category(u) in FREE else [u])
    return _unique(out)


def _unique(xs: list) -> list:
    seen, out = set(), []
    for x in xs:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _numel(n: fx.Node) -> int:
    v = n.meta.get("val")
    return v.numel() if isinstance(v, torch.Tensor) else -1


def _compute_inputs(n: fx.Node) -> list[fx.Node]:
    """The producers of n, looking through free (view/no-op) nodes."""
    return list(dict.fromkeys(_free_source(a) for a in _all_inputs(n)))


def _free_source(a: fx.Node) -> fx.Node:
    while category(a) in FREE and _all_inputs(a):
        a = _all_inputs(a)[0]
    return a


# ---- step 2: absorb views / no-ops ----------------------------------------------------------

def _absorb_free(nodes: list[fx.Node], region_of: dict) -> None:
    """Place free nodes, last first, so every user is placed before its producer.

    A free node joins region R when its data comes from R and some user is in R (it must be
    inside, or R would read its own output), when it is the only reader of R's value (a trailing
    .contiguous() is then written by the kernel directly), or when all of its users are in R. A tuple-valued
    free node (split, unbind) is placed with its getitems, by the users of those getitems.
    """
    for n in reversed(nodes):
        if category(n) not in FREE or _is_getitem_of_free_tuple(n):
            continue
        parts = list(n.users) if not _is_tensor(n) else [n]
        users = [u for p in parts for u in p.users]
        user_regions = [region_of.get(u) for u in users]
        src_region = region_of.get(_free_source(n))
        target = None
        if src_region is not None and (any(r is src_region for r in user_regions)
                                       or (_sole_tail(n) and _takes_tail(src_region, n))):
            target = src_region
        elif user_regions and all(r is not None and r is user_regions[0] for r in user_regions):
            if all(_is_tensor(a) for a in _all_inputs(n)):
                target = user_regions[0]
        if target is not None:
            for m in [n] + [p for p in parts if p is not n]:
                _join(m, target, region_of)


def _sole_tail(n: fx.Node) -> bool:
    """n ends a chain of free nodes, each the only user of the one before, from a compute node."""
    if not _is_tensor(n):
        return False
    while category(n) in FREE and n.all_input_nodes:
        src = n.all_input_nodes[0]
        if len(src.users) != 1 or not _is_tensor(src):
            return False
        n = src
    return category(n) in COMPUTE


def _takes_tail(region: list[fx.Node], n: fx.Node) -> bool:
    """Whether region's kernel can write its value through the free chain ending at n: any chain
    for row-wise/elementwise regions and anchors that write layouts (ops.OpInfo.writes_layouts);
    only no-ops (same shape, same order) for the others (a conv writes its own shape: a permute
    after it is read in place by the elementwise region that follows)."""
    anchor = next((m for m in region if category(m) == ANCHOR), None)
    if anchor is None or ops.info(op_name(anchor)).writes_layouts:
        return True
    while category(n) in FREE and n.all_input_nodes:
        if category(n) != NOOP:
            return False
        n = n.all_input_nodes[0]
    return True


def _is_getitem_of_free_tuple(n: fx.Node) -> bool:
    return op_name(n) == "getitem" and category(n.args[0]) in FREE


def _close_tuples(nodes: list[fx.Node], region_of: dict) -> None:
    """A tuple-valued node (split, unbind) inside a region takes all its getitems with it:
    region outputs must be tensors."""
    for n in nodes:
        g = region_of.get(n)
        if g is not None and not _is_tensor(n):
            for u in n.users:
                if region_of.get(u) is not g:
                    _join(u, g, region_of)


def _join(n, group, region_of) -> None:
    if region_of.get(n) is not group:
        region_of[n] = group
        group.append(n)


# ---- step 3: region boundaries --------------------------------------------------------------

def _make_region(members: list[fx.Node], order: dict, attention: dict | None = None) -> Region:
    inside = set(members)
    inputs: list[fx.Node] = []
    for n in members:
        for a in _all_inputs(n):
            if a not in inside and a not in inputs:
                inputs.append(a)
    outputs = [n for n in members if any(u not in inside for u in n.users)]
    anchor = next((n for n in members if category(n) == ANCHOR), None)
    row = next((n for n in members if category(n) == ROWWISE), None)
    pat = next((attention[n] for n in members if n in (attention or {})), None)
    if pat is not None and pat.qk in inside:        # a hand-written attention: p @ v anchors it
        kind, anchor = "attention", pat.pv
    elif anchor is not None:
        kind = ops.info(op_name(anchor)).kind
    elif row is not None:
        kind, anchor = "rowwise", row
    else:
        kind = "elementwise"
    return Region(members, inputs, outputs, kind, anchor)


def _all_inputs(n: fx.Node) -> list[fx.Node]:
    return list(n.all_input_nodes)


def _is_tensor(n: fx.Node) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


def _has_tensor_input(n: fx.Node) -> bool:
    # tuple-valued inputs count: getitem reads a split's list of tensors
    return any(isinstance(a.meta.get("val"), (torch.Tensor, list, tuple)) for a in n.all_input_nodes)
