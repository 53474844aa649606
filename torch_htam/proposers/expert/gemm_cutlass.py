"""A linear layer and its activation in ONE launch of CUTLASS's Hopper GEMM, the activation in its
epilogue: the cutlass_gemm library (csrc/cutlass_gemm.cu, built once per arch), which this module's
candidates link.

    y = act(x @ w^T + bias)        act: GELU, with erf (torch's default) or tanh
    y = silu(x @ w^T) * up         a SwiGLU MLP's gate, up [..., N] (another GEMM's output)

Why: Inductor (default and reduce-overhead modes) runs cuBLAS's GEMM with the bias, then a Triton
kernel for the activation, which reads and writes the [M, N] result again; cuBLASLt's own epilogues
have no erf GELU (torch's default) and no SiLU. At a ViT-B MLP's first GEMM (M 6304, K 768, N 3072,
bf16, CUDA graphs, H200) Inductor's region took 106 us and its GEMM alone 69 us
(docs/experiments/cutlass_gemm/headroom-h200.txt): the activation's pass is a third of the region.

Inductor leaves SwiGLU's silu * up to a kernel of its own too, after the gate's GEMM.

Runs: bf16 linear (x [..., K], w [N, K], bias [N] or none, y [..., N], all contiguous), K and N
multiples of 8 (16-byte TMA rows), an activation to fuse, on sm_90a where the library is built (on a
GPU machine, asking starts its build in the background). params: cutlass (this path), cg_tile (TILES).

    >>> src = gemm.render(gp, dict(gemm.defaults(gp), cutlass=True, cg_tile=1))
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_htam.proposers.expert.cuda import PRELUDE, cuh

LIBRARY = "cutlass_gemm"
SITE = cuh("gemm_cutlass.cuh")
# the library's tiles (M rows x N columns of y, the schedule), by their cg_tile index (cutlass_gemm.h).
# Chosen from 16 configurations timed at the zoo's MLP shapes (docs/experiments/cutlass_gemm/configs.py,
# configs-h200-*.txt): 128x192 fills one wave at BERT's [1024 -> 3072] (128 tiles) and Whisper's
# [1500 -> 2048] (132) and was the fastest there (12.5 / 11.1 us against 15.3 / 13.1 for the best of
# the first three; cuBLAS's own kernels there are 192x128 and 128x192); 64x128 pingpong and 128x256
# on one SM (no cluster: it beat the 2x1 cluster at all 9 shapes) were the fastest at others.
# Stream-K, 256x128, 128x128x128 and a 128x64 epilogue subtile were nowhere the fastest; nor was
# 128x256 on 2x1 clusters, whose launches from the library's cache also failed (cutlass_gemm.cu).
TILES = ((128, 128, "cooperative"), (128, 128, "pingpong"), (128, 192, "cooperative"), (64, 128, "pingpong"),
         (128, 256, "cooperative"))
# the epilogues the library computes (the IR's activation; silu_mul: silu(G) * up), and its names for them
ACTS = {"gelu_erf": "HTAM_GEMM_ACT_GELU", "gelu_tanh": "HTAM_GEMM_ACT_GELU_TANH", "silu_mul": "HTAM_GEMM_ACT_SILU_MUL"}
KEYS = {"cutlass", "cg_tile"}
# an H100's / H200's SMs: a tile shape whose tiles fill them at least once is worth its size
SMS = 132


@dataclass(frozen=True)
class Epilogue:
    """The library's epilogue on a region's inputs: act (ACTS, or None: the product as it is), the
    input index of a bias [N] (None: no bias) and of silu_mul's factor [..., N] (None for the GELUs)."""
    act: str | None
    bias: int | None = None
    mul: int | None = None


def reason(op: str, dtype: str, n: int, k: int, act: str | None, laid_out: bool) -> str | None:
    """Why the library's kernel cannot run this GEMM region (None: it can; whether it is built
    aside). act: the activation its epilogue is (ACTS), None where the epilogue is not
    act(x @ w^T [+ bias])."""
    if op != "linear" or laid_out:
        return "CUTLASS GEMM: a linear layer with contiguous operands and output only"
    if dtype != "bfloat16":
        return f"CUTLASS GEMM: bf16 only, not {dtype}"
    if act not in ACTS:
        return "CUTLASS GEMM: the epilogue must be a GELU (erf or tanh) of x @ w^T [+ bias], or silu(x @ w^T) * up"
    if n % 8 or k % 8:
        return "CUTLASS GEMM: K and N multiples of 8 (16-byte TMA rows)"
    return None


# The tiles default_tile chooses among: the cooperative ones, 128x128 / 128x192 / 128x256 (the
# pingpong tiles are left to the search's moves).
DEFAULT_CHOICES = (0, 2, 4)


def fill(m: int, n: int, tile: int) -> float:
    """The share of the SMs' tile slots that do useful work for y [m, n] at this tile: its tiles fill
    their last wave (ceil(tiles / SMS) waves of SMS slots), and a tile past y's edge does rows or
    columns of nothing.

        >>> round(fill(1024, 3072, 2), 3), round(fill(1024, 3072, 0), 3)     # 128 tiles; 192 of 264 slots
        (0.97, 0.727)
    """
    bm, bn, _ = TILES[tile]
    rows, cols = -(-m // bm), -(-n // bn)
    tiles = rows * cols
    return tiles / (SMS * -(-tiles // SMS)) * (m / (rows * bm)) * (n / (cols * bn))


def default_tile(m: int, n: int) -> int:
    """The cg_tile for y [m, n]: of DEFAULT_CHOICES, the one whose tiles fill the SMs best (fill),
    the larger tile where two fill within 2% (relative) of each other: more of the main loop a tile,
    fewer epilogues. NOTE: a rule of wave quantization, not a fit to timings: at the 14 GELU MLP shapes
    measured (the zoo's, at its batch and at 32; H200, CUDA graphs; docs/experiments/cutlass_gemm/
    zoo_shapes-h200-*.txt, probe-h200-*.txt) it picked the fastest of its three at all 14
    (test_the_default_tile_is_the_fastest_of_its_choices_measured). Pingpong tiles were faster still
    at 5 of them (by 1-8%), which the search's moves reach."""
    best = max(fill(m, n, t) for t in DEFAULT_CHOICES)
    near = [t for t in DEFAULT_CHOICES if fill(m, n, t) >= best * 0.98]
    return max(near, key=lambda t: TILES[t][0] * TILES[t][1])


def render(x: int, w: int, epi: Epilogue, n_in: int, tile: int) -> str:
    """The region's source: gemm_cutlass.cuh's run_linear on the region's tensors (x, w and epi's:
    input indices; n_in: the region's inputs), one library call."""
    if not 0 <= tile < len(TILES):
        raise ValueError(f"CUTLASS GEMM: no tile {tile}; one of 0-{len(TILES) - 1} ({TILES})")
    if epi.act not in ACTS or (epi.act == "silu_mul") != (epi.mul is not None):
        raise ValueError(f"CUTLASS GEMM: no epilogue {epi}")
    bm, bn, how = TILES[tile]
    b, m = (f"&in[{i}]" if i is not None else "nullptr" for i in (epi.bias, epi.mul))
    return "\n".join((
        f"// torch_htam expert: CUTLASS sm90 GEMM, linear {'+ bias ' if epi.bias is not None else ''}+ {epi.act} "
        f"in its epilogue, tile {bm}x{bn} {how}",
        PRELUDE, '#include "cutlass_gemm.h"', SITE,
        f"""HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
  if (n_in != {n_in} || n_out != 1) return HTAM_ERR_SHAPE;
  return cg::run_linear(in[{x}], in[{w}], {b}, {m}, out[0], {ACTS[epi.act]}, {tile}, stream);
}}
"""))


def library_ready() -> bool:
    """Whether the library is built for this machine's GPU (build.library_here: asking on a GPU
    machine starts its build in the background)."""
    from torch_htam import build
    return build.library_here(LIBRARY)
