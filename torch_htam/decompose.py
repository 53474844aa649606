"""Loss ops that torch.export keeps whole, rewritten into the aten ops they are made of.

F.mse_loss, F.cross_entropy, F.kl_div ... reach the captured graph as one node each
(aten.mse_loss, aten.cross_entropy_loss), which no region takes. Their decompositions are
elementwise math and row reductions (mean over everything: a full reduction), which the expert has
paths for. Each such node is traced into aten ops on its inputs' fake tensors and the
trace is inlined in its place, repeatedly (cross_entropy_loss -> log_softmax + nll_loss_forward ->
...). nll_loss's gather of the target's log-probability is a row kernel's per-row epilogue and its
mean over tokens a sum over rows (rowwise.py); ops a decomposition leaves that nothing handles stay
on PyTorch as usual.

    >>> n = decompose_losses(gm)      # number of loss nodes rewritten
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
from torch._decomp import decomposition_table
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

log = logging.getLogger("torch_htam")
aten = torch.ops.aten

LOSSES = {aten.mse_loss.default, aten.l1_loss.default, aten.smooth_l1_loss.default,
          aten.huber_loss.default, aten.kl_div.default, aten.soft_margin_loss.default,
          aten.hinge_embedding_loss.default, aten.margin_ranking_loss.default,
          aten.cosine_similarity.default, aten.cosine_embedding_loss.default,
          aten.binary_cross_entropy.default, aten.cross_entropy_loss.default,
          aten.nll_loss_forward.default, aten.nll_loss.default, aten.nll_loss_nd.default}


def _decomposition(op):
    """The op's decomposition: torch's table, else its CompositeImplicit kernel."""
    if op in decomposition_table:
        return decomposition_table[op]
    return lambda *a, **k: op.decompose(*a, **k)


def _val(v: fx.Node) -> torch.Tensor:
    val = v.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise TypeError(f"{v} has no tensor meta")
    return val


def _inline(gm: fx.GraphModule, node: fx.Node) -> None:
    """Replace node by the aten ops of its decomposition (traced on meta tensors)."""
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    nodes = [i for i, a in enumerate(flat) if isinstance(a, fx.Node)]
    fn = _decomposition(node.target)

    def call(*tensors):
        vals = list(flat)
        for i, t in zip(nodes, tensors):
            vals[i] = t
        args, kwargs = pytree.tree_unflatten(vals, spec)
        return fn(*args, **kwargs)
    # NOTE: traced on the capture's own fake tensors (device and strides as captured), in its
    # fake mode: the new nodes get meta['val'] like every other node
    vals = [_val(flat[i]) for i in nodes]
    mode = detect_fake_mode(vals)
    if mode is None:
        raise TypeError("no fake tensor mode on the loss's inputs")
    with mode:
        traced = make_fx(call, tracing_mode="real")(*vals)
    env: dict[fx.Node, fx.Node] = {}
    inputs = iter(flat[i] for i in nodes)
    result = None
    with gm.graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(inputs)
            elif n.op == "output":
                result = pytree.tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, n.args[0])
            else:
                env[n] = gm.graph.node_copy(n, lambda a: env[a])
    ctor = None
    if isinstance(result, fx.Node) and isinstance(result.target, type) and issubclass(result.target, tuple):
        # NOTE: a named tuple the decomposition built (nll_loss_forward's return_types): traced as a
        # call of its class; its fields are its arguments
        ctor, result = result, list(result.args)
    if isinstance(result, (tuple, list)):       # (output, total_weight) pairs read through getitem
        for u in list(node.users):
            if u.target is not operator.getitem:
                raise TypeError(f"{node} used whole by {u}")
            u.replace_all_uses_with(result[u.args[1]])
            gm.graph.erase_node(u)
    else:
        node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
    if ctor is not None and not ctor.users:
        gm.graph.erase_node(ctor)


def decompose_losses(gm: fx.GraphModule) -> int:
    """Rewrite every loss node (LOSSES) into aten ops, until none is left; returns how many."""
    count = 0
    for _ in range(4):          # cross_entropy_loss -> nll_loss_nd -> nll_loss -> nll_loss_forward
        todo = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in LOSSES]
        if not todo:
            break
        for n in todo:
            try:
                _inline(gm, n)
                count += 1
            except Exception as e:  # noqa: BLE001 -- a loss that does not trace stays whole (PyTorch runs it)
                log.debug("torch_htam: %s kept whole: %s", n.target, e)
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
