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


def perm_of(node) -> list[int] | None:
    """The permutation a permute/transpose/t node applies (value dim k = source dim p[k])."""
    return _perm(node)


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


# sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU.
_GELU_K, _GELU_C = 0.7978845608028654, 0.044715


def gelu_tanh(e: tuple, log: list[str]) -> tuple:
    """The tanh GELU written out (HF's NewGELU / gelu_new, Megatron's bias_gelu) as one
    ("gelu_tanh", x), so a GEMM epilogue can hand it to cuBLASLt (CUBLASLT_EPILOGUE_GELU is this
    formula) and an elementwise kernel computes it once in fp32. Recognized, in any operand order
    and grouping, with torch's intermediate roundings in between:
        0.5 * x * (1 + tanh(k * (x + c * x^3)))      (x^3: pow(x, 3), x * x * x, x^2 * x)
        0.5 * x * (1 + tanh(k * x * (1 + c * x^2)))
    NOTE: torch rounds each bf16 step of the formula; computed once in fp32 the value is closer to
    the exact GELU, which is what verification measures against.
    """
    if _bare(e)[0] != "mul":
        return e
    consts, rest = _factors(e)
    if not _near(consts, 0.5) or len(rest) != 2:
        return e
    for x, t in (rest, rest[::-1]):
        if _is_one_plus_tanh_of(t, x):
            log.append("tanh GELU formula")
            return ("gelu_tanh", x)
    return e


def _bare(e: tuple) -> tuple:
    while e[0] == "round":
        e = e[2]
    return e


def _factors(e: tuple) -> tuple[float, list[tuple]]:
    """e as a product: (constant factor, the other factors, each without its outer roundings)."""
    e = _bare(e)
    if e[0] == "mul":
        c1, r1 = _factors(e[1])
        c2, r2 = _factors(e[2])
        return c1 * c2, r1 + r2
    if e[0] == "sq":
        return 1.0, [_bare(e[1]), _bare(e[1])]
    if e[0] == "powc" and e[2] == ("const", 3.0):
        return 1.0, [_bare(e[1])] * 3
    if e[0] == "const":
        return e[1], []
    return 1.0, [e]


def _near(v: float, want: float) -> bool:
    return abs(v - want) <= 1e-6 * abs(want)


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return sorted(map(repr, a)) == sorted(map(repr, b))


def _terms(e: tuple) -> list[tuple] | None:
    """The two operands of an add, without roundings; None if e is no add."""
    e = _bare(e)
    return [_bare(e[1]), _bare(e[2])] if e[0] == "add" else None


def _is_one_plus_tanh_of(t: tuple, x: tuple) -> bool:
    """t == 1 + tanh(k * (x + c x^3)) or 1 + tanh(k * x * (1 + c x^2))."""
    terms = _terms(t)
    if terms is None:
        return False
    for one, th in (terms, terms[::-1]):
        if one == ("const", 1.0) and th[0] == "tanh":
            k, inner = _factors(th[1])
            if not _near(k, _GELU_K):
                return False
            if len(inner) == 1:                     # x + c x^3
                return _is_poly(inner[0], x, [x, x, x])
            if len(inner) == 2:                     # x * (1 + c x^2)
                return any(a == x and _is_poly(b, ("const", 1.0), [x, x]) for a, b in (inner, inner[::-1]))
    return False


def _is_poly(e: tuple, first: tuple, cubic: list[tuple]) -> bool:
    """e == first + c * prod(cubic), the terms in either order."""
    terms = _terms(e)
    if terms is None:
        return False
    for a, b in (terms, terms[::-1]):
        c, r = _factors(b)
        if a == first and _near(c, _GELU_C) and _same(r, cubic):
            return True
    return False


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
