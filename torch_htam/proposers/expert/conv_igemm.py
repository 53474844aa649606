"""Channels-last conv2d regions as ONE launch of our implicit-GEMM kernel (conv_igemm.cuh).

render_cl's cuDNN path launches two things per call: a small kernel that folds batch norm into
per-channel vectors, then cudnnBackendExecute. Where a served model is bound by its host, that
host time decides the call: at vision bf16's example batch (16, H200) each such site cost 16-27 us
more host time than aten's conv plus Inductor's Triton kernel, so the example batch ran none of our
kernels (bench/findings.md, #36). Here one kernel computes the conv and its whole epilogue, batch
norm from the raw statistics included:

    y = [relu]((round(conv(x, w)) + bias[k] - mean[k]) * gamma[k] * rsqrt(var[k] + eps) + beta[k]
               [+ residual])

This module emits the region's htam_run (its checks, the tensors bound to ig::BnEpi) and picks the
instantiation (params: ig_bm, ig_bn, ig_stages, IG_TILES). Run at any batch without a plan per
shape (cuDNN plans each new shape on its first call).

    >>> src = render(cp, dict(conv.defaults(cp), igemm=True))      # cp = conv.match(...), reason(cp) None
"""
from __future__ import annotations

from torch_htam.proposers.expert.conv_match import ConvMatch, Fold
from torch_htam.proposers.expert.cuda import DT, PRELUDE, c_float, cuh

KERNEL = cuh("conv_igemm.cuh")
MAIN_LOOP = cuh("pwconv.cuh")     # its cp.async and mma helpers (namespace pw)
# (BM, BN, STAGES) instantiations, each within 48 KB of shared memory (conv_igemm.cuh's launch), in
# their order on a model's KCRS weights at batch 16, ResNet-18's 3x3 layers (128 x 64 and 128 x 32
# level, then 64 x 64; 64 x 128 gathers twice the weights a thread, the slowest there and among the
# fastest on KRSC weights: docs/experiments/igemm_tiles, H200)
IG_TILES = ((128, 64, 3), (128, 32, 3), (64, 64, 4), (64, 128, 3))
DEFAULT_TILE = IG_TILES[0]


def reason(cp: ConvMatch) -> str | None:
    """Why the implicit-GEMM kernel cannot run this region (None: it can)."""
    if not cp.channels_last or not cp.kind.plain2d or cp.groups != 1:
        return "implicit-GEMM conv: channels-last conv2d without groups only"
    if cp.dtype not in ("bfloat16", "float16"):
        return f"implicit-GEMM conv: bf16 / fp16 tensor cores only, not {cp.dtype}"
    if cp.hardswish:
        return "implicit-GEMM conv: ReLU or no activation after the conv, not hardswish"
    if cp.in_channels % 32:
        return f"implicit-GEMM conv: input channels a multiple of 32 (a reduction step), not {cp.in_channels}"
    if len({cp.epilogue.inputs[i][1] for i in Fold(cp).present.values()}) > 1:
        return "implicit-GEMM conv: batch norm's vectors and the bias in more than one dtype"
    return None


def _vector_dtype(cp: ConvMatch) -> str:
    """The per-channel vectors' dtype name (all one, reason() checks; the data's where none)."""
    present = Fold(cp).present.values()
    return cp.epilogue.inputs[next(iter(present))][1] if present else cp.dtype


def render(cp: ConvMatch, params: dict) -> str:
    """The region's kernel source: conv_igemm.cuh and an htam_run that binds the region's inputs to
    ig::run_site (which checks every tensor: HTAM_ERR_SHAPE where one is not as the kernel reads
    it) and launches the kernel once."""
    dt, dtc, _ = DT[cp.dtype]
    vt, vcode, _ = DT[_vector_dtype(cp)]
    tile = tuple(int(params.get(k, d)) for k, d in zip(("ig_bm", "ig_bn", "ig_stages"), DEFAULT_TILE))
    if tile not in IG_TILES:
        raise ValueError(f"implicit-GEMM conv: no instantiation for tile {tile}; one of {IG_TILES}")
    present = Fold(cp).present
    vecs = ", ".join(f"&in[{present[n]}]" if n in present else "nullptr" for n in ("gamma", "beta", "mean", "var", "bias"))
    res = f"&in[{cp.residual}]" if cp.residual is not None else "nullptr"
    site = ", ".join(map(str, (*cp.stride, *cp.padding, *cp.dilation))) + f", {c_float(cp.bn.eps if cp.bn else 0.0)}"
    call = (f"ig::run_site<{dt}, {vt}, {tile[0]}, {tile[1]}, {tile[2]}, {'true' if cp.relu else 'false'}>("
            f"in[{cp.x}], in[{cp.w}], out[0], vecs, {res}, {dtc}, {vcode}, ig::Site{{{site}}}, stream)")
    head = f"// torch_htam expert: implicit-GEMM conv2d, channels-last, one launch with its epilogue params={sorted(params.items())}"
    return "\n".join((head, PRELUDE, MAIN_LOOP, KERNEL, f"""HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {cp.n_inputs} || n_out != 1) return HTAM_ERR_SHAPE;
  const HtamTensor* const vecs[5] = {{{vecs}}};   // gamma, beta, mean, var, bias
  return {call};
}}
"""))
