// torch_htam expert: rowwise RowParams(tpr=128, rows_per_block=4, vec=4, nv=2, online=False, welford=False, nc=False, fast=False, waves=0)
// ---- torch_htam expert prelude: dtype traits, vector access, math helpers, group reductions ----
#pragma nv_diag_suppress 177
#include "htam_abi.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

// Storage is raw bits (float or uint16) so loads/stores never depend on the half types' ctors.
struct F32 {
  typedef float raw;
  static __device__ __forceinline__ float to_f(raw r) { return r; }
  static __device__ __forceinline__ raw from_f(float x) { return x; }
  static __device__ __forceinline__ float round(float x) { return x; }
};
struct BF16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float to_f(raw r) { return __uint_as_float(((unsigned)r) << 16); }
  static __device__ __forceinline__ raw from_f(float x) { return __bfloat16_as_ushort(__float2bfloat16(x)); }
  static __device__ __forceinline__ float round(float x) { return to_f(from_f(x)); }
};
struct F16 {
  typedef unsigned short raw;
  static __device__ __forceinline__ float to_f(raw r) { return __half2float(__ushort_as_half(r)); }
  static __device__ __forceinline__ raw from_f(float x) { return __half_as_ushort(__float2half(x)); }
  static __device__ __forceinline__ float round(float x) { return to_f(from_f(x)); }
};

template <int BYTES> struct RawVec;
template <> struct RawVec<2> { typedef unsigned short T; };
template <> struct RawVec<4> { typedef unsigned int T; };
template <> struct RawVec<8> { typedef uint2 T; };
template <> struct RawVec<16> { typedef uint4 T; };

// Scalar load through the read-only path when NC (inputs are never written by the kernel).
template <class DT, bool NC>
__device__ __forceinline__ float ld1(const typename DT::raw* p) {
  if (NC) return DT::to_f(__ldg(p));
  return DT::to_f(*p);
}

// VEC consecutive elements; p must be aligned to VEC * sizeof(raw) (the host checks before choosing VEC > 1).
template <class DT, int VEC, bool NC>
__device__ __forceinline__ void ldv(const typename DT::raw* p, float* out) {
  typedef typename DT::raw E;
  constexpr int BYTES = (int)sizeof(E) * VEC;
  constexpr int CH = BYTES > 16 ? 16 : BYTES;
  constexpr int PER = CH / (int)sizeof(E);
  typedef typename RawVec<CH>::T R;
#pragma unroll
  for (int k = 0; k < BYTES / CH; ++k) {
    const R* rp = reinterpret_cast<const R*>(p) + k;
    R raw;
    if (NC) raw = __ldg(rp); else raw = *rp;
    E e[PER];
    memcpy(e, &raw, CH);
#pragma unroll
    for (int i = 0; i < PER; ++i) out[k * PER + i] = DT::to_f(e[i]);
  }
}

template <class DT, int VEC>
__device__ __forceinline__ void stv(typename DT::raw* p, const float* v) {
  typedef typename DT::raw E;
  constexpr int BYTES = (int)sizeof(E) * VEC;
  constexpr int CH = BYTES > 16 ? 16 : BYTES;
  constexpr int PER = CH / (int)sizeof(E);
  typedef typename RawVec<CH>::T R;
#pragma unroll
  for (int k = 0; k < BYTES / CH; ++k) {
    E e[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) e[i] = DT::from_f(v[k * PER + i]);
    R raw;
    memcpy(&raw, e, CH);
    reinterpret_cast<R*>(p)[k] = raw;
  }
}

__device__ __forceinline__ float htam_gelu_erf(float x) {
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}
__device__ __forceinline__ float htam_gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
// tanh(u) = 1 - 2 / (exp(2u) + 1): SFU exp, accurate to ~1e-6 relative away from 0 (fp32-safe
// for gelu because the 0.5 * x * (1 + tanh) form damps the error near 0).
__device__ __forceinline__ float htam_gelu_tanh_fast(float x) {
  float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  float t = 1.f - __fdividef(2.f, __expf(2.f * u) + 1.f);
  return 0.5f * x * (1.f + t);
}
__device__ __forceinline__ float htam_tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float htam_gelu_tanh_approx(float x) {
  return 0.5f * x * (1.f + htam_tanh_approx(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

// ---- reductions over a group of TPR threads (TPR a power of two; TPR > 32 means the whole block)
struct SumOp { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MinOp { __device__ __forceinline__ float operator()(float a, float b) const { return fminf(a, b); } };

// online softmax state: running max m and sum s of exp(x - m)
struct SoftmaxState { float m, s; };
__device__ __forceinline__ SoftmaxState sm_merge(SoftmaxState a, SoftmaxState b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;   // both empty: avoid exp(-inf - -inf) = nan
  SoftmaxState r;
  r.m = m;
  r.s = a.s * expf(a.m - m) + b.s * expf(b.m - m);
  return r;
}
struct SmOp { __device__ __forceinline__ SoftmaxState operator()(SoftmaxState a, SoftmaxState b) const { return sm_merge(a, b); } };

// Welford state: count n, mean, M2 = sum (x - mean)^2
struct WelfordState { float n, mean, m2; };
__device__ __forceinline__ WelfordState wf_merge(WelfordState a, WelfordState b) {
  float n = a.n + b.n;
  if (n == 0.f) return a;
  float d = b.mean - a.mean, fb = b.n / n;
  WelfordState r;
  r.n = n;
  r.mean = a.mean + d * fb;
  r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
  return r;
}
struct WfOp { __device__ __forceinline__ WelfordState operator()(WelfordState a, WelfordState b) const { return wf_merge(a, b); } };

__device__ __forceinline__ float shfl_x(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ SoftmaxState shfl_x(SoftmaxState v, int o) {
  SoftmaxState r; r.m = shfl_x(v.m, o); r.s = shfl_x(v.s, o); return r;
}
__device__ __forceinline__ WelfordState shfl_x(WelfordState v, int o) {
  WelfordState r; r.n = shfl_x(v.n, o); r.mean = shfl_x(v.mean, o); r.m2 = shfl_x(v.m2, o); return r;
}

// All TPR threads of the group get the result. NOTE: every thread of the block must call this the
// same number of times (the row loops keep trip counts block-uniform for that reason).
template <int TPR, class T, class Op>
__device__ __forceinline__ T group_reduce(T v, Op op, T identity) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1) v = op(v, shfl_x(v, o));
  if (TPR <= 32) return v;
  __shared__ T smem[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();                  // the previous reduction has finished reading smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < (TPR >> 5) ? smem[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_x(v, o));
  return v;
}

static inline int htam_sm_count() {
  static int cached[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (!cached[dev]) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    cached[dev] = n > 0 ? n : 132;
  }
  return cached[dev];
}

static inline bool htam_aligned(const void* p, int bytes) { return ((uintptr_t)p % (uintptr_t)bytes) == 0; }

// Iteration-space description built on the host from the run-time sizes (see ir.Access).
template <int NACC>
struct Space {
  int ndim;                          // after collapsing
  int64_t size[HTAM_MAX_DIMS];
  int64_t st[NACC > 0 ? NACC : 1][HTAM_MAX_DIMS];   // per access, elements per step of each dim
};

// Fill st[a][*] (over the iteration dims it_sizes) for one access; returns false on a size mismatch.
// dims[k] = iteration dim of input dim k (-1: must be size 1).
static inline bool htam_bind_dims(const HtamTensor& t, const int* dims, int nd, const int64_t* it_sizes,
                                  int it_nd, int64_t* st) {
  if (t.ndim != nd) return false;
  for (int d = 0; d < it_nd; ++d) st[d] = 0;
  for (int k = 0; k < nd; ++k) {
    if (dims[k] < 0) { if (t.sizes[k] != 1) return false; continue; }
    if (t.sizes[k] == 1) continue;
    if (t.sizes[k] != it_sizes[dims[k]]) return false;
    st[dims[k]] = t.strides[k];
  }
  return true;
}

static inline bool htam_contiguous(const HtamTensor& t) {
  int64_t acc = 1;
  for (int k = t.ndim - 1; k >= 0; --k) {
    if (t.sizes[k] != 1 && t.strides[k] != acc) return false;
    acc *= t.sizes[k];
  }
  return true;
}

// "flat": contiguous input read at the linear index; "suffix": repeats every numel(t) elements,
// so it must line up with a set of trailing iteration dims.
static inline bool htam_bind_flat(const HtamTensor& t, const int64_t* it_sizes, int it_nd, bool suffix,
                                  int64_t* st) {
  if (!htam_contiguous(t)) return false;
  int64_t want = htam_numel(&t), acc = 1;
  for (int d = it_nd - 1; d >= 0; --d) {
    st[d] = (acc < want || !suffix) ? acc : 0;
    if (acc < want || !suffix) acc *= it_sizes[d];
  }
  return acc == want;
}

// Merge adjacent iteration dims [d, d+1] when every access steps through them as one dim.
// keep_last: never merge the last dim (row kernels keep the row separate).
template <int NACC>
static inline void htam_collapse(Space<NACC>& s, int nacc, bool keep_last) {
  int nd = 0;
  int64_t size[HTAM_MAX_DIMS], st[NACC > 0 ? NACC : 1][HTAM_MAX_DIMS];
  for (int d = 0; d < s.ndim; ++d) {
    if (s.size[d] == 1 && !(keep_last && d == s.ndim - 1) && s.ndim > 1) continue;   // size-1 dims carry nothing
    bool merge = nd > 0 && !(keep_last && d == s.ndim - 1);
    for (int a = 0; merge && a < nacc; ++a)
      merge = st[a][nd - 1] == s.st[a][d] * s.size[d];
    if (merge) {
      size[nd - 1] *= s.size[d];
      for (int a = 0; a < nacc; ++a) st[a][nd - 1] = s.st[a][d];
    } else {
      size[nd] = s.size[d];
      for (int a = 0; a < nacc; ++a) st[a][nd] = s.st[a][d];
      ++nd;
    }
  }
  if (nd == 0) { size[0] = 1; for (int a = 0; a < nacc; ++a) st[a][0] = 0; nd = 1; }
  s.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    s.size[d] = size[d];
    for (int a = 0; a < nacc; ++a) s.st[a][d] = st[a][d];
  }
}
// ---- end prelude ----

// Largest element offset any access reaches (to pick 32-bit index math safely).
template <int NACC>
static inline int64_t htam_max_off(const Space<NACC>& s, int nacc) {
  int64_t m = 0;
  for (int a = 0; a < nacc; ++a) {
    int64_t o = 0;
    for (int d = 0; d < s.ndim; ++d) o += (s.size[d] - 1) * (s.st[a][d] < 0 ? -s.st[a][d] : s.st[a][d]);
    m = o > m ? o : m;
  }
  return m;
}

#include <algorithm>

#define NACC 4
#define TPR 128
#define BLOCK 128
template <int VEC, int NV>
__global__ void __launch_bounds__(BLOCK) row_kernel(Space<NACC> sp, int64_t rows, int ncol,
    const F32::raw* __restrict__ p0, const F32::raw* __restrict__ p1, const F32::raw* __restrict__ p2, const F32::raw* __restrict__ p3, F32::raw* __restrict__ o0, F32::raw* __restrict__ o1) {
  const int lane = threadIdx.x % TPR, group = threadIdx.x / TPR;
  const int64_t rpb = BLOCK / TPR;
  int64_t cs[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a) cs[a] = sp.st[a][sp.ndim - 1];
  // NOTE: the trip count is uniform over the block (rows past the end are clamped to the last row
  // and store nothing), so every thread reaches every shuffle and __syncthreads.
  for (int64_t rb = (int64_t)blockIdx.x * rpb; rb < rows; rb += (int64_t)gridDim.x * rpb) {
    const bool valid = rb + group < rows;
    const int64_t r = valid ? rb + group : rows - 1;
    int64_t ro[NACC];
    {
      int64_t rem = r;
#pragma unroll
      for (int a = 0; a < NACC; ++a) ro[a] = 0;
      for (int d = sp.ndim - 2; d >= 0; --d) {
        const int64_t i = rem % sp.size[d];
        rem /= sp.size[d];
#pragma unroll
        for (int a = 0; a < NACC; ++a) ro[a] += i * sp.st[a][d];
      }
    }

    if (NV > 0) {
      float x0[NV > 0 ? NV : 1][VEC]; float x1[NV > 0 ? NV : 1][VEC]; float x2[NV > 0 ? NV : 1][VEC]; float x3[NV > 0 ? NV : 1][VEC];
#pragma unroll
      for (int q = 0; q < NV; ++q) {
        const int c0 = (q * TPR + lane) * VEC;
        if (c0 < ncol) {
        if (VEC > 1 && cs[0] == 1) ldv<F32, VEC, false>(p0 + ro[0] + c0, x0[q]);
        else for (int e = 0; e < VEC; ++e) x0[q][e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p0 + ro[0] + (int64_t)(c0 + e) * cs[0]) : 0.f;
      if (VEC > 1 && cs[1] == 1) ldv<F32, VEC, false>(p1 + ro[1] + c0, x1[q]);
        else for (int e = 0; e < VEC; ++e) x1[q][e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p1 + ro[1] + (int64_t)(c0 + e) * cs[1]) : 0.f;
      if (VEC > 1 && cs[2] == 1) ldv<F32, VEC, false>(p2 + ro[2] + c0, x2[q]);
        else for (int e = 0; e < VEC; ++e) x2[q][e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p2 + ro[2] + (int64_t)(c0 + e) * cs[2]) : 0.f;
      if (VEC > 1 && cs[3] == 1) ldv<F32, VEC, false>(p3 + ro[3] + c0, x3[q]);
        else for (int e = 0; e < VEC; ++e) x3[q][e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p3 + ro[3] + (int64_t)(c0 + e) * cs[3]) : 0.f;
        }
      }

    float R0;
    {
      float acc = 0.f;

#pragma unroll
    for (int q = 0; q < NV; ++q) {
      const int c0 = (q * TPR + lane) * VEC;
      if (c0 < ncol) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (VEC > 1 && c0 + e >= ncol) break;
          const int c = c0 + e;
          (void)c;
          const float t0 = (x0[q][e] + x1[q][e]);
          acc = acc + t0;
        }

      }
    }
      R0 = group_reduce<TPR>(acc, SumOp(), 0.f);
    }

    float R1;
    {
      float acc = 0.f;

#pragma unroll
    for (int q = 0; q < NV; ++q) {
      const int c0 = (q * TPR + lane) * VEC;
      if (c0 < ncol) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (VEC > 1 && c0 + e >= ncol) break;
          const int c = c0 + e;
          (void)c;
          const float t0 = (x0[q][e] + x1[q][e]);
          const float t1 = (R0 / ((float)ncol));
          const float t2 = (t0 - t1);
          const float t3 = (t2 * t2);
          acc = acc + t3;
        }

      }
    }
      R1 = group_reduce<TPR>(acc, SumOp(), 0.f);
    }
    {
    float y0[VEC]; float y1[VEC];

#pragma unroll
    for (int q = 0; q < NV; ++q) {
      const int c0 = (q * TPR + lane) * VEC;
      if (c0 < ncol) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (VEC > 1 && c0 + e >= ncol) break;
          const int c = c0 + e;
          (void)c;
          const float t0 = (x0[q][e] + x1[q][e]);
          const float t1 = (R0 / ((float)ncol));
          const float t2 = (t0 - t1);
          const float t3 = (R1 / ((float)ncol));
          const float t4 = (t3 + 1e-05f);
          const float t5 = rsqrtf(t4);
          const float t6 = (t2 * t5);
          const float t7 = (t6 * x2[q][e]);
          const float t8 = (t7 + x3[q][e]);
          y0[e] = t0;
          y1[e] = t8;
        }
        if (valid) { if (VEC > 1) stv<F32, VEC>(o0 + r * ncol + c0, y0);
          else o0[r * ncol + c0] = F32::from_f(y0[0]); }
        if (valid) { if (VEC > 1) stv<F32, VEC>(o1 + r * ncol + c0, y1);
          else o1[r * ncol + c0] = F32::from_f(y1[0]); }
      }
    }
    }

    } else {

    float R0;
    {
      float acc = 0.f;

    for (int c0 = lane * VEC; c0 < ncol; c0 += TPR * VEC) {
      float x0[VEC]; float x1[VEC]; float x2[VEC]; float x3[VEC];
      if (VEC > 1 && cs[0] == 1) ldv<F32, VEC, false>(p0 + ro[0] + c0, x0);
      else for (int e = 0; e < VEC; ++e) x0[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p0 + ro[0] + (int64_t)(c0 + e) * cs[0]) : 0.f;
      if (VEC > 1 && cs[1] == 1) ldv<F32, VEC, false>(p1 + ro[1] + c0, x1);
      else for (int e = 0; e < VEC; ++e) x1[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p1 + ro[1] + (int64_t)(c0 + e) * cs[1]) : 0.f;
      if (VEC > 1 && cs[2] == 1) ldv<F32, VEC, false>(p2 + ro[2] + c0, x2);
      else for (int e = 0; e < VEC; ++e) x2[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p2 + ro[2] + (int64_t)(c0 + e) * cs[2]) : 0.f;
      if (VEC > 1 && cs[3] == 1) ldv<F32, VEC, false>(p3 + ro[3] + c0, x3);
      else for (int e = 0; e < VEC; ++e) x3[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p3 + ro[3] + (int64_t)(c0 + e) * cs[3]) : 0.f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (VEC > 1 && c0 + e >= ncol) break;
        const int c = c0 + e;
        (void)c;
          const float t0 = (x0[e] + x1[e]);
          acc = acc + t0;
      }

    }
      R0 = group_reduce<TPR>(acc, SumOp(), 0.f);
    }

    float R1;
    {
      float acc = 0.f;

    for (int c0 = lane * VEC; c0 < ncol; c0 += TPR * VEC) {
      float x0[VEC]; float x1[VEC]; float x2[VEC]; float x3[VEC];
      if (VEC > 1 && cs[0] == 1) ldv<F32, VEC, false>(p0 + ro[0] + c0, x0);
      else for (int e = 0; e < VEC; ++e) x0[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p0 + ro[0] + (int64_t)(c0 + e) * cs[0]) : 0.f;
      if (VEC > 1 && cs[1] == 1) ldv<F32, VEC, false>(p1 + ro[1] + c0, x1);
      else for (int e = 0; e < VEC; ++e) x1[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p1 + ro[1] + (int64_t)(c0 + e) * cs[1]) : 0.f;
      if (VEC > 1 && cs[2] == 1) ldv<F32, VEC, false>(p2 + ro[2] + c0, x2);
      else for (int e = 0; e < VEC; ++e) x2[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p2 + ro[2] + (int64_t)(c0 + e) * cs[2]) : 0.f;
      if (VEC > 1 && cs[3] == 1) ldv<F32, VEC, false>(p3 + ro[3] + c0, x3);
      else for (int e = 0; e < VEC; ++e) x3[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p3 + ro[3] + (int64_t)(c0 + e) * cs[3]) : 0.f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (VEC > 1 && c0 + e >= ncol) break;
        const int c = c0 + e;
        (void)c;
          const float t0 = (x0[e] + x1[e]);
          const float t1 = (R0 / ((float)ncol));
          const float t2 = (t0 - t1);
          const float t3 = (t2 * t2);
          acc = acc + t3;
      }

    }
      R1 = group_reduce<TPR>(acc, SumOp(), 0.f);
    }
    {
    float y0[VEC]; float y1[VEC];

    for (int c0 = lane * VEC; c0 < ncol; c0 += TPR * VEC) {
      float x0[VEC]; float x1[VEC]; float x2[VEC]; float x3[VEC];
      if (VEC > 1 && cs[0] == 1) ldv<F32, VEC, false>(p0 + ro[0] + c0, x0);
      else for (int e = 0; e < VEC; ++e) x0[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p0 + ro[0] + (int64_t)(c0 + e) * cs[0]) : 0.f;
      if (VEC > 1 && cs[1] == 1) ldv<F32, VEC, false>(p1 + ro[1] + c0, x1);
      else for (int e = 0; e < VEC; ++e) x1[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p1 + ro[1] + (int64_t)(c0 + e) * cs[1]) : 0.f;
      if (VEC > 1 && cs[2] == 1) ldv<F32, VEC, false>(p2 + ro[2] + c0, x2);
      else for (int e = 0; e < VEC; ++e) x2[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p2 + ro[2] + (int64_t)(c0 + e) * cs[2]) : 0.f;
      if (VEC > 1 && cs[3] == 1) ldv<F32, VEC, false>(p3 + ro[3] + c0, x3);
      else for (int e = 0; e < VEC; ++e) x3[e] = (VEC == 1 || c0 + e < ncol) ? ld1<F32, false>(p3 + ro[3] + (int64_t)(c0 + e) * cs[3]) : 0.f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (VEC > 1 && c0 + e >= ncol) break;
        const int c = c0 + e;
        (void)c;
          const float t0 = (x0[e] + x1[e]);
          const float t1 = (R0 / ((float)ncol));
          const float t2 = (t0 - t1);
          const float t3 = (R1 / ((float)ncol));
          const float t4 = (t3 + 1e-05f);
          const float t5 = rsqrtf(t4);
          const float t6 = (t2 * t5);
          const float t7 = (t6 * x2[e]);
          const float t8 = (t7 + x3[e]);
          y0[e] = t0;
          y1[e] = t8;
      }
        if (valid) { if (VEC > 1) stv<F32, VEC>(o0 + r * ncol + c0, y0);
          else o0[r * ncol + c0] = F32::from_f(y0[0]); }
        if (valid) { if (VEC > 1) stv<F32, VEC>(o1 + r * ncol + c0, y1);
          else o1[r * ncol + c0] = F32::from_f(y1[0]); }
    }
    }

    }
  }
}


HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 4 || n_out != 2) return HTAM_ERR_SHAPE;
  if (in[0].dtype != HTAM_FLOAT32 || in[0].data == nullptr) return HTAM_ERR_SHAPE;
  if (in[1].dtype != HTAM_FLOAT32 || in[1].data == nullptr) return HTAM_ERR_SHAPE;
  if (in[2].dtype != HTAM_FLOAT32 || in[2].data == nullptr) return HTAM_ERR_SHAPE;
  if (in[3].dtype != HTAM_FLOAT32 || in[3].data == nullptr) return HTAM_ERR_SHAPE;
  if (out[0].dtype != HTAM_FLOAT32 || out[0].data == nullptr) return HTAM_ERR_SHAPE;
  if (out[1].dtype != HTAM_FLOAT32 || out[1].data == nullptr) return HTAM_ERR_SHAPE;
  const HtamTensor& szt = out[0];
  if (szt.ndim != 3) return HTAM_ERR_SHAPE;
  int64_t it[HTAM_MAX_DIMS];
  int64_t n = 1;
  for (int d = 0; d < 3; ++d) { it[d] = szt.sizes[d]; n *= it[d]; }
  const int64_t ncol = it[2];
  if (ncol <= 0 || ncol > (int64_t(1) << 30)) return HTAM_ERR_SHAPE;
  const int64_t rows = n / ncol;
  Space<NACC> sp;
  sp.ndim = 3;
  for (int d = 0; d < 3; ++d) sp.size[d] = it[d];
  { static const int dm[] = {0, 1, 2};
    if (!htam_bind_dims(in[0], dm, 3, it, 3, sp.st[0])) return HTAM_ERR_SHAPE; }
  { static const int dm[] = {0, 1, 2};
    if (!htam_bind_dims(in[1], dm, 3, it, 3, sp.st[1])) return HTAM_ERR_SHAPE; }
  { static const int dm[] = {2};
    if (!htam_bind_dims(in[2], dm, 1, it, 3, sp.st[2])) return HTAM_ERR_SHAPE; }
  { static const int dm[] = {2};
    if (!htam_bind_dims(in[3], dm, 1, it, 3, sp.st[3])) return HTAM_ERR_SHAPE; }
  const int64_t max_off = htam_max_off<NACC>(sp, 4);
  (void)max_off;
  if (!htam_contiguous(out[0]) || htam_numel(&out[0]) != n) return HTAM_ERR_SHAPE;
  if (!htam_contiguous(out[1]) || htam_numel(&out[1]) != n) return HTAM_ERR_SHAPE;
  if (rows == 0) return HTAM_OK;
  htam_collapse<NACC>(sp, 4, true);
  const int V = 4;
  bool vec_ok = V > 1 && ncol % V == 0;
  { const int64_t inner = sp.st[0][sp.ndim - 1];
    if (inner != 0 && (inner != 1 || !htam_aligned(in[0].data, V * 4))) vec_ok = false;
    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[0][d] % V != 0) vec_ok = false; }
  { const int64_t inner = sp.st[1][sp.ndim - 1];
    if (inner != 0 && (inner != 1 || !htam_aligned(in[1].data, V * 4))) vec_ok = false;
    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[1][d] % V != 0) vec_ok = false; }
  { const int64_t inner = sp.st[2][sp.ndim - 1];
    if (inner != 0 && (inner != 1 || !htam_aligned(in[2].data, V * 4))) vec_ok = false;
    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[2][d] % V != 0) vec_ok = false; }
  { const int64_t inner = sp.st[3][sp.ndim - 1];
    if (inner != 0 && (inner != 1 || !htam_aligned(in[3].data, V * 4))) vec_ok = false;
    if (inner == 1) for (int d = 0; d + 1 < sp.ndim; ++d) if (sp.st[3][d] % V != 0) vec_ok = false; }
  if (!htam_aligned(out[0].data, V * 4)) vec_ok = false;
  if (!htam_aligned(out[1].data, V * 4)) vec_ok = false;
  int64_t blocks = (rows + BLOCK / TPR - 1) / (BLOCK / TPR);
  if (0 > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * 0);
  blocks = std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
  const bool regs = 2 > 0 && ncol <= 1024;
  if (regs && vec_ok) row_kernel<4, 2><<<blocks, BLOCK, 0, stream>>>(sp, rows, (int)ncol, (F32::raw*)in[0].data, (F32::raw*)in[1].data, (F32::raw*)in[2].data, (F32::raw*)in[3].data, (F32::raw*)out[0].data, (F32::raw*)out[1].data);
  else if (regs) row_kernel<1, 8><<<blocks, BLOCK, 0, stream>>>(sp, rows, (int)ncol, (F32::raw*)in[0].data, (F32::raw*)in[1].data, (F32::raw*)in[2].data, (F32::raw*)in[3].data, (F32::raw*)out[0].data, (F32::raw*)out[1].data);
  else if (vec_ok) row_kernel<4, 0><<<blocks, BLOCK, 0, stream>>>(sp, rows, (int)ncol, (F32::raw*)in[0].data, (F32::raw*)in[1].data, (F32::raw*)in[2].data, (F32::raw*)in[3].data, (F32::raw*)out[0].data, (F32::raw*)out[1].data);
  else row_kernel<1, 0><<<blocks, BLOCK, 0, stream>>>(sp, rows, (int)ncol, (F32::raw*)in[0].data, (F32::raw*)in[1].data, (F32::raw*)in[2].data, (F32::raw*)in[3].data, (F32::raw*)out[0].data, (F32::raw*)out[1].data);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
