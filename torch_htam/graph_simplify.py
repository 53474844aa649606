"""Graph-level simplifications applied right after capture, before planning and swapping.

Tracing loses optimizations that eager code makes on data: HF models skip an all-ones attention
mask, or use SDPA's causal kernel, after looking at the mask's values, which export cannot do. The
exported graph then builds the mask from `arange` and passes SDPA an expanded (stride-0) boolean
tensor. That is the same function but a slower path. Measured on an H100 (bench_models, archived in
docs/RESULTS_LOG.md): with the masks in, BERT-base fp32's captured graph took 48.8 ms where its eager
forward took 38.9 ms.

`simplify_attention_masks` evaluates each SDPA mask that depends on no graph input and no weight
(only on shapes, which the runtime's guard pins) and rewrites the call:
  all true (bool) / all zero (additive float)   -> no mask                 (exactly the same result)
  the causal pattern j <= i over square scores  -> is_causal=True, no mask (the same masking)
Anything else is left alone.

    >>> n = simplify_attention_masks(gm)      # number of SDPA calls rewritten
"""
from __future__ import annotations

import logging

import torch
import torch.fx as fx

log = logging.getLogger("torch_htam")
aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default


def simplify_attention_masks(gm: fx.GraphModule) -> int:
    """Rewrite SDPA calls whose constant mask is a no-op or causal; returns how many changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not SDPA:
            continue
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        if not isinstance(mask, fx.Node) or _sdpa_arg(node, 4, "dropout_p", 0.0) != 0.0 \
                or _sdpa_arg(node, 5, "is_causal", False):
            continue
        value = _constant_value(mask)
        if value is None:
            continue
        kind = _mask_kind(value, node)
        if kind is None:
            continue
        # NOTE: scale and enable_gqa are keyword-only in the aten schema: they stay in kwargs
        kwargs = {k: v for k, v in node.kwargs.items() if k not in ("attn_mask", "dropout_p", "is_causal")}
        kwargs["is_causal"] = kind == "causal"
        node.args, node.kwargs = tuple(node.args[:3]), kwargs
        _erase_unused(mask)
        changed += 1
        log.info("torch_htam: SDPA %s: constant %s mask folded", node.name, kind)
    if changed:
        gm.recompile()
    return changed


def _erase_unused(node: fx.Node) -> None:
    """Erase node and then its inputs as they lose their last user (only the mask's own chain:
    a whole-graph dead-code pass could also drop export's unused guard call)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.users or n.op != "call_function":
            continue
        inputs = n.all_input_nodes
        n.graph.erase_node(n)
        stack.extend(inputs)


def _sdpa_arg(node: fx.Node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _constant_value(mask: fx.Node, max_nodes: int = 64) -> torch.Tensor | None:
    """The mask's value if it is computed from no placeholder and no get_attr (only aten ops on
    constants and shapes), by running those few nodes; else None."""
    order, stack, seen = [], [mask], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or len(seen) > max_nodes:
            return None      # an input, a weight, a Python call or a long chain: not a constant
        if n.target._schema.is_mutable:
            return None
        order.append(n)
        stack.extend(n.all_input_nodes)
    env: dict[fx.Node, object] = {}
    try:
        for n in sorted(order, key=_position(mask.graph)):
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
            env[n] = n.target(*args, **kwargs)
    except Exception:   # noqa: BLE001 -- anything odd: leave the graph as it was
        return None
    v = env[mask]
    return v if isinstance(v, torch.Tensor) else None


def _position(graph: fx.Graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: index[n]


def _mask_kind(mask: torch.Tensor, sdpa: fx.Node) -> str | None:
    """"none" (every position kept), "causal" (position j kept for query i iff j <= i, square
    scores) or None. mask broadcasts to [..., L, S]."""
    q, k = (a.meta.get("val") for a in sdpa.args[:2])
    if q is None or k is None or mask.dim() < 2:
        return None
    L, S = q.shape[-2], k.shape[-2]
    if mask.shape[-2] not in (1, L) or mask.shape[-1] not in (1, S):
        return None
    keep = mask if mask.dtype == torch.bool else (mask == 0)
    if mask.dtype != torch.bool and not torch.isin(mask, torch.tensor([0.0, float("-inf")], device=mask.device,
                                                                     dtype=mask.dtype)).all():
        return None       # an additive bias (ALiBi, relative positions): a real input to SDPA
    if bool(keep.all()):
        return "none"
    if L == S:
        causal = torch.ones(L, S, dtype=torch.bool, device=mask.device).tril()
        if bool((keep == causal).all()):
            return "causal"
    return None
