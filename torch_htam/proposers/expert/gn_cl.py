"""Group norm regions posed channels-last (extract.group_norm_boundary): a diffusion UNet's
GroupNorm + SiLU, and its attention blocks' GroupNorm -> [N, H * W, C] tokens.

The region is  x [N, C, H, W] stored N, H, W, C -> group_norm(G, weight, bias, eps) -> epilogue
(extract.GN_EPILOGUES: none, SiLU, or the tokens view), its output in x's memory order. The
kernels are gn_cl.cuh's two launches, gn_cl_stats (shifted sums per (image, pixel chunk, group))
and gn_cl_apply (which adds them up, then normalizes), or its one launch, gn_cl_onepass (a cluster
per (image, channel slab) holding the pixels in registers; sm_90, where the call's sizes fit the
slab and pixels a thread baked in, else the two launches run); this module picks their template
arguments (dtype, epilogue, vector width, pixels in flight or held, read-only loads, SFU math) and
launch shapes and writes the host entry. C and G are baked in; N, H and W are read at run time.

    >>> gm = gn_cl.match(task.graph, policy); src = gn_cl.render(gm, gn_cl.defaults(gm))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch_htam.extract import group_norm_chain
from torch_htam.proposers.expert.cuda import DT, PRELUDE, cuh
from torch_htam.proposers.expert.ir import Unsupported, dtype_of, shape_of
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import Target
from torch_htam.task import TensorSpec

GN_CL_CUH = cuh("gn_cl.cuh")
EPI = {"none": "GnIdentity", "silu": "GnSilu", "tokens": "GnIdentity"}
MAX_THREADS = 1024
SMEM_LIMIT = 48 << 10         # gn_cl_stats' dynamic shared memory: rows * C * 8 bytes
CLUSTER = 8                   # gn_cl_onepass's blocks per (image, slab): the portable cluster size
ONEPASS_THREADS = 512         # its most threads a block: 128 registers a thread at most
MAX_PX = 16                   # its pixels a thread holds (16-byte vectors: 64 registers)


@dataclass
class GnMatch:
    dtype: str                 # x's and y's
    wdtype: str                # weight's and bias's (x's where both are absent)
    channels: int
    groups: int
    eps: float
    epilogue: str              # extract.GN_EPILOGUES
    x: int                     # placeholder index of x
    weight: int | None         # placeholder index, or None (no affine weight)
    bias: int | None
    n_inputs: int
    pixels: int = 0            # the example's H * W
    facts: TaskFacts | None = None


def _placeholder(node, ph: list) -> int | None:
    if node is None:
        return None
    if node not in ph:
        raise Unsupported("group_norm's weight or bias is not a region input")
    return ph.index(node)


def match(gm, policy) -> GnMatch:
    """A region of extract.group_norm_chain whose input is channels-last."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    chain = group_norm_chain(calls)
    if chain is None:
        raise Unsupported("not a group norm with no epilogue, a SiLU or a tokens view")
    gn, epilogue = chain
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    x = gn.args[0]
    if x not in ph or not TensorSpec.of(x.meta["val"]).channels_last:
        raise Unsupported("group_norm's input is not a channels-last region input")
    args = list(gn.args) + [None] * (6 - len(gn.args))
    groups, weight, bias = int(args[1] if args[1] is not None else 1), args[2], args[3]
    eps = float(args[4] if args[4] is not None else 1e-5)
    shape, dt = shape_of(x), dtype_of(x)
    if dt not in ("float32", "bfloat16", "float16"):
        raise Unsupported(f"group_norm of {dt}")
    c = shape[1]
    if c % groups:
        raise Unsupported(f"{c} channels in {groups} groups")
    affine = [dtype_of(a) for a in (weight, bias) if a is not None]
    if len(set(affine)) > 1 or (affine and affine[0] not in ("float32", dt)):
        raise Unsupported(f"group_norm weight / bias of {affine} with {dt} input")
    gm_ = GnMatch(dt, affine[0] if affine else dt, c, groups, eps, epilogue, ph.index(x),
                  _placeholder(weight, ph), _placeholder(bias, ph), len(ph), shape[2] * shape[3])
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = out[0] if isinstance(out, (tuple, list)) else out
    if dtype_of(out) != dt:
        raise Unsupported("the region's output dtype differs from the norm's input")
    low = dt != "float32"
    gm_.facts = TaskFacts("rowwise", shape[2] * shape[3] * (c // groups), 16 // DT[dt][2],
                          has_transcendental=epilogue == "silu", low_precision=low, fp32=not low,
                          single_pass=False)
    return gm_


def _block(m: GnMatch, p: dict) -> tuple[int, int]:
    """(pixel rows, threads) of a block: C / vec lanes x rows pixels, rounded up to whole warps."""
    lanes = m.channels // p["vec"]
    rows = max(1, min(p["tpr"] // lanes, MAX_THREADS // lanes, SMEM_LIMIT // (8 * m.channels)))
    return rows, -(-lanes * rows // 32) * 32


def _slab(m: GnMatch, vec: int) -> int:
    """gn_cl_onepass's channels per slab: whole groups and whole vectors, the fewest of at least 64
    (a pixel's slab then spans whole 128-byte lines in bf16) that divide C; C where none does."""
    cg = m.channels // m.groups
    unit = cg * vec // math.gcd(cg, vec)
    return next((sc for sc in range(unit, m.channels + 1, unit)
                 if m.channels % sc == 0 and sc >= min(64, m.channels)), m.channels)


def _onepass(m: GnMatch, p: dict) -> tuple[int, int, int, int] | None:
    """(slab channels, pixel rows, threads, PX) of gn_cl_onepass for the example's H * W: rows from
    tpr, doubled while a thread would hold more than MAX_PX pixels; None where no block fits."""
    sc = _slab(m, p["vec"])
    lanes = sc // p["vec"]
    most = min(ONEPASS_THREADS // lanes, SMEM_LIMIT // (8 * sc))
    if most < 1:
        return None
    ppb = -(-m.pixels // CLUSTER)
    rows = max(1, min(p["tpr"] // lanes, most))
    while -(-ppb // rows) > MAX_PX and rows * 2 <= most:
        rows *= 2
    px = 1 << max(0, math.ceil(math.log2(-(-ppb // rows))))
    return (sc, rows, -(-lanes * rows // 32) * 32, px) if px <= MAX_PX else None


def _run(m: GnMatch, p: dict) -> str:
    """gn_cl.cuh's gn_cl_run<DT, WT, EPI, VEC, U, NC, PX> for these parameters."""
    t, w, nc = DT[m.dtype][0], DT[m.wdtype][0], str(p["nc"]).lower()
    epi = "GnSiluFast" if m.epilogue == "silu" and p["fast"] else EPI[m.epilogue]
    one = _onepass(m, p) if p.get("onepass") else None
    return f"gn_cl_run<{t}, {w}, {epi}, {p['vec']}, {p['unroll']}, {nc}, {one[3] if one else 0}, {CLUSTER}>"


def _host(m: GnMatch, p: dict) -> str:
    """The entry: checks of the call against the match (C, dtypes, layouts), then gn_cl_run."""
    rows, threads = _block(m, p)
    t, w = DT[m.dtype], DT[m.wdtype]
    checks = [f"n_in != {m.n_inputs} || n_out != 1",
              f"x.dtype != {t[1]} || y.dtype != {t[1]} || x.ndim != 4 || x.sizes[1] != C || !htam_channels_last(x)",
              "y.sizes[0] != x.sizes[0]"]
    if m.epilogue == "tokens":     # y: [N, H * W, C] row-major
        checks.append("y.ndim != 3 || y.sizes[1] != x.sizes[2] * x.sizes[3] || y.sizes[2] != C || !htam_contiguous(y)")
    else:                          # y: x's shape and memory order
        checks.append("y.ndim != 4 || y.sizes[1] != C || y.sizes[2] != x.sizes[2] || y.sizes[3] != x.sizes[3] "
                      "|| !htam_channels_last(y)")
    checks += [f"in[{i}].dtype != {w[1]} || !htam_contiguous(in[{i}]) || htam_numel(&in[{i}]) != C"
               for i in (m.weight, m.bias) if i is not None]
    wp, bp = (f"(const {w[0]}::raw*)in[{i}].data" if i is not None else "nullptr" for i in (m.weight, m.bias))
    one = (_onepass(m, p) if p.get("onepass") else None) or (m.channels, 1, 32, 0)
    shape = (f"GnShape s{{x.sizes[2] * x.sizes[3], C, {m.groups}, 0, 0, {rows}, {m.eps!r}f}};\n"
             f"  const GnSlab b{{{one[0]}, {one[1]}, {one[2]}, 0}};")
    guard = "".join(f"\n  if ({c}) return HTAM_ERR_SHAPE;" for c in checks[1:])
    return (f"HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{\n"
            f"  if ({checks[0]}) return HTAM_ERR_SHAPE;\n"
            f"  const HtamTensor& x = in[{m.x}];\n  HtamTensor& y = out[0];\n  const int C = {m.channels};{guard}\n"
            f"  {shape}\n"
            f"  return {_run(m, p)}((const {t[0]}::raw*)x.data, {wp}, {bp}, ({t[0]}::raw*)y.data, x.sizes[0], s,\n"
            f"      {threads}, {p['waves']}, b, stream);\n}}\n")


def render(m: GnMatch, p: dict) -> str:
    if not valid(p) or m.channels % p["vec"]:
        raise Unsupported(f"group norm params {p} for {m.channels} channels (vec must divide C)")
    if m.channels // p["vec"] > MAX_THREADS or 8 * m.channels > SMEM_LIMIT:
        raise Unsupported(f"{m.channels} channels: a pixel's lanes or statistics exceed a block")
    return "\n".join([f"// torch_htam expert: channels-last group norm ({m.epilogue}) params={sorted(p.items())}",
                      PRELUDE, "#include <algorithm>", "#include <cooperative_groups.h>", GN_CL_CUH, _host(m, p)])


# ---- the target (target.Target) ------------------------------------------------------------------

def defaults(m: GnMatch) -> dict:
    # 16-byte vectors where C allows; about 256 threads a block; 2 blocks per SM for the two
    # launches' pixels (on the UNet's bf16 shapes, H200, 2 beat 4 on the largest and 1 and 2 tied
    # on the small ones). One launch where the example's slab fits a cluster of 256-thread blocks
    # at 2 or more pixels a thread: CUDA graph replay, H200 (docs/experiments/gn_cl), it beat the
    # two launches at 8 x 128 x 64 x 64 (16.3 against 18.8 us) and the tokens norm at 8 x 256 x
    # 32 x 32 (9.9 against 14.8), tied at 8 x 512 x 16 x 16 (1 pixel a thread: 12.8 against
    # 13.3), and lost at 8 x 1024 x 16 x 16 (1 pixel a thread, 1024 blocks: 20.0 against 14.7)
    # and 8 x 384 x 64 x 64 (512 threads: 42.7 against 40.1). Set on those five UNet shapes.
    vec = m.facts.vec16
    while m.channels % vec:
        vec //= 2
    out = {"vec": vec, "tpr": 256, "waves": 2, "unroll": 4, "nc": False, "fast": m.facts.sfu_math}
    one = _onepass(m, out)
    return dict(out, onepass=one is not None and one[3] >= 2 and one[2] <= 256)


KNOBS = ("vec", "tpr", "waves", "unroll", "nc", "fast", "onepass")
TWO_PASS = ("waves", "unroll", "nc")          # the knobs only the two launches read


def canonical(m: GnMatch, p: dict) -> dict:
    """The knobs this kernel reads (a row-kernel move's others dropped), tpr in [32, 1024]: SFU
    math for half types' SiLU only; one launch only where it fits, and then the two launches'
    own knobs at the defaults (they run only for sizes the one launch does not fit)."""
    d = defaults(m)
    out = {**d, **{k: p[k] for k in KNOBS if k in p}}
    out = dict(out, fast=bool(out["fast"] and m.facts.sfu_math))
    if not out["onepass"] or m.channels % out["vec"] or _onepass(m, out) is None:
        return dict(out, onepass=False)
    return dict(out, **{k: d[k] for k in TWO_PASS})


def valid(p: dict) -> bool:
    v, t, w, u = p.get("vec", 1), p.get("tpr", 256), p.get("waves", 4), p.get("unroll", 1)
    return v > 0 and not v & (v - 1) and 32 <= t <= MAX_THREADS and w > 0 and u in (1, 2, 4, 8)


def tags(m: GnMatch, p: dict) -> list[str]:
    out = ["fuse_row_prologue_epilogue"] * (m.epilogue == "silu")
    out += ["single_kernel_launch", "row_in_registers"] if p.get("onepass") else ["block_per_row", "grid_stride_loop"]
    if p.get("vec", 1) > 1:
        out.append("vectorized_16b_access")
    if p.get("nc"):
        out.append("read_only_cache_loads")
    if p.get("unroll", 1) > 1:
        out.append("ilp_unroll")
    if p.get("fast"):
        out.append("fast_math_intrinsics")
    return out


def grid(m: GnMatch, base: dict) -> list[dict]:
    two = dict(base, onepass=False)
    out = [dict(two, unroll=u) for u in (1, 2, 8)]
    out += [dict(two, tpr=t) for t in (128, 512, 1024)]
    out += [dict(two, waves=w) for w in (1, 2, 4, 8)]
    out += [dict(two, nc=True), dict(two, tpr=512, waves=8), dict(two, tpr=128, waves=8),
            dict(two, tpr=512, waves=2), dict(two, waves=1, unroll=8)]
    return out + [dict(base, onepass=True, tpr=t) for t in (128, 512)]


def claims(gm) -> bool:
    """The region is a group norm chain on a channels-last input (this target's alone)."""
    try:
        match(gm, None)
    except (Unsupported, KeyError):
        return False
    return True


TARGET = Target(
    kind="rowwise", match=match, defaults=defaults, tags=tags,
    retag=lambda m, params, tags_: [t for t in tags_ if t in tags(m, params)],
    start_order=("block_per_row", "grid_stride_loop", "read_only_cache_loads"),
    grid=grid, render=render, valid=valid, canonical=canonical, claims=claims)
