"""What conv.match finds in a conv region (ConvMatch, BatchNorm), and the batch-norm fold as C++
expressions (Fold). conv.py, pwconv.py and cudnn_conv.py all read these; this module imports none
of them.

    >>> cp = conv.match(task.graph, policy); Fold(cp).scale("k")
    'F32::to_f(gamma[k]) * rsqrtf(F32::to_f(var[k]) + eps)'
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_htam.proposers.expert.conv_geom import ConvKind
from torch_htam.proposers.expert.cuda import DT
from torch_htam.proposers.expert.ir import ExprProgram
from torch_htam.proposers.expert.strategies import TaskFacts


@dataclass(frozen=True)
class BatchNorm:
    """Input indices of the eval-mode batch norm's parameters (gamma/beta None: affine=False)."""
    gamma: int | None
    beta: int | None
    mean: int
    var: int
    eps: float


@dataclass
class ConvMatch:
    """A single-conv region: the conv's inputs and geometry, the folded batch norm, the epilogue."""
    x: int                           # input index of x [N, C, H, W] (conv1d [N, C, L], conv3d [N, C, D, H, W])
    w: int                           # input index of the filter [K, C/groups, R, S] (transposed: [C, K/groups, ...])
    bias: int | None                 # input index of the conv bias [K]
    stride: tuple[int, ...]          # (H, W), or (D, H, W) for conv3d; conv1d's as (1, s)
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    dtype: str
    bn: BatchNorm | None
    epilogue: ExprProgram            # elementwise over the output; reads G (the conv) and S/T (scale/shift)
    g: int                           # index of G among epilogue.inputs; S = g + 1, T = g + 2 with bn
    residual: int | None = None      # fused path: input index added before the activation
    relu: bool = False               # fused path: ReLU (else identity)
    fusable: bool = False            # cuDNN's conv + bias + residual + act covers the whole region
    allow_tf32: bool = False
    facts: TaskFacts | None = None
    kind: ConvKind = ConvKind()      # 1-/2-/3-D, transposed (conv_geom.py); geometry in its cuDNN dims
    channels_last: bool = False      # x, the residual and y channels-last (conv.render_cl; extract.py says when)
    in_channels: int = 0             # x's C at capture
    batch_ranged: bool = False       # x's batch is the task's served range (render_cl slices it; match_task says)
    hardswish: bool = False          # channels-last: [batch norm] [+ residual] hardswish (not cuDNN-fusable)

    @property
    def n_inputs(self) -> int:
        return self.g


def g_only(prog: ExprProgram, g: int) -> bool:
    """The epilogue is the plain conv result (nothing to run after cuDNN)."""
    e = prog.outputs[0].expr
    return e[0] == "in" and prog.accesses[e[1]].input == g


class Fold:
    """Batch norm (and the conv bias) folded per output channel, as C++ fp32 expressions over the
    kernel's parameters named gamma/beta/mean/var/bias (those the region has, see `present`)."""

    def __init__(self, cp: ConvMatch):
        bn, names = cp.bn, {}
        if bn is not None:
            names = {"gamma": bn.gamma, "beta": bn.beta, "mean": bn.mean, "var": bn.var}
        names["bias"] = cp.bias
        self.cp, self.bn = cp, bn
        self.present = {k: v for k, v in names.items() if v is not None}

    def ld(self, name: str, k: str, default: str = "0.f") -> str:
        if name not in self.present:
            return default
        return f"{DT[self.cp.epilogue.inputs[self.present[name]][1]][0]}::to_f({name}[{k}])"

    def scale(self, k: str) -> str:
        return f"{self.ld('gamma', k, '1.f')} * rsqrtf({self.ld('var', k)} + eps)" if self.bn is not None else "1.f"

    def center(self, k: str) -> str:
        """mean - bias: our epilogue computes (conv - center) * scale + beta."""
        return f"{self.ld('mean', k)} - {self.ld('bias', k)}"

    def params(self) -> str:
        return "".join(f"const {DT[self.cp.epilogue.inputs[i][1]][0]}::raw* __restrict__ {n}, "
                       for n, i in self.present.items())
