// ---- torch_htam expert: pointwise-conv main loop (a tiled tensor-core GEMM over NCHW) ----
// A 1x1 stride-1 conv is a GEMM per image: Y[n, k, p] = sum_c W[k, c] * X[n, c, p] (p = h * W + w).
// Pixels of all images form one GEMM dimension q = n * P + p, so a tile of BN pixels may span
// images (each thread computes its column's image once). One block of 256 threads (2 x 4 warps)
// computes the tile Y[m0 : m0 + BM, q0 : q0 + BN] with mma.sync (TF32 m16n8k8 for fp32, m16n8k16
// for bf16/fp16), fp32 accumulators, C in steps of BK = 32 through a STAGES-deep cp.async
// pipeline; store_tile leaves it in shared memory ([BM][BN + 8], fp32 or the conv's dtype) for the
// generated epilogue. A block may loop over tiles: issue_prologue lets the next tile's loads fly
// while the current tile's epilogue runs.
//
// Shared memory rows are padded so fragment loads are free of bank conflicts: A (W tile) rows by
// 16 bytes (a thread reads row gid, column tig: gid * 4 + tig covers 32 banks), B (X tile) rows by
// 8 elements (fp32: tig * 8 + gid; bf16: ldmatrix rows 16 bytes apart modulo 128).
//
// VA / VB: 16-byte cp.async for the W / X tiles (the host checks C resp. P divisible by 16 bytes'
// worth of elements and 16-byte aligned pointers); otherwise plain element loads, zero-filled.
#include <type_traits>
namespace pw {
constexpr int THREADS = 256, WARPS_N = 4, BK = 32;

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zero-filled (and src unread) when !full
__device__ __forceinline__ void cp16(void* dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// NOTE: round to nearest (cvt.rna), as cuBLAS/cuDNN TF32 do: feeding raw fp32 bits truncates,
// which doubles the error of each product.
__device__ __forceinline__ unsigned tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

template <class DT> struct Mma;
template <> struct Mma<F32> {        // TF32, k = 8 per instruction
  static constexpr int K = 8;
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <> struct Mma<BF16> {
  static constexpr int K = 16;
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <> struct Mma<F16> {
  static constexpr int K = 16;
  static __device__ __forceinline__ void run(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <class DT, int BM, int BN>
struct Tile {
  typedef typename DT::raw raw;
  static constexpr int E = (int)sizeof(raw);
  static constexpr int VEC = 16 / E;                 // elements per 16-byte chunk
  static constexpr int LDA = BK + 16 / E;            // W tile row: BK + 16 bytes
  static constexpr int LDB = BN + 8;                 // X tile row: BN + 8 elements
  static constexpr int LDC = BN + 8;                 // fp32 result row (float2 stores conflict-free)
  static constexpr int STAGE = BM * LDA + BK * LDB;  // elements per pipeline stage
  static constexpr int WM = BM / 2, WN = BN / WARPS_N, MI = WM / 16, NI = WN / 8;
  static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "tile too small for 2 x 4 warps");
  static_assert(THREADS % BN == 0 && BN % VEC == 0, "a thread keeps one X column");
  static constexpr size_t pipe_bytes(int stages) { return ((size_t)stages * STAGE * E + 127) / 128 * 128; }
};

// n / d and n % d for 0 <= n < 2^32 by a multiply-high and shifts (Granlund and Montgomery 1994,
// round-up variant): t = umulhi(n, m), q = (t + ((n - t) >> s1)) >> s2. The kernel divides pixel
// and tile indices by P and by the channel-tile count for every tile; a 64-bit division is ~25
// instructions, this is 5 (IDX = int32_t: the host checked every index fits).
struct Div {
  int64_t d;
  unsigned m, s1, s2;
};
__host__ inline Div make_div(int64_t d) {   // d >= 1
  Div v;
  v.d = d;
  unsigned l = 0;
  while (l < 32 && (int64_t(1) << l) < d) ++l;
  v.m = d > (int64_t(1) << 32) ? 0u : (unsigned)((((uint64_t(1) << l) - (uint64_t)d) << 32) / (uint64_t)d + 1);
  v.s1 = l < 1 ? l : 1;
  v.s2 = l > 1 ? l - 1 : 0;
  return v;
}
template <typename IDX>
__device__ __forceinline__ int64_t div_of(const Div& v, int64_t n) {
  if constexpr (sizeof(IDX) == 4) {
    const unsigned x = (unsigned)n, t = __umulhi(x, v.m);
    return (int64_t)((t + ((x - t) >> v.s1)) >> v.s2);
  } else {
    return n / v.d;
  }
}
template <typename IDX>
__device__ __forceinline__ void divmod(const Div& v, int64_t n, int64_t& q, int64_t& r) {
  q = div_of<IDX>(v, n);
  r = n - q * v.d;
}

// Problem sizes: P pixels per image, NQ = N * P pixels in all; dp divides by P, dmt by the number
// of BM-channel tiles (tile t covers channel tile t % MT of pixel tile t / MT).
struct Dims { int64_t C, K, P, NQ; Div dp, dmt; };

// Loads W[m0 : +BM, c0 : +BK] and X[c0 : +BK, q0 : +BN] into one pipeline stage.
// xcol: this thread's X column in the tile; xbase: offset of X[n, 0, p] for that column.
template <class DT, int BM, int BN, bool VA, bool VB>
__device__ __forceinline__ void load_stage(typename DT::raw* sA, typename DT::raw* sB,
                                           const typename DT::raw* __restrict__ W,
                                           const typename DT::raw* __restrict__ X, const Dims& d, int m0,
                                           int64_t c0, int xcol, int64_t xbase, bool qok) {
  typedef Tile<DT, BM, BN> T;
  const int tid = threadIdx.x;
  if constexpr (VA) {
    constexpr int CPR = BK / T::VEC;                 // 16-byte chunks per W tile row
#pragma unroll
    for (int i = 0; i < BM * CPR / THREADS; ++i) {
      const int ch = tid + i * THREADS, r = ch / CPR, cc = (ch % CPR) * T::VEC;
      const bool ok = m0 + r < d.K && c0 + cc < d.C;   // C % VEC == 0: a chunk is all in or all out
      cp16(sA + r * T::LDA + cc, ok ? W + (m0 + r) * d.C + c0 + cc : W, ok);
    }
  } else {
#pragma unroll 4
    for (int i = 0; i < BM * BK / THREADS; ++i) {
      const int e = tid + i * THREADS, r = e / BK, cc = e % BK;
      const bool ok = m0 + r < d.K && c0 + cc < d.C;
      sA[r * T::LDA + cc] = ok ? W[(m0 + r) * d.C + c0 + cc] : typename DT::raw(0);
    }
  }
  constexpr int RSTEP = VB ? THREADS / (BN / T::VEC) : THREADS / BN;   // X rows apart per iteration
  const int row0 = VB ? tid / (BN / T::VEC) : tid / BN;
#pragma unroll
  for (int i = 0; i < BK / RSTEP; ++i) {
    const int r = row0 + i * RSTEP;
    const bool ok = qok && c0 + r < d.C;
    const typename DT::raw* src = ok ? X + xbase + (c0 + r) * d.P : X;
    if constexpr (VB) cp16(sB + r * T::LDB + xcol, src, ok);
    else sB[r * T::LDB + xcol] = ok ? *src : typename DT::raw(0);
  }
}

// x = big + small with both parts TF32 (3xTF32: big*big + big*small + small*big loses only
// small*small and small's truncation, ~2^-21 relative: fp32 accuracy on tensor cores).
// NOTE: the tensor cores ignore a tf32 operand's low 13 bits, so big is x plus half a tf32 ulp
// (bit 12) and the hardware's truncation completes round-to-nearest-ties-away, as cvt.rna does
// for every finite x; small is the exact remainder, truncated likewise. 6 instructions where
// tf32() twice is 8 (sm_90 emulates cvt.rna with a finiteness test): the split's opcodes were 30%
// of the fp32 kernel's instructions (ncu, docs/RESULTS_LOG.md). An infinite x is carried by small alone
// (big = 0): then w * x is big_w * inf, +-inf as in torch, where big = inf would add
// small_w * inf, of either sign, and make inf - inf = NaN. A NaN x keeps small = NaN.
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  const bool inf = fabsf(x) == __int_as_float(0x7f800000);
  const unsigned b = __float_as_uint(x) + 0x1000u;
  big = inf ? 0u : b;
  small = inf ? __float_as_uint(x) : __float_as_uint(x - __uint_as_float(b & 0xffffe000u));
}

// One BK step of MMAs on a stage, into acc[MI][NI][4]. SPLIT (fp32 only): 3xTF32, else 1xTF32.
template <class DT, int BM, int BN, bool SPLIT>
__device__ __forceinline__ void mma_stage(const typename DT::raw* sA, const typename DT::raw* sB,
                                          float (&acc)[Tile<DT, BM, BN>::MI][Tile<DT, BM, BN>::NI][4],
                                          int wm, int wn) {
  typedef Tile<DT, BM, BN> T;
  constexpr bool S = SPLIT && T::E == 4;
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int kk = 0; kk < BK; kk += Mma<DT>::K) {
    unsigned a[T::MI][4], b[T::NI][2], as[S ? T::MI : 1][4], bs[S ? T::NI : 1][2];
#pragma unroll
    for (int mi = 0; mi < T::MI; ++mi) {
      const typename DT::raw* p = sA + (wm + mi * 16 + gid) * T::LDA + kk;
      if constexpr (T::E == 4) {      // a0 (gid, tig) a1 (gid + 8, tig) a2 (gid, tig + 4) a3 (gid + 8, tig + 4)
        const float v[4] = {p[tig], p[8 * T::LDA + tig], p[tig + 4], p[8 * T::LDA + tig + 4]};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (S) split_tf32(v[j], a[mi][j], as[mi][j]);
          else a[mi][j] = tf32(v[j]);
        }
      } else {                        // pairs along k: (gid, 2tig) (gid + 8, 2tig) (gid, 2tig + 8) (gid + 8, 2tig + 8)
        a[mi][0] = *reinterpret_cast<const unsigned*>(p + 2 * tig);
        a[mi][1] = *reinterpret_cast<const unsigned*>(p + 8 * T::LDA + 2 * tig);
        a[mi][2] = *reinterpret_cast<const unsigned*>(p + 2 * tig + 8);
        a[mi][3] = *reinterpret_cast<const unsigned*>(p + 8 * T::LDA + 2 * tig + 8);
      }
    }
#pragma unroll
    for (int ni = 0; ni < T::NI; ni += 2) {
      if constexpr (T::E == 4) {      // b0 (k = tig, n = gid) b1 (k = tig + 4, n = gid)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float* p = reinterpret_cast<const float*>(sB) + (kk + tig) * T::LDB + wn + (ni + j) * 8 + gid;
          if constexpr (S) {
            split_tf32(p[0], b[ni + j][0], bs[ni + j][0]);
            split_tf32(p[4 * T::LDB], b[ni + j][1], bs[ni + j][1]);
          } else {
            b[ni + j][0] = tf32(p[0]);
            b[ni + j][1] = tf32(p[4 * T::LDB]);
          }
        }
      } else {
        // X is [k][n] (n contiguous): ldmatrix.trans hands each thread the (k = 2tig, 2tig + 1; n = gid)
        // pairs the col-major B fragment wants; matrices: k 0-7 / 8-15 at n, then at n + 8
        const int l = lane, k = kk + (l % 8) + ((l / 8) % 2) * 8, n = wn + ni * 8 + (l / 16) * 8;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(b[ni][0]), "=r"(b[ni][1]), "=r"(b[ni + 1][0]), "=r"(b[ni + 1][1])
                     : "r"(smem_addr(sB + k * T::LDB + n)));
      }
    }
#pragma unroll
    for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::NI; ++ni) {
        if constexpr (S) {            // the small terms first: they are added at full precision
          Mma<DT>::run(acc[mi][ni], as[mi], b[ni]);
          Mma<DT>::run(acc[mi][ni], a[mi], bs[ni]);
        }
        Mma<DT>::run(acc[mi][ni], a[mi], b[ni]);
      }
    (void)as; (void)bs;
  }
}

// This thread's X column in a tile starting at pixel q0 (one per thread, see load_stage).
struct XCol { int col; int64_t base; bool ok; };
template <class DT, int BN, bool VB, typename IDX>
__device__ __forceinline__ XCol x_column(const Dims& d, int64_t q0) {
  constexpr int VEC = 16 / (int)sizeof(typename DT::raw);
  XCol c;
  c.col = VB ? (threadIdx.x % (BN / VEC)) * VEC : threadIdx.x % BN;
  const int64_t q = q0 + c.col;
  c.ok = q < d.NQ;
  int64_t n = 0, p = 0;
  if (c.ok) divmod<IDX>(d.dp, q, n, p);
  c.base = n * d.C * d.P + p;
  return c;
}

// Issues the first STAGES - 1 stages of a tile (one cp.async group each): the main loop expects them.
// c: x_column of the tile's first pixel (the main loop takes the same one).
template <class DT, int BM, int BN, int STAGES, bool VA, bool VB>
__device__ __forceinline__ void issue_prologue(typename DT::raw* s, const typename DT::raw* __restrict__ W,
                                               const typename DT::raw* __restrict__ X, const Dims& d, int m0,
                                               const XCol& c) {
  typedef Tile<DT, BM, BN> T;
  const int64_t KT = (d.C + BK - 1) / BK;
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < KT)
      load_stage<DT, BM, BN, VA, VB>(s + st * T::STAGE, s + st * T::STAGE + BM * T::LDA, W, X, d, m0,
                                     (int64_t)st * BK, c.col, c.base, c.ok);
    cp_commit();
  }
}

// The K loop of one tile after issue_prologue (same c): acc = W[m0 : +BM, :] . X[:, q0 : +BN]. Returns with
// every cp.async of this thread complete (older groups too: an epilogue prefetch issued before the
// prologue) and the block synced, so the stage buffers may be refilled.
template <class DT, int BM, int BN, int STAGES, bool VA, bool VB, bool SPLIT>
__device__ __forceinline__ void main_loop(typename DT::raw* s, const typename DT::raw* __restrict__ W,
                                          const typename DT::raw* __restrict__ X, const Dims& d, int m0,
                                          const XCol& c,
                                          float (&acc)[Tile<DT, BM, BN>::MI][Tile<DT, BM, BN>::NI][4]) {
  typedef Tile<DT, BM, BN> T;
  typedef typename DT::raw raw;
  const int warp = threadIdx.x / 32;
  const int wm = (warp / WARPS_N) * T::WM, wn = (warp % WARPS_N) * T::WN;
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;
  const int64_t KT = (d.C + BK - 1) / BK;
  for (int64_t kt = 0; kt < KT; ++kt) {
    cp_wait<STAGES - 2>();
    __syncthreads();     // stage kt landed for every thread; stage kt - 1 is free to overwrite
    const int64_t next = kt + STAGES - 1;
    if (next < KT) {
      raw* ns = s + (next % STAGES) * T::STAGE;
      load_stage<DT, BM, BN, VA, VB>(ns, ns + BM * T::LDA, W, X, d, m0, next * BK, c.col, c.base, c.ok);
    }
    cp_commit();
    const raw* cs = s + (kt % STAGES) * T::STAGE;
    mma_stage<DT, BM, BN, SPLIT>(cs, cs + BM * T::LDA, acc, wm, wn);
  }
  cp_wait<0>();
  __syncthreads();
}

// Writes the accumulators as ST values (fp32, or the conv's own dtype: torch rounds the conv result
// to it before anything reads it) into out[BM][LDC]. The caller syncs before reading.
template <class DT, class ST, int BM, int BN>
__device__ __forceinline__ void store_tile(const float (&acc)[Tile<DT, BM, BN>::MI][Tile<DT, BM, BN>::NI][4],
                                           typename ST::raw* out) {
  typedef Tile<DT, BM, BN> T;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int wm = (warp / WARPS_N) * T::WM, wn = (warp % WARPS_N) * T::WN;
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::NI; ++ni) {
      typename ST::raw* o = out + (wm + mi * 16 + gid) * T::LDC + wn + ni * 8 + 2 * tig;
      if constexpr (sizeof(typename ST::raw) == 4) {     // float2 rows, conflict-free at LDC = BN + 8
        *reinterpret_cast<float2*>(o) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);
        *reinterpret_cast<float2*>(o + 8 * T::LDC) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);
      } else {                                            // one packed word per pair
        *reinterpret_cast<unsigned*>(o) = ST::to_word(&acc[mi][ni][0]);
        *reinterpret_cast<unsigned*>(o + 8 * T::LDC) = ST::to_word(&acc[mi][ni][2]);
      }
    }
}

// Loads a conv result held NHWC (pixel q of the flattened batch, channel k at y[q * K + k]; cuDNN
// wrote it) into out as store_tile leaves a tile: [BM channels][LDC], in the conv's dtype. V: 16-byte
// vectors along channels (host-checked: K divisible by them, y 16-byte aligned). Consecutive
// threads take consecutive pixels of one channel chunk, so each warp's shared-memory stores fill
// one row (conflict-free); each pixel's BM channels are contiguous in y, read by neighbouring warps.
template <class DT, int BM, int BN, bool V>
__device__ __forceinline__ void load_nhwc_tile(const typename DT::raw* __restrict__ y, const Dims& d, int m0,
                                               int64_t q0, typename DT::raw* out) {
  typedef Tile<DT, BM, BN> T;
  typedef typename DT::raw raw;
  constexpr int VEC = V ? T::VEC : 1, PER = BM * BN / VEC / THREADS;   // chunks per thread
  static_assert(PER >= 1 && THREADS % BN == 0, "a thread keeps one pixel");
  typedef typename std::conditional<V, uint4, raw>::type chunk;
  chunk v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {      // all loads first: PER in flight per thread
    const int ch = threadIdx.x + i * THREADS, j = ch % BN, k = (ch / BN) * VEC;
    const bool ok = q0 + j < d.NQ && m0 + k < d.K;     // K % VEC == 0 when V: all in or all out
    const chunk* src = reinterpret_cast<const chunk*>(y + (q0 + j) * d.K + m0 + k);
    v[i] = ok ? __ldg(src) : chunk{};
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int ch = threadIdx.x + i * THREADS, j = ch % BN, k = (ch / BN) * VEC;
    const raw* e = reinterpret_cast<const raw*>(&v[i]);
#pragma unroll
    for (int u = 0; u < VEC; ++u) out[(k + u) * T::LDC + j] = e[u];
  }
}

// Issues (does not wait for) cp.async copies of an epilogue input's [BM][BN] tile into s (rows of BN
// elements), for an input whose pixel stride is 1 with P divisible by a 16-byte chunk (host-checked);
// sn / sk: its image / channel strides. Rows or pixels past the end are zero-filled.
template <class IT, int BM, int BN, typename IDX>
__device__ __forceinline__ void prefetch_tile(typename IT::raw* s, const typename IT::raw* __restrict__ src,
                                              int64_t sn, int64_t sk, const Dims& d, int m0, int64_t q0) {
  constexpr int VEC = 16 / (int)sizeof(typename IT::raw), CPR = BN / VEC;
  static_assert(THREADS % CPR == 0, "a thread keeps one column");
  const int col = (threadIdx.x % CPR) * VEC;
  const int64_t q = q0 + col;
  const bool qok = q < d.NQ;
  int64_t n = 0, p = 0;
  if (qok) divmod<IDX>(d.dp, q, n, p);
#pragma unroll
  for (int i = 0; i < BM * CPR / THREADS; ++i) {
    const int r = threadIdx.x / CPR + i * (THREADS / CPR);
    const bool ok = qok && m0 + r < d.K;
    cp16(s + r * BN + col, ok ? src + n * sn + (m0 + r) * sk + p : src, ok);
  }
}
}  // namespace pw
// ---- end pointwise-conv main loop ----
