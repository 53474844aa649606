// ---- torch_htam expert: flash attention main loops (online softmax; the [L, S] scores never
// leave the chip) and their host entry (fa::run) ----
// O[b, h, i, :] = sum_j softmax_j(score(q_i . k_j)) v_j over keys j < S (and j <= i when CAUSAL,
// top-left aligned as torch's is_causal). score() is the generated SC::at: scale, masks and fills
// as the region writes them, returned in the units SC::ex exponentiates (log2 units for the half
// types, where ex is exp2: the scale and log2(e) fold into one multiply).
//
// Operands are 4-D (batch, head, row, col) with element strides from the host (views, transposes
// and broadcast masks need no copy); a kv head serves `group` query heads (GQA, or a broadcast kv
// with one head). Rows past L and keys past S are zero-filled in shared memory and masked out of
// the softmax; head-dim columns past D are zero (they add nothing to q . k) and never stored.
//
// fa_mma (bf16 / fp16, and fp32 on TF32 where the policy allows it: the Tf32 tag): FlashAttention-2's
//   schedule on mma.sync, fp32 accumulators. A block of BM / 16 warps owns BM query rows (each
//   warp 16), loops over BN-key tiles of K and V that a STAGES-deep cp.async pipeline brings into
//   shared memory. Per tile a warp computes its 16 x BN scores S = Q K^T, updates the running row
//   max m and sum l, rescales its O accumulators, and adds P V (online_softmax between the two).
//   The products are the dtype's (Products<DT>):
//   - bf16 / fp16: m16n8k16. A = Q by ldmatrix, B = K rows by ldmatrix (K stored [key][d] is the
//     "col" operand); P is the accumulator fragments re-packed to bf16/fp16 (the C layout of two
//     n8 tiles is the A layout of one k16 step) times V (ldmatrix.trans: V stored [key][dv]).
//   - Tf32: m16n8k8 on fp32 tiles, each operand rounded to TF32 as it is read (the comment above
//     Tf32: a permuted key order for P V, 3xTF32 scores).
//   Shared rows are padded by 16 bytes: 8 ldmatrix rows then fall in distinct bank quads.
// fa_fma (fp32): the same online softmax with plain FMAs (fp32-exact order of magnitude: no TF32).
//   256 threads as 16 x 16; thread (ty, tx) owns score rows ty + 16 r and key columns tx + 16 c of
//   each BM x BN tile, and O columns tx + 16 c; P goes through shared memory between the two
//   products. Q and K rows are padded by one float (the 16 tx read 16 different K rows per d).
// fa::run (host): binds the region's tensors, checks their shapes and launches the kernel of the
//   dtype; attention.py's htam_run instantiates it with the generated SC (score function) and
//   Region (the tensors and their bindings) at the tile shape of the candidate.
#include <type_traits>
namespace fa {

struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  int64_t qs[4], ks[4], vs[4], os[4];   // element strides of (batch, head, row, col)
  const void* m[2];                      // masks the score function reads
  int64_t ms[2][4];                      // their strides (0 where broadcast)
  int B, H, L, S, group;                 // group: query heads per kv head
};

// How a kernel operand (4 dims: batch, head, row, col) is read from a task tensor t (generated
// per operand from the region's view chain, attention.py's Bind).
struct Bind {
  int mode;              // 0: t itself, right-aligned to the 4 dims; 1: strided view; 2: flat view
  int nsrc;              // modes 1, 2: t.ndim at capture
  int64_t src[8];        // modes 1, 2: t.sizes at capture (the view chain bakes them in)
  int64_t coef[4][8];    // mode 1: stride of dim j = sum_i coef[j][i] * t.strides[i]
  int64_t base[8];       // mode 1: offset = sum_i base[i] * t.strides[i]
  int64_t fst[4];        // mode 2 (t contiguous): strides
  int64_t foff;          // mode 2: offset
  int64_t size[4];       // modes 1, 2: sizes of the 4 dims
  int grow[4];           // mode 1: dim j's size is t.sizes[grow[j]] (-1: size[j]); that t dim may
                         // differ from src (a ranged batch or sequence the views pass through)
};

// The operand's strides, sizes and element offset; false when t does not fit the binding.
static inline bool bind(const HtamTensor& t, const Bind& b, int64_t* st, int64_t* sz, int64_t* off) {
  *off = 0;
  if (b.mode == 0) {
    if (t.ndim < 1 || t.ndim > 4) return false;
    for (int j = 0; j < 4; ++j) {
      const int k = j - (4 - t.ndim);
      sz[j] = k < 0 ? 1 : t.sizes[k];
      st[j] = (k < 0 || sz[j] == 1) ? 0 : t.strides[k];
    }
    return true;
  }
  if (t.ndim != b.nsrc) return false;
  for (int i = 0; i < b.nsrc; ++i) {
    bool grows = false;
    for (int j = 0; j < 4; ++j) grows = grows || (b.mode == 1 && b.grow[j] == i);
    if (t.sizes[i] != b.src[i] && !(grows && t.sizes[i] >= 1)) return false;
  }
  if (b.mode == 2 && !htam_contiguous(t)) return false;
  for (int j = 0; j < 4; ++j) {
    sz[j] = b.mode == 1 && b.grow[j] >= 0 ? t.sizes[b.grow[j]] : b.size[j];
    st[j] = 0;
    if (b.mode == 1)
      for (int i = 0; i < b.nsrc; ++i) st[j] += b.coef[j][i] * t.strides[i];
    else
      st[j] = b.fst[j];
    if (sz[j] == 1) st[j] = 0;
  }
  if (b.mode == 1)
    for (int i = 0; i < b.nsrc; ++i) *off += b.base[i] * t.strides[i];
  else
    *off = b.foff;
  return true;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zero-filled (src unread) when !full
__device__ __forceinline__ void cp16(void* dst, const void* src, bool full) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

template <class DT> struct Mma;
template <> struct Mma<BF16> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<F16> {
  static __device__ __forceinline__ void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Rows [r0, r0 + R) x cols [0, CP) of a (row stride rs, col stride cs) operand into a [R][LD]
// shared tile; rows >= nrows and cols >= ncols are zero. vec: 16-byte cp.async chunks (the host
// checked cs == 1, 16-byte aligned rows and head dims a multiple of a chunk: all in or all out);
// otherwise element loads (still asynchronous to nothing: plain stores, visible after the
// block's next __syncthreads).
template <class DT, int R, int CP, int LD, int NT>
__device__ __forceinline__ void load_tile(typename DT::raw* s, const typename DT::raw* g, int64_t rs,
                                          int64_t cs, int64_t r0, int64_t nrows, int ncols, bool vec) {
  typedef typename DT::raw raw;
  constexpr int E = 16 / sizeof(raw);             // elements per 16-byte chunk: 8 two-byte, 4 fp32
  constexpr int CH = CP / E;                      // chunks per row
  static_assert(CP % E == 0, "rows of whole chunks");
#pragma unroll 2
  for (int c = threadIdx.x; c < R * CH; c += NT) {
    const int r = c / CH, cc = (c % CH) * E;
    const bool row_ok = r0 + r < nrows;
    const raw* src = g + (r0 + r) * rs + cc * cs;
    if (vec) {
      const bool ok = row_ok && cc < ncols;
      cp16(s + r * LD + cc, ok ? src : g, ok);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const bool ok = row_ok && cc + e < ncols;
        s[r * LD + cc + e] = ok ? src[e * cs] : raw(0);
      }
    }
  }
}

__device__ __forceinline__ unsigned pack2(float lo, float hi, BF16) {
  float v[2] = {lo, hi};
  return BF16::to_word(v);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, F16) {
  float v[2] = {lo, hi};
  return F16::to_word(v);
}

// Tf32: fp32 operands on TF32 tensor cores (mma.sync m16n8k8), where the policy allows TF32 matmuls
// (as torch's own fp32 attention then runs its two bmm's). Shared tiles hold fp32 and each operand
// is rounded to TF32 (cvt.rna) as it is read into a fragment.
//   m16n8k8 fragments (g = lane / 4, t = lane % 4): A a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
//   a3 (g + 8, t + 4); B b0 (k t, n g), b1 (k t + 4, n g); C as m16n8k16's: c0, c1 (g, 2t, 2t + 1),
//   c2, c3 (g + 8, 2t, 2t + 1). The scores' C fragment is not P's A fragment (columns 2t, 2t + 1
//   against t, t + 4), so P V sums its 8 keys in a permuted order: A's k index t is key 2t and
//   t + 4 is key 2t + 1, and V's rows are read in that same order (b0 = V[2t][g], b1 = V[2t + 1][g]).
//   Rows padded by 16 bytes, 4 floats (LD % 32 == 4 or 20, LD % 16 == 4): A / B reads (8 rows g x 4
//   columns t) and V's (rows 2t x columns g) each hit 32 distinct banks.
//   SPLIT (3xTF32 on the scores): x = big + small, both TF32, and q.k = qs.kb + qb.ks + qb.kb, about
//   fp32's accuracy for three MMAs. Why: a score's TF32 error is ~2^-11 of sum |q_d k_d|, and an
//   unscaled attention's scores (T5's, ~10-100 at verification's inputs) move their probabilities
//   by several percent, past the TF32 policy's 5e-3 (eager's fp32 SDPA does not run TF32). P V
//   stays one MMA: P is in [0, 1] and its error is relative.
template <bool SPLIT> struct Tf32 : F32 {};   // the dtype tag of fp32 tasks run on TF32 tensor cores

__device__ __forceinline__ unsigned tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ unsigned tf32_rest(float x, unsigned big) { return tf32(x - __uint_as_float(big)); }
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A warp's two products over its 16 query rows, per dtype tag: scores S = Q K^T (NB n8 tiles over
// the tile's keys; sQ and sK: shared rows of stride LDQ / LDK) and O += P V (P: the scores' tiles as
// online_softmax leaves them; sV rows of stride LDV).
template <class DT> struct Products {   // bf16 / fp16: m16n8k16, operands by ldmatrix
  typedef typename DT::raw raw;
  template <int NB, int DP, int LDQ, int LDK>
  static __device__ __forceinline__ void scores(float (&s)[NB][4], const raw* sQ, const raw* sK, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      unsigned a[4];
      ldsm_x4(a, sQ + (warp * 16 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int n2 = 0; n2 < NB / 2; ++n2) {        // keys n2*16 .. +15: two n8 tiles per ldmatrix.x4
        unsigned kb[4];
        ldsm_x4(kb, sK + (n2 * 16 + (lane & 7) + 8 * (lane >> 4)) * LDK + kk * 16 + 8 * ((lane >> 3) & 1));
        Mma<DT>::run(s[2 * n2], a, kb[0], kb[1]);
        Mma<DT>::run(s[2 * n2 + 1], a, kb[2], kb[3]);
      }
    }
  }
  // BN / 16 k-steps; P's A fragment is two n8 score tiles re-packed (the C layout of two n8 tiles
  // is the A layout of one k16 step)
  template <int NB, int ND, int LDV>
  static __device__ __forceinline__ void pv(float (&o)[ND][4], const float (&s)[NB][4], const raw* sV, int lane) {
#pragma unroll
    for (int kk = 0; kk < NB / 2; ++kk) {
      unsigned a[4];
      a[0] = pack2(s[2 * kk][0], s[2 * kk][1], DT());
      a[1] = pack2(s[2 * kk][2], s[2 * kk][3], DT());
      a[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1], DT());
      a[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3], DT());
#pragma unroll
      for (int n2 = 0; n2 < ND / 2; ++n2) {        // dv n2*16 .. +15: two n8 tiles per ldmatrix.x4.trans
        unsigned vb[4];
        ldsm_x4_t(vb, sV + (kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LDV + n2 * 16 + 8 * (lane >> 4));
        Mma<DT>::run(o[2 * n2], a, vb[0], vb[1]);
        Mma<DT>::run(o[2 * n2 + 1], a, vb[2], vb[3]);
      }
    }
  }
};
template <bool SPLIT> struct Products<Tf32<SPLIT>> {   // fp32: m16n8k8 TF32, operands by plain loads
  template <int NB, int DP, int LDQ, int LDK>
  static __device__ __forceinline__ void scores(float (&s)[NB][4], const float* sQ, const float* sK, int warp, int lane) {
    const int gid = lane >> 2, tig = lane & 3;
    const float* qa = sQ + (warp * 16 + gid) * LDQ + tig;   // this thread's A elements: + 8 LDQ, + 4
#pragma unroll
    for (int kk = 0; kk < DP / 8; ++kk) {
      const float qf[4] = {qa[kk * 8], qa[8 * LDQ + kk * 8], qa[kk * 8 + 4], qa[8 * LDQ + kk * 8 + 4]};
      unsigned a[4], as[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        a[e] = tf32(qf[e]);
        if (SPLIT) as[e] = tf32_rest(qf[e], a[e]);
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        const float* kb = sK + (n * 8 + gid) * LDK + kk * 8 + tig;
        const unsigned b0 = tf32(kb[0]), b1 = tf32(kb[4]);
        if (SPLIT) {                              // the small products first
          mma_tf32(s[n], as, b0, b1);
          mma_tf32(s[n], a, tf32_rest(kb[0], b0), tf32_rest(kb[4], b1));
        }
        mma_tf32(s[n], a, b0, b1);
      }
    }
  }
  // one k8 step per score tile, its keys in the permuted order above
  template <int NB, int ND, int LDV>
  static __device__ __forceinline__ void pv(float (&o)[ND][4], const float (&s)[NB][4], const float* sV, int lane) {
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int kk = 0; kk < NB; ++kk) {
      const unsigned a[4] = {tf32(s[kk][0]), tf32(s[kk][2]), tf32(s[kk][1]), tf32(s[kk][3])};
      const float* vb = sV + (kk * 8 + 2 * tig) * LDV + gid;
#pragma unroll
      for (int n = 0; n < ND; ++n) mma_tf32(o[n], a, tf32(vb[n * 8]), tf32(vb[LDV + n * 8]));
    }
  }
};

// One key tile's online-softmax step for a warp's rows (this thread's i0 and i0 + 8) over scores s
// in the m16n8 C layout (key n0 + 8n + 2 tig + (e & 1) at s[n][e]): the scores taken to SC's units
// (masked, causal and out-of-range positions -> -inf), the running row max mrow and sum lrow
// updated, O's accumulators rescaled, and s left holding the tile's unnormalized probabilities.
template <class SC, int NB, int ND>
__device__ __forceinline__ void online_softmax(const Params& p, float (&s)[NB][4], float (&o)[ND][4],
                                               float (&mrow)[2], float (&lrow)[2], int b, int h,
                                               int64_t i0, int64_t n0, int tig) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t i = i0 + 8 * (e >> 1), j = n0 + n * 8 + 2 * tig + (e & 1);
      const bool in = i < p.L && j < p.S && (!SC::CAUSAL || j <= i);
      const float x = in ? SC::at(p, s[n][e], b, h, i, j) : -INFINITY;
      s[n][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {                   // a row lives in the 4 threads of a quad
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  float alpha[2], mu[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float mn = fmaxf(mrow[r], mx[r]);
    mu[r] = mn == -INFINITY ? 0.f : mn;           // a row masked so far: exp(-inf - 0) = 0, not NaN
    alpha[r] = SC::ex(mrow[r] - mu[r]);
    mrow[r] = mn;
    lrow[r] *= alpha[r];
  }
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = SC::ex(s[n][e] - mu[e >> 1]);
      lrow[e >> 1] += s[n][e];
    }
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
    o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
  }
}

// Two adjacent output elements in one store (the host checked the pair is aligned: ovec).
template <class DT>
__device__ __forceinline__ void store_pair(typename DT::raw* dst, float v0, float v1) {
  float v[2] = {v0, v1};
  if constexpr (DT::PER_WORD == 2)
    *reinterpret_cast<unsigned*>(dst) = DT::to_word(v);
  else
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
}

// O's rows i0 and i0 + 8 (the C layout's accumulators o) divided by their softmax sums (lrow, this
// thread's part: summed over the quad here) and stored, in column pairs where ovec.
template <class DT, class SC, int ND>
__device__ __forceinline__ void store_o(const Params& p, float (&o)[ND][4], float (&lrow)[2], int b, int h,
                                        int64_t i0, int tig, int DV, bool ovec) {
  typedef typename DT::raw raw;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
  }
  raw* O = static_cast<raw*>(p.o) + b * p.os[0] + h * p.os[1];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + 8 * r;
    if (i >= p.L) continue;
    const float inv = SC::inv(lrow[r]);
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const int c = n * 8 + 2 * tig;               // this thread's columns c, c + 1
      if (c >= DV) continue;
      raw* dst = O + i * p.os[2] + (int64_t)c * p.os[3];
      const float v0 = o[n][2 * r] * inv, v1 = o[n][2 * r + 1] * inv;
      if (ovec && c + 1 < DV) {
        store_pair<DT>(dst, v0, v1);
      } else {
        dst[0] = DT::from_f(v0);
        if (c + 1 < DV) dst[p.os[3]] = DT::from_f(v1);
      }
    }
  }
}

// Shared rows are padded by 16 bytes (PAD elements): 8 ldmatrix rows of two-byte elements fall in
// distinct bank quads, and TF32's fragment reads in distinct banks.
template <class DT> constexpr int pad() { return 16 / (int)sizeof(typename DT::raw); }
template <class DT, int BM, int BN, int DP, int DVP, int STAGES>
constexpr size_t mma_smem() {   // bytes: Q [BM][DP + PAD], then STAGES x (K [BN][DP + PAD], V [BN][DVP + PAD])
  constexpr int P = pad<DT>();
  return sizeof(typename DT::raw) * (BM * (DP + P) + STAGES * BN * (DP + P + DVP + P));
}

// grid: x = batch * heads, y = query tiles (reversed when causal: the longest rows start first).
// vec: 16-byte loads of q, k, v (host-checked); ovec: o's columns are contiguous, pairs aligned.
template <class DT, class SC, int BM, int BN, int DP, int DVP, int STAGES>
__global__ void __launch_bounds__(BM * 2) fa_mma(const Params p, int D, int DV, bool vec, bool ovec) {
  typedef typename DT::raw raw;
  constexpr int NT = BM * 2, LDQ = DP + pad<DT>(), LDK = LDQ, LDV = DVP + pad<DT>();
  constexpr int NB = BN / 8, ND = DVP / 8;        // n8 tiles of the scores and of O per warp
  static_assert(BM % 16 == 0 && BN % 16 == 0 && DP % 16 == 0 && DVP % 16 == 0, "mma tile shapes");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  raw* sQ = reinterpret_cast<raw*>(smem_raw);
  raw* sKV = sQ + BM * LDQ;                       // stage s: K at sKV + s * (BN * (LDK + LDV)), V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, hk = h / p.group;
  const int mt = SC::CAUSAL ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int64_t m0 = (int64_t)mt * BM;
  const raw* Q = static_cast<const raw*>(p.q) + b * p.qs[0] + h * p.qs[1];
  const raw* K = static_cast<const raw*>(p.k) + b * p.ks[0] + hk * p.ks[1];
  const raw* V = static_cast<const raw*>(p.v) + b * p.vs[0] + hk * p.vs[1];
  // keys this block needs: all, or (causal) up to its last row
  const int64_t kend = SC::CAUSAL ? (m0 + BM < p.S ? m0 + BM : p.S) : p.S;
  const int ntiles = (int)((kend + BN - 1) / BN);

  auto issue = [&](int t) {
    raw* sK = sKV + (t % STAGES) * (BN * (LDK + LDV));
    load_tile<DT, BN, DP, LDK, NT>(sK, K, p.ks[2], p.ks[3], (int64_t)t * BN, p.S, D, vec);
    load_tile<DT, BN, DVP, LDV, NT>(sK + BN * LDK, V, p.vs[2], p.vs[3], (int64_t)t * BN, p.S, DV, vec);
  };
  load_tile<DT, BM, DP, LDQ, NT>(sQ, Q + m0 * p.qs[2], p.qs[2], p.qs[3], 0, p.L - m0, D, vec);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {          // Q rides in the first group
    if (s < ntiles) issue(s);
    cp_commit();
  }

  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};   // rows gid and gid + 8
  const int64_t i0 = m0 + warp * 16 + gid;        // this thread's first row (second: i0 + 8)

  for (int t = 0; t < ntiles; ++t) {
    if (t + STAGES - 1 < ntiles) issue(t + STAGES - 1);
    cp_commit();                                  // (possibly empty) keeps the group count uniform
    cp_wait<STAGES - 1>();                        // tile t (and Q) have landed for this thread
    __syncthreads();                              // ... and for every thread
    const raw* sK = sKV + (t % STAGES) * (BN * (LDK + LDV));
    const raw* sV = sK + BN * LDK;
    const int64_t n0 = (int64_t)t * BN;

    float s[NB][4];
#pragma unroll
    for (int n = 0; n < NB; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    Products<DT>::template scores<NB, DP, LDQ, LDK>(s, sQ, sK, warp, lane);
    online_softmax<SC>(p, s, o, mrow, lrow, b, h, i0, n0, tig);

    Products<DT>::template pv<NB, ND, LDV>(o, s, sV, lane);
    __syncthreads();                              // stage t % STAGES is refilled next iteration
  }
  cp_wait<0>();
  store_o<DT, SC>(p, o, lrow, b, h, i0, tig, DV, ovec);
}

template <int BM, int BN, int DP, int DVP>
constexpr size_t fma_smem() {   // bytes: Q [BM][DP + 1], K [BN][DP + 1], V [BN][DVP], P [BM][BN]
  return (size_t)4 * (BM * (DP + 1) + BN * (DP + 1) + BN * DVP + BM * BN);
}

// fp32: grid as fa_mma; 256 threads (16 x 16).
template <class SC, int BM, int BN, int DP, int DVP>
__global__ void __launch_bounds__(256) fa_fma(const Params p, int D, int DV) {
  constexpr int RM = BM / 16, RN = BN / 16, RD = DVP / 16;   // rows, key columns, O columns per thread
  constexpr int LDQ = DP + 1, LDK = DP + 1, LDV = DVP, LDP = BN;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);
  float* sK = sQ + BM * LDQ;
  float* sV = sK + BN * LDK;
  float* sP = sV + BN * LDV;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, hk = h / p.group;
  const int mt = SC::CAUSAL ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
  const int64_t m0 = (int64_t)mt * BM;
  const float* Q = static_cast<const float*>(p.q) + b * p.qs[0] + h * p.qs[1];
  const float* K = static_cast<const float*>(p.k) + b * p.ks[0] + hk * p.ks[1];
  const float* V = static_cast<const float*>(p.v) + b * p.vs[0] + hk * p.vs[1];
  const int64_t kend = SC::CAUSAL ? (m0 + BM < p.S ? m0 + BM : p.S) : p.S;

  for (int e = tid; e < BM * DP; e += 256) {      // consecutive threads: consecutive columns
    const int r = e / DP, c = e % DP;
    sQ[r * LDQ + c] = (m0 + r < p.L && c < D) ? Q[(m0 + r) * p.qs[2] + c * p.qs[3]] : 0.f;
  }
  float o[RM][RD], mrow[RM], lrow[RM];
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    mrow[r] = -INFINITY;
    lrow[r] = 0.f;
#pragma unroll
    for (int c = 0; c < RD; ++c) o[r][c] = 0.f;
  }

  for (int64_t n0 = 0; n0 < kend; n0 += BN) {
    __syncthreads();                              // the previous tile's K, V, P are no longer read
    for (int e = tid; e < BN * DP; e += 256) {
      const int r = e / DP, c = e % DP;
      sK[r * LDK + c] = (n0 + r < p.S && c < D) ? K[(n0 + r) * p.ks[2] + c * p.ks[3]] : 0.f;
    }
    for (int e = tid; e < BN * DVP; e += 256) {
      const int r = e / DVP, c = e % DVP;
      sV[r * LDV + c] = (n0 + r < p.S && c < DV) ? V[(n0 + r) * p.vs[2] + c * p.vs[3]] : 0.f;
    }
    __syncthreads();
    float s[RM][RN];
#pragma unroll
    for (int r = 0; r < RM; ++r)
#pragma unroll
      for (int c = 0; c < RN; ++c) s[r][c] = 0.f;
    for (int d = 0; d < DP; ++d) {
      float qv[RM], kv[RN];
#pragma unroll
      for (int r = 0; r < RM; ++r) qv[r] = sQ[(ty + 16 * r) * LDQ + d];
#pragma unroll
      for (int c = 0; c < RN; ++c) kv[c] = sK[(tx + 16 * c) * LDK + d];
#pragma unroll
      for (int r = 0; r < RM; ++r)
#pragma unroll
        for (int c = 0; c < RN; ++c) s[r][c] = fmaf(qv[r], kv[c], s[r][c]);
    }
#pragma unroll
    for (int r = 0; r < RM; ++r) {
      const int64_t i = m0 + ty + 16 * r;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < RN; ++c) {
        const int64_t j = n0 + tx + 16 * c;
        const bool in = i < p.L && j < p.S && (!SC::CAUSAL || j <= i);
        s[r][c] = in ? SC::at(p, s[r][c], b, h, i, j) : -INFINITY;
        mx = fmaxf(mx, s[r][c]);
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1)        // the row's 16 threads share a half-warp
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mn = fmaxf(mrow[r], mx);
      const float mu = mn == -INFINITY ? 0.f : mn;
      const float alpha = SC::ex(mrow[r] - mu);
      mrow[r] = mn;
      lrow[r] *= alpha;
#pragma unroll
      for (int c = 0; c < RD; ++c) o[r][c] *= alpha;
#pragma unroll
      for (int c = 0; c < RN; ++c) {
        const float pe = SC::ex(s[r][c] - mu);
        lrow[r] += pe;
        sP[(ty + 16 * r) * LDP + tx + 16 * c] = pe;
      }
    }
    __syncthreads();
    for (int j = 0; j < BN; ++j) {
      float vv[RD];
#pragma unroll
      for (int c = 0; c < RD; ++c) vv[c] = sV[j * LDV + tx + 16 * c];
#pragma unroll
      for (int r = 0; r < RM; ++r) {
        const float pe = sP[(ty + 16 * r) * LDP + j];
#pragma unroll
        for (int c = 0; c < RD; ++c) o[r][c] = fmaf(pe, vv[c], o[r][c]);
      }
    }
  }
  float* O = static_cast<float*>(p.o) + b * p.os[0] + h * p.os[1];
#pragma unroll
  for (int r = 0; r < RM; ++r) {
    float l = lrow[r];
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    const int64_t i = m0 + ty + 16 * r;
    if (i >= p.L) continue;
    const float inv = SC::inv(l);
#pragma unroll
    for (int c = 0; c < RD; ++c) {
      const int col = tx + 16 * c;
      if (col < DV) O[i * p.os[2] + (int64_t)col * p.os[3]] = o[r][c] * inv;
    }
  }
}

// ---- host side: bind the operands, check the shapes, launch ----

// A task tensor the kernel reads or writes: in[index] (out[0] for the output), its HtamDtype and
// bytes per element, and how its 4 kernel dims are bound (Bind).
struct Operand {
  int index;
  int dtype;
  int esz;
  Bind bind;
};

// 16-byte cp.async chunks of a (batch, head, row, col) operand at base are whole: unit column
// stride, the other strides multiples of a chunk's E elements, base 16-byte aligned.
static inline bool vec16(const int64_t* st, const void* base, int E) {
  return st[3] == 1 && st[0] % E == 0 && st[1] % E == 0 && st[2] % E == 0 && htam_aligned(base, 16);
}

// The kernel of a dtype tag and its launch: fa_mma (bf16 / fp16 / Tf32: BM / 16 warps, BM * 2
// threads) or, specialized below, fa_fma (F32: 256 threads). SMEM: its dynamic shared memory in
// bytes.
template <class DT, class SC, int BM, int BN, int DP, int DVP, int STAGES>
struct Kernel {
  static constexpr size_t SMEM = mma_smem<DT, BM, BN, DP, DVP, STAGES>();
  static cudaError_t allow_smem() {
    return cudaFuncSetAttribute(fa_mma<DT, SC, BM, BN, DP, DVP, STAGES>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM);
  }
  static void launch(dim3 grid, cudaStream_t stream, const Params& p, int D, int DV, bool vec, bool ovec) {
    fa_mma<DT, SC, BM, BN, DP, DVP, STAGES><<<grid, BM * 2, SMEM, stream>>>(p, D, DV, vec, ovec);
  }
};
template <class SC, int BM, int BN, int DP, int DVP, int STAGES>
struct Kernel<F32, SC, BM, BN, DP, DVP, STAGES> {
  static constexpr size_t SMEM = fma_smem<BM, BN, DP, DVP>();
  static cudaError_t allow_smem() {
    return cudaFuncSetAttribute(fa_fma<SC, BM, BN, DP, DVP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)SMEM);
  }
  static void launch(dim3 grid, cudaStream_t stream, const Params& p, int D, int DV, bool, bool) {
    fa_fma<SC, BM, BN, DP, DVP><<<grid, 256, SMEM, stream>>>(p, D, DV);
  }
};

// The region's tensors bound to Params (p.B..p.group set). Region (generated per region): N_IN
// task inputs; D, DV: q/k's and v's head dims; GQA: any H % Hk == 0 query heads per kv head (else
// Hk == H, or 1 broadcast kv head); q, k, v, o: Operand; m[NMASK]: the masks SC::at reads (p.m[i],
// p.ms[i]), NMASK <= 2. Returns 0, kEmpty where there is nothing to compute, or HTAM_ERR_SHAPE for
// tensors the bindings do not fit (torch runs the region).
static const int kEmpty = -1;
template <class Region>
static int operands(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, Params* pp) {
  typedef Region R;
  Params& p = *pp;
  if (n_in != R::N_IN || n_out != 1) return HTAM_ERR_SHAPE;
  if (in[R::q.index].dtype != R::q.dtype || in[R::k.index].dtype != R::k.dtype ||
      in[R::v.index].dtype != R::v.dtype || out[0].dtype != R::o.dtype) return HTAM_ERR_SHAPE;
  for (int i = 0; i < R::NMASK; ++i)
    if (in[R::m[i].index].dtype != R::m[i].dtype) return HTAM_ERR_SHAPE;
  int64_t st_q[4], sz_q[4], off_q, st_k[4], sz_k[4], off_k, st_v[4], sz_v[4], off_v;
  if (!bind(in[R::q.index], R::q.bind, st_q, sz_q, &off_q)) return HTAM_ERR_SHAPE;
  if (!bind(in[R::k.index], R::k.bind, st_k, sz_k, &off_k)) return HTAM_ERR_SHAPE;
  if (!bind(in[R::v.index], R::v.bind, st_v, sz_v, &off_v)) return HTAM_ERR_SHAPE;
  int64_t st_m[2][4], sz_m[2][4], off_m[2];
  for (int i = 0; i < R::NMASK; ++i)
    if (!bind(in[R::m[i].index], R::m[i].bind, st_m[i], sz_m[i], &off_m[i])) return HTAM_ERR_SHAPE;
  int64_t st_o[4], sz_o[4], off_o;
  if (!bind(out[0], R::o.bind, st_o, sz_o, &off_o)) return HTAM_ERR_SHAPE;
  // q (B, H, L, E), k (Bk, Hk, S, E), v (Bk, Hk, S, Ev), out (B, H, L, Ev); kv batch 1 broadcasts
  const int64_t B = sz_q[0], H = sz_q[1], L = sz_q[2], S = sz_k[2], Hk = sz_k[1];
  const int D = R::D, DV = R::DV;
  if (sz_q[3] != D || sz_k[3] != D || sz_v[3] != DV || sz_v[2] != S || sz_v[1] != Hk) return HTAM_ERR_SHAPE;
  if ((sz_k[0] != B && sz_k[0] != 1) || sz_v[0] != sz_k[0] || Hk < 1 ||
      !(R::GQA ? H % Hk == 0 : (Hk == H || Hk == 1))) return HTAM_ERR_SHAPE;
  if (sz_o[0] != B || sz_o[1] != H || sz_o[2] != L || sz_o[3] != DV) return HTAM_ERR_SHAPE;
  if (B * H > 2147483647LL || L > 2147483647LL || S > 2147483647LL) return HTAM_ERR_SHAPE;
  if (B == 0 || H == 0 || L == 0) return kEmpty;
  if (S == 0) return HTAM_ERR_SHAPE;   // torch's empty softmax: left to torch
  const int64_t want[4] = {B, H, L, S};
  p = Params{};
  p.q = static_cast<const char*>(in[R::q.index].data) + off_q * R::q.esz;
  p.k = static_cast<const char*>(in[R::k.index].data) + off_k * R::k.esz;
  p.v = static_cast<const char*>(in[R::v.index].data) + off_v * R::v.esz;
  p.o = static_cast<char*>(out[0].data) + off_o * R::o.esz;
  for (int d = 0; d < 4; ++d) { p.qs[d] = st_q[d]; p.ks[d] = st_k[d]; p.vs[d] = st_v[d]; p.os[d] = st_o[d]; }
  for (int i = 0; i < R::NMASK; ++i) {
    p.m[i] = static_cast<const char*>(in[R::m[i].index].data) + off_m[i] * R::m[i].esz;
    for (int d = 0; d < 4; ++d) {
      if (sz_m[i][d] != 1 && sz_m[i][d] != want[d]) return HTAM_ERR_SHAPE;   // broadcasts to (B, H, L, S)
      p.ms[i][d] = sz_m[i][d] == 1 ? 0 : st_m[i][d];
    }
  }
  p.B = (int)B; p.H = (int)H; p.L = (int)L; p.S = (int)S; p.group = (int)(H / Hk);
  return 0;
}

// The entry point's body: the region bound (operands), then the kernel of the dtype launched.
template <class DT, class SC, class Region, int BM, int BN, int DP, int DVP, int STAGES>
static int run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  typedef Kernel<DT, SC, BM, BN, DP, DVP, STAGES> K;
  Params p;
  const int bound = operands<Region>(in, n_in, out, n_out, &p);
  if (bound != 0) return bound == kEmpty ? HTAM_OK : bound;
  const int D = Region::D, DV = Region::DV;
  const int64_t L = p.L;
  const int64_t* st_q = p.qs; const int64_t* st_k = p.ks; const int64_t* st_v = p.vs; const int64_t* st_o = p.os;
  // fa_fma (F32) reads and writes element by element: it takes no vec / ovec
  constexpr int esz = sizeof(typename DT::raw), E = 16 / esz;
  const bool vec = !std::is_same<DT, F32>::value && D % E == 0 && DV % E == 0 && vec16(st_q, p.q, E) &&
                   vec16(st_k, p.k, E) && vec16(st_v, p.v, E);
  const bool ovec = st_o[3] == 1 && st_o[0] % 2 == 0 && st_o[1] % 2 == 0 && st_o[2] % 2 == 0 &&
                    htam_aligned(p.o, 2 * esz);
  static bool ready[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return (int)e;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  if (!ready[dev]) {
    e = K::allow_smem();
    if (e != cudaSuccess) return (int)e;
    ready[dev] = true;
  }
  const int64_t mtiles = (L + BM - 1) / BM;
  if (mtiles > 65535) return HTAM_ERR_SHAPE;
  K::launch(dim3((unsigned)(p.B * p.H), (unsigned)mtiles), stream, p, D, DV, vec, ovec);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}

#ifdef HTAM_CUDNN_SDPA
// The entry point's body on cuDNN's fused attention (the htam_cudnn_sdpa library: cudnn_sdpa.h):
// the region bound as for the kernel above, no masks, one scale, causal or not; a kv batch of 1
// broadcast to B as a zero stride.
template <class Region>
static int run_cudnn(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream,
                     float scale, bool causal) {
  static_assert(Region::NMASK == 0 && Region::D == Region::DV, "cuDNN's attention: no masks, E == Ev");
  Params p;
  const int bound = operands<Region>(in, n_in, out, n_out, &p);
  if (bound != 0) return bound == kEmpty ? HTAM_OK : bound;
  HtamSdpa a = {};
  a.dtype = Region::q.dtype;
  a.q = p.q; a.k = p.k; a.v = p.v; a.o = p.o;
  a.b = p.B; a.h = p.H; a.h_kv = p.H / p.group; a.l = p.L; a.s = p.S; a.d = Region::D;
  for (int d = 0; d < 4; ++d) { a.qs[d] = p.qs[d]; a.ks[d] = p.ks[d]; a.vs[d] = p.vs[d]; a.os[d] = p.os[d]; }
  a.scale = scale;
  a.causal = causal ? 1 : 0;
  return htam_cudnn_sdpa(&a, stream);
}
#endif
}  // namespace fa
// ---- end flash attention ----
