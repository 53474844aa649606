// ---- pool: one pooling op with its elementwise prologue and epilogue (pool.py) ----
// Geometry padded to 3 spatial dims (D, H, W). N, C and sizes in int64 on the host; spatial sizes
// and window math in int (the host checks every spatial size < 2^30), element offsets in IDX
// (int32 where they fit: no int64 division).
template <int NACC>
struct PoolShape {
  int64_t N, C;
  int I[3], O[3];                           // x's spatial sizes; y's spatial sizes
  int K[3], S[3], P[3], Dl[3];              // kernel, stride, padding, dilation
  int64_t st[NACC > 0 ? NACC : 1][5];       // per prologue access: elements per step of n, c, d, h, w
};

enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE_AVG };

// Window oc's taps per dim: cnt[q] of them at lo[q] + j * dilation (adaptive: [start, end) step
// 1); returns the average's divisor (torch's: the window clipped to the padded input, or to the
// input itself; the adaptive window's size).
template <int OP, bool INCLUDE_PAD, int NACC, class IDX>
__device__ __forceinline__ int64_t pool_window(const PoolShape<NACC>& s, const IDX* oc, int* lo, int* cnt) {
  int64_t div = 1;
  for (int q = 0; q < 3; ++q) {
    if (OP == POOL_ADAPTIVE_AVG) {
      lo[q] = (int)(((int64_t)oc[q] * s.I[q]) / s.O[q]);
      cnt[q] = (int)((((int64_t)oc[q] + 1) * s.I[q] + s.O[q] - 1) / s.O[q]) - lo[q];
      div *= cnt[q];
    } else {
      lo[q] = (int)oc[q] * s.S[q] - s.P[q];
      cnt[q] = s.K[q];
      if (OP == POOL_AVG) {
        const int end = min(lo[q] + s.K[q], s.I[q] + s.P[q]);
        const int a = max(lo[q], 0), b = min(end, s.I[q]);
        div *= INCLUDE_PAD ? end - lo[q] : b - a;
      }
    }
  }
  return div;
}

// Taps first, first + step, ... of a window (lo, cnt) in (d, h, w) order, stepped without division
// (a 3x3 window costs no index division per tap), folded into acc (and arg: max pooling's index);
// b[a]: access a's (n, c) offset.
template <int OP, bool INDEX, int NACC, class IDX, class R>
__device__ __forceinline__ void pool_taps(const PoolShape<NACC>& s, const IDX* b, const int* lo, const int* cnt,
                                          int first, int step, float& acc, int64_t& arg, const R& r) {
  int td = 0, th = 0, tw = first;
  for (;;) {
    while (tw >= cnt[2]) { tw -= cnt[2]; if (++th >= cnt[1]) { th = 0; ++td; } }
    if (td >= cnt[0]) break;
    const int id = lo[0] + td * s.Dl[0], ih = lo[1] + th * s.Dl[1], iw = lo[2] + tw * s.Dl[2];
    tw += step;
    if (id < 0 || id >= s.I[0] || ih < 0 || ih >= s.I[1] || iw < 0 || iw >= s.I[2]) continue;
    const float v = r.tap(s, b, id, ih, iw);
    // NOTE: torch keeps the first maximum (strict >), NaN wins, and a window of -inf values
    // still has an index (its first tap): arg < 0 means no tap seen yet
    if (OP != POOL_MAX) acc += v;
    else if (!INDEX) { if (v > acc || v != v) acc = v; }
    else if (arg < 0 || v > acc || v != v) { acc = v; arg = ((int64_t)id * s.I[1] + ih) * s.I[2] + iw; }
  }
}

// Output element o is one window: TPR lanes (a sub-warp) walk its taps, reduce in fp32 and
// shuffle; lane 0 rounds to DT and stores. OP: POOL_*; INDEX: max pooling also returns the first
// maximum's index (flat within the input plane); INCLUDE_PAD: average pooling counts padding taps;
// DIVISOR > 0: divisor_override. R, emitted per region, holds the pointers (the kernel's
// parameters, __restrict__ there) and
//   tap(s, b, id, ih, iw)   the pool input's value at one tap: the prologue over the reads at
//                           b[a] + id, ih, iw steps of access a (b[a]: its (n, c) offset)
//   store(o, pv, arg)       the epilogue over the pooled value pv; arg: the max's index
template <class DT, int OP, bool INDEX, bool INCLUDE_PAD, int DIVISOR, int TPR, int NACC, class IDX, class R>
__device__ __forceinline__ void pool_body(const PoolShape<NACC>& s, IDX total, const R& r) {
  const int lane = threadIdx.x % TPR;
  // the TPR lanes of one window (a sub-warp) shuffle among themselves
  const unsigned mask = TPR == 32 ? 0xffffffffu : ((1u << TPR) - 1u) << ((threadIdx.x % 32) / TPR * TPR);
  (void)mask; (void)lane;
  const IDX step = (IDX)gridDim.x * (blockDim.x / TPR);
  for (IDX o = ((IDX)blockIdx.x * blockDim.x + threadIdx.x) / TPR; o < total; o += step) {
    IDX rem = o, oc[3];
    for (int q = 2; q >= 0; --q) { oc[q] = rem % (IDX)s.O[q]; rem /= (IDX)s.O[q]; }
    const IDX c = rem % (IDX)s.C, n = rem / (IDX)s.C;
    int lo[3], cnt[3];
    const int64_t div = pool_window<OP, INCLUDE_PAD>(s, oc, lo, cnt);
    (void)div;
    IDX b[NACC > 0 ? NACC : 1];
#pragma unroll
    for (int a = 0; a < NACC; ++a) b[a] = n * (IDX)s.st[a][0] + c * (IDX)s.st[a][1];
    float acc = OP == POOL_MAX ? -INFINITY : 0.f;
    int64_t arg = -1;
    pool_taps<OP, INDEX>(s, b, lo, cnt, lane, TPR, acc, arg, r);
    (void)arg;
#pragma unroll
    for (int m = TPR / 2; m > 0; m /= 2) {
      const float ov = __shfl_down_sync(mask, acc, m, TPR);
      if (OP != POOL_MAX) {
        acc += ov;
      } else if (!INDEX) {
        if (ov > acc || ov != ov) acc = ov;
      } else {
        const int64_t oa = __shfl_down_sync(mask, arg, m, TPR);
        if (oa >= 0 && (arg < 0 || ov > acc || (ov == acc && oa < arg) || (ov != ov && acc == acc))) {
          acc = ov; arg = oa;
        }
      }
    }
    if (lane == 0) {
      const float pv = DT::round(OP == POOL_MAX ? acc : DIVISOR ? acc / (float)DIVISOR : acc / (float)div);
      r.store(o, pv, arg);
    }
  }
}

// Channels-last input (average pooling): a block of WARPS warps takes 32 windows adjacent in
// (n, d, h, w, c) order, channel fastest. Lane l owns window l of them, and warp k walks its taps
// k, k + WARPS, ...: per tap the 32 lanes read 32 adjacent channels, one coalesced access, where
// a warp per window (pool_body) reads taps C elements apart. The warps' partial sums meet in
// shared memory; warp 0 divides, rounds and stores at the window's (n, c, d, h, w) index.
// NOTE: a channels-last global pool [32, 960, 7, 7] bf16 took 0.47x of eager a warp per window
// and 0.61-0.89x at the best sub-warp split tried (H100, bench/results/anytime_table-*).
template <class DT, int OP, bool INCLUDE_PAD, int DIVISOR, int WARPS, int NACC, class IDX, class R>
__device__ __forceinline__ void pool_body_cl(const PoolShape<NACC>& s, IDX total, const R& r) {
  static_assert(OP != POOL_MAX, "channels-last windows: average pooling only");
  __shared__ float part[WARPS][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // NOTE: base is the same for the whole block: every thread reaches both barriers each trip
  for (IDX base = (IDX)blockIdx.x * 32; base < total; base += (IDX)gridDim.x * 32) {
    const IDX p = base + lane;
    float acc = 0.f;
    IDX o = 0;
    int64_t div = 1;
    if (p < total) {
      IDX rem = p, oc[3];
      const IDX c = rem % (IDX)s.C;
      rem /= (IDX)s.C;
      for (int q = 2; q >= 0; --q) { oc[q] = rem % (IDX)s.O[q]; rem /= (IDX)s.O[q]; }
      const IDX n = rem;
      o = (((n * (IDX)s.C + c) * (IDX)s.O[0] + oc[0]) * (IDX)s.O[1] + oc[1]) * (IDX)s.O[2] + oc[2];
      int lo[3], cnt[3];
      div = pool_window<OP, INCLUDE_PAD>(s, oc, lo, cnt);
      IDX b[NACC > 0 ? NACC : 1];
#pragma unroll
      for (int a = 0; a < NACC; ++a) b[a] = n * (IDX)s.st[a][0] + c * (IDX)s.st[a][1];
      int64_t arg = -1;
      pool_taps<OP, false>(s, b, lo, cnt, warp, WARPS, acc, arg, r);
    }
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && p < total) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) sum += part[k][lane];
      r.store(o, DT::round(DIVISOR ? sum / (float)DIVISOR : sum / (float)div), -1);
    }
    __syncthreads();
  }
}

// Host: s's window (geometry kK .. kDil) and input sizes from the pool input's sizes it[0, SPATIAL
// + 2); false where a spatial size passes the kernel's int window math.
template <int SPATIAL, int NACC>
static inline bool pool_shape(PoolShape<NACC>& s, const int64_t* it, const int64_t* kK, const int64_t* kS,
                              const int64_t* kP, const int64_t* kDil) {
  s.N = it[0]; s.C = it[1];
  for (int q = 0; q < 3; ++q) { s.K[q] = (int)kK[q]; s.S[q] = (int)kS[q]; s.P[q] = (int)kP[q]; s.Dl[q] = (int)kDil[q]; }
  for (int q = 0; q < 3 - SPATIAL; ++q) s.I[q] = 1;
  for (int d = 2; d < SPATIAL + 2; ++d) {
    if (it[d] >= (int64_t(1) << 30)) return false;
    s.I[d - SPATIAL + 1] = (int)it[d];
  }
  return true;
}

// Host: torch's pooling_output_shape, ceil_mode included; false where a window does not fit.
template <bool CEIL, int NACC>
static inline bool pool_out_sizes(PoolShape<NACC>& s, const int64_t* kK, const int64_t* kS, const int64_t* kP,
                                  const int64_t* kDil) {
  for (int q = 0; q < 3; ++q) {
    const int64_t span = s.I[q] + 2 * kP[q] - kDil[q] * (kK[q] - 1) - 1 + (CEIL ? kS[q] - 1 : 0);
    if (span < 0) return false;
    int64_t o = span / kS[q] + 1;
    if (CEIL && (o - 1) * kS[q] >= s.I[q] + kP[q]) --o;   // the last window starts inside
    s.O[q] = (int)o;
  }
  return true;
}

// Host: access i's strides from tensor t read along iteration dims dm[0, nd) of it (rank SPATIAL
// + 2), as (n, c, d, h, w) steps (0 along the padded unit dims).
template <int SPATIAL, int NACC>
static inline bool pool_bind(PoolShape<NACC>& s, int i, const HtamTensor& t, const int* dm, int nd, const int64_t* it) {
  int64_t st[HTAM_MAX_DIMS];
  if (!htam_bind_dims(t, dm, nd, it, SPATIAL + 2, st)) return false;
  s.st[i][0] = st[0]; s.st[i][1] = st[1];
  for (int q = 0; q < 3; ++q) s.st[i][q + 2] = q < 3 - SPATIAL ? 0 : st[q - (3 - SPATIAL) + 2];
  return true;
}

// Host: blocks of ROWS windows for `total` windows; WAVES > 0 caps the grid at WAVES blocks per SM
// (the grid-stride loop covers the rest).
template <int ROWS, int WAVES>
static inline int64_t pool_blocks(int64_t total) {
  int64_t blocks = (total + ROWS - 1) / ROWS;
  if (WAVES > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * WAVES);
  return std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
}

// Host: int32 offsets where every element index fits: each access's largest offset, the output's
// and the grid-stride loop's last window index (threads: the grid's).
template <int NACC>
static inline bool pool_idx32(const PoolShape<NACC>& s, int64_t total, int64_t threads) {
  int64_t max_off = total;
  for (int i = 0; i < NACC; ++i) {
    const int64_t ext[5] = {s.N, s.C, s.I[0], s.I[1], s.I[2]};
    int64_t off = 0;
    for (int d = 0; d < 5; ++d) off += (ext[d] - 1) * (s.st[i][d] < 0 ? -s.st[i][d] : s.st[i][d]);
    max_off = std::max(max_off, off);
  }
  return max_off + threads < (int64_t(1) << 31);
}
// ---- end pool ----
