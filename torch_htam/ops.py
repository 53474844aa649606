"""The op registry: one table of what torch_htam knows about each aten op.

Keyed by overload-packet name ("linear", "add", "relu_" is looked up as "relu"): every overload
of an op shares one row. partition (which region an op joins), task (FLOPs, value ranges of its
inputs), state (the HTG's coarse kernel state) and the expert's lowering (the expression an op
becomes) all read this table, so an op is classified once.

    >>> info("addmm").kind, info("gelu").flops, info("batch_norm").positive
    ('gemm', 8, (4,))
"""
from __future__ import annotations

from dataclasses import dataclass

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
                     "addmv", "mv"), kind="gemm"),
    **_rows(ANCHOR, ("conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                     "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), kind="conv",
             # NOTE: the conv + BN + add + ReLU kernel is our largest region win (3.2-3.6x over
             # eager, docs/RESULTS_LOG.md), and pooling has no expert path: the conv keeps it.
             keeps_epilogue=True),
    **_rows(ANCHOR, ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_flash_attention_for_cpu"), kind="attention", reduction=True),
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
    **{n: _row() for n in ("adaptive_avg_pool1d", "adaptive_avg_pool2d", "avg_pool1d",
                           "avg_pool2d", "max_pool1d", "max_pool2d")},
    # ---- elementwise arithmetic (with the aliases export keeps: multiply, divide, ...)
    "add": _bin("add"), "sub": _bin("sub"), "mul": _bin("mul"), "div": _bin("div"),
    "rsub": _bin("rsub"), "maximum": _bin("max", ("default",)), "minimum": _bin("min", ("default",)),
    "pow": _bin("pow", ("Tensor_Tensor",)),
    "neg": _ew("neg"), "reciprocal": _ew("recip"), "sqrt": _ew("sqrt"), "rsqrt": _ew("rsqrt"),
    "abs": _ew("abs"), "square": _ew("sq"),
    **{n: _ew() for n in ("multiply", "divide", "true_divide", "subtract", "negative", "remainder",
                          "fmod", "floor_divide", "addcmul", "addcdiv", "lerp", "clamp",
                          "clamp_min", "clamp_max", "clip", "round", "floor", "ceil", "trunc",
                          "sign")},
    # transcendental and activations
    "exp": _ew("exp", 2), "log": _ew("log", 2), "log1p": _ew("log1p", 2), "expm1": _ew("expm1", 2),
    "sin": _ew("sin", 2), "cos": _ew("cos", 2), "erf": _ew("erf", 4), "tanh": _ew("tanh", 4),
    "sigmoid": _ew("sigmoid", 4), "relu": _ew("relu"), "gelu": _ew("gelu", 8),
    "silu": _ew("silu", 4),
    **{n: _ew() for n in ("exp2", "log2", "tan", "erfc", "relu6", "mish", "hardswish",
                          "hardsigmoid", "hardtanh", "leaky_relu", "elu", "selu", "celu",
                          "softplus", "logit", "glu")},
    # comparisons, selection, casts
    **{n: _ew() for n in ("greater", "less", "greater_equal", "less_equal", "not_equal",
                          "bitwise_and", "bitwise_or", "bitwise_not", "zeros_like", "ones_like",
                          "full_like", "fill", "isnan", "isinf", "nan_to_num")},
    **{n: _ew(cast=True) for n in ("_to_copy", "to", "type_as")},
    # per-channel affine in eval mode (batch statistics are constants); arg 4 is running_var
    "batch_norm": _ew(flops=2, positive=(4,)),
    "_native_batch_norm_legit_no_training": _ew(flops=2, positive=(4,)),
    # NOTE: instance statistics even in eval (use_input_stats unless it tracks running stats)
    "instance_norm": OpInfo(ROWWISE, "rowwise", 8, positive=(4,), reduction=True),
    # comparisons and logical ops: 0 / 1 values (bool outputs, masks), and the selections
    **{n: _bin(n) for n in ("eq", "ne", "lt", "le", "gt", "ge")},
    "logical_not": _ew("not"),
    "logical_and": _bin("and", ("default",)), "logical_or": _bin("or", ("default",)),
    "where": _ew("where", operands=3, overloads=("self",)),
    "masked_fill": _ew("masked_fill", operands=3, overloads=("Scalar", "Tensor")),
    # NOTE: cat moves data but fuses into an elementwise kernel as index math (rotary embeddings)
    "cat": _ew(), "tril": _ew(), "triu": _ew(),
    # ---- views: relabel elements
    **_rows(VIEW, ("view", "reshape", "_unsafe_view", "permute", "transpose", "t", "select",
                   "slice", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten",
                   "split", "split_with_sizes", "chunk", "unbind", "narrow", "as_strided",
                   "movedim", "view_as", "unfold", "diagonal", "getitem")),
    # ---- no work in eval. NOTE: dropout is a no-op only in eval; a task calls it exactly as the
    # graph does (aten.dropout(x, p, train=False)), so the reference stays exact either way.
    **_rows(NOOP, ("dropout", "contiguous", "clone", "alias", "detach", "lift_fresh_copy",
                   "feature_dropout", "alpha_dropout")),
}


def info(name: str | None) -> OpInfo | None:
    """The row of an overload-packet name; None: torch_htam leaves the op to PyTorch.

    NOTE: in-place forms ("relu_", "add_") have no row: capture.functionalize turns each one that
    is safe to rewrite into its out-of-place twin; the rest mutate what others read and must stay.
    """
    return OPS.get(name) if name is not None else None


def packet_of(op: str) -> str:
    """'aten.addmm.default' -> 'addmm' (Task.ops holds such strings)."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]
