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
    """The cg_tile for y [m, n]: 128x256 (2x1 clusters) where N is a multiple of 256, its tiles fill
    their last wave on the SMs as well as 128x128's do (within 2%), and N is at least 3072 or
    128x256's tiles are one wave or less; else 128x128 (cooperative). The wave decides first: at
    ViT-B's batch 16 (M 3152, N 3072) 128x128's 600 tiles fill 91% of 5 waves, 128x256's 300 fill
    76% of 3, and 128x128 was faster (37.5 against 40.9 us). Where both fill alike, the larger tile
    was faster at N 3072 and above (BERT's M 1024: 15.5 against 16.7 us; ViT-B at batch 32: 65.8
    against 70.1) and in a single wave (Whisper's [1500, 512 -> 2048]: 13.1 against 14.5), not over
    several waves at N 2048 (MLP-Mixer's [6272, 512 -> 2048]: 45.7 against 39.5). H200, CUDA graphs
    (docs/experiments/cutlass_gemm/zoo_shapes-h200-e680268.txt, probe-h200-e680268.txt): the
    fastest of the two at all 14 shapes measured, which are the zoo's MLP shapes, so fitted on them.
    Pingpong (tile 2) was faster still at 5 of them; the search's moves reach it."""
    def tiles(tm: int, tn: int) -> int:
        return -(-m // tm) * -(-n // tn)

    def filled(t: int) -> float:
        return t / (SMS * -(-t // SMS))
    (bm0, bn0, _), (bm1, bn1, _) = TILES[0], TILES[1]
    t0, t1 = tiles(bm0, bn0), tiles(bm1, bn1)
    wide = n >= 3072 or t1 <= SMS
    return 1 if n % bn1 == 0 and wide and filled(t1) >= filled(t0) - 0.02 else 0


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
