// ---- torch_htam expert prelude: dtype traits, vector access, math helpers, group reductions ----
#pragma nv_diag_suppress 177
#include "htam_abi.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

// Storage is raw bits (float or uint16) so loads/stores never depend on the half types' ctors.
// Vector accesses move 32-bit words: PER_WORD values per word, unpacked with shifts (no local
// arrays: a memcpy into ushort[8] put a 16-byte stack frame into bf16 kernels).
struct F32 {
  typedef float raw;
  static constexpr int PER_WORD = 1;
  static __device__ __forceinline__ float to_f(raw r) { return r; }
  static __device__ __forceinline__ raw from_f(float x) { return x; }
  static __device__ __forceinline__ float round(float x) { return x; }
  static __device__ __forceinline__ unsigned bits(raw r) { return __float_as_uint(r); }
  static __device__ __forceinline__ float from_word(unsigned w, int) { return __uint_as_float(w); }
  static __device__ __forceinline__ unsigned to_word(const float* v) { return __float_as_uint(v[0]); }
};
struct BF16 {
  typedef unsigned short raw;
  static constexpr int PER_WORD = 2;
  static __device__ __forceinline__ float to_f(raw r) { return __uint_as_float(((unsigned)r) << 16); }
  static __device__ __forceinline__ raw from_f(float x) { return __bfloat16_as_ushort(__float2bfloat16(x)); }
  static __device__ __forceinline__ float round(float x) { return to_f(from_f(x)); }
  static __device__ __forceinline__ unsigned bits(raw r) { return r; }
  static __device__ __forceinline__ float from_word(unsigned w, int h) {
    return __uint_as_float(h ? (w & 0xffff0000u) : (w << 16));
  }
  // one cvt.rn.bf16x2.f32 for the pair (v[0] in the low half), where two from_f take four instructions
  static __device__ __forceinline__ unsigned to_word(const float* v) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[0], v[1]);
    unsigned w;
    memcpy(&w, &h, 4);
    return w;
  }
};
struct F16 {
  typedef unsigned short raw;
  static constexpr int PER_WORD = 2;
  static __device__ __forceinline__ float to_f(raw r) { return __half2float(__ushort_as_half(r)); }
  static __device__ __forceinline__ raw from_f(float x) { return __half_as_ushort(__float2half(x)); }
  static __device__ __forceinline__ float round(float x) { return to_f(from_f(x)); }
  static __device__ __forceinline__ unsigned bits(raw r) { return r; }
  static __device__ __forceinline__ float from_word(unsigned w, int h) {
    return to_f((raw)(h ? (w >> 16) : (w & 0xffffu)));
  }
  static __device__ __forceinline__ unsigned to_word(const float* v) {
    const __half2 h = __floats2half2_rn(v[0], v[1]);
    unsigned w;
    memcpy(&w, &h, 4);
    return w;
  }
};

template <int BYTES> struct RawVec;
template <> struct RawVec<4> { typedef unsigned int T; };
template <> struct RawVec<8> { typedef uint2 T; };
template <> struct RawVec<16> { typedef uint4 T; };
__device__ __forceinline__ unsigned word_of(const uint4& r, int j) { return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w; }
__device__ __forceinline__ unsigned word_of(const uint2& r, int j) { return j == 0 ? r.x : r.y; }
__device__ __forceinline__ unsigned word_of(unsigned r, int) { return r; }
__device__ __forceinline__ void set_word(uint4& r, int j, unsigned w) {
  if (j == 0) r.x = w; else if (j == 1) r.y = w; else if (j == 2) r.z = w; else r.w = w;
}
__device__ __forceinline__ void set_word(uint2& r, int j, unsigned w) { if (j == 0) r.x = w; else r.y = w; }
__device__ __forceinline__ void set_word(unsigned& r, int, unsigned w) { r = w; }

// Scalar load through the read-only path when NC (inputs are never written by the kernel).
template <class DT, bool NC>
__device__ __forceinline__ float ld1(const typename DT::raw* p) {
  if (NC) return DT::to_f(__ldg(p));
  return DT::to_f(*p);
}

// VEC consecutive elements as WORDS 32-bit words; p must be aligned to VEC * sizeof(raw) (the host
// checks before choosing VEC > 1).
template <class DT, int VEC, bool NC>
__device__ __forceinline__ void ldw(const typename DT::raw* p, unsigned* w) {
  constexpr int BYTES = (int)sizeof(typename DT::raw) * VEC;
  if constexpr (BYTES < 4) {          // one 2-byte value (or up to 3 bytes): bits from the low end
    unsigned v = 0;
#pragma unroll
    for (int e = 0; e < VEC; ++e) v |= DT::bits(NC ? __ldg(p + e) : p[e]) << (8 * (int)sizeof(typename DT::raw) * e);
    w[0] = v;
  } else {
    constexpr int CH = BYTES > 16 ? 16 : BYTES;
    typedef typename RawVec<CH>::T R;
#pragma unroll
    for (int k = 0; k < BYTES / CH; ++k) {
      const R* rp = reinterpret_cast<const R*>(p) + k;
      R raw;
      if (NC) raw = __ldg(rp); else raw = *rp;
#pragma unroll
      for (int j = 0; j < CH / 4; ++j) w[k * (CH / 4) + j] = word_of(raw, j);
    }
  }
}

// VEC consecutive elements as floats (same alignment contract as ldw).
template <class DT, int VEC, bool NC>
__device__ __forceinline__ void ldv(const typename DT::raw* p, float* out) {
  if constexpr ((int)sizeof(typename DT::raw) * VEC < 4) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = ld1<DT, NC>(p + e);
  } else {
    unsigned w[(int)sizeof(typename DT::raw) * VEC / 4];
    ldw<DT, VEC, NC>(p, w);
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = DT::from_word(w[e / DT::PER_WORD], e % DT::PER_WORD);
  }
}

template <class DT, int VEC>
__device__ __forceinline__ void stv(typename DT::raw* p, const float* v) {
  if constexpr ((int)sizeof(typename DT::raw) * VEC < 4) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) p[e] = DT::from_f(v[e]);
  } else {
    constexpr int BYTES = (int)sizeof(typename DT::raw) * VEC;
    constexpr int CH = BYTES > 16 ? 16 : BYTES;
    typedef typename RawVec<CH>::T R;
#pragma unroll
    for (int k = 0; k < BYTES / CH; ++k) {
      R raw;
#pragma unroll
      for (int j = 0; j < CH / 4; ++j)
        set_word(raw, j, DT::to_word(v + (k * (CH / 4) + j) * DT::PER_WORD));
      reinterpret_cast<R*>(p)[k] = raw;
    }
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
// NOTE: torch.maximum / clamp / amax propagate NaN; fmaxf and fminf return the other operand.
__device__ __forceinline__ float htam_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float htam_min(float a, float b) { return (a < b || a != a) ? a : b; }
// Integer and bool storage (elementwise programs' "i" and "b" values): loaded to and stored from
// the type the kernel computes in (long long: int64 and int32 arithmetic stays exact; bool: a byte).
struct I64 {
  typedef long long raw;
  typedef long long val;
  static __device__ __forceinline__ val to_v(raw r) { return r; }
  static __device__ __forceinline__ raw from_v(val v) { return v; }
};
struct I32 {
  typedef int raw;
  typedef long long val;
  static __device__ __forceinline__ val to_v(raw r) { return (long long)r; }
  static __device__ __forceinline__ raw from_v(val v) { return (int)v; }
};
// bool: one byte. Elementwise kernels load it as a bool (to_v); row kernels load it in their float
// lanes (ld1 / ldw / from_word) as 0.f / 1.f, which their C++ reads as the same bool.
struct B8 {
  typedef unsigned char raw;
  typedef bool val;
  static constexpr int PER_WORD = 4;
  static __device__ __forceinline__ val to_v(raw r) { return r != 0; }
  static __device__ __forceinline__ raw from_v(val v) { return v ? 1 : 0; }
  static __device__ __forceinline__ float to_f(raw r) { return r ? 1.f : 0.f; }
  static __device__ __forceinline__ raw from_f(float x) { return x != 0.f ? 1 : 0; }
  static __device__ __forceinline__ float round(float x) { return x != 0.f ? 1.f : 0.f; }
  static __device__ __forceinline__ unsigned bits(raw r) { return r; }
  static __device__ __forceinline__ float from_word(unsigned w, int h) { return ((w >> (8 * h)) & 0xffu) ? 1.f : 0.f; }
  static __device__ __forceinline__ unsigned to_word(const float* v) {
    return (unsigned)from_f(v[0]) | ((unsigned)from_f(v[1]) << 8) | ((unsigned)from_f(v[2]) << 16) |
           ((unsigned)from_f(v[3]) << 24);
  }
};
__device__ __forceinline__ long long htam_imax(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long htam_imin(long long a, long long b) { return a < b ? a : b; }
// Python-style floor division and modulo (torch's floor_divide / remainder on integers); a zero
// divisor gives 0 where torch's CUDA kernels leave the result undefined.
__device__ __forceinline__ long long htam_ifloordiv(long long a, long long b) {
  if (b == 0) return 0;
  const long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ long long htam_imod(long long a, long long b) {
  if (b == 0) return 0;
  const long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ float htam_modf(float a, float b) {
  const float r = fmodf(a, b);
  return (r != 0.f && ((r < 0.f) != (b < 0.f))) ? r + b : r;
}
__device__ __forceinline__ float htam_signf(float x) { return (float)((x > 0.f) - (x < 0.f)); }
struct MaxOp { __device__ __forceinline__ float operator()(float a, float b) const { return htam_max(a, b); } };
struct MinOp { __device__ __forceinline__ float operator()(float a, float b) const { return htam_min(a, b); } };

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

// A sliced read: input index starts[k] + i * steps[k] for iteration index i along dims[k] (a -1
// dim reads one element); *off gets the element offset of the first one. Every read index must
// lie inside the input.
static inline bool htam_bind_slice(const HtamTensor& t, const int* dims, const int64_t* starts,
                                   const int64_t* steps, int nd, const int64_t* it_sizes, int it_nd,
                                   int64_t* st, int64_t* off) {
  if (t.ndim != nd) return false;
  for (int d = 0; d < it_nd; ++d) st[d] = 0;
  *off = 0;
  for (int k = 0; k < nd; ++k) {
    const int64_t n = dims[k] < 0 ? 1 : it_sizes[dims[k]];
    if (n > 0 && starts[k] + (n - 1) * steps[k] >= t.sizes[k]) return false;
    *off += starts[k] * t.strides[k];
    if (dims[k] >= 0 && n != 1) st[dims[k]] = t.strides[k] * steps[k];
  }
  return true;
}

// A cat operand's read (ir.Access.window): along the window's iteration dim wd, iteration index
// i in [lo, hi) reads input index starts[k] + i * steps[k] (starts already hold -lo * steps); the
// kernel loads nothing outside [lo, hi), so *off (the offset at i = 0) may lie before the data.
// The other dims read as a slice. size: wd's whole size at capture (the cat's), checked.
static inline bool htam_bind_window(const HtamTensor& t, const int* dims, const int64_t* starts,
                                    const int64_t* steps, int nd, const int64_t* it_sizes, int it_nd,
                                    int wd, int64_t lo, int64_t hi, int64_t size, int64_t* st,
                                    int64_t* off) {
  if (t.ndim != nd || wd >= it_nd || it_sizes[wd] != size) return false;
  for (int d = 0; d < it_nd; ++d) st[d] = 0;
  *off = 0;
  for (int k = 0; k < nd; ++k) {
    const bool w = dims[k] == wd;
    const int64_t n = dims[k] < 0 ? 1 : (w ? hi - lo : it_sizes[dims[k]]);
    const int64_t first = starts[k] + (w ? lo * steps[k] : 0);
    if (n > 0 && (first < 0 || first + (n - 1) * steps[k] >= t.sizes[k])) return false;
    *off += starts[k] * t.strides[k];
    if (dims[k] >= 0 && n != 1) st[dims[k]] = t.strides[k] * steps[k];
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

// A 4-D [N, C, H, W] tensor stored N, H, W, C (channels-last; size-1 dims' strides ignored).
static inline bool htam_channels_last(const HtamTensor& t) {
  if (t.ndim != 4) return false;
  int64_t acc = 1;
  for (int k : {1, 3, 2, 0}) {   // innermost first: C, W, H, N
    if (t.sizes[k] != 1 && t.strides[k] != acc) return false;
    acc *= t.sizes[k];
  }
  return true;
}

// t seen with the given (contiguous) shape: a reshape of a contiguous tensor (ir.Access.view).
static inline bool htam_reshape(HtamTensor& t, const int64_t* sizes, int nd) {
  if (!htam_contiguous(t) || nd > HTAM_MAX_DIMS) return false;
  int64_t n = 1;
  for (int k = 0; k < nd; ++k) n *= sizes[k];
  if (n != htam_numel(&t)) return false;
  t.ndim = nd;
  int64_t acc = 1;
  for (int k = nd - 1; k >= 0; --k) { t.sizes[k] = sizes[k]; t.strides[k] = acc; acc *= sizes[k]; }
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

// order[0, nd): the dims by the magnitude of their strides st, largest first, ties in their order
// (a stable insertion sort): a tensor's memory order, outer to inner. False (order unset) where a
// dim of size > 1 has stride 0 (an element repeated along it: no memory order).
static inline bool htam_memory_order(const int64_t* st, const int64_t* size, int nd, int* order) {
  for (int d = 0; d < nd; ++d) {
    if (size[d] > 1 && st[d] == 0) return false;
    order[d] = d;
  }
  for (int i = 1; i < nd; ++i)
    for (int j = i; j > 0; --j) {
      const int64_t a = st[order[j - 1]], b = st[order[j]];
      if ((a < 0 ? -a : a) >= (b < 0 ? -b : b)) break;
      const int t = order[j - 1]; order[j - 1] = order[j]; order[j] = t;
    }
  return true;
}

// Put the iteration dims in the memory order of entry `ref` (its strides non-increasing, outer to
// inner; a stable sort, so ties keep their order), as PyTorch's TensorIterator orders a loop by its
// output. Only for a space whose every output is a Space entry (stored through its strides, none
// at a linear index), where any order of the dims computes the same elements. NOTE: a
// channels-last add or multiply ([16, 96, 56, 56] at strides [301056, 1, 5376, 96]) walked in
// logical order steps 96 elements between neighbouring threads: 0.11-0.32x of eager, H100,
// bench/results/anytime_table-*; in the output's order it collapses to one unit-stride dim.
// Left alone where `ref` repeats an element along a dim (stride 0, an expanded output).
template <int NACC>
static inline void htam_order_by(Space<NACC>& s, int ref) {
  int order[HTAM_MAX_DIMS];
  if (!htam_memory_order(s.st[ref], s.size, s.ndim, order)) return;
  Space<NACC> was = s;
  for (int d = 0; d < s.ndim; ++d) {
    s.size[d] = was.size[order[d]];
    for (int a = 0; a < NACC; ++a) s.st[a][d] = was.st[a][order[d]];
  }
}

// Merge adjacent iteration dims [d, d+1] when every access steps through them as one dim.
// keep_last: the last row_dims dims are the row (row kernels keep it separate from the rows: its
// dims merge only with each other). Returns how many dims the row has after merging.
template <int NACC>
static inline int htam_collapse(Space<NACC>& s, int nacc, bool keep_last, int row_dims = 1) {
  int nd = 0, row_nd = 0;
  const int row0 = keep_last ? s.ndim - row_dims : s.ndim;
  int64_t size[HTAM_MAX_DIMS], st[NACC > 0 ? NACC : 1][HTAM_MAX_DIMS];
  for (int d = 0; d < s.ndim; ++d) {
    const bool in_row = d >= row0;
    // size-1 dims carry nothing (the row keeps one dim, its last, if all of its dims are 1)
    if (s.size[d] == 1 && !(in_row && d == s.ndim - 1 && row_nd == 0) && s.ndim > 1) continue;
    bool merge = nd > 0 && (row_nd > 0) == in_row;
    for (int a = 0; merge && a < nacc; ++a)
      merge = st[a][nd - 1] == s.st[a][d] * s.size[d];
    if (merge) {
      size[nd - 1] *= s.size[d];
      for (int a = 0; a < nacc; ++a) st[a][nd - 1] = s.st[a][d];
    } else {
      size[nd] = s.size[d];
      for (int a = 0; a < nacc; ++a) st[a][nd] = s.st[a][d];
      ++nd;
      row_nd += in_row;
    }
  }
  if (nd == 0) { size[0] = 1; for (int a = 0; a < nacc; ++a) st[a][0] = 0; nd = 1; }
  s.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    s.size[d] = size[d];
    for (int a = 0; a < nacc; ++a) s.st[a][d] = st[a][d];
  }
  return row_nd;
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
