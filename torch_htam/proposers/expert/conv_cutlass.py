"""Channels-last conv2d sites in ONE launch of CUTLASS's Hopper implicit-GEMM conv, batch norm in its
epilogue: the cutlass_conv library (csrc/cutlass_conv.cu, built once per arch), which this module's
candidates link.

    y = act((conv(x, w) - mean[k]) * gamma[k] * rsqrt(var[k] + eps) + beta[k] [+ residual])

act: none, ReLU or hardswish (MobileNetV3's, which cuDNN's graph cannot fuse).

Why: render_cl's cuDNN path launches the batch-norm fold and then cudnnBackendExecute, and at a
served model's small batches the host decides the call (bench/findings.md, #36). This one is one
launch of 6-11 us of host time (cached TMA descriptors), and on the GPU 1.27-2.85x faster than aten's
site (cuDNN's conv, then batch norm, add, ReLU) at ResNet-50's conv shapes, batches 1, 16 and 64;
0.78-1.54x of torch.compile's (H200, docs/experiments/cutlass_conv). A model's KCRS 3x3 weight is copied to KRSC first (one more small
launch); a 1x1 or channels-last one is read as it is.

Runs: bf16, plain conv2d (groups 1), batch norm with gamma and beta, no conv bias, C and K multiples
of 8 (16-byte TMA rows), on sm_90a where the library is built (on a GPU machine, asking starts its
build in the background: build.library_in_background). params: cutlass (this path), ct_tile (TILES).

    >>> src = render(cp, dict(conv.defaults(cp), cutlass=True, ct_tile=1))
"""
from __future__ import annotations

from torch_htam.proposers.expert.conv_match import ConvMatch
from torch_htam.proposers.expert.cuda import PRELUDE, c_float, cuh

LIBRARY = "cutlass_conv"
SITE = cuh("conv_cutlass.cuh")
# the library's tiles (M output pixels x N output channels), by their ct_tile index
TILES = ((128, 64), (128, 128), (64, 64))
# A tile shape is the default where it gives at least this many output tiles: about two thirds of
# an H100's / H200's 132 SMs. It picks the fastest of the three at all 21 of ResNet-50's conv shapes
# x batches 1, 16, 64 (H200, docs/experiments/cutlass_conv/conv_bn_probe.json).
MIN_TILES = 90
KEYS = {"cutlass", "ct_tile"}


def reason(cp: ConvMatch) -> str | None:
    """Why the library's kernel cannot run this region (None: it can; whether it is built aside)."""
    if not cp.channels_last or not cp.kind.plain2d or cp.groups != 1:
        return "CUTLASS conv: channels-last conv2d without groups only"
    if cp.dtype != "bfloat16":
        return f"CUTLASS conv: bf16 only, not {cp.dtype}"
    if cp.bn is None or cp.bn.gamma is None or cp.bn.beta is None or cp.bias is not None:
        return "CUTLASS conv: batch norm with gamma and beta after the conv, no conv bias"
    if any(cp.epilogue.inputs[i][1] != "bfloat16" for i in (cp.bn.gamma, cp.bn.beta, cp.bn.mean, cp.bn.var)):
        return "CUTLASS conv: batch norm's vectors in bf16 only"
    if cp.in_channels % 8 or out_channels(cp) % 8:
        return "CUTLASS conv: input and output channels multiples of 8 (16-byte TMA rows)"
    return None


def out_channels(cp: ConvMatch) -> int:
    """K: the conv result's channels (the epilogue's input g is the conv result, [N, K, P, Q])."""
    return int(cp.epilogue.inputs[cp.g][0][1])


def default_tile(m: int, k: int) -> int:
    """The ct_tile for m output pixels (N * P * Q) and k output channels: the largest tile (128x128,
    then 128x64, then 64x64) no wider than k that gives MIN_TILES tiles, else 64x64."""
    for t in (1, 0):
        bm, bn = TILES[t]
        if bn <= k and -(-m // bm) * -(-k // bn) >= MIN_TILES:
            return t
    return 2


def render(cp: ConvMatch, params: dict) -> str:
    """The region's source: conv_cutlass.cuh's run_site on the region's tensors, one library call."""
    tile = int(params.get("ct_tile", 0))
    if not 0 <= tile < len(TILES):
        raise ValueError(f"CUTLASS conv: no tile {tile}; one of 0-{len(TILES) - 1} ({TILES})")
    bn = cp.bn
    vecs = ", ".join(f"&in[{i}]" for i in (bn.mean, bn.gamma, bn.var, bn.beta))
    res = f"&in[{cp.residual}]" if cp.residual is not None else "nullptr"
    site = ", ".join(map(str, (*cp.stride, *cp.padding, *cp.dilation)))
    act = "HTAM_CONV_ACT_HARDSWISH" if cp.hardswish else "HTAM_CONV_ACT_RELU" if cp.relu else "HTAM_CONV_ACT_NONE"
    site += f", {c_float(bn.eps)}, {act}, {tile}"
    bm, bn_ = TILES[tile]
    words = "+ hardswish " if cp.hardswish else "+ ReLU " if cp.relu else ""
    return "\n".join((
        f"// torch_htam expert: CUTLASS sm90 implicit-GEMM conv2d, channels-last, batch norm "
        f"{'+ residual ' if cp.residual is not None else ''}{words}in its epilogue, tile {bm}x{bn_}",
        PRELUDE, "#include <algorithm>", '#include "cutlass_conv.h"', SITE,
        f"""HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {cp.n_inputs} || n_out != 1) return HTAM_ERR_SHAPE;
  const HtamTensor* const vecs[4] = {{{vecs}}};   // mean, gamma, var, beta
  return ct::run_site(in[{cp.x}], in[{cp.w}], out[0], vecs, {res}, ct::Site{{{site}}}, stream);
}}
"""))


def library_ready() -> bool:
    """Whether the library is built for this machine's GPU (build.library_here: asking on a GPU
    machine starts its build in the background, a minute and a half; the search waits for it a
    while, pipeline.wait_for_libraries)."""
    from torch_htam import build
    return build.library_here(LIBRARY)
