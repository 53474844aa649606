// ---- torch_htam expert: the tiled pointwise-conv kernel with its epilogue fused (after pwconv.cuh) ----
// One block (pw::THREADS threads) computes BM x BN tiles (output channels x pixels of the flattened
// batch) with pw::main_loop, or in NHWC mode loads them from a conv result cuDNN wrote NHWC, and
// applies the region's epilogue to the tile in shared memory before the one store to Y (NCHW).
//
// R, the region (pwconv.py emits it per task):
//   DT, OT, STG       the conv's dtype, the output's, and the result tile's storage type (DT for
//                     half types: torch rounds the conv result to it; F32 for fp32)
//   Args              the epilogue's global inputs (pointers and strides), a kernel argument
//   STAGED            whether a tile stages anything (batch norm's scale / center, or per-channel
//                     inputs, each in a channel_row of its own)
//   NPRE, PRE_BYTES   pixel-varying inputs (a residual) and the bytes of one element of each, summed
//   Epi<BM, BN, EV, JJ, PRE, PERSIST, IDX>   the epilogue's code, static functions called below:
//     issue(ea, d, tail, buf, m0, q0)  cp.async of the pixel-varying inputs' tile (m0, q0) into
//                                      their buffers buf (tail: dynamic shared memory after the
//                                      result tile, where the PRE buffers are)
//     stage(ea, i, sS, sT)             channel i's per-tile values (thread i - m0)
//     Pre select(tail, it)             the PRE buffers tile it reads
//     Cols column(ea, n, p)            the per-row inputs' offsets at channel 0 of pixel p of image n
//     Rows, load(ea, x, u, r, kc, col, pre, cols)   row u's global inputs (tile row r, channel kc)
//     value(x, cvs, u, e, r, sS, sT)                the output at row u, pixel e; cvs: conv values
//   Pre and Cols are the per-tile state: a scalar for one input, else a struct (the kernel keeps
//   them as locals: per-tile values in registers, no object the hooks write to).
namespace pw {
// Dynamic shared memory: the main loop's stages, the result tile, then (PRE) one or two [BM][BN]
// buffers per pixel-varying epilogue input. PERSIST: a block issues the next tile's stages before
// this tile's epilogue, so the result tile has memory of its own; else it reuses the stages'
// memory. NHWC: the tile is loaded from the conv result in NHWC (load_nhwc_tile): no stages.
template <class R, int BM, int BN> constexpr size_t stg_bytes() {
  return ((size_t)BM * Tile<typename R::DT, BM, BN>::LDC * sizeof(typename R::STG::raw) + 127) / 128 * 128;
}
template <class R, bool PERSIST, bool NHWC, int BM, int BN, int STAGES> constexpr size_t stg_off() {
  return PERSIST && !NHWC ? Tile<typename R::DT, BM, BN>::pipe_bytes(STAGES) : 0;
}
template <class R, bool PERSIST, bool NHWC, int BM, int BN, int STAGES> constexpr size_t tail_off() {
  constexpr size_t pipe = NHWC ? 0 : Tile<typename R::DT, BM, BN>::pipe_bytes(STAGES), stg = stg_bytes<R, BM, BN>();
  return PERSIST ? pipe + stg : (pipe > stg ? pipe : stg);
}
template <class R, bool PERSIST, bool NHWC, int BM, int BN, int STAGES, bool PRE> constexpr size_t smem_bytes() {
  constexpr size_t tail = tail_off<R, PERSIST, NHWC, BM, BN, STAGES>();
  return PRE ? tail + (size_t)(PERSIST ? 2 : 1) * BM * BN * R::PRE_BYTES : tail;
}

// The block's [BM] shared-memory row of per-channel values K of epilogue E (K = 0: batch norm's
// scale, 1: its center, 2 + j: E's staged input j), staged once per tile. Each is an array of its
// own, as the kernel's own __shared__ arrays were (one array [K][BM] addresses them differently).
template <class E, int BM, int K>
__device__ __forceinline__ float* channel_row() {
  __shared__ float v[BM];
  return v;
}

// x = EV consecutive pixels of one epilogue input row from p + o: pixel stride sp 1 (a vector when
// EV > 1) or 0 (one value, broadcast along the pixels).
template <class T, int EV, typename IDX>
__device__ __forceinline__ void load_row(const typename T::raw* p, IDX o, int64_t sp, float (&x)[EV]) {
  if (EV > 1 && sp == 1) ldv<T, EV, false>(p + o, x);
  else {
    const float v = ld1<T, false>(p + o);
#pragma unroll
    for (int e = 0; e < EV; ++e) x[e] = v;
  }
}
}  // namespace pw

// VA, VB, EV > 1: the fast instantiation (16-byte vectors everywhere); PRE: with it, pixel-varying
// inputs are copied into shared memory ahead of use. A block computes tiles t = blockIdx.x,
// + gridDim.x, ... (T tiles, MT channel tiles per pixel tile: the channel tiles of one pixel tile
// run on neighbouring blocks at the same time, so X is read from DRAM once and then from L2).
// PERSIST false: one tile per block. NHWC: X is the conv result in NHWC, W is unused.
// IDX: int32_t when every element offset of the epilogue fits (the host checks), else int64_t.
template <class R, int MINB, bool PERSIST, bool NHWC, int BM, int BN, int STAGES, bool VA, bool VB, int EV,
          int JU, bool PRE, bool SPLIT, typename IDX>
__global__ void __launch_bounds__(pw::THREADS, MINB) pw_kernel(const typename R::DT::raw* __restrict__ W,
    const typename R::DT::raw* __restrict__ X, typename R::OT::raw* __restrict__ Y, pw::Dims d,
    typename R::Args ea, int64_t T) {
  typedef typename R::DT DT;
  typedef typename R::STG STG;
  typedef typename DT::raw raw;
  typedef pw::Tile<DT, BM, BN> TL;
  constexpr int LDC = TL::LDC, TPR = BN / EV, RPP = pw::THREADS / TPR;
  constexpr int JJ = JU < BM / RPP ? JU : BM / RPP;    // tile rows per thread in flight
  extern __shared__ __align__(128) unsigned char smem[];
  raw* pipe = reinterpret_cast<raw*>(smem);
  typename STG::raw* stg = reinterpret_cast<typename STG::raw*>(smem + pw::stg_off<R, PERSIST, NHWC, BM, BN, STAGES>());
  unsigned char* tail = smem + pw::tail_off<R, PERSIST, NHWC, BM, BN, STAGES>();
  typedef typename R::template Epi<BM, BN, EV, JJ, PRE, PERSIST, IDX> E;
  float* const sS = pw::channel_row<E, BM, 0>();      // batch norm scale / center of the tile's channels
  float* const sT = pw::channel_row<E, BM, 1>();
  auto issue_pre = [&](int buf, int m0n, int64_t q0n) {
    if constexpr (PRE && R::NPRE > 0) {
      E::issue(ea, d, tail, buf, m0n, q0n);
      pw::cp_commit();
    }
  };
  // tile tt: channels m0 : m0 + BM of pixels q0 : q0 + BN
  auto at = [&](int64_t tt, int& m0, int64_t& q0) {
    int64_t pt, mt;
    pw::divmod<IDX>(d.dmt, tt, pt, mt);
    m0 = (int)mt * BM;
    q0 = pt * BN;
  };
  int64_t t = blockIdx.x;
  if (t >= T) return;
  int m0;
  int64_t q0;
  at(t, m0, q0);
  issue_pre(0, m0, q0);
  pw::XCol xc = {};                  // this thread's X column, per tile (not used by NHWC)
  if constexpr (!NHWC) {
    xc = pw::x_column<DT, BN, VB, IDX>(d, q0);
    pw::issue_prologue<DT, BM, BN, STAGES, VA, VB>(pipe, W, X, d, m0, xc);
  }
  const int col = (threadIdx.x % TPR) * EV, row0 = threadIdx.x / TPR;
  for (int it = 0; t < T; t += gridDim.x, ++it) {
    if constexpr (R::STAGED) {       // (read by every thread after the main loop's sync)
      if (threadIdx.x < BM && m0 + (int64_t)threadIdx.x < d.K) E::stage(ea, m0 + threadIdx.x, sS, sT);
    }
    if constexpr (NHWC) {
      pw::load_nhwc_tile<DT, BM, BN, VB>(X, d, m0, q0, reinterpret_cast<raw*>(stg));
      pw::cp_wait<0>();               // the residual prefetch (PRE); the sync below publishes both
    } else {
      float acc[TL::MI][TL::NI][4];
      pw::main_loop<DT, BM, BN, STAGES, VA, VB, SPLIT>(pipe, W, X, d, m0, xc, acc);   // synced
      pw::store_tile<DT, STG, BM, BN>(acc, stg);     // (main_loop ended synced: the stages are free)
    }
    const int64_t tn = t + gridDim.x;
    int m0n = 0;
    int64_t q0n = 0;
    if (PERSIST && tn < T) {        // the next tile's loads fly during this tile's epilogue
      at(tn, m0n, q0n);
      issue_pre((it + 1) % 2, m0n, q0n);
      xc = pw::x_column<DT, BN, VB, IDX>(d, q0n);
      pw::issue_prologue<DT, BM, BN, STAGES, VA, VB>(pipe, W, X, d, m0n, xc);
    }
    __syncthreads();      // the result tile (and sS / sT) are visible to every thread
    const typename E::Pre pre = E::select(tail, it);
    const int64_t q = q0 + col;
    const bool qok = q < d.NQ;           // NQ % EV == 0 when EV > 1: a vector is all in or all out
    int64_t n64 = 0, p64 = 0;
    if (qok) pw::divmod<IDX>(d.dp, q, n64, p64);
    const IDX n = (IDX)n64, p = (IDX)p64;
    const typename E::Cols cols = E::column(ea, n, p);
    const IDX ybase = n * (IDX)d.K * (IDX)d.P + p;
    for (int j0 = 0; j0 < BM / RPP; j0 += JJ) {
      typename E::Rows x;
      float y[JJ][EV];
      bool ok[JJ];
#pragma unroll
      for (int u = 0; u < JJ; ++u) {
        const int r = row0 + (j0 + u) * RPP;
        ok[u] = qok && m0 + r < d.K;
        const IDX kc = ok[u] ? (IDX)(m0 + r) : 0;    // masked rows read channel 0 and store nothing
        E::load(ea, x, u, r, kc, col, pre, cols);
      }
#pragma unroll
      for (int u = 0; u < JJ; ++u) {
        const int r = row0 + (j0 + u) * RPP;
        float cvs[EV];
        ldv<STG, EV, false>(stg + r * LDC + col, cvs);
#pragma unroll
        for (int e = 0; e < EV; ++e) y[u][e] = E::value(x, cvs, u, e, r, sS, sT);
      }
#pragma unroll
      for (int u = 0; u < JJ; ++u) {
        if (!ok[u]) continue;
        const int r = row0 + (j0 + u) * RPP;
        typename R::OT::raw* yp = Y + ybase + (IDX)(m0 + r) * (IDX)d.P;
        if (EV > 1) stv<typename R::OT, EV>(yp, y[u]); else *yp = R::OT::from_f(y[u][0]);
      }
    }
    __syncthreads();      // the result tile, this tile's prefetch buffers and sS / sT are free
    m0 = m0n;
    q0 = q0n;
  }
}
// ---- end tiled pointwise-conv kernel ----
