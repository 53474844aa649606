"""Conv kinds: which aten convolution a region holds (1-, 2- or 3-D, forward or transposed) and its
geometry, as conv.match reads it, and the host C++ that sizes the problem at run time.

Every kind runs as one cuDNN problem of cuDNN rank 2 or 3:
  conv1d [N, C, L] * [K, C/g, k]     as a 2-D conv of height 1: x [N, C, 1, L], w [K, C/g, 1, k]
                                     (stride (1, s), padding (0, p), dilation (1, d)), the layout
                                     PyTorch itself hands cuDNN for conv1d;
  conv2d / conv3d                    as themselves (NCHW / NCDHW);
  conv_transpose{1,2,3}d             as the backward-data pass of the conv it transposes (cuDNN's
                                     CONVOLUTION_BACKWARD_DATA, the call PyTorch makes): dy = x
                                     [N, C, ...], w [C, K/g, ...] as stored, dx = y [N, K, ...].
The problem key d[11] (cudnn.cuh's kConvDims) keeps conv2d's order and appends depth:
  N, C, H, W of x; K (output channels), R, S of the filter; alignment; D (x), T (filter), O (y).
Depth is 1 for 1-D and 2-D convs.

    >>> g = parse(conv_node); g.kind.spatial, g.stride
    (1, (1, 2))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_htam.proposers.expert.ir import Unsupported

aten = torch.ops.aten

# aten conv overload -> (spatial dims, transposed)
# NOTE: conv_transpose*d take (stride, padding, output_padding, groups, dilation), not conv*d's order
CONV_OPS = {
    aten.conv1d.default: (1, False), aten.conv2d.default: (2, False), aten.conv3d.default: (3, False),
    aten.conv_transpose1d.default: (1, True), aten.conv_transpose2d.input: (2, True),
    aten.conv_transpose3d.input: (3, True),
    # padding given as a string ("same" / "valid")
    aten.conv1d.padding: (1, False), aten.conv2d.padding: (2, False), aten.conv3d.padding: (3, False),
}


@dataclass(frozen=True)
class ConvKind:
    """spatial: the aten op's spatial dims (1, 2, 3); transposed: conv_transpose (cuDNN's backward
    data); output_padding: extra output size (transposed only), in cuDNN dims like the geometry."""
    spatial: int = 2
    transposed: bool = False
    output_padding: tuple[int, ...] = (0, 0)

    @property
    def rank(self) -> int:
        """Rank of x, w and y (3 for conv1d, 4 for conv2d, 5 for conv3d)."""
        return self.spatial + 2

    @property
    def dims(self) -> int:
        """cuDNN's spatial dims: conv1d runs as a 2-D conv of height 1."""
        return max(2, self.spatial)

    @property
    def plain2d(self) -> bool:
        """The conv2d forward that every path (legacy, fused, NHWC, tiled 1x1) takes."""
        return self.spatial == 2 and not self.transposed

    @property
    def name(self) -> str:
        return f"conv{'_transpose' if self.transposed else ''}{self.spatial}d"


@dataclass(frozen=True)
class Geometry:
    """A conv node's operands and geometry (stride/padding/dilation in cuDNN dims: H, W or D, H, W)."""
    x: object
    w: object
    bias: object
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    kind: ConvKind


def _arg(node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _ints(v, n: int, what: str, op: str) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(a, int) for a in v):
        raise Unsupported(f"{op} {what}={v!r} (need {n} ints)")
    return tuple(v)


def _cudnn(v: tuple[int, ...], spatial: int, unit: int) -> tuple[int, ...]:
    """conv1d's geometry as a height-1 2-D conv's: (unit, v)."""
    return (unit,) + v if spatial == 1 else v


def is_conv(node) -> bool:
    return node.op == "call_function" and node.target in CONV_OPS


def parse(node) -> Geometry:
    """The operands and geometry of one aten conv node (Unsupported: a form no path takes)."""
    if node.target is aten.convolution.default:
        raise Unsupported("aten.convolution (export emits conv1d/2d/3d and conv_transpose*d)")
    if node.target not in CONV_OPS:
        raise Unsupported(f"{node.target} (not a conv1d/2d/3d or conv_transpose1d/2d/3d)")
    spatial, transposed = CONV_OPS[node.target]
    op = str(node.target)
    stride = _ints(_arg(node, 3, "stride", 1), spatial, "stride", op)
    padding = _arg(node, 4, "padding", 0)
    if transposed:
        out_pad = _ints(_arg(node, 5, "output_padding", 0), spatial, "output_padding", op)
        groups, dilation = _arg(node, 6, "groups", 1), _arg(node, 7, "dilation", 1)
    else:
        out_pad = (0,) * spatial
        dilation, groups = _arg(node, 5, "dilation", 1), _arg(node, 6, "groups", 1)
    dilation = _ints(dilation, spatial, "dilation", op)
    padding = _same(padding, node, dilation, op) if isinstance(padding, str) else \
        _ints(padding, spatial, "padding", op)
    kind = ConvKind(spatial, transposed, _cudnn(out_pad, spatial, 0))
    return Geometry(node.args[0], node.args[1], _arg(node, 2, "bias", None), _cudnn(stride, spatial, 1),
                    _cudnn(padding, spatial, 0), _cudnn(dilation, spatial, 1), int(groups), kind)


def _same(padding: str, node, dilation: tuple[int, ...], op: str) -> tuple[int, ...]:
    """padding="valid" / "same" as ints: "same" pads dil * (k - 1) / 2 on both sides, which needs
    an even total (torch pads the odd one out on one side only: no symmetric cuDNN padding)."""
    if padding == "valid":
        return (0,) * len(dilation)
    ks = node.args[1].meta["val"].shape[2:]
    total = [d * (k - 1) for d, k in zip(dilation, ks)]
    if padding != "same" or any(t % 2 for t in total):
        raise Unsupported(f"{op} padding={padding!r} with kernel {tuple(ks)} (need 'valid' or a symmetric 'same')")
    return tuple(t // 2 for t in total)


def host_dims(kind: ConvKind, stride, padding, dilation, groups: int, dtype: str, align: str,
              channels_last: bool = False) -> str:
    """C++ for htam_run: checks x (X), w (Wt), y (Y) against this kind, then declares the problem
    key d[11], K (output channels) and the output sizes O, P, Q; HTAM_ERR_SHAPE on any mismatch.
    dtype: the HtamDtype code of x, w and y; align: a C expression whose low bits give d[7] (the
    data's alignment in bytes; 0 on the legacy API, which needs none). channels_last: x and y
    stored N, H, W, C and w either way (conv.render_cl); else all three contiguous."""
    layout = ("!(t == &Wt ? htam_contiguous(*t) || htam_channels_last(*t) : htam_channels_last(*t))"
              if channels_last else "!htam_contiguous(*t)")
    r, s = kind.rank, kind.spatial
    # x's / w's / y's spatial sizes as (depth, height, width), 1 where the kind has no such dim
    sp = lambda t: {1: f"1, 1, {t}.sizes[2]", 2: f"1, {t}.sizes[2], {t}.sizes[3]",   # noqa: E731
                    3: f"{t}.sizes[2], {t}.sizes[3], {t}.sizes[4]"}[s]
    if kind.transposed:      # w [C, K/g, ...]: K = w.sizes[1] * g
        k = f"Wt.sizes[1] * {groups}"
        chan_ok = f"Wt.sizes[0] != X.sizes[1] || X.sizes[1] % {groups} != 0"
    else:                    # w [K, C/g, ...]
        k = "Wt.sizes[0]"
        chan_ok = f"Wt.sizes[1] * {groups} != X.sizes[1] || Wt.sizes[0] % {groups} != 0"
    # cuDNN dims (D, H, W): conv1d and conv2d have no depth
    geo = [(0, 1, 1)] * (3 - len(stride)) + list(zip(padding, dilation, stride))
    op = [0] * (3 - len(kind.output_padding)) + list(kind.output_padding)
    names = ("O", "P", "Q")
    ins, ks = ("d[8]", "d[2]", "d[3]"), ("d[9]", "d[5]", "d[6]")
    sizes = []
    for i, (nm, n_in, kk, (p, dl, st)) in enumerate(zip(names, ins, ks, geo)):
        if kind.transposed:
            sizes.append(f"{nm} = ({n_in} - 1) * {st} - 2 * {p} + {dl} * ({kk} - 1) + {op[i]} + 1")
        else:
            sizes.append(f"{nm} = out_size({n_in}, {p}, {dl}, {kk}, {st})")
    ysp = {1: "Y.sizes[2] != Q", 2: "Y.sizes[2] != P || Y.sizes[3] != Q",
           3: "Y.sizes[2] != O || Y.sizes[3] != P || Y.sizes[4] != Q"}[s]
    key = f"""  for (const HtamTensor* t : {{&X, &Wt, (const HtamTensor*)&Y}})
    if (t->dtype != {dtype} || t->ndim != {r} || {layout} || t->data == nullptr) return HTAM_ERR_SHAPE;
  // d[7]: the data's alignment in bytes, which a backend plan is built for (a view 2 bytes past
  // its allocation gets a plan of its own, not a refusal); 0 on the legacy API, which needs none
  const uintptr_t bits = {align};
  const int64_t xs[3] = {{{sp("X")}}}, ws[3] = {{{sp("Wt")}}};
  // {kind.name}: N, C, H, W of x; K, R, S; alignment; D of x, T of w, O of y (set below)
  int64_t d[kConvDims] = {{X.sizes[0], X.sizes[1], xs[1], xs[2], {k}, ws[1], ws[2],
                          bits == 0 ? 0 : bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : 2,
                          xs[0], ws[0], 0}};"""
    outputs = f"""
  const int64_t K = d[4];
  if ({chan_ok} || d[1] == 0 || K == 0) return HTAM_ERR_SHAPE;
  const int64_t {", ".join(sizes)};
  if (O <= 0 || P <= 0 || Q <= 0) return HTAM_ERR_SHAPE;
  d[10] = O;
  if (Y.sizes[0] != d[0] || Y.sizes[1] != K || {ysp}) return HTAM_ERR_SHAPE;"""
    return key + outputs
