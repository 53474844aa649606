"""ExpertProposer: the built-in, offline, deterministic proposer.

graph -> plan (ir.lower / gemm.match / conv.match) -> default parameters -> strategy moves (strategies.TABLE)
-> up to n distinct parameter settings -> CUDA sources. The search evaluates them on the GPU and
keeps the best, so a proposal is one autotuning round around the parent's parameters.

    >>> prop = ExpertProposer().propose(ProposalRequest(task, "seed", [], n=4))
    >>> [(c.tags, c.params) for c in prop.candidates]
"""
from __future__ import annotations

import dataclasses
from typing import Any

from torch_htam.proposers.base import Candidate, Proposal, ProposalRequest
from torch_htam.proposers.expert import conv, elementwise, gemm, rowwise
from torch_htam.proposers.expert.cuda import DT
from torch_htam.proposers.expert.ir import Plan, Unsupported, lower
from torch_htam.proposers.expert.strategies import CONV_ALGOS, GEMM_ALGOS, PlanInfo, moves_for, strategy_id


def _plan_info(plan: Plan, policy) -> PlanInfo:
    dts = [dt for _, dt in plan.inputs] + [o.dtype for o in plan.outputs]
    pairs = {r.pair[0] for r in plan.reductions if r.pair}
    low = any(dt != "float32" for dt in dts)
    single = len(plan.reductions) == 1 and all(o.row for o in plan.outputs)
    return PlanInfo(plan.kind, plan.shape[-1], 16 // min(DT[dt][2] for dt in dts),
                    "softmax" in pairs, "welford" in pairs, plan.has_transcendental,
                    bool(plan.dropped), low, bool(policy and policy.allow_tf32), not low,
                    single_pass=single)


def _default_row(info: PlanInfo) -> dict[str, Any]:
    """Warp per row while the row fits 32 threads' registers, else a block per row; streamed
    (online/Welford, one pass) beyond 16 values per thread of 1024 threads, except 16K-32K-wide
    fp32 rows, held 32 values a thread by one 1024-thread block per SM (_long_row_in_registers).

    Half-precision rows are held packed (two values per register), so a thread holds 32 of them
    where it holds 16 fp32 values. Measured (bench/sweep.py, H100, docs/RESULTS_LOG.md): packed
    took bf16 softmax from 52.6 to 31.1 us, RMSNorm [4096, 4096] from 36.7 to 31.2 us, and a
    768-wide LayerNorm was fastest warp-per-row with 32 values per thread (18.6 us vs 25.1 us).
    """
    n = max(info.ncol, 1)
    vec = info.vec16
    while vec > 1 and n % vec:
        vec //= 2
    packed, cap = info.packs_half, info.row_cap
    tpr = 32 if n <= 32 * cap else 128 if n <= 128 * 16 else 256 if n <= 256 * 16 else 1024
    per_thread = -(-n // tpr)
    while vec > per_thread:           # stays a power of two (vector loads are 2/4/8/16 bytes)
        vec //= 2
    nv = -(-per_thread // vec)     # exact (768 = 32 x 8 x 3): a padded 4th chunk costs registers
    # NOTE: a row read once (mean(silu(x) * s)) gains nothing from registers: streaming it took
    # 12.7 us against 14.3 us held ([4096, 768] fp32, bench/sweep.py, H100, docs/RESULTS_LOG.md).
    stream = info.single_pass or (nv * vec > 16 and not (packed and tpr == 32 and nv * vec <= cap))
    # NOTE: a register-held row asks for 1024 resident threads (at most 64 registers): left alone,
    # ptxas unrolled the 768-wide bf16 LayerNorm into 254 registers with spills (21.2 us), capped it
    # took 14.1 us; bf16 softmax 25.3 -> 23.7 us, fp32 softmax 38.5 -> 38.8 us (bench/sweep.py, H100).
    p = {"tpr": tpr, "rows_per_block": 4, "vec": vec, "nv": 0 if stream else nv,
         "online": stream, "welford": stream, "nc": False, "waves": 0, "fast": info.sfu_math,
         "lazy": True, "packed": packed, "occ": 0 if stream else 1024, "rpg": 1, "memo": True}
    # NOTE: a 32000-wide fp32 log_softmax held this way took 54.2 us against 69.1 streamed
    # (bench/sweep.py, H100, docs/RESULTS_LOG.md): one DRAM read of the row instead of two
    return dict(p, **(_long_row_in_registers(info) or {}))


def _default_tags(kind: str, params: dict, info: PlanInfo) -> list[str]:
    tags = ["single_kernel_launch"]
    if kind == "elementwise":
        tags.append("fuse_elementwise_chain")
    if kind == "rowwise":
        tags += ["fuse_row_prologue_epilogue", "warp_shuffle_reduction",
                 "warp_per_row" if params["tpr"] <= 32 else "block_per_row"]
        if params["nv"]:
            tags.append("row_in_registers")
        if params["online"] and info.has_softmax_pair:
            tags.append("online_softmax")
        if params["welford"] and info.has_welford_pair:
            tags.append("welford_statistics")
    if kind == "gemm":
        return tags + ["fuse_elementwise_chain"] + _gemm_tags(params, info)
    if params.get("vec", 1) > 1:
        tags.append("vectorized_16b_access")
    if info.has_dropped:
        tags.append("drop_noop_ops")
    return tags


class _Target:
    """One supported task: its kind, default params and how to render params to CUDA."""

    def __init__(self, kind: str, info: PlanInfo, defaults: dict, render, note: str = "", tagger=None,
                 canonical=None):
        self.kind, self.info, self.defaults, self.render, self.note = kind, info, defaults, render, note
        self.tagger = tagger     # params -> the kind's path-dependent strategy tags (conv)
        # params -> the same kernel's params with the knobs it does not read at their defaults
        self.canonical = canonical or (lambda p: p)


def _target(task, policy) -> _Target:
    try:
        plan = lower(task.graph)
    except Unsupported as e_plan:
        if conv.has_conv(task.graph):
            cp = conv.match(task.graph, policy)
            return _Target("conv", cp.info, cp.defaults(), cp.render, tagger=cp.tags, canonical=cp.canonical)
        try:
            gp = gemm.match(task.graph, policy)
        except Unsupported as e_gemm:
            raise Unsupported(f"fused elementwise/row: {e_plan}; gemm: {e_gemm}") from None
        return _Target("gemm", gp.info, gp.defaults(), gp.render)
    if not plan.accesses:
        raise Unsupported("the region reads no input")
    info = _plan_info(plan, policy)
    if plan.kind == "elementwise":
        # NOTE: half-precision outputs take SFU math by default (tanh.approx: ~2^-11 relative
        # error under bf16's 2^-8 rounding): bias + GELU bf16 went 25.4 -> 21.9 us (bench/sweep.py,
        # H100, docs/RESULTS_LOG.md); fp32 keeps the exact functions (its 1e-4 tolerance).
        defaults = dataclasses.asdict(elementwise.EwParams(vec=info.vec16, fast=info.sfu_math))
        return _Target("elementwise", info, defaults, lambda p: elementwise.generate(
            plan, elementwise.EwParams(**p), info.low_precision))
    return _Target("rowwise", info, _default_row(info), lambda p: rowwise.generate(
        plan, rowwise.RowParams(**p), info.low_precision))


def _valid(kind: str, p: dict) -> bool:
    if p.get("vec", 1) & (p.get("vec", 1) - 1):
        return False
    if kind == "rowwise":
        return p["tpr"] <= 1024 and (p["tpr"] > 32 or p["tpr"] * p["rows_per_block"] <= 1024)
    return True


class ExpertProposer:
    """Deterministic, offline proposer (no LLM): see the module docstring."""
    name = "expert"

    def propose(self, request: ProposalRequest) -> Proposal:
        task = request.task
        if task.graph is None:
            return Proposal([], "expert: task has no graph (rebuild it from the task source first)")
        try:
            tgt = _target(task, request.policy)
        except Unsupported as e:
            return Proposal([], f"expert: unsupported graph: {e}")
        except Exception as e:   # NOTE: never raise into the search; an odd graph is just unsupported
            return Proposal([], f"expert: failed to plan {task.name}: {type(e).__name__}: {e}")
        base = dict(tgt.defaults)
        base_tags = tgt.tagger(base) if tgt.tagger else _default_tags(tgt.kind, base, tgt.info)
        parent = request.parent
        if parent is not None and parent.params and set(parent.params) <= set(base):
            base.update(parent.params)
            base_tags = list(dict.fromkeys(parent.tags or base_tags))
        sids = [strategy_id(s) for s in request.strategies]
        settings = self._settings(tgt, base, base_tags, sids, request.direction == "seed" or not sids,
                                  parent is not None)
        out, seen, skipped = [], set(), []
        for params, tags in settings:
            params = tgt.canonical(params)      # two settings of one kernel are one candidate
            key = tuple(sorted(params.items()))
            if key in seen or not _valid(tgt.kind, params):
                continue
            seen.add(key)
            try:
                src = tgt.render(params)
            except Unsupported as e:
                skipped.append(str(e))
                continue
            out.append(Candidate(src, tags, dict(params), "expert"))
            if len(out) >= request.n:
                break
        unknown = [s for s in sids if not moves_for(s, tgt.info)]
        note = f"expert: {tgt.kind} kernel, {len(out)} setting(s)"
        if unknown:
            note += f"; not applicable here: {', '.join(unknown)}"
        if skipped:
            note += f"; skipped: {'; '.join(skipped[:2])}"
        return Proposal(out, note)

    def _settings(self, tgt: _Target, base: dict, base_tags: list[str], sids: list[str],
                  seed: bool, has_parent: bool) -> list[tuple[dict, list[str]]]:
        """Ordered (params, tags): round-robin over the strategies' variants, then all first
        variants combined; for a seed, the defaults first and then every known strategy."""
        info = tgt.info
        if seed and not has_parent:
            sids = sids or _seed_order(tgt.kind)
        per = [(s, moves_for(s, info)) for s in sids]
        per = [(s, v) for s, v in per if v]
        out: list[tuple[dict, list[str]]] = []
        if seed and not has_parent:
            out.append((dict(base), list(base_tags)))
        depth = max((len(v) for _, v in per), default=0)
        for level in range(depth):
            for s, variants in per:
                if level < len(variants):
                    p = _refit(tgt.kind, dict(base, **variants[level]), variants[level], info)
                    out.append((p, _tags(tgt.kind, p, info, base_tags, [s], tgt.tagger)))
        if len(per) > 1:
            p, moved = dict(base), {}
            for _, v in per:
                moved.update(v[0])
            p = _refit(tgt.kind, dict(base, **moved), moved, info)
            out.append((p, _tags(tgt.kind, p, info, base_tags, [s for s, _ in per], tgt.tagger)))
        if tgt.kind in ("gemm", "conv"):   # the library heuristic's next algorithms, same strategy tags
            # (on the last library setting: the algorithm means nothing to our tiled conv kernel)
            lib = [(p, t) for p, t in out if not p.get("tiled")]
            last_p, last_t = lib[-1] if lib else (dict(base, tiled=False) if "tiled" in base else base, None)
            for a in (CONV_ALGOS if tgt.kind == "conv" else GEMM_ALGOS):
                p = dict(last_p, **a)
                out.append((p, last_t or (tgt.tagger(p) if tgt.tagger else list(base_tags))))
        if not seed:
            key = tuple(sorted(base.items()))
            out = [(p, t) for p, t in out if tuple(sorted(p.items())) != key]
        return out


def _long_row_in_registers(info: PlanInfo) -> dict | None:
    """A row of 16K-32K fp32 values held by one 1024-thread block, 32 values a thread, one block per
    SM (occ=1024 caps 64 registers): read from DRAM once where streaming reads it twice (a softmax's
    statistics pass, then its output pass). ptxas fits the 32000-wide log_softmax in 62 registers
    without spills (-Xptxas -v, sm_90a). None for other rows.

        >>> _long_row_in_registers(info_of_log_softmax_32000)
        {'tpr': 1024, 'rows_per_block': 1, 'vec': 4, 'nv': 8, 'online': False, 'welford': False, 'occ': 1024}
    """
    n, vec = info.ncol, 4
    if info.single_pass or info.packs_half or not 16 * 1024 < n <= 32 * 1024 or n % vec:
        return None
    return {"tpr": 1024, "rows_per_block": 1, "vec": vec, "nv": -(-n // (1024 * vec)), "online": False,
            "welford": False, "occ": 1024}


def _refit(kind: str, p: dict, moved: dict, info: PlanInfo) -> dict:
    """A row kernel kept in registers must still hold the whole row after a move changed its
    threads per row or vector width: recompute NV (and narrow VEC) for the new mapping, unless the
    move set NV itself. NOTE: without this, warp_per_row on a 768-column row kept the NV of a
    128-thread row, covered 256 columns and fell back to the streaming path at run time.
    A conv move of cuDNN's knobs (fused, graph, algo, tf32) leaves the tiled kernel for cuDNN's path.
    """
    if kind == "conv" and "tiled" not in moved and conv.CUDNN_KEYS & set(moved):
        return dict(p, tiled=False)     # a move of the cuDNN path takes the cuDNN path
    if kind != "rowwise" or not p.get("nv") or "nv" in moved:
        return p
    n = max(info.ncol, 1)
    per_thread = -(-n // p["tpr"])
    vec = moved.get("vec", info.vec16)      # 16-byte vectors unless the move chose a width
    while vec > 1 and (n % vec or vec > per_thread):
        vec //= 2
    nv = -(-per_thread // vec)
    cap = 16 if p["tpr"] * (p["rows_per_block"] if p["tpr"] <= 32 else 1) > 256 else 32   # values/thread
    if nv * vec > cap:     # too long for this mapping's registers: stream it, one pass where possible
        return dict(p, vec=vec, nv=0, online=info.has_softmax_pair, welford=info.has_welford_pair)
    return dict(p, vec=vec, nv=nv)


def _tags(kind: str, params: dict, info: PlanInfo, base_tags: list[str], applied: list[str],
          tagger=None) -> list[str]:
    tags = list(dict.fromkeys(base_tags + applied))
    if kind == "conv":       # conv tags follow the cuDNN path actually used
        return [t for t in tags if t not in conv.TAG_IDS] + tagger(params)
    if kind == "rowwise":   # mapping tags follow the mapping actually used
        wpr, bpr = "warp_per_row", "block_per_row"
        tags = [t for t in tags if t not in (wpr, bpr)] + [wpr if params["tpr"] <= 32 else bpr]
        if not params["nv"]:
            tags = [t for t in tags if t != "row_in_registers"]
    if kind == "gemm":       # GEMM tags follow the GEMM path actually used
        gemm_ids = ("cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores",
                    "bf16_tensor_cores", "vectorized_16b_access")
        tags = [t for t in tags if t not in gemm_ids] + _gemm_tags(params, info)
    elif params.get("vec", 1) == 1:
        tags = [t for t in tags if t != "vectorized_16b_access"]
    return tags


def _gemm_tags(params: dict, info: PlanInfo) -> list[str]:
    tags = ["cublaslt_epilogue" if params["lt_epilogue"] else "gemm_plus_epilogue_kernel"]
    if params.get("tf32") and info.allow_tf32 and info.fp32:
        tags.append("tf32_tensor_cores")
    if not info.fp32:
        tags.append("bf16_tensor_cores")
    return tags


def _seed_order(kind: str) -> list[str]:
    if kind == "elementwise":
        return ["ilp_unroll", "grid_stride_loop", "read_only_cache_loads", "fast_math_intrinsics"]
    if kind == "rowwise":
        return ["occupancy_tuning", "online_softmax", "welford_statistics", "block_per_row",
                "warp_per_row", "hoist_broadcast_loads", "fp32_math_half_io", "row_in_registers",
                "read_only_cache_loads"]
    if kind == "conv":
        return ["smem_tiling", "coalesced_layout_access", "fold_batchnorm", "fuse_elementwise_chain",
                "tf32_tensor_cores", "bf16_tensor_cores"]
    return ["cublaslt_epilogue", "gemm_plus_epilogue_kernel", "tf32_tensor_cores"]


def tuning_grid(task, policy=None, limit: int = 48) -> list[dict]:
    """Every parameter setting worth timing for a task (the exhaustive autotuning space around the
    defaults, defaults first), for bench/sweep.py and for picking defaults from measurements.

        >>> [p["tpr"] for p in tuning_grid(rmsnorm_task)][:3]
        [256, 32, 32]
    """
    tgt = _target(task, policy)
    base, info, out = dict(tgt.defaults), tgt.info, []

    def add(p: dict) -> None:
        if _valid(tgt.kind, p) and p not in out:
            out.append(p)

    add(base)
    if tgt.kind == "rowwise":
        # one knob at a time from the defaults first (the grid is cut at `limit`)
        for rpg in (2, 4):       # several rows in flight per group (short rows, few registers)
            add(dict(base, rpg=rpg))
        add(dict(base, lazy=False))
        add(dict(base, memo=False))
        add(dict(base, occ=0))
        if info.has_transcendental:
            add(dict(base, fast=True))
        add(dict(base, nv=0, online=info.has_softmax_pair, welford=info.has_welford_pair))
        # (32, 1): a one-warp block per row, the launch shape torch.compile's persistent
        # reductions took for the 768-wide LayerNorm and 512-wide softmax (ncu, H100)
        mappings = [(32, 1), (32, 4), (32, 8), (64, 1), (128, 1), (256, 1), (512, 1), (1024, 1)]
        for tpr, rpb in mappings:
            for packed in ((False, True) if info.low_precision else (False,)):
                p = _refit("rowwise", dict(base, tpr=tpr, rows_per_block=rpb, nv=1, packed=packed),
                           {"tpr": tpr}, info)
                for occ in (1024, 0, 2048):
                    add(dict(p, occ=occ))
        long_row = _long_row_in_registers(info)
        if long_row:
            add(dict(base, **long_row))
    elif tgt.kind == "elementwise":
        for block in (128, 256, 512):
            for unroll in (1, 2, 4):
                for waves in (0, 8):
                    add(dict(base, block=block, unroll=unroll, waves=waves))
        if info.has_transcendental:   # SFU intrinsics (tanh.approx for half outputs) or not
            for unroll in (1, 2):
                add(dict(base, fast=not base["fast"], unroll=unroll))
    else:   # gemm / conv: the library's ranked algorithms, with and without the fused path
        lib = dict(base, tiled=False) if "tiled" in base else base
        for flag in ("fused", "lt_epilogue"):
            if flag in base:
                for v in (base[flag], not base[flag]):
                    for algo in range(8):
                        add(dict(lib, **{flag: v}, algo=algo))
        if "graph" in base:   # conv: the unfused path through cuDNN's graph API, then the legacy one
            for graph in (True, False):
                for algo in range(6):
                    add(dict(lib, fused=False, graph=graph, algo=algo))
            if info.nhwc_conv and not info.tiled_conv:    # on NHWC copies, the epilogue transposing back
                for algo in range(3):
                    add(dict(lib, fused=False, graph=True, nhwc=True, algo=algo))
        if moves_for("smem_tiling", info):   # conv: our tiled 1x1 kernel
            for bm, bn in ((base["bm"], 128), (192 - base["bm"], 128), (64, 256), (64, 64)):
                for pre in (True, False):
                    for stages, ju in ((2, 4), (3, 4), (2, 8)):
                        add(dict(base, tiled=True, bm=bm, bn=bn, stages=stages, ju=ju, pre=pre))
            for minb in (1, 3):
                add(dict(base, tiled=True, minb=minb))
            add(dict(base, tiled=True, persist=False))
            add(dict(base, tiled=True, pre=False, persist=False))
            add(dict(base, tiled=True, bn=256, pre=False, persist=False))
            if info.fp32 and info.allow_tf32:      # plain TF32: a third of 3xTF32's MMAs
                add(dict(base, tiled=True, split=False))
    return out[:limit]
