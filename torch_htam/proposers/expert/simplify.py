"""Algebraic simplification (strategy drop_noop_ops): identities the fused kernel need not compute.

Works on the expression tuples of ir.py and on permute chains of the fx graph; never mutates the
task's graph (it is shared with the runtime and other proposers).

    >>> fold(("mul", ("in", 0), ("const", 1.0)), log := [])
    ('in', 0)
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

PERMUTES = {aten.permute.default, aten.transpose.int, aten.t.default}


def _perm(node) -> list[int] | None:
    """The permutation a permute/transpose/t node applies, as a list of source dims."""
    nd = len(node.meta["val"].shape) if "val" in node.meta else None
    if nd is None:
        return None
    if node.target is aten.permute.default:
        return [d % nd for d in node.args[1]]
    if node.target is aten.t.default:
        return [1, 0] if nd == 2 else list(range(nd))
    d0, d1 = node.args[1] % nd, node.args[2] % nd
    p = list(range(nd))
    p[d0], p[d1] = p[d1], p[d0]
    return p


def permutation(node) -> list[int]:
    """The source dim of each of a permute/transpose/t node's dims."""
    p = _perm(node)
    if p is None:
        raise ValueError(f"{node} has no shape")
    return p


def permute_source(node):
    """If node ends a chain of permutes/transposes whose composition is the identity, the node the
    chain starts from; else None. x.transpose(1, 2).transpose(1, 2) -> x."""
    total = list(range(len(node.meta["val"].shape)))
    cur = node
    while hasattr(cur, "op") and cur.op == "call_function" and cur.target in PERMUTES:
        p = _perm(cur)
        if p is None:
            return None
        total = [p[i] for i in total]
        cur = cur.args[0]
        if total == sorted(total):
            return cur
    return None


def _is_const(e, v: float) -> bool:
    return e[0] == "const" and e[1] == v


def fold(e: tuple, log: list[str]) -> tuple:
    """One step of identity folding at the root of e (children are already folded)."""
    op = e[0]
    if op in ("mul",) and _is_const(e[2], 1.0):
        log.append("mul by 1")
        return e[1]
    if op == "mul" and _is_const(e[1], 1.0):
        log.append("mul by 1")
        return e[2]
    if op in ("add", "sub") and _is_const(e[2], 0.0):
        log.append(f"{op} 0")
        return e[1]
    if op == "add" and _is_const(e[1], 0.0):
        log.append("add 0")
        return e[2]
    if op == "div" and _is_const(e[2], 1.0):
        log.append("div by 1")
        return e[1]
    if op == "neg" and e[1][0] == "neg":
        log.append("double neg")
        return e[1][1]
    if op == "round" and e[2][0] == "round" and e[2][1] == e[1]:
        log.append("redundant cast")
        return e[2]
    return e


def unused_ops(gm) -> list[str]:
    """Ops whose results never reach an output (dead code the kernel does not compute)."""
    live, out = set(), next(n for n in gm.graph.nodes if n.op == "output")
    stack = [out]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    return [f"unused {n.target}" for n in gm.graph.nodes
            if n.op == "call_function" and n not in live
            and n.target is not aten._assert_tensor_metadata.default]
