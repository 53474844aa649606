"""Hand-written attention in an aten graph: q @ k^T, scale, mask, softmax, eval dropout, @ v.

MinGPT-style code writes attention out op by op. Cut by the generic rules it is a batched GEMM, a
row-wise region (scale + mask + softmax) and a second GEMM, and the [L, S] score matrix goes
through memory twice. find() recognizes the chain from each softmax outwards, by the ops' roles in
ops.py (OpInfo.attn), so that partition makes it ONE attention region and the expert's attention
target (proposers/expert/attention.py) reads it as SDPA with a score pipeline.

Recognized, on the scores s = a @ b (a: [..., L, E], b: [..., E, S]), in any order and number:
  s * c, s / c (c a number)             -> Step("mul", c) / Step("div", c)
  s.masked_fill(m, v) (v a number)      -> Step("fill", v, Mask(m))
  torch.where(m, s, v) / where(m, v, s) -> Step("fill", v, Mask(m, negate / not))
  s + m (m a tensor)                    -> Step("bias", mask=Mask(m))
  casts                                 -> nothing (the kernel keeps the scores in fp32)
then softmax over the last dim, casts and no-ops (eval dropout), then p @ v.
A mask read by the chain is a tensor, or `x == c` (a comparison with a number, ops role "cond")
whose only reader is the chain: the comparison then runs inside the kernel (MinGPT's
`mask[:, :, :T, :T] == 0`). Every intermediate must be read by the next op of the chain alone
(the kernel produces p @ v, nothing in between).

    >>> [p.pv.name for p in find(list(gm.graph.nodes))]
    ['matmul_1']
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from torch_htam import ops
from torch_htam.ops import NOOP

# comparison op -> C++ operator (the kernel compares the mask value, as float, with the constant)
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@dataclass(frozen=True)
class Mask:
    """What a masking step reads: tensor `node` (seen through views), compared with a constant
    when cond is set (("eq", 0.0): node == 0); negate: the step applies where the mask is false."""
    node: fx.Node
    cond: tuple[str, float] | None = None
    negate: bool = False


@dataclass(frozen=True)
class Step:
    """One op on the scores, in natural units. op: "mul" | "div" (by value) | "fill" (value where
    mask holds) | "bias" (+ mask)."""
    op: str
    value: float = 0.0
    mask: Mask | None = None


@dataclass
class Pattern:
    """One hand-written attention: scores qk = a @ b, steps, softmax, p @ v (pv, the result).
    nodes: its compute nodes (both matmuls, the steps, softmax, casts, in-kernel comparisons) in
    graph order; no-ops and views between them are left to partition's free-node absorption."""
    qk: fx.Node
    pv: fx.Node
    softmax: fx.Node
    steps: list[Step] = field(default_factory=list)
    nodes: list[fx.Node] = field(default_factory=list)
    through: list[fx.Node] = field(default_factory=list)   # the no-ops passed (eval dropout)

    @property
    def a(self) -> fx.Node:           # [..., L, E]: q
        return self.qk.args[0]

    @property
    def b(self) -> fx.Node:           # [..., E, S]: k transposed
        return self.qk.args[1]

    @property
    def v(self) -> fx.Node:           # [..., S, Ev]
        return self.pv.args[1]


def find(nodes: list[fx.Node]) -> list[Pattern]:
    """Every hand-written attention among `nodes` (graph order), by its softmax."""
    order = {n: i for i, n in enumerate(nodes)}
    out = []
    for n in nodes:
        if _role(n) == "softmax":
            pat = _from_softmax(n)
            if pat is not None:
                pat.nodes.sort(key=lambda x: order.get(x, -1))
                out.append(pat)
    return out


def _name(n) -> str | None:
    """The aten overload-packet name of a call ("softmax"), as partition.op_name gives it (which
    this module cannot import: partition imports it)."""
    if not isinstance(n, fx.Node) or n.op != "call_function":
        return None
    t = n.target
    if isinstance(t, torch._ops.OpOverload) and t.namespace == "aten":
        return t.overloadpacket.__name__
    return None


def _role(n) -> str | None:
    row = ops.info(_name(n))
    return row.attn if row is not None else None


def _is_noop(n: fx.Node) -> bool:
    """An op that passes its first input through at inference: eval dropout, clone, contiguous."""
    row = ops.info(_name(n))
    if row is None or row.category != NOOP or not n.args or not isinstance(n.args[0], fx.Node):
        return False
    train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", False)
    return "dropout" not in _name(n) or train is False


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _last_dim(n: fx.Node, dim) -> bool:
    val = n.meta.get("val")
    return isinstance(dim, int) and val is not None and dim in (-1, val.dim() - 1)


def _from_softmax(sm: fx.Node) -> Pattern | None:
    if not _last_dim(sm, sm.args[1] if len(sm.args) > 1 else None):
        return None
    nodes, steps, through = [sm], [], []
    cur = sm.args[0]
    while True:                                  # back to q @ k^T
        if not isinstance(cur, fx.Node) or len(cur.users) != 1:
            return None
        role = _role(cur)
        if role == "matmul":
            qk = cur
            break
        if _is_noop(cur):
            through.append(cur)
            cur = cur.args[0]
            continue
        got = _step(cur, role)
        if got is None:
            return None
        step, prev, extra = got
        if step is not None:
            steps.insert(0, step)
        nodes += [cur] + extra
        cur = prev
    cur = sm
    while True:                                  # forward to p @ v
        users = list(cur.users)
        if len(users) != 1:
            return None
        u = users[0]
        if _role(u) == "matmul" and u.args[0] is cur and u.args[1] is not cur:
            pv = u
            break
        if _role(u) == "cast" or _is_noop(u):
            (nodes if _role(u) == "cast" else through).append(u)
            cur = u
            continue
        return None
    if qk.target != pv.target or len(qk.args) != 2 or len(pv.args) != 2:
        return None
    return Pattern(qk, pv, sm, steps, [qk, pv] + nodes, through)


def _step(n: fx.Node, role: str | None):
    """(Step or None for a cast, the chain's node before n, comparison nodes taken in) for one op
    on the scores; None when n is no step the kernel can run."""
    args = n.args
    if role == "cast":          # the scores stay fp32 in the kernel: nothing to do
        plain = args and isinstance(args[0], fx.Node) and not any(isinstance(a, fx.Node) for a in args[1:])
        return (None, args[0], []) if plain else None
    if role == "scale" and len(args) == 2 and not n.kwargs:
        x, c = args
        if isinstance(x, fx.Node) and _number(c):
            return Step("div" if "div" in _name(n) else "mul", float(c)), x, []
        if _name(n) in ("mul", "multiply") and isinstance(c, fx.Node) and _number(x):
            return Step("mul", float(x)), c, []
        return None
    if role == "fill" and len(args) == 3 and isinstance(args[1], fx.Node) and _number(args[2]):
        mask, extra = _mask(args[1], n)
        return Step("fill", float(args[2]), mask), args[0], extra
    if role == "where" and len(args) == 3 and isinstance(args[0], fx.Node):
        cond, a, b = args
        if isinstance(a, fx.Node) and _number(b):       # where(m, s, v): v where m is false
            mask, extra = _mask(cond, n)
            return Step("fill", float(b), Mask(mask.node, mask.cond, not mask.negate)), a, extra
        if isinstance(b, fx.Node) and _number(a):       # where(m, v, s): v where m holds
            mask, extra = _mask(cond, n)
            return Step("fill", float(a), mask), b, extra
        return None
    if role == "bias" and len(args) == 2 and not n.kwargs and all(isinstance(a, fx.Node) for a in args):
        x, m = args if _on_chain(args[0]) or not _on_chain(args[1]) else args[::-1]   # mask + s too
        val = m.meta.get("val")
        if val is None or not val.dtype.is_floating_point:
            return None
        return Step("bias", mask=Mask(m)), x, []
    return None


def _on_chain(a: fx.Node) -> bool:
    """a can be the scores' chain: read once, an op of a role the chain has."""
    return len(a.users) == 1 and (_role(a) in ("matmul", "scale", "fill", "where", "bias", "cast")
                                  or _is_noop(a))


def _mask(m: fx.Node, reader: fx.Node) -> tuple[Mask, list[fx.Node]]:
    """The mask a step reads: a comparison with a number read only by this step runs in-kernel."""
    if _role(m) == "cond" and list(m.users) == [reader] and isinstance(m.args[0], fx.Node):
        name = _name(m)
        if name == "logical_not" and len(m.args) == 1:
            return Mask(m.args[0], ("eq", 0.0)), [m]
        if name in COMPARE and len(m.args) == 2 and _number(m.args[1]):
            return Mask(m.args[0], (name, float(m.args[1]))), [m]
    return Mask(m), []
