// ---- group norm over channels-last activations (gn_cl.py) ----
// x, y: [N, P, C] in memory: an [N, C, H, W] tensor stored N, H, W, C (P = H * W pixels), or the
// [N, H * W, C] tokens a UNet's attention reads from it. G groups of CG = C / G adjacent channels;
// weight, bias: [C] or absent. y = EPI(round((x - mean_g) * rstd_g * weight + bias)), the statistics
// in fp32 over each (image, group) as torch's group_norm takes them (biased variance).
//
// Why not the row kernel: a group's elements are CG channels out of every pixel's C, so a block
// per group reads runs of CG elements (8 bytes for CG = 4 in bf16) C apart. Here a block reads
// whole pixels (C contiguous channels, 16-byte vectors) and keeps every group's statistics.
//
// Two launches, deterministic (fixed summation order, no atomics), or one (gn_cl_onepass, below)
// where an image's channel slab fits a cluster's registers:
//  gn_cl_stats  block (s, n): pixels [s * pp, (s + 1) * pp) of image n, every channel. Threads are
//               LANES channel vectors (C / VEC) x ROWS pixel rows; each sums y = x - K_g and y^2
//               per channel of its vector, the block sums them per group into one (S1, S2) for
//               (n, s, g) in the workspace.
//  gn_cl_apply  block (s, n): loads image n's S x G partials into shared memory, sums each group's
//               in chunk order (a warp per group: mean, rstd), folds weight and bias into a scale
//               and shift per channel, then writes its pixels.
// Shifted sums, not Welford: K_g = x[n, pixel 0, first channel of g], one of the group's own
// values, and var = S2 / count - (S1 / count)^2 loses about ((K_g - mean) / std)^2 ulps of fp32
// to cancellation: nothing where K_g is a typical value, whatever the mean (a mean of 1000 and a
// std of 1 normalizes within 2e-4 of float64: gpu test), 2^-13 of the variance for a K_g 30 stds
// out. (Sums of x and x^2 without a shift, as fast NHWC group norms often take them, lose
// (mean / std)^2.) Every merge is then an addition. Welford's merges (a division and a dependent
// chain of shuffles per level) made both launches latency-bound: 9-12 us each on an H200 for
// 4-8 MB tensors (ncu: 3% of DRAM bandwidth, 8 cycles between a warp's instructions).
// Every apply block sums the same partials again: one L2 round trip per block, where a merge by
// the stats pass's last block (atomics) ran serially after all of them. The pixels' second read
// (apply) is mostly an L2 hit: the stats pass read them just before.

struct GnShape {
  int64_t P;        // pixels per image
  int C, G;         // channels, groups
  int S;            // pixel chunks per image (stats blocks per image)
  int64_t pp;       // pixels per chunk
  int rows;         // pixel rows per block (threads: C / VEC lanes x rows, rounded up to warps)
  float eps;
};

__device__ __forceinline__ float gn_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += shfl_x(v, o);
  return v;
}

// A warp per group sums the (row, channel) sums a block left in shared memory ([rows][ld] S1s,
// then [rows][ld] S2s; group g's channels are g * cg .. g * cg + cg - 1 of a row) for groups
// 0 .. ng - 1, in a fixed order; lane 0 of the group's warp gets done(g, S1, S2).
template <class Done>
__device__ __forceinline__ void gn_group_sums(const float* sm, int rows, int ld, int cg, int ng, Done done) {
  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int g = warp; g < ng; g += warps) {
    float a = 0.f, b = 0.f;
    for (int i = wl; i < rows * cg; i += 32) {
      const int at = (i / cg) * ld + g * cg + i % cg;
      a += sm[at];
      b += sm[rows * ld + at];
    }
    a = gn_warp_sum(a);
    b = gn_warp_sum(b);
    if (wl == 0) done(g, a, b);
  }
}

// A thread's shifted sums over VEC channels: d = v - k, s1 += d, s2 += d * d
template <int VEC>
__device__ __forceinline__ void gn_add_shifted(const float (&v)[VEC], const float (&k)[VEC], float (&s1)[VEC],
                                               float (&s2)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float d = v[j] - k[j];
    s1[j] += d;
    s2[j] = fmaf(d, d, s2[j]);
  }
}

// A thread's sums into the block's table for gn_group_sums: [rows][ld] S1s, then [rows][ld] S2s
template <int VEC>
__device__ __forceinline__ void gn_store_sums(float* sm, int rows, int row, int ld, int col, const float (&s1)[VEC],
                                              const float (&s2)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    sm[row * ld + col + j] = s1[j];
    sm[(rows + row) * ld + col + j] = s2[j];
  }
}

// K_g of image n, channel c's group (gn_cl_stats and gn_cl_apply read the same element)
template <class DT>
__device__ __forceinline__ float gn_shift(const typename DT::raw* x, const GnShape& s, int n, int c) {
  const int cg = s.C / s.G;
  return DT::to_f(x[(int64_t)n * s.P * s.C + (c / cg) * cg]);
}

// blockDim.x = round_up(lanes * rows, 32); dynamic shared memory: gn_stats_smem(C, rows), and
// gn_apply_smem(S, G) for the apply pass. The workspace holds the partials [N][S][G] x (S1, S2).
static inline size_t gn_stats_smem(int C, int rows) { return (size_t)rows * C * 2 * sizeof(float); }
static inline size_t gn_apply_smem(int S, int G) { return ((size_t)S * G * 2 + (size_t)G * 2) * sizeof(float); }
static const size_t kGnApplySmem = 40u << 10;

// U: pixels a thread loads before it uses them (loads in flight per thread)
template <class DT, int VEC, int U, bool NC>
__global__ void gn_cl_stats(const typename DT::raw* __restrict__ x, GnShape s, float* __restrict__ part) {
  extern __shared__ float gn_sm[];      // [rows][C] S1s, then [rows][C] S2s
  const int lanes = s.C / VEC, rows = s.rows;
  const int lane = threadIdx.x % lanes, row = threadIdx.x / lanes;
  const int n = blockIdx.y, chunk = blockIdx.x;
  const int64_t p0 = chunk * s.pp, p1 = min(s.P, p0 + s.pp);
  if (row < rows) {
    float k[VEC], s1[VEC], s2[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      k[j] = gn_shift<DT>(x, s, n, lane * VEC + j);
      s1[j] = s2[j] = 0.f;
    }
    const typename DT::raw* base = x + ((int64_t)n * s.P) * s.C + lane * VEC;
    for (int64_t p = p0 + row; p < p1; p += (int64_t)rows * U) {
      float v[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (p + u * rows < p1) ldv<DT, VEC, NC>(base + (p + u * rows) * s.C, v[u]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (p + u * rows >= p1) break;
        gn_add_shifted(v[u], k, s1, s2);
      }
    }
    gn_store_sums(gn_sm, rows, row, s.C, lane * VEC, s1, s2);
  }
  __syncthreads();
  gn_group_sums(gn_sm, rows, s.C, s.C / s.G, s.G, [&](int g, float a, float b) {
    float* w = part + (((int64_t)n * s.S + chunk) * s.G + g) * 2;
    w[0] = a; w[1] = b;
  });
}

// EPI: the value after the norm's rounding to DT (torch's group_norm output) -> the stored value
struct GnIdentity { static __device__ __forceinline__ float apply(float v) { return v; } };
struct GnSilu { static __device__ __forceinline__ float apply(float v) { return v / (1.f + expf(-v)); } };
// SFU exp and division: ~2 ulp of fp32, below a 2-byte output's rounding (gn_cl.py: half types only)
struct GnSiluFast { static __device__ __forceinline__ float apply(float v) { return __fdividef(v, 1.f + __expf(-v)); } };

// WT: the weight's and bias's dtype tag (each may be absent: nullptr)
template <class DT, class WT, class EPI, int VEC, int U, bool NC>
__global__ void gn_cl_apply(const typename DT::raw* __restrict__ x, const typename WT::raw* __restrict__ weight,
                            const typename WT::raw* __restrict__ bias, GnShape s, const float* __restrict__ part,
                            typename DT::raw* __restrict__ y) {
  extern __shared__ float gn_sm[];      // image n's partials [S][G][2], then [G] x (mean, rstd)
  const int n = blockIdx.y, chunk = blockIdx.x, cg = s.C / s.G;
  const int total = s.S * s.G * 2;
  const float* src = part + (int64_t)n * total;
  // LD loads in flight per thread: the loop's trip count is a run-time value, so without the
  // batch each load waits out the one before it (an L2 round trip each)
  constexpr int LD = 8;
  for (int i0 = threadIdx.x; i0 < total; i0 += blockDim.x * LD) {
    float v[LD];
#pragma unroll
    for (int j = 0; j < LD; ++j) v[j] = i0 + j * (int)blockDim.x < total ? __ldcg(src + i0 + j * blockDim.x) : 0.f;
#pragma unroll
    for (int j = 0; j < LD; ++j)
      if (i0 + j * (int)blockDim.x < total) gn_sm[i0 + j * blockDim.x] = v[j];
  }
  __syncthreads();
  float* stat = gn_sm + total;
  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float count = (float)s.P * (float)cg;
  for (int g = warp; g < s.G; g += warps) {
    float a = 0.f, b = 0.f;
    for (int k = wl; k < s.S; k += 32) {
      a += gn_sm[(k * s.G + g) * 2];
      b += gn_sm[(k * s.G + g) * 2 + 1];
    }
    a = gn_warp_sum(a) / count;
    b = gn_warp_sum(b) / count;
    if (wl == 0) {
      stat[g * 2] = gn_shift<DT>(x, s, n, g * cg) + a;
      stat[g * 2 + 1] = rsqrtf(fmaxf(b - a * a, 0.f) + s.eps);
    }
  }
  __syncthreads();
  const int lanes = s.C / VEC, rows = s.rows;
  const int lane = threadIdx.x % lanes, row = threadIdx.x / lanes;
  if (row >= rows) return;
  float scale[VEC], shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int c = lane * VEC + j, g = c / cg;
    const float a = stat[g * 2 + 1] * (weight ? WT::to_f(weight[c]) : 1.f);
    scale[j] = a;
    shift[j] = (bias ? WT::to_f(bias[c]) : 0.f) - stat[g * 2] * a;
  }
  const int64_t p0 = chunk * s.pp, p1 = min(s.P, p0 + s.pp);
  const int64_t off = ((int64_t)n * s.P) * s.C + lane * VEC;
  for (int64_t p = p0 + row; p < p1; p += (int64_t)rows * U) {
    float v[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (p + u * rows < p1) ldv<DT, VEC, NC>(x + off + (p + u * rows) * s.C, v[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (p + u * rows >= p1) break;
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[u][j] = EPI::apply(DT::round(fmaf(v[u][j], scale[j], shift[j])));
      stv<DT, VEC>(y + off + (p + u * rows) * s.C, v[u]);
    }
  }
}

// ---- one launch: a cluster per (image, channel slab), sm_90 ----
// Where an image's slab of SC channels fits in a cluster's registers (every size of the diffusion
// UNet's norms at 8 images): block r of the cluster (blockIdx.x, CL blocks) holds pixels
// [r * ppb, (r + 1) * ppb) of channels [c0, c0 + SC) of image n (blockIdx.z) in registers, PX
// pixels a thread; sums them per group as gn_cl_stats does; the cluster's blocks read each
// other's sums over distributed shared memory, in rank order (each computes the same statistics,
// deterministically); then each normalizes what it holds. x is read once and y written once: no
// workspace, no second launch, no second pass over the pixels. SC: whole groups and whole
// vectors (gn_cl.py's slab); threads: SC / VEC lanes x rows, rounded up to warps.
struct GnSlab {
  int sc;           // channels per slab
  int rows;         // pixel rows per block
  int threads;
  int64_t ppb;      // pixels per block
};

static inline size_t gn_onepass_smem(const GnSlab& b, int cg) {
  return ((size_t)b.rows * b.sc * 2 + (size_t)(b.sc / cg) * 4) * sizeof(float);
}

template <class DT, class WT, class EPI, int VEC, int PX, int CL>
__global__ void __launch_bounds__(512) __cluster_dims__(CL, 1, 1)
gn_cl_onepass(const typename DT::raw* __restrict__ x, const typename WT::raw* __restrict__ weight,
              const typename WT::raw* __restrict__ bias, GnShape s, GnSlab b, typename DT::raw* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int BYTES = (int)sizeof(typename DT::raw) * VEC, W = BYTES < 4 ? 1 : BYTES / 4;
  extern __shared__ float gn_sm[];      // [rows][sc] S1s, [rows][sc] S2s, [groups] sums, [groups] stats
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int lanes = b.sc / VEC, rows = b.rows, cg = s.C / s.G, ng = b.sc / cg;
  const int lane = threadIdx.x % lanes, row = threadIdx.x / lanes;
  const int n = blockIdx.z, c0 = blockIdx.y * b.sc, cl = c0 + lane * VEC;
  const int64_t p0 = (int64_t)blockIdx.x * b.ppb, p1 = min(s.P, p0 + b.ppb);
  const int64_t img = (int64_t)n * s.P * s.C;
  unsigned w[PX][W];
  if (row < rows) {
    float k[VEC], s1[VEC], s2[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      k[j] = gn_shift<DT>(x, s, n, cl + j);
      s1[j] = s2[j] = 0.f;
    }
#pragma unroll
    for (int u = 0; u < PX; ++u) {
      const int64_t p = p0 + row + (int64_t)u * rows;
      if (p < p1) ldw<DT, VEC, false>(x + img + p * s.C + cl, w[u]);
    }
#pragma unroll
    for (int u = 0; u < PX; ++u) {
      if (p0 + row + (int64_t)u * rows >= p1) break;
      float v[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = DT::from_word(w[u][j / DT::PER_WORD], j % DT::PER_WORD);
      gn_add_shifted(v, k, s1, s2);
    }
    gn_store_sums(gn_sm, rows, row, b.sc, lane * VEC, s1, s2);
  }
  __syncthreads();
  float* sums = gn_sm + 2 * rows * b.sc;     // [ng] x (S1, S2): this block's
  float* stat = sums + 2 * ng;               // [ng] x (mean, rstd)
  gn_group_sums(gn_sm, rows, b.sc, cg, ng, [&](int g, float a, float c) { sums[g * 2] = a; sums[g * 2 + 1] = c; });
  cluster.sync();                            // every block's sums written
  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31, warps = blockDim.x >> 5;
  const float count = (float)s.P * (float)cg;
  for (int g = warp; g < ng; g += warps) {
    float a = 0.f, c = 0.f;
    if (wl < CL) {
      const float* peer = cluster.map_shared_rank(sums, wl);
      a = peer[g * 2];
      c = peer[g * 2 + 1];
    }
    a = gn_warp_sum(a) / count;
    c = gn_warp_sum(c) / count;
    if (wl == 0) {
      stat[g * 2] = gn_shift<DT>(x, s, n, c0 + g * cg) + a;
      stat[g * 2 + 1] = rsqrtf(fmaxf(c - a * a, 0.f) + s.eps);
    }
  }
  cluster.sync();                            // no block leaves while another reads its sums; stat written
  if (row >= rows) return;
  float scale[VEC], shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int g = (lane * VEC + j) / cg;
    const float a = stat[g * 2 + 1] * (weight ? WT::to_f(weight[cl + j]) : 1.f);
    scale[j] = a;
    shift[j] = (bias ? WT::to_f(bias[cl + j]) : 0.f) - stat[g * 2] * a;
  }
#pragma unroll
  for (int u = 0; u < PX; ++u) {
    const int64_t p = p0 + row + (int64_t)u * rows;
    if (p >= p1) break;
    float v[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      v[j] = EPI::apply(DT::round(fmaf(DT::from_word(w[u][j / DT::PER_WORD], j % DT::PER_WORD), scale[j], shift[j])));
    stv<DT, VEC>(y + img + p * s.C + cl, v);
  }
#else
  __trap();   // gn_cl_run launches it on sm_90 and later only
#endif
}

static inline bool htam_has_clusters() {
  static int major[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (!major[dev]) cudaDeviceGetAttribute(&major[dev], cudaDevAttrComputeCapabilityMajor, dev);
  return major[dev] >= 9;
}

// ---- host ----
// The workspaces: one per (device, stream), so that two streams never share one. A device's
// kGnSlots slices of kGnWs bytes are allocated together by its first call (keep that call outside
// CUDA graph capture); a stream seen later, as a graph's capture stream, takes a free slice with
// no allocation.
static const size_t kGnWs = 2u << 20;
static const int kGnSlots = 8;
static float* htam_gn_ws(cudaStream_t stream) {
  struct Device { char* base; cudaStream_t streams[kGnSlots]; int used; };
  static Device devices[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return nullptr;
  Device& d = devices[dev];
  if (d.base == nullptr) {
    void* p = nullptr;
    if (cudaMalloc(&p, kGnWs * kGnSlots) != cudaSuccess) { cudaGetLastError(); return nullptr; }
    d.base = (char*)p;
  }
  for (int i = 0; i < d.used; ++i)
    if (d.streams[i] == stream) return (float*)(d.base + i * kGnWs);
  if (d.used == kGnSlots) return nullptr;
  d.streams[d.used] = stream;
  return (float*)(d.base + d.used++ * kGnWs);
}

// Chunks per image: about `waves` blocks per SM over all images, each chunk at least `rows`
// pixels, an image's partials within the apply pass's shared memory and all of them within the
// workspace. 0: none fits.
static inline int gn_chunks(int64_t N, int64_t P, int G, int rows, int waves) {
  int64_t s = std::max<int64_t>(1, (int64_t)htam_sm_count() * waves / std::max<int64_t>(N, 1));
  s = std::min<int64_t>(s, std::max<int64_t>(1, P / rows));
  s = std::min<int64_t>(s, 65535);
  while (s > 0 && (gn_apply_smem((int)s, G) > kGnApplySmem || N * s * G * 2 * 4 > (int64_t)kGnWs)) s /= 2;
  return (int)s;
}
// The launches for an [N, P, C] x and y the entry has checked (dtype, layout, C): chunking, the
// stream's workspace, both kernels. rows: pixel rows per block; threads: gn_cl.py's block size.
// PX > 0: the one-launch kernel (PX pixels a thread, slab b) where this call's sizes fit it on
// an sm_90 device, else the two launches.
template <class DT, class WT, class EPI, int VEC, int U, bool NC, int PX = 0, int CL = 8>
static int gn_cl_run(const typename DT::raw* x, const typename WT::raw* weight, const typename WT::raw* bias,
                     typename DT::raw* y, int64_t N, GnShape s, int threads, int waves, GnSlab b, cudaStream_t stream) {
  if (N == 0 || s.P == 0) return HTAM_OK;
  if (!htam_aligned(x, VEC * sizeof(typename DT::raw)) || !htam_aligned(y, VEC * sizeof(typename DT::raw)))
    return HTAM_ERR_SHAPE;
  if constexpr (PX > 0) {
    b.ppb = (s.P + CL - 1) / CL;
    if (b.ppb <= (int64_t)b.rows * PX && N <= 65535 && htam_has_clusters()) {
      const dim3 grid(CL, s.C / b.sc, (unsigned)N);
      gn_cl_onepass<DT, WT, EPI, VEC, PX, CL><<<grid, b.threads, gn_onepass_smem(b, s.C / s.G), stream>>>(
          x, weight, bias, s, b, y);
      HTAM_CHECK_LAUNCH();
      return HTAM_OK;
    }
  }
  s.S = gn_chunks(N, s.P, s.G, s.rows, waves);
  if (s.S == 0 || N > 65535) return HTAM_ERR_SHAPE;     // (an image's partials fit only in the workspace)
  s.pp = (s.P + s.S - 1) / s.S;
  s.S = (int)((s.P + s.pp - 1) / s.pp);     // no empty chunk
  float* ws = htam_gn_ws(stream);
  if (ws == nullptr) return HTAM_ERR_SHAPE;
  const dim3 grid((unsigned)s.S, (unsigned)N);
  gn_cl_stats<DT, VEC, U, NC><<<grid, threads, gn_stats_smem(s.C, s.rows), stream>>>(x, s, ws);
  HTAM_CHECK_LAUNCH();
  gn_cl_apply<DT, WT, EPI, VEC, U, NC><<<grid, threads, gn_apply_smem(s.S, s.G), stream>>>(x, weight, bias, s, ws, y);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
// ---- end group norm channels-last ----
