"""The other two mappings of a row program (rowwise.py), sharing RowGen's passes and folds.

col_kernel: rows whose columns are strided and whose rows are adjacent (sum over dim 1 of
[B, C, HW]): a block is 32 consecutive rows (threadIdx.x % 32) times CK lanes along the row
(threadIdx.x / 32); lane ty walks columns ty, ty + CK, .. and col_reduce (rows.cuh) combines the CK
lanes, so a warp reads 32 adjacent elements per step where the row mapping reads one per row.

split_kernel + split_finish: a one-reduction program with per-row outputs only, for a few very long
rows: blocks of 256 threads reduce chunks of a row (a grid of splits x rows), split_finish combines
each row's partials in order and writes the row's outputs.
"""
from __future__ import annotations

from torch_htam.proposers.expert.cuda import DT
from torch_htam.proposers.expert.ir import stored
from torch_htam.proposers.expert.rowwise_kernel import FOLDS, RowGen, fold_at, fold_decl, fold_results, indent


def col_merges(p):
    """The column mapping folds a Welford / online-softmax pair in one pass (col_onepass): each
    pass is one more read of the block's [32 x ncol] tile."""
    return lambda pair: p.col_onepass


class ColGen:
    """The column mapping's kernel for RowGen g's program and params.

    Bandwidth (NOTE: one 2-4 byte load per lane per step is 64-128 bytes a warp, too few bytes in
    flight to cover DRAM latency): each lane issues col_unroll (U) steps' loads before it folds
    them (in column order, so results do not depend on U). Full-row outputs stored contiguously
    ([rows, ncol], the row mapping's layout, a permuted LayerNorm's) would be written one element
    per row by a warp (a 2-byte store per 768-byte row): they go through a shared [steps * CK
    columns x 32 rows] tile instead (steps: final_steps), written back along the row (the tiled
    transpose), so a block stores steps * CK contiguous values a row."""

    def __init__(self, g: RowGen, final_steps: int):
        self.g, self.U, self.final_steps = g, g.p.col_unroll, final_steps

    def ld(self, i: int, c: str) -> str:
        g = self.g
        return f"ld1<{g.dt(i)}, false>(p{i} + ro[{i}] + {g.coff(i, c)})"

    def step(self, body: str) -> str:
        """body at column c = c0 + u * ck, its inputs read from the u-th loaded values."""
        bind = " ".join(f"float x{i}[1] = {{xu{i}[u]}};" for i in self.g.varying)
        return (f"#pragma unroll\n        for (int u = 0; u < {self.U}; ++u) {{\n"
                f"          const int c = c0 + u * ck; (void)c; const int e = 0; (void)e;\n"
                f"          {bind}\n{body}\n        }}")

    def loop(self, body: str, tail_body: str | None = None, pre: str = "", post: str = "") -> str:
        """body over this lane's columns in increasing order: U loads in flight, then a tail
        (tail_body, default body); pre / post: code around each group of U steps."""
        U, varying = self.U, self.g.varying
        decl = " ".join(f"float xu{i}[{U}];" for i in varying)
        loads = "\n".join(f"#pragma unroll\n        for (int u = 0; u < {U}; ++u) xu{i}[u] = {self.ld(i, 'c0 + u * ck')};"
                          for i in varying)
        tail = "\n".join(f"        x{i}[0] = {self.ld(i, 'c')};" for i in varying)
        return (f"      int c0 = ty;\n"
                f"      for (; c0 + {U - 1} * ck < ncol; c0 += {U} * ck) {{\n        {decl}\n{loads}\n"
                f"{pre}{self.step(body)}\n{post}      }}\n"
                f"      for (int c = c0; c < ncol; c += ck) {{\n"
                f"        {' '.join(f'float x{i}[1];' for i in varying)}\n        const int e = 0; (void)e;\n"
                f"{tail}\n{tail_body or body}\n      }}")

    def reduction_pass(self, k: int) -> tuple[str, int]:
        g = self.g
        f = fold_at(g.prog, k, col_merges(g.p))
        em = g.emitter(False)
        v = em.emit(g.prog.reductions[k].expr)
        lines = indent(em.lines, "          ")
        if f is FOLDS["welford"]:
            return self.welford_pass(k, v, lines), 2
        code = (f"    {fold_decl(f, k)}\n    {{\n      {f.declare('acc')}\n{self.loop(g.fold_body(f, v, lines))}\n"
                f"      acc = col_reduce(acc, {f.op}());\n      {fold_results(f, k)}\n    }}")
        return code, len(f.results)

    def welford_pass(self, k: int, v: str, lines: str) -> str:
        """R{k}, R{k + 1}: the sum and sum of squared deviations of v in one pass.

        NOTE: each group of U values is reduced two-pass (its mean, then its squared deviations)
        and merged into the lane's Welford state (n_, m_, q_; Chan et al.): one division per
        group, where Welford's update divides per value. Summing shifted by the lane's first value
        instead lost digits when that value sat far from the mean: var over dim 1 of [64, 512,
        1024] fp32 missed rtol 1e-4 on 3 of 65536 values (H100, scripts/stress_verify.py
        rw_var_dim1_fp32). (Written out here, not as rows.cuh's WelfordState functions: ptxas
        scheduled those differently.)"""
        U = self.U
        merge = (f"        {{\n          float cs_ = 0.f, cq_ = 0.f;\n#pragma unroll\n"
                 f"          for (int u = 0; u < {U}; ++u) cs_ += cv_[u];\n"
                 f"          const float cm_ = cs_ * (1.f / {U}.f);\n#pragma unroll\n"
                 f"          for (int u = 0; u < {U}; ++u) {{ const float d_ = cv_[u] - cm_; cq_ += d_ * d_; }}\n"
                 f"          const float nn_ = n_ + {U}.f, dm_ = cm_ - m_;\n"
                 f"          m_ += dm_ * ({U}.f / nn_); q_ += cq_ + dm_ * dm_ * (n_ * ({U}.f / nn_)); n_ = nn_;\n"
                 f"        }}\n")
        tail = (f"{lines}\n          n_ += 1.f;\n          const float d_ = {v} - m_;\n"
                f"          m_ += d_ / n_; q_ += d_ * ({v} - m_);")
        loop = self.loop(f"{lines}\n          cv_[u] = {v};", tail, f"        float cv_[{U}];\n", merge)
        return (f"    float R{k}, R{k + 1};\n    {{\n      float n_ = 0.f, m_ = 0.f, q_ = 0.f;\n{loop}\n"
                f"      WelfordState w; w.n = n_; w.mean = m_; w.m2 = q_;\n      w = col_reduce(w, WfOp());\n"
                f"      R{k} = w.mean * w.n; R{k + 1} = w.m2;   // sum and sum of squared deviations\n    }}")

    def kernel(self) -> str:
        g, passes, k = self.g, [], 0
        while k < len(g.prog.reductions):
            code, used = self.reduction_pass(k)
            passes.append(code)
            k += used
        full = [(k, o) for k, o in enumerate(g.prog.outputs) if not o.row and not o.total]
        if full:
            passes.append(self.final(full))
        head = f"""
__global__ void __launch_bounds__(1024) col_kernel(Space<NACC> sp, int64_t rows, {g.ncol_params},
    {g.params()}) {{
  const int lane = threadIdx.x & 31, ty = threadIdx.x >> 5, ck = blockDim.x >> 5;
  extern __shared__ float stg[];    // staged outputs: [steps * ck columns][33] (final_steps)
  (void)stg;
{g.setup()}"""
        return head + f"""
  // NOTE: block-uniform trip count (rows past the end are clamped and store nothing): col_reduce syncs
  for (int64_t rb = (int64_t)blockIdx.x * 32; rb < rows; rb += (int64_t)gridDim.x * 32) {{
    const bool valid = rb + lane < rows;
    const int64_t r = valid ? rb + lane : rows - 1;
    int64_t ro[NACC];
    {{
{g.row_offsets("ro", "r", "      ")}
    }}
{g.fixed_loads("    ")}
{chr(10).join(passes)}
{g.row_outputs("valid && ty == 0")}
  }}
}}
"""

    def final(self, full: list) -> str:
        """The output pass over tiles of W = steps * ck columns (block-uniform trips: the staged
        stores sync). Outputs with their own strides (Output.dims) are stored where they are
        computed; contiguous ones ([rows, ncol]) are staged in stg, then stored along the row:
        thread j of the block writes row j / W, column j % W of the tile."""
        g, U = self.g, self.final_steps
        em = g.emitter(False)
        names = [em.emit(stored(o.expr, o.dtype)) for _, o in full]
        direct, staged = [], []
        for (k, o), n in zip(full, names):
            t = DT[o.dtype][0]
            if k in g.ostride:
                j = g.ostride[k]
                direct.append(f"          if (valid) o{k}[ro[{j}] + {g.coff(j, 'c')}] = {t}::from_f({n});")
            else:
                staged.append((k, t, n))
        decl = " ".join(f"float xu{i}[{U}];" for i in g.varying)
        loads = "\n".join(f"#pragma unroll\n      for (int u = 0; u < {U}; ++u) xu{i}[u] = cb + u * ck + ty < ncol ? "
                          f"{self.ld(i, 'cb + u * ck + ty')} : 0.f;" for i in g.varying)
        ydecl = " ".join(f"float y{k}_[{U}];" for k, _, _ in staged)
        sets = "\n".join(f"          y{k}_[u] = {n};" for k, _, n in staged)
        bind = " ".join(f"float x{i}[1] = {{xu{i}[u]}};" for i in g.varying)
        writes = "".join(self.staged_store(k, t) for k, t, _ in staged)
        return (f"    {{\n      const int W = {U} * ck;          // columns per tile\n"
                f"      for (int cb = 0; cb < ncol; cb += W) {{\n        {decl} {ydecl}\n{loads}\n"
                f"#pragma unroll\n        for (int u = 0; u < {U}; ++u) {{\n"
                f"          const int c = cb + u * ck + ty; const int e = 0; (void)e;\n          {bind}\n"
                f"{indent(em.lines, '          ')}\n{sets}\n"
                f"          if (c < ncol) {{\n{chr(10).join(direct)}\n          }}\n"
                f"        }}{writes}\n      }}\n    }}")

    def staged_store(self, k: int, t: str) -> str:
        return f"""
      __syncthreads();                 // the previous tile's stores have read stg
#pragma unroll
      for (int u = 0; u < {self.final_steps}; ++u) stg[(u * ck + ty) * 33 + lane] = y{k}_[u];
      __syncthreads();
      for (int j = threadIdx.x; j < 32 * W; j += blockDim.x) {{
        const int rr = j / W, cc = j % W;
        if (rb + rr < rows && cb + cc < ncol) o{k}[(rb + rr) * ncol + cb + cc] = {t}::from_f(stg[cc * 33 + rr]);
      }}"""


def split_state(g: RowGen) -> str:
    """C++ type of the split-rows partials (one per row and split in the workspace)."""
    return FOLDS[g.prog.reductions[0].kind].state


def split_kernels(g: RowGen) -> str:
    """split_kernel folds chunk blockIdx.x of row blockIdx.y into ws; split_finish merges a row's
    partials in split order and stores its outputs."""
    f = FOLDS[g.prog.reductions[0].kind]
    decl = " ".join(f"float x{i}[1];" for i in g.varying)
    loads = "\n".join(f"    x{i}[0] = ld1<{g.dt(i)}, false>(p{i} + ro[{i}] + {g.coff(i, 'c')});" for i in g.varying)
    em = g.emitter(False)
    v = em.emit(g.prog.reductions[0].expr)
    add = f.add.format(s="acc", v=v, fast="true" if g.p.fast else "false")
    sig = f"Space<NACC> sp, {g.ncol_params}, int splits"
    ident, idn = f.identity()
    partial = f"""
__global__ void __launch_bounds__(256) split_kernel({sig}, {f.state}* ws,
    {g.params()}) {{
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.y;
{_split_row(g)}"""
    partial += f"""
  const int chunk = (ncol + splits - 1) / splits, c_lo = (int)blockIdx.x * chunk;
  const int c_hi = min(ncol, c_lo + chunk);
  {f.declare("acc")}
  for (int c = c_lo + lane; c < c_hi; c += 256) {{
    {decl}
    const int e = 0; (void)e;
{loads}
{indent(em.lines, "    ")}
    {add}
  }}"""
    partial += f"""
  {ident}
  acc = group_reduce<256>(acc, {f.op}(), {idn});
  if (lane == 0) ws[r * splits + blockIdx.x] = acc;
}}"""
    return partial + f"""
__global__ void __launch_bounds__(256) split_finish({sig}, const {f.state}* ws,
    {g.params()}) {{
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
{_split_row(g)}
  {ident}
  {f.state} acc = {idn};
  for (int j = lane; j < splits; j += 256) acc = {f.op}()(acc, ws[r * splits + j]);   // fixed order
  acc = group_reduce<256>(acc, {f.op}(), {idn});
  {fold_decl(f, 0)} {fold_results(f, 0)}
{g.row_outputs("lane == 0")}
}}
"""


def _split_row(g: RowGen) -> str:
    """Row r's column strides, offsets and per-row values."""
    return (f"{g.setup()}\n  int64_t ro[NACC];\n{g.row_offsets('ro', 'r', '  ')}\n"
            f"{g.fixed_loads('  ')}")
