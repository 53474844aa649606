"""Strategy id -> parameter moves, as data. The autotuning space of the expert generator.

Each entry says which task kinds a strategy applies to, when it is meaningful for a task, and the
parameter overrides to try, best guess first. A candidate is (base params + overrides), tagged with
the strategy ids it embodies. Ids follow torch_htam/prior (the HTG's local strategies).

    >>> moves_for("ilp_unroll", facts)       # facts: an elementwise task's TaskFacts
    [{'unroll': 2}, {'unroll': 4}]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class TaskFacts:
    """What the strategy table needs to know about a task (kept small so every kind fits)."""
    kind: str                   # "elementwise" | "rowwise" | "gemm" | "conv" | "attention" | "pool"
    ncol: int = 0               # row length at capture (rowwise; pool: taps per window)
    vec16: int = 4              # elements in 16 bytes of the narrowest dtype
    has_softmax_pair: bool = False
    has_welford_pair: bool = False
    has_transcendental: bool = False
    has_dropped: bool = False
    low_precision: bool = False
    allow_tf32: bool = False
    fp32: bool = True
    epilogue_fits_lt: bool = False
    has_batchnorm: bool = False        # conv: an eval batch norm is folded in
    epilogue_fits_cudnn: bool = False  # conv: cudnnConvolutionBiasActivationForward covers the epilogue
    single_pass: bool = False          # rowwise: one reduction, no full-row output (the row is read once)
    tiled_conv: bool = False           # conv: pwconv.py's tiled kernel runs it (1x1, policy allows)
    nhwc_conv: bool = False            # conv: the NHWC path can run it (conv.nhwc_reason)
    igemm_tiles: tuple = ()            # conv: conv_igemm.IG_TILES where its one-launch kernel runs it
    cutlass_tiles: tuple = ()          # conv / gemm: conv_cutlass.TILES' / gemm_cutlass.TILES' indices
                                       # where that library runs the region, built
    lt_tiles: tuple = ()               # gemm: cuBLASLt tiles worth forcing on this arch (gemm.LT_TILES)
    cudnn_attention: bool = False      # attention: cuDNN's fused attention can run it, its library built

    @property
    def packs_half(self) -> bool:
        """Every input and output is 2 bytes wide: a row kernel can hold them two to a register."""
        return self.low_precision and self.vec16 == 8

    @property
    def sfu_math(self) -> bool:
        """SFU exp/div/tanh by default: half-precision outputs round away their ~2 ulp of fp32 error
        (8 or 11 significant bits); fp32 keeps the exact functions for its 1e-4 tolerance."""
        return self.low_precision and self.has_transcendental

    @property
    def row_cap(self) -> int:
        """Values per thread a row kernel holds in registers before it spills (32 packed, 16 fp32)."""
        return 32 if self.packs_half else 16


@dataclass(frozen=True)
class StrategyMoves:
    """One strategy's parameter moves: the task kinds it applies to, the overrides to try (best
    guess first) and when it means something for a task."""
    kinds: frozenset[str]
    variants: Callable[[TaskFacts], list[dict[str, Any]]]
    applies: Callable[[TaskFacts], bool] = field(default=lambda i: True)


def _row_in_regs(i: TaskFacts) -> list[dict]:
    """Mappings that hold the whole row in registers: at most 16 values a thread (32 for packed
    half-precision rows, two to a register), beyond which the row kernel spills."""
    out = []
    for tpr in (32, 128, 256):
        nv = max(1, -(-i.ncol // (tpr * i.vec16)))   # exact: a padded chunk costs registers
        if nv * i.vec16 <= i.row_cap:
            out.append({"tpr": tpr, "nv": nv, "vec": i.vec16})
    return out


def _pw_tiles() -> list[dict]:
    return [{"tiled": True}, {"tiled": True, "bn": 256, "pre": False, "persist": False},
            {"tiled": True, "bn": 128, "persist": True}, {"tiled": True, "stages": 3}]


def _igemm_tiles(i: TaskFacts) -> list[dict]:
    """The CUTLASS conv's tiles, then the implicit-GEMM conv's (conv.match gives them: conv_igemm and
    conv_cutlass import this module)."""
    return ([{"cutlass": True, "ct_tile": t} for t in i.cutlass_tiles]
            + [{"cutlass": False, "igemm": True, "ig_bm": bm, "ig_bn": bn, "ig_stages": st} for bm, bn, st in i.igemm_tiles])


def _smem_tiles(i: TaskFacts) -> list[dict]:
    """smem_tiling's moves: a GEMM's CUTLASS tiles, then the tiles forced on cuBLASLt's ranked
    algorithm (the lt_tile knob alone: a move that also set `algo` would be credited with every
    setting of another rank, tags_of's touched); a conv's library and implicit-GEMM tiles, else
    the tiled 1x1 kernel's."""
    if i.kind == "gemm":
        return ([{"cutlass": True, "cg_tile": t} for t in i.cutlass_tiles]
                + [{"lt_tile": t} for t in i.lt_tiles])
    return _igemm_tiles(i) if i.igemm_tiles or i.cutlass_tiles else _pw_tiles()


EW, ROW, GEMM = frozenset({"elementwise"}), frozenset({"rowwise"}), frozenset({"gemm"})
CONV = frozenset({"conv"})
ATTN = frozenset({"attention"})
POOL = frozenset({"pool"})       # windowed reductions (pool.py): a window is a row of taps
EW_ROW = EW | ROW


def _attn_tiles(i: TaskFacts) -> list[dict]:
    """Flash attention's (query rows, keys) per block beside the defaults (attention.defaults):
    half types 128 x 64 (8 warps) by default, fp32 64 x 64 (a 4 x 4 register tile per thread)."""
    if i.fp32:
        return [{"bm": 32, "bn": 64}, {"bm": 128, "bn": 32}, {"bm": 32, "bn": 32}]
    return [{"bm": 64, "bn": 64}, {"bm": 128, "bn": 128}, {"bm": 64, "bn": 128}]

TABLE: dict[str, StrategyMoves] = {
    "vectorized_16b_access": StrategyMoves(EW_ROW, lambda i: [{"vec": i.vec16}, {"vec": max(1, i.vec16 // 2)}]),
    "read_only_cache_loads": StrategyMoves(EW_ROW | POOL, lambda i: [{"nc": True}]),
    "row_in_registers": StrategyMoves(ROW, _row_in_regs),
    "warp_per_row": StrategyMoves(ROW | POOL, lambda i: [{"tpr": 32, "rows_per_block": 4}, {"tpr": 32, "rows_per_block": 8},
                                             {"tpr": 16, "rows_per_block": 8}]),
    "block_per_row": StrategyMoves(ROW, lambda i: [{"tpr": t} for t in (256, 128, 512, 1024)]),
    "grid_stride_loop": StrategyMoves(EW_ROW | POOL, lambda i: [{"waves": 8}, {"waves": 4}, {"waves": 16}]),
    "persistent_grid": StrategyMoves(EW_ROW, lambda i: [{"waves": 2}, {"waves": 1}]),
    "fuse_elementwise_chain": StrategyMoves(EW | GEMM | CONV, lambda i: [{"fused": True}] if i.kind == "conv"
                                       and i.epilogue_fits_cudnn else [{}]),
    "fuse_row_prologue_epilogue": StrategyMoves(ROW, lambda i: [{}]),
    "warp_shuffle_reduction": StrategyMoves(ROW | POOL, lambda i: [{"tpr": 32}, {"tpr": 16, "rows_per_block": 8}]),
    "online_softmax": StrategyMoves(ROW, lambda i: [{"online": True}], lambda i: i.has_softmax_pair),
    "welford_statistics": StrategyMoves(ROW, lambda i: [{"welford": True}], lambda i: i.has_welford_pair),
    "ilp_unroll": StrategyMoves(EW, lambda i: [{"unroll": 2}, {"unroll": 4}]),
    # rows: a norm's weight/bias held in registers from the start (lazy=False) instead of loaded in
    # the final pass; neither wins everywhere (bench/sweep.py, H100: 768-wide bf16 LayerNorm 17.2 us
    # held vs 19.1 us lazy; lazy removed a spill from a 4096-wide RMSNorm)
    "hoist_broadcast_loads": StrategyMoves(ROW, lambda i: [{"lazy": False}]),
    # rows: ask for 2048 / 1024 resident threads (32 / 64 registers), or let the compiler choose
    "occupancy_tuning": StrategyMoves(ROW, lambda i: [{"occ": 2048}, {"occ": 1024}, {"occ": 0}]),
    "fp32_math_half_io": StrategyMoves(ROW, lambda i: [{"packed": True}, {"packed": False}],
                                  lambda i: i.packs_half),
    "fast_math_intrinsics": StrategyMoves(EW_ROW | GEMM, lambda i: [{"fast": True}], lambda i: i.has_transcendental),
    "single_kernel_launch": StrategyMoves(EW_ROW, lambda i: [{}]),
    "drop_noop_ops": StrategyMoves(EW_ROW, lambda i: [{}], lambda i: i.has_dropped),
    # GEMM: cuBLASLt with its fused epilogue, or cuBLASLt + one fused epilogue kernel
    "cublaslt_epilogue": StrategyMoves(GEMM, lambda i: [{"lt_epilogue": True}], lambda i: i.epilogue_fits_lt),
    "gemm_plus_epilogue_kernel": StrategyMoves(GEMM | CONV, lambda i: [{"fused": False} if i.kind == "conv"
                                                                  else {"lt_epilogue": False}]),
    # conv: TF32 on cuDNN's next tensor-core engines too (its top-ranked fp32 engines under TF32
    # are not always the fastest that verify: conv.py's NOTE on cuDNN's ranking), as bf16_tensor_cores
    # does; attention: the flash kernel on TF32 tensor cores (attention.py, the Tf32 tag of fa_mma)
    "tf32_tensor_cores": StrategyMoves(GEMM | CONV | ATTN, lambda i: [{"tf32": True}] + [{"tf32": True, "algo": a} for a in
                                                                               (1, 2, 3)] * (i.kind == "conv"),
                                       lambda i: i.fp32 and i.allow_tf32),
    "bf16_tensor_cores": StrategyMoves(GEMM | CONV, lambda i: [{"algo": 1}, {"algo": 2}], lambda i: not i.fp32),
    # conv: BN folded into cuDNN's fused conv + bias + residual + ReLU, or into our epilogue kernel
    "fold_batchnorm": StrategyMoves(CONV, lambda i: [{"fused": True}] * i.epilogue_fits_cudnn + [{"fused": False}],
                               lambda i: i.has_batchnorm),
    # conv: a 1x1 conv as our own tiled tensor-core GEMM with the epilogue applied before the one
    # store (pwconv.py), where cuDNN writes the conv and an epilogue kernel reads it back; a
    # channels-last conv as our implicit-GEMM kernel (conv_igemm.py), one launch with batch norm
    # from the raw statistics, where cuDNN's path launches the fold and then cuDNN
    # GEMM: CUTLASS's Hopper GEMM with the activation in its epilogue (gemm_cutlass.py), its tiles;
    # cuBLASLt's ranked algorithm made to use another tile (gemm.LT_TILES)
    "smem_tiling": StrategyMoves(CONV | GEMM, _smem_tiles,
                                 lambda i: i.tiled_conv or bool(i.igemm_tiles or i.cutlass_tiles or i.lt_tiles)),
    # conv: cuDNN's conv on NHWC copies of x and w (the layout its tensor-core engines run natively;
    # on NCHW it transposes in and out itself), the tiled kernel's epilogue transposing back through
    # shared memory (conv.py, pwconv.nhwc_epilogue). Not where our tiled 1x1 kernel runs (faster).
    "coalesced_layout_access": StrategyMoves(CONV, lambda i: [{"nhwc": True, "graph": True, "fused": False},
                                                         {"nhwc": True, "graph": True, "fused": False, "algo": 1}],
                                        lambda i: i.nhwc_conv and not i.tiled_conv),
    # attention (attention.py): block tiles, and a third cp.async stage for K / V (half types)
    "flash_attention_tiling": StrategyMoves(ATTN, _attn_tiles),
    "async_copy_pipeline": StrategyMoves(ATTN, lambda i: [{"stages": 3}], lambda i: not i.fp32),
    "cudnn_fused_attention": StrategyMoves(ATTN, lambda i: [{"backend": "cudnn"}], lambda i: i.cudnn_attention),
}
KNOWN = set(TABLE)   # ids the prior uses


def strategy_id(s: Any) -> str:
    """htg.Strategy objects or plain strings."""
    return s if isinstance(s, str) else getattr(s, "id")


def moves_for(sid: str, facts: TaskFacts) -> list[dict[str, Any]]:
    """Parameter overrides for one strategy on one task ([] when it does not apply)."""
    st = TABLE.get(sid)
    if st is None or facts.kind not in st.kinds or not st.applies(facts):
        return []
    return st.variants(facts)
