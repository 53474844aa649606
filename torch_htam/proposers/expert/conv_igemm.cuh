// ---- torch_htam expert: an implicit-GEMM conv over channels-last tensors, its epilogue fused (after pwconv.cuh) ----
// One kernel launch per conv site: no batch-norm fold kernel, no cudnnBackendExecute on the host
// path. A conv site of ours on cuDNN costs the host a fold launch plus cuDNN's execute, and at a
// served batch that the host decides (vision bf16, batch 16, H200) that made each site 16-27 us
// slower than aten's conv plus one Triton kernel (bench/findings.md, #36).
//
//   Y[n, p, q, k] = Epi(sum over r, s, c of X[n, h, w, c] * W[k, r, s, c]),
//   h = p * sh - ph + r * dh,  w = q * sw - pw + s * dw   (X zero outside [0, H) x [0, W))
//
// as one GEMM: rows m = (n, p, q), the output pixels in NHWC order (a row of Y is its K channels,
// contiguous), columns k, the output channels, and the reduction over (c, r, s) in steps of BK = 32
// channels of one tap (the host checks C % 32 == 0; step_of gives the order). X is [N, H, W, C] in
// memory (torch's channels-last [N, C, H, W]); W is [K, R, S, C] (channels-last) or [K, C, R, S]
// (as a model holds it unless converted), either is read (load_b_krsc, Gather).
//
// A block of 128 threads (2 x 2 warps) computes a BM x BN tile with mma.sync m16n8k16 (bf16 /
// fp16 in, fp32 accumulators) through a STAGES-deep cp.async pipeline. The A tile gathers, per
// output pixel, the 32 channels of the current tap (16-byte copies, zero-filled in the padding);
// the B tile is 32 channels of BN filters. Shared rows are LDS = 40 elements (80 bytes): the eight
// rows one ldmatrix reads fall in eight distinct 16-byte slots of the 128-byte bank window.
//
// The epilogue runs on the accumulators in registers. Epi (a template parameter) turns the conv
// values of channels k and k + 1 at row m into the outputs (BnEpi: the conv rounded to T as torch
// stores it, its bias, batch norm from the raw statistics, a residual, ReLU). Each thread stores
// pairs of channels.
//
// Deep, narrow layers (C 512 at 7 x 7: 49 rows an image, 144 k-blocks) give too few tiles to fill
// the GPU; there the launch splits each tile's reduction across a cluster of 2-8 blocks (split_for)
// that sum their partial tiles over distributed shared memory before the epilogue (sm_90).
#include <cooperative_groups.h>
namespace ig {
constexpr int THREADS = 128, BK = 32, LDS = BK + 8;

// The conv's sizes (all in elements). M = N * P * Q rows; the host checks that it and every
// tensor's element count fit in int32 / int64 as used below.
struct Geom {
  int N, H, W, C, K, R, S, P, Q, sh, sw, ph, pw, dh, dw, M;
};

// The bytes of one pipeline stage's tiles, and of the whole pipeline (dynamic shared memory).
template <int BM, int BN> constexpr int stage_elems() { return (BM + BN) * LDS; }
template <class T, int BM, int BN, int STAGES> constexpr int smem_bytes() {
  return STAGES * stage_elems<BM, BN>() * (int)sizeof(typename T::raw);
}

// A row of the A tile this thread copies: its output pixel's image and top-left input position.
struct Row {
  int n, h0, w0;
  bool ok;   // m < M
};

template <int BM>
__device__ __forceinline__ void rows_of(const Geom& g, int m0, Row (&rows)[BM / 32]) {
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int m = m0 + (int)threadIdx.x / 4 + i * 32;
    Row r{0, 0, 0, m < g.M};
    if (r.ok) {
      const int pq = g.P * g.Q, n = m / pq, rem = m - n * pq, p = rem / g.Q, q = rem - p * g.Q;
      r.n = n;
      r.h0 = p * g.sh - g.ph;
      r.w0 = q * g.sw - g.pw;
    }
    rows[i] = r;
  }
}

// Stage kb of the reduction: channels c0 .. c0 + 32 at tap (r, s), the channel block outer and
// the tap inner, so R * S stages in a row read the same 32 channels: of a KCRS weight those are
// 32 * R * S contiguous elements a filter, fetched into L1 once and read by all R * S stages, and
// of X windows that overlap from one tap to the next (load_a caches them in L1 too). On the H200
// this order measured level with the tap-outer one (bench/findings.md): the loop is bound by
// issuing instructions, not by memory. Each thread copies 16-byte chunk (threadIdx % 4) of tile
// rows threadIdx / 4 + 32 i.
struct Step {
  int tap, r, s, c0;
};
__device__ __forceinline__ Step step_of(const Geom& g, int kb) {
  const int rs = g.R * g.S, cb = kb / rs, tap = kb - cb * rs, r = tap / g.S;
  return Step{tap, r, tap - r * g.S, cb * BK};
}

// 16 bytes global -> shared through L1 (cp.async.ca; pw::cp16 is .cg, L2 only), zero-filled and
// src unread when !full.
__device__ __forceinline__ void cp16_ca(void* dst, const void* src, bool full) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(pw::smem_addr(dst)), "l"(src),
               "r"(full ? 16 : 0));
}

// The A tile into sA [BM][LDS]: per output pixel the 32 channels at its tap, zero in the padding.
template <class T, int BM>
__device__ __forceinline__ void load_a(typename T::raw* sA, const typename T::raw* __restrict__ X, const Geom& g,
                                       const Row (&rows)[BM / 32], int kb) {
  const int chunk = threadIdx.x % 4, row = threadIdx.x / 4;
  const Step t = step_of(g, kb);
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const Row& a = rows[i];
    const int h = a.h0 + t.r * g.dh, w = a.w0 + t.s * g.dw;
    const bool ok = a.ok && h >= 0 && h < g.H && w >= 0 && w < g.W;
    const typename T::raw* src = ok ? X + (((int64_t)a.n * g.H + h) * g.W + w) * g.C + t.c0 + chunk * 8 : X;
    cp16_ca(sA + (row + i * 32) * LDS + chunk * 8, src, ok);
  }
}

// The B tile into sB [BN][LDS], 32 channels of BN filters at the tap. KRSC (w stored K, R, S, C:
// channels-last, or 1x1): a filter's 32 channels are 64 contiguous bytes, copied like A.
template <class T, int BN>
__device__ __forceinline__ void load_b_krsc(typename T::raw* sB, const typename T::raw* __restrict__ Wt, const Geom& g,
                                            int n0, int kb) {
  const int chunk = threadIdx.x % 4, row = threadIdx.x / 4;
  const Step t = step_of(g, kb);
#pragma unroll
  for (int i = 0; i < BN / 32; ++i) {
    const int k = n0 + row + i * 32;
    const bool ok = k < g.K;
    const typename T::raw* src = ok ? Wt + ((int64_t)k * g.R * g.S + t.tap) * g.C + t.c0 + chunk * 8 : Wt;
    pw::cp16(sB + (row + i * 32) * LDS + chunk * 8, src, ok);
  }
}

// KCRS (w as a model holds it): a filter's channels at one tap lie R * S elements apart, so the B
// tile is gathered element by element (from L1, step_of's order: a warp's load spans 32 * R * S
// elements of one filter, read again by the next R * S - 1 stages) into registers, and stored to
// shared memory one stage later (store), after the current stage's MMAs: the loads' latency hides
// behind them. So no second kernel (nor a cached copy, stale once a
// weight is written in place) makes a KRSC weight. Element e of this thread: filter
// (threadIdx + e * THREADS) / BK, channel lane idx % BK (consecutive lanes, consecutive channels).
template <class T, int BN>
struct Gather {
  static constexpr int PER = BN * BK / THREADS;
  typename T::raw v[PER];

  __device__ __forceinline__ void fetch(const typename T::raw* __restrict__ Wt, const Geom& g, int n0, int kb) {
    const Step t = step_of(g, kb);
    const int64_t rs = (int64_t)g.R * g.S;
#pragma unroll
    for (int e = 0; e < PER; ++e) {
      const int idx = threadIdx.x + e * THREADS, k = n0 + idx / BK;
      v[e] = k < g.K ? __ldg(Wt + ((int64_t)k * g.C + t.c0 + idx % BK) * rs + t.tap) : (typename T::raw)0;
    }
  }
  __device__ __forceinline__ void store(typename T::raw* sB) const {
#pragma unroll
    for (int e = 0; e < PER; ++e) {
      const int idx = threadIdx.x + e * THREADS;
      sB[(idx / BK) * LDS + idx % BK] = v[e];
    }
  }
};

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(pw::smem_addr(p)));
}

// acc += this stage's A tile x B tile for the warp's (BM / 2) x (BN / 2) part: MT = BM / 32 row
// tiles of 16, NT = BN / 16 column tiles of 8, two k16 steps. Fragments as mma.m16n8k16's .row /
// .col operands want them: A by ldmatrix.x4 at rows lane % 16, columns (lane / 16) * 8; B (stored
// [n][k]) two column tiles per ldmatrix.x4, rows (lane & 7) + (lane / 16) * 8, columns bit 3 of lane.
template <class T, int BM, int BN>
__device__ __forceinline__ void mma_stage(const typename T::raw* sA, const typename T::raw* sB,
                                          float (&acc)[BM / 32][BN / 16][4]) {
  constexpr int MT = BM / 32, NT = BN / 16;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    unsigned a[MT][4], b[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(a[mt], sA + (wm * (BM / 2) + mt * 16 + lane % 16) * LDS + kk + (lane / 16) * 8);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      unsigned r[4];
      ldmatrix_x4(r, sB + (wn * (BN / 2) + nt * 8 + (lane & 7) + (lane >> 4) * 8) * LDS + kk + ((lane >> 3) & 1) * 8);
      b[nt][0] = r[0];
      b[nt][1] = r[1];
      b[nt + 1][0] = r[2];
      b[nt + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) pw::Mma<T>::run(acc[mt][nt], a[mt], b[nt]);
  }
}

// The accumulators' place in the tile: acc[mt][nt][half * 2 + j] is row
// wm * (BM / 2) + mt * 16 + lane / 4 + half * 8, channel wn * (BN / 2) + nt * 8 + (lane % 4) * 2 + j.
template <int BM, int BN>
struct Frag {
  int lane, wm, wn;
  __device__ __forceinline__ Frag() : lane(threadIdx.x % 32), wm(threadIdx.x / 64), wn((threadIdx.x / 32) % 2) {}
  __device__ __forceinline__ int row(int mt, int half) const { return wm * (BM / 2) + mt * 16 + lane / 4 + half * 8; }
  __device__ __forceinline__ int col(int nt) const { return wn * (BN / 2) + nt * 8 + (lane % 4) * 2; }
};

// Y's channels k, k + 1 (pair: k + 1 < K) at row m from their conv values v, through the epilogue.
template <class T, class Epi>
__device__ __forceinline__ void put(typename T::raw* __restrict__ Y, const Geom& g, const Epi& epi,
                                    const typename Epi::Channels& ch, int m, int k, bool pair, float (&v)[2]) {
  const int64_t at = (int64_t)m * g.K + k;
  epi.apply(ch, v, at, pair);
  if (pair && (g.K % 2 == 0)) {
    *reinterpret_cast<unsigned*>(Y + at) = T::to_word(v);
  } else {
    Y[at] = T::from_f(v[0]);
    if (pair) Y[at + 1] = T::from_f(v[1]);
  }
}

// SPLIT == 1: the epilogue on the accumulators in registers, each thread storing its pairs.
template <class T, int BM, int BN, class Epi>
__device__ __forceinline__ void epilogue_regs(typename T::raw* __restrict__ Y, const Geom& g, const Epi& epi,
                                              const float (&acc)[BM / 32][BN / 16][4], int m0, int n0) {
  const Frag<BM, BN> f;
#pragma unroll
  for (int nt = 0; nt < BN / 16; ++nt) {
    const int k = n0 + f.col(nt);
    if (k >= g.K) continue;
    const bool pair = k + 1 < g.K;
    const typename Epi::Channels ch = epi.channels(k, pair);
#pragma unroll
    for (int mt = 0; mt < BM / 32; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = m0 + f.row(mt, half);
        if (m >= g.M) continue;
        float v[2] = {acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]};
        put<T>(Y, g, epi, ch, m, k, pair, v);
      }
  }
}

// Split-K across a cluster of SPLIT blocks (sm_90): each block of the cluster reduced its share of
// the taps for the same output tile. Each writes its partial tile to its own shared memory (fp32
// [BM][BN + 8]: row r starts 32 bytes past row r - 1 in the bank window, so a warp's float2
// stores of eight rows fill 128 distinct bytes per phase), then block q of the cluster sums rows
// q * BM / SPLIT .. of every block's tile over distributed shared memory and runs the epilogue on
// them. No workspace in global memory and no second launch: the partials never leave the chip.
template <int BN> constexpr int acc_ld() { return BN + 8; }

template <class T, int BM, int BN, int SPLIT, class Epi>
__device__ __forceinline__ void epilogue_cluster(float* tile, typename T::raw* __restrict__ Y, const Geom& g,
                                                 const Epi& epi, const float (&acc)[BM / 32][BN / 16][4], int m0,
                                                 int n0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int LD = acc_ld<BN>(), ROWS = BM / SPLIT;
  const Frag<BM, BN> f;
#pragma unroll
  for (int mt = 0; mt < BM / 32; ++mt)
#pragma unroll
    for (int nt = 0; nt < BN / 16; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(tile + f.row(mt, half) * LD + f.col(nt)) =
            make_float2(acc[mt][nt][half * 2], acc[mt][nt][half * 2 + 1]);
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();   // every block's partial tile written
  const int q0 = (int)cluster.block_rank() * ROWS;
  for (int i = threadIdx.x; i < ROWS * (BN / 2); i += THREADS) {
    const int r = q0 + i / (BN / 2), c = (i % (BN / 2)) * 2, m = m0 + r, k = n0 + c;
    float v[2] = {0.f, 0.f};
#pragma unroll
    for (int q = 0; q < SPLIT; ++q) {
      const float2 part = *reinterpret_cast<const float2*>(cluster.map_shared_rank(tile, q) + r * LD + c);
      v[0] += part.x;
      v[1] += part.y;
    }
    if (m < g.M && k < g.K) put<T>(Y, g, epi, epi.channels(k, k + 1 < g.K), m, k, k + 1 < g.K, v);
  }
  cluster.sync();   // no block leaves while another still reads its tile
#else
  __trap();   // split_for splits only where clusters launch: compiled here for an older arch
#endif
}

// One output tile, rows m0 .. m0 + BM, channels n0 .. n0 + BN; with SPLIT > 1, block z of the
// cluster (blockIdx.z) reduces k-blocks [kbs * z / SPLIT, kbs * (z + 1) / SPLIT).
template <class T, int BM, int BN, int STAGES, int SPLIT, bool KRSC, class Epi>
__global__ void __launch_bounds__(THREADS)
conv_kernel(const typename T::raw* __restrict__ X, const typename T::raw* __restrict__ Wt,
            typename T::raw* __restrict__ Y, const Geom g, const Epi epi) {
  static_assert(BM % 32 == 0 && BN % 32 == 0 && BM <= 128 && BN <= 128, "tiles of 32-128 rows / columns");
  static_assert(BM % SPLIT == 0, "a cluster splits the tile's rows for its epilogue");
  extern __shared__ __align__(128) unsigned char smem[];
  typedef typename T::raw raw;
  raw* s = reinterpret_cast<raw*>(smem);
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, kbs = g.R * g.S * (g.C / BK);
  const int kb0 = (int)((int64_t)kbs * blockIdx.z / SPLIT), kb1 = (int)((int64_t)kbs * (blockIdx.z + 1) / SPLIT);
  Row rows[BM / 32];
  rows_of<BM>(g, m0, rows);
  float acc[BM / 32][BN / 16][4] = {};
  Gather<T, BN> wv;   // KCRS: stage next's weights, in flight during stage kb's MMAs
  const auto stage = [&](int kb) { return s + ((kb - kb0) % STAGES) * stage_elems<BM, BN>(); };
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (kb0 + st < kb1) {
      raw* t = stage(kb0 + st);
      load_a<T, BM>(t, X, g, rows, kb0 + st);
      if (KRSC) {
        load_b_krsc<T, BN>(t + BM * LDS, Wt, g, n0, kb0 + st);
      } else {
        wv.fetch(Wt, g, n0, kb0 + st);
        wv.store(t + BM * LDS);
      }
    }
    pw::cp_commit();   // one group per stage, empty ones included: the wait below counts groups
  }
  for (int kb = kb0; kb < kb1; ++kb) {
    pw::cp_wait<STAGES - 2>();
    __syncthreads();   // stage kb landed for every thread; stage kb - 1 is free for the next load
    const int next = kb + STAGES - 1;
    if (next < kb1) {
      raw* t = stage(next);
      load_a<T, BM>(t, X, g, rows, next);
      if (KRSC) load_b_krsc<T, BN>(t + BM * LDS, Wt, g, n0, next);
      else wv.fetch(Wt, g, n0, next);
    }
    pw::cp_commit();
    const raw* t = stage(kb);
    mma_stage<T, BM, BN>(t, t + BM * LDS, acc);
    // the slot of stage next was read at kb - 1, before this iteration's barrier; its readers
    // wait at iteration next's barrier
    if (!KRSC && next < kb1) wv.store(stage(next) + BM * LDS);
  }
  pw::cp_wait<0>();
  if constexpr (SPLIT == 1) {
    epilogue_regs<T, BM, BN>(Y, g, epi, acc, m0, n0);
  } else {
    __syncthreads();   // every warp's last MMAs done: the pipeline's memory holds the partial tile
    epilogue_cluster<T, BM, BN, SPLIT>(reinterpret_cast<float*>(smem), Y, g, epi, acc, m0, n0);
  }
}

// The epilogue of a conv2d -> [conv bias] -> [batch norm (inference)] -> [+ residual] -> [ReLU]
// site: V is the per-channel vectors' type, a null vector is absent (gamma 1, beta 0, mean 0,
// var 1 - eps, bias 0). Batch norm as (y - mean) * (gamma * rsqrt(var + eps)) + beta, from the raw
// statistics in every call (no fold kernel, no cached fold: a parameter written through p.data is
// read as it is now). The residual is like Y (channels-last [N, P, Q, K] in memory).
template <class T, class V, bool RELU>
struct BnEpi {
  const typename V::raw *gamma, *beta, *mean, *var, *bias;
  const typename T::raw* res;
  float eps;

  struct Channels {   // per channel j of the pair: y = (round(acc) + bias - mean) * scale + beta
    float center[2], scale[2], beta[2];
  };

  __device__ __forceinline__ float at(const typename V::raw* v, int k, float absent) const {
    return v != nullptr ? V::to_f(v[k]) : absent;
  }

  __device__ __forceinline__ Channels channels(int k, bool pair) const {
    Channels c;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int kj = j == 0 || pair ? k + j : k;
      const bool bn = var != nullptr;
      c.center[j] = at(mean, kj, 0.f) - at(bias, kj, 0.f);
      c.scale[j] = bn ? at(gamma, kj, 1.f) * rsqrtf(V::to_f(var[kj]) + eps) : 1.f;
      c.beta[j] = at(beta, kj, 0.f);
    }
    return c;
  }

  __device__ __forceinline__ void apply(const Channels& c, float (&v)[2], int64_t at_, bool pair) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (j == 1 && !pair) break;
      float y = (T::round(v[j]) - c.center[j]) * c.scale[j] + c.beta[j];
      if (res != nullptr) y += T::to_f(res[at_ + j]);
      v[j] = RELU ? fmaxf(y, 0.f) : y;
    }
  }
};

// Whether this device launches clusters (sm_90 on): split-K needs them (epilogue_cluster).
inline bool clusters_ok() {
  static int cached[64] = {0};   // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (!cached[dev]) {
    int v = 0;
    cached[dev] = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev) == cudaSuccess && v ? 2 : 1;
  }
  return cached[dev] == 2;
}

// How many blocks share a tile's reduction: where the tiles alone give fewer than two blocks an SM
// (deep, narrow layers: C 512 at 7 x 7 and batch 16 is 56 tiles of 128 x 64 and 144 k-blocks on
// 132 SMs), double the split while each block keeps at least 8 k-blocks; at most 8, the portable
// cluster size.
inline int split_for(int64_t tiles, int kbs) {
  if (!clusters_ok()) return 1;
  const int64_t target = 2 * (int64_t)htam_sm_count();
  int split = 1;
  while (split < 8 && tiles * split < target && kbs / (2 * split) >= 8) split *= 2;
  return split;
}

template <class T, int BM, int BN, int STAGES, int SPLIT, bool KRSC, class Epi>
int launch_split(dim3 grid, const typename T::raw* X, const typename T::raw* Wt, typename T::raw* Y, const Geom& g,
                 const Epi& epi, cudaStream_t stream) {
  constexpr int smem = smem_bytes<T, BM, BN, STAGES>();
  static_assert(smem <= 48 * 1024, "a pipeline beyond 48 KB needs cudaFuncSetAttribute");
  static_assert(SPLIT == 1 || BM * acc_ld<BN>() * 4 <= smem, "the partial tile reuses the pipeline's memory");
  grid.z = SPLIT;
  if constexpr (SPLIT == 1) {
    conv_kernel<T, BM, BN, STAGES, 1, KRSC, Epi><<<grid, THREADS, smem, stream>>>(X, Wt, Y, g, epi);
    return (int)cudaGetLastError();
  } else {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = SPLIT;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, conv_kernel<T, BM, BN, STAGES, SPLIT, KRSC, Epi>, X, Wt, Y, g, epi);
  }
}

// The launch, after the checks a caller cannot skip: HTAM_ERR_SHAPE where the kernel does not
// apply (C not a multiple of 32, a pointer not 16-byte aligned, sizes beyond int32 rows). KRSC: w's
// layout (load_b_krsc or Gather).
template <class T, int BM, int BN, int STAGES, bool KRSC, class Epi>
int launch(const typename T::raw* X, const typename T::raw* Wt, typename T::raw* Y, const Geom& g, const Epi& epi,
           cudaStream_t stream) {
  if (g.C % BK != 0 || ((uintptr_t)X | (uintptr_t)Wt) % 16 != 0) return HTAM_ERR_SHAPE;
  if ((int64_t)g.N * g.P * g.Q != (int64_t)g.M || (int64_t)g.M + BM > INT32_MAX) return HTAM_ERR_SHAPE;
  if (g.M == 0 || g.K == 0) return HTAM_OK;
  const dim3 grid((unsigned)((g.M + BM - 1) / BM), (unsigned)((g.K + BN - 1) / BN));
  if (grid.y > 65535) return HTAM_ERR_SHAPE;
  switch (split_for((int64_t)grid.x * grid.y, g.R * g.S * (g.C / BK))) {
    case 8: return launch_split<T, BM, BN, STAGES, 8, KRSC>(grid, X, Wt, Y, g, epi, stream);
    case 4: return launch_split<T, BM, BN, STAGES, 4, KRSC>(grid, X, Wt, Y, g, epi, stream);
    case 2: return launch_split<T, BM, BN, STAGES, 2, KRSC>(grid, X, Wt, Y, g, epi, stream);
    default: return launch_split<T, BM, BN, STAGES, 1, KRSC>(grid, X, Wt, Y, g, epi, stream);
  }
}

// A conv site's call from htam_run's tensors: x (X), w (Wt), y (Y) and the epilogue's [K] vectors
// (vecs: gamma, beta, mean, var, bias; null where the region has none) and residual (res: like y, or
// null), checked as the kernel reads them, else HTAM_ERR_SHAPE: x, y and the residual channels-last,
// w channels-last or contiguous (either is read), in dtype code dt; the vectors
// contiguous, in vt.
struct Site {
  int sh, sw, ph, pw, dh, dw;   // stride, padding, dilation (H, W)
  float eps;                    // batch norm's
};

inline bool vector_ok(const HtamTensor* v, int64_t K, int vt) {
  return v == nullptr || (v->ndim == 1 && v->sizes[0] == K && v->strides[0] == 1 && v->dtype == vt && v->data != nullptr);
}

template <class T, class V, int BM, int BN, int STAGES, bool RELU>
int run_site(const HtamTensor& X, const HtamTensor& Wt, const HtamTensor& Y, const HtamTensor* const (&vecs)[5],
             const HtamTensor* res, int dt, int vt, const Site& site, cudaStream_t stream) {
  if (X.dtype != dt || Wt.dtype != dt || Y.dtype != dt) return HTAM_ERR_SHAPE;
  const bool krsc = htam_channels_last(Wt);
  if (!htam_channels_last(X) || !htam_channels_last(Y) || !(krsc || htam_contiguous(Wt))) return HTAM_ERR_SHAPE;
  if (X.sizes[1] != Wt.sizes[1] || Y.sizes[0] != X.sizes[0] || Y.sizes[1] != Wt.sizes[0]) return HTAM_ERR_SHAPE;
  const HtamTensor* const ts[] = {&X, &Wt, &Y};
  for (const HtamTensor* t : ts)
    for (int i = 0; i < 4; ++i)
      if (t->sizes[i] > INT32_MAX / 4) return HTAM_ERR_SHAPE;
  Geom g;
  g.N = (int)X.sizes[0]; g.C = (int)X.sizes[1]; g.H = (int)X.sizes[2]; g.W = (int)X.sizes[3];
  g.K = (int)Wt.sizes[0]; g.R = (int)Wt.sizes[2]; g.S = (int)Wt.sizes[3];
  g.sh = site.sh; g.sw = site.sw; g.ph = site.ph; g.pw = site.pw; g.dh = site.dh; g.dw = site.dw;
  g.P = (g.H + 2 * g.ph - g.dh * (g.R - 1) - 1) / g.sh + 1;
  g.Q = (g.W + 2 * g.pw - g.dw * (g.S - 1) - 1) / g.sw + 1;
  if (Y.sizes[2] != g.P || Y.sizes[3] != g.Q || (int64_t)g.N * g.P * g.Q > INT32_MAX / 2) return HTAM_ERR_SHAPE;
  g.M = g.N * g.P * g.Q;
  for (const HtamTensor* v : vecs)
    if (!vector_ok(v, g.K, vt)) return HTAM_ERR_SHAPE;
  if (res != nullptr) {
    if (res->dtype != dt || !htam_channels_last(*res) || res->data == nullptr) return HTAM_ERR_SHAPE;
    for (int i = 0; i < 4; ++i)
      if (res->sizes[i] != Y.sizes[i]) return HTAM_ERR_SHAPE;
  }
  typedef typename V::raw vraw;
  typedef typename T::raw raw;
  const auto ptr = [](const HtamTensor* v) { return v != nullptr ? (const vraw*)v->data : nullptr; };
  const BnEpi<T, V, RELU> epi{ptr(vecs[0]), ptr(vecs[1]), ptr(vecs[2]), ptr(vecs[3]), ptr(vecs[4]),
                              res != nullptr ? (const raw*)res->data : nullptr, site.eps};
  return krsc ? launch<T, BM, BN, STAGES, true>((const raw*)X.data, (const raw*)Wt.data, (raw*)Y.data, g, epi, stream)
              : launch<T, BM, BN, STAGES, false>((const raw*)X.data, (const raw*)Wt.data, (raw*)Y.data, g, epi, stream);
}
}  // namespace ig
