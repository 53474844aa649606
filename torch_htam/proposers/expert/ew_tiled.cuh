// ---- elementwise: the transposing (tiled) kernel (elementwise.py, EwParams.tile) ----
// A block of TILE * ROWS threads takes a [TILE x TILE] patch of (r, w), two iteration dims, at one
// index of the others (block index: the w tile fastest, then the r tile, then the other dims). The
// accesses in `staged` step by one along r: the block reads their patch with lanes walking r
// (coalesced) into shared memory; then lanes walk w, along which output 0 steps by one, reading
// the staged values transposed from shared memory and the rest from global memory. Space entries:
// accesses, coordinates, then every output.

// A kernel's pointer parameter of type P, __restrict__ when RESTRICT (an in-place epilogue reads
// and writes one tensor: no __restrict__); on the kernel's own parameters, where the read-only
// path and alias analysis see it.
template <class P, bool RESTRICT> struct EwPtr { typedef P type; };
template <class P> struct EwPtr<P, true> { typedef P __restrict__ type; };

// The kernel: R<TILE, ROWS, IDX>, emitted per region, is built from the pointers ptrs (p<i> per
// access, then o<k> per output; EwPtr: __restrict__ when RESTRICT) and has
//   element(tile, staged, off, tx, j)    one output element: staged reads from the patches
//                            (ew_staged: w = w0 + tx, r = r0 + j), the rest at off[a]; the
//                            program; the stores at off[outputs' entries]
// EW_TILED_STAGE, emitted per region before this file: per stageable access a, when staged, the
// loop that reads its patch (tl[j][tx] = access a at r = rr, w = w0 + j, j = ty + q * ROWS).
// NOTE: a macro expanded in the kernel, not a member function: a callee's loops are optimized
// before it is inlined, which moves hoisting and scheduling (other SASS).
// Patches: one [TILE][TILE + 1] float patch per staged access, in the order of the staged bits,
// indexed [w][r]: the +1 keeps the transposed reads (lanes stepping w) on 32 distinct banks.
template <int TILE, int ROWS, int N, class IDX, template <int, int, class> class R, bool RESTRICT, class... P>
__global__ void __launch_bounds__(TILE * ROWS) ew_tiled(Space<N> sp, int r_dim, int w_dim, unsigned staged,
                                                        IDX n_wt, IDX n_rt, typename EwPtr<P, RESTRICT>::type... ptrs) {
  typedef R<TILE, ROWS, IDX> Region;
  const Region reg{ptrs...};
  IDX base[N], stR[N], stW[N];
  extern __shared__ float tile[];
  IDX b = (IDX)blockIdx.x;
  const IDX w0 = (b % n_wt) * TILE; b /= n_wt;
  const IDX r0 = (b % n_rt) * TILE; b /= n_rt;
  const IDX nR = (IDX)sp.size[r_dim], nW = (IDX)sp.size[w_dim];
#pragma unroll
  for (int a = 0; a < N; ++a) { base[a] = 0; stR[a] = (IDX)sp.st[a][r_dim]; stW[a] = (IDX)sp.st[a][w_dim]; }
  for (int d = sp.ndim - 1; d >= 0; --d) {     // b: the index over the other dims
    if (d == r_dim || d == w_dim) continue;
    const IDX sz = (IDX)sp.size[d], i = b % sz;
    b /= sz;
#pragma unroll
    for (int a = 0; a < N; ++a) base[a] += i * (IDX)sp.st[a][d];
  }
  const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
  {   // the staged patches, lanes tx walking r (coalesced along the accesses' contiguous dim)
    const IDX rr = r0 + tx;
    EW_TILED_STAGE
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < TILE / ROWS; ++q) {   // lanes tx walking w, along which output 0 steps by one
    const int j = ty + q * ROWS;
    const IDX r = r0 + j, w = w0 + tx;
    if (r < nR && w < nW) {
      IDX off[N];
#pragma unroll
      for (int a = 0; a < N; ++a) off[a] = base[a] + r * stR[a] + w * stW[a];
      reg.element(tile, staged, off, tx, j);
    }
  }
}

// Access I's staged value at (w0 + tx, r0 + j) (element).
template <int TILE, int I>
__device__ __forceinline__ float ew_staged(const float* tile, unsigned staged, int tx, int j) {
  return tile[__popc(staged & ((1u << I) - 1u)) * (TILE * (TILE + 1)) + tx * (TILE + 1) + j];
}

// Host: ts takes sp's sizes and the strides of its first `entries` entries (the accesses and the
// coordinates; the caller sets the outputs' after them).
template <int NT, int N>
static inline void ew_tile_space(const Space<N>& sp, int entries, Space<NT>& ts) {
  ts.ndim = sp.ndim;
  for (int d = 0; d < sp.ndim; ++d) ts.size[d] = sp.size[d];
  for (int a = 0; a < entries; ++a)
    for (int d = 0; d < sp.ndim; ++d) ts.st[a][d] = sp.st[a][d];
}

// Host: the tiled launch for a Space ts already filled (entries as the kernel's) and collapsed,
// or false where the run-time layouts do not call for it: no (r, w) pair (htam_tile_dims), a dim
// shorter than 16 (most lanes of a tile idle), the staged patches over 48 KB of shared memory.
struct EwTilePlan {
  int r_dim, w_dim;
  unsigned staged;
  int64_t n_wt, n_rt, blocks;
  size_t smem;
  bool idx32;                   // every offset and the element count below 2^30
};
template <int TILE, int N>
static inline bool ew_tile_plan(const Space<N>& ts, int64_t n, unsigned stageable, int nacc, int out0,
                                EwTilePlan* pl) {
  if (!htam_tile_dims<N>(ts, out0, stageable, nacc, &pl->r_dim, &pl->w_dim, &pl->staged)) return false;
  pl->n_wt = (ts.size[pl->w_dim] + TILE - 1) / TILE;
  pl->n_rt = (ts.size[pl->r_dim] + TILE - 1) / TILE;
  pl->blocks = pl->n_wt * pl->n_rt * (n / (ts.size[pl->w_dim] * ts.size[pl->r_dim]));
  pl->smem = (size_t)__builtin_popcount(pl->staged) * TILE * (TILE + 1) * sizeof(float);
  if (!(pl->blocks < ((int64_t)1 << 31) && pl->smem <= 48 * 1024 && ts.size[pl->r_dim] >= 16 &&
        ts.size[pl->w_dim] >= 16))
    return false;
  pl->idx32 = n < ((int64_t)1 << 30) && htam_max_off<N>(ts, N) < ((int64_t)1 << 30);
  return true;
}
// Host: ew_tiled as planned, pointers as typed (const for the inputs).
template <int TILE, int ROWS, class IDX, template <int, int, class> class R, bool RESTRICT, int N, class... P>
static inline void ew_tiled_launch(const EwTilePlan& pl, cudaStream_t stream, const Space<N>& ts, P... ptrs) {
  ew_tiled<TILE, ROWS, N, IDX, R, RESTRICT, P...><<<(unsigned)pl.blocks, TILE * ROWS, pl.smem, stream>>>(
      ts, pl.r_dim, pl.w_dim, pl.staged, (IDX)pl.n_wt, (IDX)pl.n_rt, ptrs...);
}
// ---- end elementwise tiled ----
