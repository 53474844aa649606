"""A linear layer and its activation in ONE launch of CUTLASS's Hopper GEMM, the activation in its
epilogue: the cutlass_gemm library (csrc/cutlass_gemm.cu, built once per arch), which this module's
candidates link.

    y = act(x @ w^T + bias)        act: GELU, with erf (torch's default) or tanh

Why: Inductor (default and reduce-overhead modes) runs cuBLAS's GEMM with the bias, then a Triton
kernel for the activation, which reads and writes the [M, N] result again; cuBLASLt's own epilogues
have no erf GELU (torch's default) and no SiLU. At a ViT-B MLP's first GEMM (M 6304, K 768, N 3072,
bf16, CUDA graphs, H200) Inductor's region took 106 us and its GEMM alone 69 us
(docs/experiments/cutlass_gemm/headroom-h200.txt): the activation's pass is a third of the region.

Runs: bf16 linear (x [..., K], w [N, K], bias [N] or none, y [..., N], all contiguous), K and N
multiples of 8 (16-byte TMA rows), an activation to fuse, on sm_90a where the library is built (on a
GPU machine, asking starts its build in the background). params: cutlass (this path), cg_tile (TILES).

    >>> src = render(gp, dict(gemm.defaults(gp), cutlass=True, cg_tile=1))
"""
from __future__ import annotations

from torch_htam.proposers.expert.cuda import PRELUDE, cuh

LIBRARY = "cutlass_gemm"
SITE = cuh("gemm_cutlass.cuh")
# the library's tiles (M rows x N columns of y, the schedule), by their cg_tile index (cutlass_gemm.h)
TILES = ((128, 128, "cooperative"), (128, 256, "cooperative, 2x1 clusters"), (128, 128, "pingpong"))
# the IR's activations the epilogue computes, and the library's names for them
ACTS = {"gelu_erf": "HTAM_GEMM_ACT_GELU", "gelu_tanh": "HTAM_GEMM_ACT_GELU_TANH"}
KEYS = {"cutlass", "cg_tile"}
# an H100's / H200's SMs: a tile shape whose tiles fill them at least once is worth its size
SMS = 132


def reason(op: str, dtype: str, n: int, k: int, act: str | None, laid_out: bool) -> str | None:
    """Why the library's kernel cannot run this GEMM region (None: it can; whether it is built
    aside). act: the activation its epilogue is (ACTS), None where the epilogue is not
    act(x @ w^T [+ bias])."""
    if op != "linear" or laid_out:
        return "CUTLASS GEMM: a linear layer with contiguous operands and output only"
    if dtype != "bfloat16":
        return f"CUTLASS GEMM: bf16 only, not {dtype}"
    if act not in ACTS:
        return "CUTLASS GEMM: the epilogue must be a GELU (erf or tanh) of x @ w^T [+ bias]"
    if n % 8 or k % 8:
        return "CUTLASS GEMM: K and N multiples of 8 (16-byte TMA rows)"
    return None


def default_tile(m: int, n: int) -> int:
    """The cg_tile for y [m, n]: 128x256 (2x1 clusters) where N is a multiple of 256, at least 3072,
    and its tiles fill the SMs once, else 128x128 (cooperative). On an H200 under CUDA graphs
    (docs/experiments/cutlass_gemm/probe-h200-afbc268.txt, the zoo's MLP shapes at batch 32, so
    fitted on them) 128x256 was the fastest at N 3072 (ViT-B, BERT-sized: 72.0 and 85.1 against
    76.6 and 92.1 us) and within 0.5% of the fastest at [4096, 4096]; 128x128 at N 2048 and below
    (MLP-Mixer 42.6 against 48.5 us, ConvNeXt 81.7 against 97.9 and 30.8 against 33.2)."""
    bm, bn, _ = TILES[1]
    return 1 if n % bn == 0 and n >= 3072 and -(-m // bm) * (n // bn) >= SMS else 0


def render(x: int, w: int, bias: int | None, n_in: int, act: str, tile: int) -> str:
    """The region's source: gemm_cutlass.cuh's run_linear on the region's tensors (x, w, bias:
    input indices; n_in: the region's inputs), one library call."""
    if not 0 <= tile < len(TILES):
        raise ValueError(f"CUTLASS GEMM: no tile {tile}; one of 0-{len(TILES) - 1} ({TILES})")
    bm, bn, how = TILES[tile]
    b = f"&in[{bias}]" if bias is not None else "nullptr"
    return "\n".join((
        f"// torch_htam expert: CUTLASS sm90 GEMM, linear {'+ bias ' if bias is not None else ''}+ {act} "
        f"in its epilogue, tile {bm}x{bn} {how}",
        PRELUDE, '#include "cutlass_gemm.h"', SITE,
        f"""HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {n_in} || n_out != 1) return HTAM_ERR_SHAPE;
  return cg::run_linear(in[{x}], in[{w}], {b}, out[0], {ACTS[act]}, {tile}, stream);
}}
"""))


def library_ready() -> bool:
    """Whether the library is built for this machine's GPU (build.library_here: asking on a GPU
    machine starts its build in the background)."""
    from torch_htam import build
    return build.library_here(LIBRARY)
