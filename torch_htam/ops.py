"""The op registry: one table of what torch_htam knows about each aten op.

Keyed by overload-packet name ("linear", "add", "relu_" is looked up as "relu"): every overload
of an op shares one row. partition (which region an op joins), task (FLOPs, value ranges of its
inputs), state (the HTG's coarse kernel state) and the expert's lowering (the expression an op
becomes) all read this table, so an op is classified once.

    >>> info("addmm").kind, info("gelu").flops, info("batch_norm").positive
    ('gemm', 8, (4,))
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# Categories: how partition treats an op.
ANCHOR = "anchor"            # a GEMM / conv / attention: seeds a region, takes its epilogue
ROWWISE = "rowwise"          # a reduction or normalization along rows (or windows)
ELEMENTWISE = "elementwise"  # one output element from the same element of each input
VIEW = "view"                # relabels elements, no data moved inside a kernel
NOOP = "noop"                # no work at inference (eval dropout, clone, detach)
COMPUTE = (ANCHOR, ROWWISE, ELEMENTWISE)
FREE = (VIEW, NOOP)


@dataclass(frozen=True)
class OpInfo:
    """What one aten op is to torch_htam.

    category: one of ANCHOR .. NOOP. kind: the task kind an anchor gives its region ("gemm",
    "conv", "attention"); rowwise ops give "rowwise", elementwise "elementwise".
    flops: FLOPs per output element (elementwise) or per input element (rowwise); anchors count
    2*M*N*K-style work in task.node_flops instead. expr: the expression op the expert's lowering
    emits for a unary/binary elementwise op (None: lowered specially or not at all).
    positive: argument positions that hold variance-like values (a batch norm's running_var):
    task inputs there are drawn positive, since a negative variance makes NaN, not a test.
    reduction: the op reduces along rows (the HTG's "has_reduction"), which windowed pooling and
    attention's softmax also do. cast: only changes the dtype (a region of nothing but casts is
    not worth a kernel). operands / overloads (rows with an expr): how many tensor-or-scalar
    operands the expression takes, and the aten overloads the expert lowers that way.
    keeps_epilogue (anchors): the elementwise chain after this anchor stays its epilogue even when
    a row-wise op follows (a conv's BN + add + ReLU, not the next pooling's prologue).
    attn: the op's role in a hand-written attention (attn_pattern.py): "matmul" (q @ k^T, p @ v),
    "scale" (scores times / by a constant), "fill" (masked_fill), "where", "bias" (an added mask),
    "softmax", "cast", "cond" (mask == 0 and other comparisons with a constant that make a mask).
    window (pooling, row-wise): "max" | "avg" | "adaptive_avg", the reduction over each window
    (the expert's pool.py reads the geometry from the op's arguments).
    keeps_order (views and no-ops): a contiguous value keeps its elements' order through the op
    (reshape, unsqueeze, eval dropout); permutes, slices and broadcasts do not.
    writes_layouts (anchors): the kind's kernel writes its result through a chain of views
    (gemm_layout.py, attention's strided output), so such a chain after it stays in its region.
    """
    category: str
    kind: str | None = None
    flops: int = 1
    expr: str | None = None
    positive: tuple[int, ...] = ()
    reduction: bool = False
    cast: bool = False
    operands: int = 1
    overloads: tuple[str, ...] = ("default",)
    keeps_epilogue: bool = False
    attn: str | None = None
    window: str | None = None
    keeps_order: bool = False
    writes_layouts: bool = False


def _rows(category: str, names, **kw) -> dict[str, OpInfo]:
    return {n: OpInfo(category, **kw) for n in names}


def _ew(expr: str | None = None, flops: int = 1, **kw) -> OpInfo:
    return OpInfo(ELEMENTWISE, "elementwise", flops, expr, **kw)


def _bin(expr: str, overloads: tuple[str, ...] = ("Tensor", "Scalar")) -> OpInfo:
    return _ew(expr, operands=2, overloads=overloads)


def _row(flops: int = 1, reduction: bool = True) -> OpInfo:
    return OpInfo(ROWWISE, "rowwise", flops, reduction=reduction)


OPS: dict[str, OpInfo] = {
    # ---- anchors
    **_rows(ANCHOR, ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum",
                     "addmv", "mv"), kind="gemm", writes_layouts=True),
    **_rows(ANCHOR, ("conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                     "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), kind="conv",
             # NOTE: the conv + BN + add + ReLU kernel is our largest region win (3.2-3.6x over
             # eager, docs/RESULTS_LOG.md): the conv keeps it, the pool after it (pool.py) reads
             # the conv's output.
             keeps_epilogue=True),
    **_rows(ANCHOR, ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_flash_attention_for_cpu"), kind="attention", reduction=True,
             writes_layouts=True),
    # ---- row-wise: softmax and norms (FLOPs per input element)
    "softmax": _row(5), "_softmax": _row(5), "log_softmax": _row(5), "_log_softmax": _row(5),
    "_safe_softmax": _row(5), "layer_norm": _row(8), "native_layer_norm": _row(8),
    "rms_norm": _row(5), "_fused_rms_norm": _row(5), "group_norm": _row(8),
    "native_group_norm": _row(8),
    # reductions
    **{n: _row() for n in ("sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std",
                           "std_mean", "logsumexp", "linalg_vector_norm", "norm", "prod",
                           "argmax", "argmin")},
    # losses and batch statistics reduce too (no expert path yet: the search has no candidate)
    **{n: _row() for n in ("cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d",
                           "_native_batch_norm_legit")},
    # windowed reductions: one pass over a neighbourhood per output, like a row
    **{f"{kind}_pool{d}d{tail}": OpInfo(ROWWISE, "rowwise", 1, reduction=True, window=window)
       for kind, window, tails in (("max", "max", ("", "_with_indices")), ("avg", "avg", ("",)),
                                   ("adaptive_avg", "adaptive_avg", ("",)))
       for d in (1, 2, 3) for tail in tails},
    # ---- elementwise arithmetic (with the aliases export keeps: multiply, divide, ...)
    "add": _bin("add"), "sub": _bin("sub"), "mul": _bin("mul"), "div": _bin("div"),
    "rsub": _bin("rsub"), "maximum": _bin("max", ("default",)), "minimum": _bin("min", ("default",)),
    "pow": _bin("pow", ("Tensor_Tensor",)),
    "multiply": _bin("mul"), "divide": _bin("div"), "true_divide": _bin("div"),
    "subtract": _bin("sub"), "remainder": _bin("mod"), "fmod": _bin("fmod"),
    "floor_divide": _bin("floordiv", ("default", "Scalar")),
    "neg": _ew("neg"), "negative": _ew("neg"), "reciprocal": _ew("recip"), "sqrt": _ew("sqrt"),
    "rsqrt": _ew("rsqrt"), "abs": _ew("abs"), "square": _ew("sq"), "round": _ew("rint"),
    "floor": _ew("floor"), "ceil": _ew("ceil"), "trunc": _ew("trunc"), "sign": _ew("sign"),
    "addcmul": _ew("addcmul", 2, operands=3), "addcdiv": _ew("addcdiv", 2, operands=3),
    "lerp": _ew("lerp", 3, operands=3, overloads=("Scalar", "Tensor")),
    **{n: _ew() for n in ("clamp", "clamp_min", "clamp_max", "clip")},
    # transcendental and activations. NOTE: the activations with parameters (leaky_relu's slope,
    # elu's alpha, softplus' beta) are composites the expert's lowering spells out (ir.COMPOSITE)
    "exp": _ew("exp", 2), "log": _ew("log", 2), "log1p": _ew("log1p", 2), "expm1": _ew("expm1", 2),
    "sin": _ew("sin", 2), "cos": _ew("cos", 2), "erf": _ew("erf", 4), "tanh": _ew("tanh", 4),
    "sigmoid": _ew("sigmoid", 4), "relu": _ew("relu"), "gelu": _ew("gelu", 8),
    "silu": _ew("silu", 4), "exp2": _ew("exp2", 2), "log2": _ew("log2", 2), "tan": _ew("tan", 4),
    "erfc": _ew("erfc", 4), "mish": _ew("mish", 8), "hardswish": _ew("hardswish", 4),
    "hardsigmoid": _ew("hardsigmoid", 3), "leaky_relu": _ew("leaky_relu", 2),
    "elu": _ew("elu", 4), "selu": _ew("selu", 4), "celu": _ew("celu", 4),
    "softplus": _ew("softplus", 4), "logit": _ew("logit", 4),
    # x * log(y), 0 where x == 0 (kl_div's target * log(target))
    "xlogy": _ew("xlogy", 2, operands=2, overloads=("Tensor", "Scalar_Self", "Scalar_Other")),
    **{n: _ew() for n in ("relu6", "hardtanh", "glu")},
    # comparisons and logic: bool results (stored as bytes), computed in the promoted input type
    **{n: _bin(e) for n, e in (("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                               ("ge", "ge"), ("greater", "gt"), ("less", "lt"), ("not_equal", "ne"),
                               ("greater_equal", "ge"), ("less_equal", "le"))},
    "logical_and": _bin("and", ("default",)), "logical_or": _bin("or", ("default",)),
    "logical_xor": _bin("xor", ("default",)), "logical_not": _ew("not"),
    "bitwise_and": _bin("band"), "bitwise_or": _bin("bor"), "bitwise_xor": _bin("bxor"),
    "__and__": _bin("band"), "__or__": _bin("bor"), "__xor__": _bin("bxor"),
    "bitwise_not": _ew("bnot"), "isnan": _ew("isnan"), "isinf": _ew("isinf"),
    "where": _ew("select", operands=3, overloads=("self", "ScalarSelf", "ScalarOther", "Scalar")),
    "masked_fill": _ew("masked_fill", operands=3, overloads=("Scalar", "Tensor")),
    **{n: _ew() for n in ("zeros_like", "ones_like", "full_like", "fill", "nan_to_num")},
    # a 0-dim constant (losses' where(cond, x, scalar_tensor(0.))): joins its user's region
    "scalar_tensor": _ew(),
    # one element per row picked by an index (nll_loss's target log-probability): a row kernel's
    # per-row epilogue after the log_softmax it reads (ir.Lowerer.gather)
    "gather": _ew(),
    **{n: _ew(cast=True) for n in ("_to_copy", "to", "type_as")},
    # per-channel affine in eval mode (batch statistics are constants); arg 4 is running_var
    "batch_norm": _ew(flops=2, positive=(4,)),
    "_native_batch_norm_legit_no_training": _ew(flops=2, positive=(4,)),
    # NOTE: instance statistics even in eval (use_input_stats unless it tracks running stats)
    "instance_norm": OpInfo(ROWWISE, "rowwise", 8, positive=(4,), reduction=True),
    # NOTE: cat moves data but fuses into an elementwise kernel as index math (rotary embeddings)
    "cat": _ew(), "tril": _ew(), "triu": _ew(),
    # ---- views: relabel elements
    **_rows(VIEW, ("permute", "transpose", "t", "select", "slice", "expand", "expand_as",
                   "split", "split_with_sizes", "chunk", "unbind", "narrow", "as_strided",
                   "movedim", "unfold", "diagonal", "getitem", "broadcast_tensors")),
    **_rows(VIEW, ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten",
                   "unflatten", "view_as"), keeps_order=True),
    # ---- no work in eval. NOTE: dropout is a no-op only in eval; a task calls it exactly as the
    # graph does (aten.dropout(x, p, train=False)), so the reference stays exact either way.
    **_rows(NOOP, ("dropout", "contiguous", "clone", "alias", "detach", "lift_fresh_copy",
                   "feature_dropout", "alpha_dropout"), keeps_order=True),
}


# roles in a hand-written attention (OpInfo.attn): q @ k^T, scale, mask, softmax, eval dropout
# (a no-op row), p @ v; attn_pattern.py groups such a chain into one attention region
_ATTN_ROLES = {
    "matmul": ("matmul", "bmm"), "scale": ("mul", "div", "multiply", "divide", "true_divide"),
    "fill": ("masked_fill",), "where": ("where",), "bias": ("add",),
    "softmax": ("softmax", "_softmax", "_safe_softmax"), "cast": ("_to_copy", "to", "type_as"),
    "cond": ("eq", "ne", "lt", "le", "gt", "ge", "logical_not"),
}
for _role, _names in _ATTN_ROLES.items():
    for _n in _names:
        OPS[_n] = replace(OPS[_n], attn=_role)


# Overloads that are another kind of op than their packet's row: min(a, b) / max(a, b) are
# elementwise where min(x, dim) is a row reduction. Keyed "packet.overload".
OVERLOADS: dict[str, OpInfo] = {
    "min.other": _bin("min", ("other",)), "max.other": _bin("max", ("other",)),
}


def info(name: str | None, overload: str | None = None) -> OpInfo | None:
    """The row of an overload-packet name (or of that overload, where OVERLOADS has one); None:
    torch_htam leaves the op to PyTorch.

    NOTE: in-place forms ("relu_", "add_") have no row: capture.functionalize turns each one that
    is safe to rewrite into its out-of-place twin; the rest mutate what others read and must stay.
    """
    if name is None:
        return None
    return OVERLOADS.get(f"{name}.{overload}") or OPS.get(name)


def packet_of(op: str) -> str:
    """'aten.addmm.default' -> 'addmm' (Task.ops holds such strings)."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]
