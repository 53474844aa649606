"""Fused row kernel: reductions over the last dim with their elementwise prologue/epilogue.

A group of TPR threads owns one row (TPR <= 32: a warp or sub-warp per row, several rows per block;
TPR >= 64: the block is the row). Each reduction of the program is one pass over the row; the row's
inputs are either kept in registers (loaded once, NV chunks of VEC per thread) or re-read per pass
(streaming, for rows longer than the register capacity; L1/L2 serve the re-reads). Online softmax
and Welford merge a pair of passes into one. The host picks register vs streaming and vector vs
scalar at run time from the real row length and alignment, so every instantiation is always valid.

Rows are any set of reduced dims (ir.py orders the iteration space kept dims first, reduced dims
last, with run-time strides), so the same program meets rows that are contiguous (this mapping),
rows whose columns are strided but whose rows are adjacent (mean over dim 1 of [B, C, HW], a
layer_norm of a transposed view: the column mapping, col_kernel, 32 rows a block), and a few very
long rows (a full reduction: split_kernel + split_finish, partials combined in order, no atomics).
The host picks among those the source carries from the real sizes and strides.

Per-row outputs may read the row at one more column, an int64 index per row (nll_loss's target:
("gather", src, index), read once by the row's lane 0), and sums over rows of per-row values (a
loss's mean over tokens: ExprProgram.outer) end the program: each thread group adds its rows in
order, writes its partial to the split-rows workspace, and outer_finish (one block) adds the
partials in a fixed order and stores the program's single values (Output.total).

Register budget (what decides bandwidth here): an SM has 64K registers, so 2048 resident threads
get 32 each. A row held as fp32 costs one register per value; `packed` keeps 2-byte inputs as raw
bits (two values per register, converted at use) and `lazy` loads inputs that no reduction reads
(a norm's weight and bias) in the final pass instead of holding them across the reductions. Both
free registers for more resident threads, hence more bytes in flight per SM; neither wins on every
row (bench/sweep.py), so the search tries both ways.

    >>> src = generate(prog, RowParams(tpr=32, rows_per_block=4, vec=4, nv=8))
    >>> m = TARGET.match(task.graph, policy); src = TARGET.render(m, TARGET.defaults(m))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch_htam.proposers.expert import host
from torch_htam.proposers.expert.cuda import DT, PRELUDE, cuh
from torch_htam.proposers.expert.ir import ExprProgram, Unsupported, lower, walk
from torch_htam.proposers.expert.rowwise_col import ColGen, split_kernels, split_state
from torch_htam.proposers.expert.rowwise_kernel import RowGen, memo_values  # noqa: F401 (rowwise.memo_values)
from torch_htam.proposers.expert.strategies import TaskFacts
from torch_htam.proposers.expert.target import (
    ProgramMatch, Target, access_tags, drop_scalar_tag, pow2_vec, program_facts,
)

ROWS_CUH = cuh("rows.cuh")
ROWS_HOST_CUH = cuh("rows_host.cuh")


@dataclass(frozen=True)
class RowParams:
    tpr: int = 32              # threads per row (power of two, <= 1024)
    rows_per_block: int = 4    # rows per block when tpr <= 32
    vec: int = 4               # elements per vector access along the row
    nv: int = 4                # register chunks per thread (row in registers up to tpr*vec*nv); 0 = stream
    online: bool = False       # online softmax: max and sum in one pass
    welford: bool = False      # Welford mean/var: one pass instead of two
    nc: bool = False           # read-only cache loads
    fast: bool = False         # SFU intrinsics
    waves: int = 0             # 0: one row group per row; k: grid capped at k blocks per SM
    lazy: bool = True          # inputs only the final pass reads are loaded there, not held in registers
    packed: bool = False       # register-held 2-byte inputs stay raw bf16/fp16 bits until used
    rpg: int = 1               # rows per thread group in flight: their loads all issue before any
                               # row is reduced (latency hiding for short rows)
    occ: int = 0               # resident threads per SM to ask of the compiler (__launch_bounds__
                               # min blocks = occ / block; 0: let it choose). 2048 caps 32 registers.
    memo: bool = True          # keep a transcendental value a later pass reads again (softmax's
                               # exp(x - max)) in registers instead of computing it twice
    su: int = 1                # streaming: chunks of VEC a thread loads together before it reduces
                               # them (loads in flight per thread on the streaming path)
    col_unroll: int = 4        # column mapping: steps along the row whose loads a lane issues
                               # together (bytes in flight), and the staged output tile's width / CK
    col_onepass: bool = True   # column mapping: Welford / online-softmax pairs in one pass (one
                               # read of the row instead of two)

    @property
    def block(self) -> int:
        return self.tpr * self.rows_per_block if self.tpr <= 32 else self.tpr


def _main_access(prog: ExprProgram) -> int:
    """The access the mapping is chosen for: the largest input a reduction reads along the row
    (the data, not a broadcast scale), the lowest such access on ties."""
    reduced = sorted({x[1] for r in prog.reductions for x in walk(r.expr) if x[0] == "in"
                      and prog.accesses[x[1]].column_varying(prog.ndim, prog.nred)})
    if not reduced:
        return 0
    return max(reduced, key=lambda a: (math.prod(prog.inputs[prog.accesses[a].input][0]), -a))


def has_column_mapping(prog: ExprProgram) -> bool:
    """The program may meet rows whose columns are strided (reduced over a middle dim, or read
    through a permute): its source carries the column mapping too, chosen at run time."""
    if not prog.accesses or prog.outer:    # (sums over rows: the row mapping only, any strides)
        return False
    a = prog.accesses[_main_access(prog)]
    return a.mode == "dims" and a.dims != tuple(range(prog.ndim))


def _col_final_unroll(prog: ExprProgram, unroll: int) -> int:
    """Steps per tile of the column mapping's output pass: at most 8 values in flight per lane over
    all the row's inputs (a power of two, at most col_unroll). That pass re-reads the block's
    [32 x ncol] tile, which the statistics pass just brought into L1, so it needs few loads in
    flight; registers decide its occupancy. NOTE: ptxas -v (sm_90a), permuted bf16 LayerNorm (x,
    weight, bias): 8 steps 62 registers (2 blocks of 512 per SM: 375 blocks in 1.4 waves), 4
    steps 44, 2 steps 34 (3 blocks per SM: one wave)."""
    varying = sum(a.column_varying(prog.ndim, prog.nred) for a in prog.accesses)
    u = 1
    while u * 2 <= min(unroll, 8 // max(varying, 1)):
        u *= 2
    return u


def _col_staged(prog: ExprProgram) -> bool:
    """The column mapping stages full-row outputs stored contiguously ([rows, ncol]) in shared memory."""
    return any(not o.row and not o.total and k not in prog.strided_outputs for k, o in enumerate(prog.outputs))


def has_split_rows(prog: ExprProgram) -> bool:
    """A full reduction (or a few long rows) of one reduction with per-row outputs only: its source
    carries the split-rows path too, chosen at run time when rows are too few to fill the GPU."""
    kept = math.prod(prog.shape[:prog.ndim - prog.nred])
    return (len(prog.reductions) == 1 and all(o.row for o in prog.outputs) and kept < 32
            and bool(prog.accesses) and not prog.outer)


def _host(g: RowGen) -> str:
    """htam_run: checks and binds the program's tensors, then launches the mapping the real sizes
    and strides call for (column mapping, split rows, else the row mapping)."""
    prog = g.prog
    args = ", ".join([host.access_ptr(prog, i) for i in range(len(prog.accesses))]
                     + _outs(prog) + ["ows"] * bool(prog.outer))
    ncol = "(int)ncol, inner" if prog.nred > 1 else "(int)ncol"
    binds = "\n" + host.bind_outputs(prog) if prog.strided_outputs else ""
    head = f"""
HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {{
{host.prologue(prog)}
{_host_sizes(prog)}
  Space<NACC> sp;
{host.bind_accesses(prog)}{binds}
  (void)max_off;
{_out_checks(prog)}
  if (rows == 0) return {"HTAM_ERR_SHAPE" if prog.outer else "HTAM_OK"};
{_host_collapse(prog)}"""
    mappings = _split_launch(g, ncol, args) * has_split_rows(prog) + _col_launch(g, ncol, args)
    return head + mappings + _row_launch(g, ncol, args) + "\n  return HTAM_OK;\n}\n"


def _outs(prog: ExprProgram) -> list[str]:
    return [f"({DT[o.dtype][0]}::raw*)out[{k}].data" for k, o in enumerate(prog.outputs)]


def _out_checks(prog: ExprProgram) -> str:
    """Sizes of the outputs: one value (totals), one a row, or the iteration's (contiguous unless
    stored through their own strides)."""
    return "\n".join(
        f"  if (htam_numel(&out[{k}]) != 1) return HTAM_ERR_SHAPE;" if o.total else
        ("" if o.broadcast else f"  if (htam_numel(&out[{k}]) != n) return HTAM_ERR_SHAPE;") if o.dims is not None else
        f"  if (!htam_contiguous(out[{k}]) || htam_numel(&out[{k}]) != {'rows' if o.row else 'n'}) return HTAM_ERR_SHAPE;"
        for k, o in enumerate(prog.outputs))


def _host_sizes(prog: ExprProgram) -> str:
    """ncol (one-dim rows) or rowlen (the product of the row's dims), and rows."""
    D, nr = prog.ndim, prog.nred
    if nr == 1:
        return (f"  const int64_t ncol = it[{D - 1}];\n"
                f"  if (ncol <= 0 || ncol > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;\n"
                f"  const int64_t rows = n / ncol;")
    return (f"  int64_t rowlen = 1;\n  for (int d = {D - nr}; d < {D}; ++d) rowlen *= it[d];\n"
            f"  if (rowlen <= 0 || rowlen > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;\n"
            f"  const int64_t rows = n / rowlen;")


def _host_collapse(prog: ExprProgram) -> str:
    """Merges sp's dims; a row of several dims must merge into one or two (row_nd)."""
    nacc = len(prog.accesses) + len(prog.strided_outputs)
    if prog.nred == 1:
        return f"  htam_collapse<NACC>(sp, {nacc}, true);"
    # NOTE: a row that stays two dims after merging (a GroupNorm's channels x pixels, its weight
    # stepping per channel) is walked as one: `inner` is its last dim's size
    return (f"  const int row_nd = htam_collapse<NACC>(sp, {nacc}, true, {prog.nred});\n"
            f"  if (row_nd > 2) return HTAM_ERR_SHAPE;\n"
            f"  const int inner = row_nd == 2 ? (int)sp.size[sp.ndim - 1] : 0;\n"
            f"  const int64_t ncol = row_nd == 2 ? sp.size[sp.ndim - 2] * sp.size[sp.ndim - 1] : sp.size[sp.ndim - 1];")


def _col_launch(g: RowGen, ncol: str, args: str) -> str:
    """Strided columns, adjacent rows (the main input steps along the row by more than one
    element, by one between rows): the column mapping."""
    prog = g.prog
    if not has_column_mapping(prog):
        return ""
    staged = "true" if _col_staged(prog) else "false"
    return f"""
  if (htam_col_strided(sp, {_main_access(prog)}, {"row_nd, inner" if prog.nred > 1 else "1, 0"})) {{
    const HtamColLaunch cl = htam_col_launch(rows, ncol, {staged}, {_col_final_unroll(prog, g.p.col_unroll)});
    col_kernel<<<cl.blocks, cl.threads, cl.smem, stream>>>(sp, rows, {ncol}, {args});
    HTAM_CHECK_LAUNCH();
    return HTAM_OK;
  }}"""


def _split_launch(g: RowGen, ncol: str, args: str) -> str:
    """A few long rows: each split over many blocks, the partials combined in order."""
    state = split_state(g)
    return f"""
  {{
    const int splits = htam_split_count(rows, ncol, sizeof({state}));
    void* ws = splits >= 2 ? htam_split_ws(stream) : nullptr;
    if (ws != nullptr) {{
      split_kernel<<<dim3(splits, (unsigned)rows), 256, 0, stream>>>(sp, {ncol}, splits, ({state}*)ws, {args});
      HTAM_CHECK_LAUNCH();
      split_finish<<<(unsigned)rows, 256, 0, stream>>>(sp, {ncol}, splits, ({state}*)ws, {args});
      HTAM_CHECK_LAUNCH();
      return HTAM_OK;
    }}
  }}"""


def _row_launch(g: RowGen, ncol: str, args: str) -> str:
    """The row mapping: register-held while the row fits NV chunks a thread (rows_host.cuh)."""
    prog, p = g.prog, g.p
    launch = (f"  row_launch<{p.vec}, {max(p.nv, 1)}, {max(p.nv * p.vec, 1)}>(regs, vec_ok, blocks, stream, "
              f"sp, rows, {ncol}, {args});\n  HTAM_CHECK_LAUNCH();")
    return (f"\n  const int V = {p.vec};\n  bool vec_ok = V > 1 && ncol % V == 0;\n"
            f"{host.vector_checks(prog, 'V', full_outputs_only=True)}\n"
            f"  int64_t blocks = htam_row_blocks(rows, BLOCK / TPR * RPG, {p.waves});{_outer_setup(prog)}\n"
            f"  const bool regs = {p.nv} > 0 && ncol <= {p.tpr * p.vec * p.nv};\n{launch}{_outer_launch(prog)}")


def _outer_setup(prog: ExprProgram) -> str:
    # NOTE: every thread group's partial sums take one 8-byte slot per sum in the split-rows
    # workspace: the grid is capped to fit it (the row loop is grid-stride, so every row is still
    # visited)
    if not prog.outer:
        return ""
    return (f"\n  void* ows = htam_split_ws(stream);\n  if (ows == nullptr) return HTAM_ERR_SHAPE;\n"
            f"  blocks = std::min<int64_t>(blocks, (int64_t)(kSplitWs / (8 * {len(prog.outer)} * (BLOCK / TPR))));")


def _outer_launch(prog: ExprProgram) -> str:
    if not prog.outer:
        return ""
    return (f"\n  outer_finish<<<1, 1024, 0, stream>>>(blocks * (BLOCK / TPR), rows, ows, {', '.join(_outs(prog))});\n"
            f"  HTAM_CHECK_LAUNCH();")


def generate(prog: ExprProgram, p: RowParams, low_precision: bool = False) -> str:
    """CUDA source (kernel ABI) for a row prog."""
    assert prog.kind == "rowwise", prog.kind
    g = RowGen(prog, p, low_precision)
    parts = [f"// torch_htam expert: rowwise {p}", PRELUDE, "#include <algorithm>", ROWS_CUH, g.kernel()]
    if has_column_mapping(prog):
        parts.append(ColGen(g, _col_final_unroll(prog, p.col_unroll)).kernel())
    if has_split_rows(prog):
        parts.append(split_kernels(g))
    if prog.outer:
        parts.append(g.outer_finish())
    return "\n".join(parts + [ROWS_HOST_CUH, _host(g)])


# ---- the rowwise target (target.Target) ------------------------------------------------------------

def match(gm, policy) -> ProgramMatch:
    """A region of row reductions with their elementwise prologue/epilogue; raises Unsupported."""
    prog = lower(gm)
    if prog.kind != "rowwise":
        raise Unsupported("no row reduction (the elementwise target's)")
    if not prog.accesses:
        raise Unsupported("the region reads no input")
    return ProgramMatch(prog, program_facts(prog, policy))


def defaults(m: ProgramMatch) -> dict:
    return _default_row(m.facts)


def _default_row(facts: TaskFacts) -> dict:
    """Warp per row while the row fits 32 threads' registers, else a block per row; streamed
    (online/Welford, one pass) beyond 16 values per thread of 1024 threads, except 16K-32K-wide
    fp32 rows, held 32 values a thread by one 1024-thread block per SM (_long_row_in_registers).

    Half-precision rows are held packed (two values per register), so a thread holds 32 of them
    where it holds 16 fp32 values. Measured (bench/sweep.py, H100, docs/RESULTS_LOG.md): packed
    took bf16 softmax from 52.6 to 31.1 us, RMSNorm [4096, 4096] from 36.7 to 31.2 us, and a
    768-wide LayerNorm was fastest warp-per-row with 32 values per thread (18.6 us vs 25.1 us).
    """
    n = max(facts.ncol, 1)
    vec = facts.vec16
    while vec > 1 and n % vec:
        vec //= 2
    packed, cap = facts.packs_half, facts.row_cap
    tpr = 32 if n <= 32 * cap else 128 if n <= 128 * 16 else 256 if n <= 256 * 16 else 1024
    mid = _mid_row_threads(facts)
    tpr = mid or tpr
    if facts.single_pass and tpr > 256:     # see _stream_chunks
        tpr = 256
    per_thread = -(-n // tpr)
    while vec > per_thread:           # stays a power of two (vector loads are 2/4/8/16 bytes)
        vec //= 2
    nv = -(-per_thread // vec)     # exact (768 = 32 x 8 x 3): a padded 4th chunk costs registers
    # NOTE: a row read once (mean(silu(x) * s)) gains nothing from registers: streaming it took
    # 12.7 us against 14.3 us held ([4096, 768] fp32, bench/sweep.py, H100, docs/RESULTS_LOG.md).
    stream = facts.single_pass or (nv * vec > 16 and not (packed and (tpr == 32 or mid) and nv * vec <= cap))
    # NOTE: a register-held row asks for 1024 resident threads (at most 64 registers): left alone,
    # ptxas unrolled the 768-wide bf16 LayerNorm into 254 registers with spills (21.2 us), capped it
    # took 14.1 us; bf16 softmax 25.3 -> 23.7 us, fp32 softmax 38.5 -> 38.8 us (bench/sweep.py, H100).
    p = {"tpr": tpr, "rows_per_block": 4, "vec": vec, "nv": 0 if stream else nv,
         "online": stream, "welford": stream, "nc": False, "waves": 0, "fast": facts.sfu_math,
         "lazy": True, "packed": packed, "occ": 0 if stream else 1024, "rpg": 1, "memo": True,
         "col_unroll": _col_unroll(facts), "col_onepass": True}
    su = _stream_chunks(facts, tpr, vec)
    if su > 1:
        p.update(su=su, occ=1024)
    # NOTE: a 32000-wide fp32 log_softmax held this way took 54.2 us against 69.1 streamed
    # (bench/sweep.py, H100, docs/RESULTS_LOG.md): one DRAM read of the row instead of two
    return dict(p, **(_long_row_in_registers(facts) or {}))


def _stream_chunks(facts: TaskFacts, tpr: int, vec: int) -> int:
    """Chunks a thread loads together on a row read once (su): 16 values (64 bytes fp32, 32 bytes
    bf16) where every thread of the row has that many full chunks, else 1. Such rows (argmax over
    a 32000-wide vocabulary, max over 1024 columns) also take blocks of at most 256 threads and
    ask for 1024 resident threads (64 registers).

    NOTE: ptxas -v (sm_90a): the 32000-wide bf16 argmax streamed by 1024 threads used 48
    registers, one resident block per SM: 16 KB in flight, and the SM idles while the block
    reduces its row. 256 threads x 2 chunks (54 registers, no spills) are 4 blocks and 32 KB in
    flight; fp32 256 x 4 chunks, 56 registers. Left to itself (occ=0) ptxas took 95-128 registers
    for 4 chunks; at 32 (occ=2048) it spilled. A row too short for every thread to have su full
    chunks keeps one (the 768-wide mean of silu(x) * s, where loading both of a thread's chunks
    first, held, measured 14.3 us against 12.7 us streamed)."""
    if not facts.single_pass:
        return 1
    return max(1, min(16 // vec, facts.ncol // (tpr * vec)))


def _mid_row_threads(facts: TaskFacts) -> int | None:
    """Threads per row for a register-held row of 4K-8K values that more than one pass reads (a
    GroupNorm's group of channels x pixels): the fewest that hold it, 32 packed 2-byte values or 16
    fp32 values a thread (256 or 512), None elsewhere (1024 then).

    NOTE: at 1024 threads and 64 registers a block per row is one resident block per SM, each
    with one row's 16-32 KB in flight, then two block-wide reductions before its stores; the
    512 rows of GroupNorm(32) on [16, 256, 32, 32] were ~4 such waves. 256-thread blocks (bf16) are
    4 resident per SM: all 512 rows in one wave; 512-thread blocks (fp32) 2 per SM, two waves."""
    n, cap = facts.ncol, facts.row_cap
    if facts.single_pass or not 256 * 16 < n or n % facts.vec16:
        return None
    if facts.packs_half and n <= 256 * cap:
        return 256
    if n <= 512 * 16:
        return 512
    return None


def _col_unroll(facts: TaskFacts) -> int:
    """Column mapping: 16 bytes of the narrowest input in flight per lane (4 fp32 steps, 8 bf16),
    so that 2048 resident lanes keep 32 KB per SM in flight (H100: ~3 TB/s x ~1 us over 132 SMs
    is ~23 KB), where one step's load (64-128 bytes a warp) keeps a quarter to half of that."""
    return max(4, min(8, facts.vec16))


def _long_row_in_registers(facts: TaskFacts) -> dict | None:
    """A row of 16K-32K fp32 values held by one 1024-thread block, 32 values a thread, one block per
    SM (occ=1024 caps 64 registers): read from DRAM once where streaming reads it twice (a softmax's
    statistics pass, then its output pass). ptxas fits the 32000-wide log_softmax in 62 registers
    without spills (-Xptxas -v, sm_90a). None for other rows.

        >>> _long_row_in_registers(facts_of_log_softmax_32000)
        {'tpr': 1024, 'rows_per_block': 1, 'vec': 4, 'nv': 8, 'online': False, 'welford': False, 'occ': 1024}
    """
    n, vec = facts.ncol, 4
    if facts.single_pass or facts.packs_half or not 16 * 1024 < n <= 32 * 1024 or n % vec:
        return None
    return {"tpr": 1024, "rows_per_block": 1, "vec": vec, "nv": -(-n // (1024 * vec)), "online": False,
            "welford": False, "occ": 1024}



def tags(m: ProgramMatch, params: dict) -> list[str]:
    facts = m.facts
    out = ["single_kernel_launch", "fuse_row_prologue_epilogue", "warp_shuffle_reduction",
           "warp_per_row" if params["tpr"] <= 32 else "block_per_row"]
    if params["nv"]:
        out.append("row_in_registers")
    if params["online"] and facts.has_softmax_pair:
        out.append("online_softmax")
    if params["welford"] and facts.has_welford_pair:
        out.append("welford_statistics")
    return out + access_tags(params, facts)


def retag(m: ProgramMatch, params: dict, tags: list[str]) -> list[str]:
    """Mapping tags follow the mapping actually used."""
    wpr, bpr = "warp_per_row", "block_per_row"
    tags = [t for t in tags if t not in (wpr, bpr)] + [wpr if params["tpr"] <= 32 else bpr]
    if not params["nv"]:
        tags = [t for t in tags if t != "row_in_registers"]
    return drop_scalar_tag(params, tags)


def refit(m: ProgramMatch, p: dict, moved: dict) -> dict:
    """A row kernel kept in registers must still hold the whole row after a move changed its
    threads per row or vector width: recompute NV (and narrow VEC) for the new mapping, unless the
    move set NV itself. NOTE: without this, warp_per_row on a 768-column row kept the NV of a
    128-thread row, covered 256 columns and fell back to the streaming path at run time.
    """
    facts = m.facts
    if not p.get("nv") or "nv" in moved:
        return p
    n = max(facts.ncol, 1)
    per_thread = -(-n // p["tpr"])
    vec = moved.get("vec", facts.vec16)      # 16-byte vectors unless the move chose a width
    while vec > 1 and (n % vec or vec > per_thread):
        vec //= 2
    nv = -(-per_thread // vec)
    cap = 16 if p["tpr"] * (p["rows_per_block"] if p["tpr"] <= 32 else 1) > 256 else 32   # values/thread
    if nv * vec > cap:     # too long for this mapping's registers: stream it, one pass where possible
        return dict(p, vec=vec, nv=0, online=facts.has_softmax_pair, welford=facts.has_welford_pair)
    return dict(p, vec=vec, nv=nv)


def valid(p: dict) -> bool:
    return (pow2_vec(p) and p["tpr"] <= 1024 and (p["tpr"] > 32 or p["tpr"] * p["rows_per_block"] <= 1024)
            and p.get("su", 1) >= 1 and p.get("col_unroll", 1) >= 1)


def grid(m: ProgramMatch, base: dict) -> list[dict]:
    """One knob at a time from the defaults first (the grid is cut at its limit), then mappings."""
    facts, out = m.facts, []
    for rpg in (2, 4):       # several rows in flight per group (short rows, few registers)
        out.append(dict(base, rpg=rpg))
    out += [dict(base, lazy=False), dict(base, memo=False), dict(base, occ=0)]
    if facts.has_transcendental:
        out.append(dict(base, fast=True))
    out.append(dict(base, nv=0, online=facts.has_softmax_pair, welford=facts.has_welford_pair))
    if not base["nv"]:       # streamed: chunks in flight per thread
        out += [dict(base, su=su) for su in (1, 2, 4) if su != base.get("su", 1)]
    # (32, 1): a one-warp block per row, the launch shape torch.compile's persistent
    # reductions took for the 768-wide LayerNorm and 512-wide softmax (ncu, H100)
    mappings = [(32, 1), (32, 4), (32, 8), (64, 1), (128, 1), (256, 1), (512, 1), (1024, 1)]
    for tpr, rpb in mappings:
        for packed in ((False, True) if facts.low_precision else (False,)):
            p = refit(m, dict(base, tpr=tpr, rows_per_block=rpb, nv=1, packed=packed), {"tpr": tpr})
            out += [dict(p, occ=occ) for occ in (1024, 0, 2048)]
    if has_column_mapping(m.program):    # (other sources do not read the column mapping's knobs)
        out += [dict(base, col_unroll=u) for u in (1, 2, 8 if base["col_unroll"] != 8 else 4)]
        if facts.has_welford_pair or facts.has_softmax_pair:
            out.append(dict(base, col_onepass=False))
    long_row = _long_row_in_registers(facts)
    if long_row:
        out.append(dict(base, **long_row))
    return out


TARGET = Target(
    kind="rowwise", match=match, defaults=defaults, tags=tags, retag=retag,
    start_order=("occupancy_tuning", "online_softmax", "welford_statistics", "block_per_row", "warp_per_row",
                 "hoist_broadcast_loads", "fp32_math_half_io", "row_in_registers", "read_only_cache_loads"),
    grid=grid, render=lambda m, params: generate(m.program, RowParams(**params), m.facts.low_precision),
    valid=valid, refit=refit)
