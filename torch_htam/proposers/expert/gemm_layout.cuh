// ---- torch_htam expert: a GEMM with layout operands/outputs (gemm.py's layout path) -------------
// Needs cublaslt.cuh and lt_call.cuh before it. Y[batch, M, N] = A[batch, M, K] B[batch, K, N], A and
// B strided views of region inputs, sizes as captured. cuBLASLt computes Y^T column-major: its A is
// our B^T (N x K), its B our A^T (K x M). Each output is a box of Y (gemm_layout.py's OutBox): one
// cuBLASLt call writes it where its strides make it a (batched) column-major matrix (lay_direct);
// otherwise Y goes to scratch and a kernel per output stores it through its layout.

// The GEMM's constants (elements) in cuBLASLt's roles.
struct LayGemm {
  int64_t batch, M, N, K;
  int64_t outer;              // batch = outer x cuBLASLt's batch: lay_call loops over the outer part
  int32_t ta, tb;             // 1: cuBLASLt's A (our B) / B (our A) read transposed (op T)
  int64_t lda, ldb;
  int64_t sa, sb;             // cuBLASLt's batch strides of its A and B (0: broadcast)
  int64_t a_col, b_row;       // our B's column stride, our A's row stride: a box's n0 / m0 offsets
  int64_t a_outer, b_outer;   // the outer loop's strides of cuBLASLt's A and B
};

// One fine dim of an output's map into Y (gemm_layout.OutLayout): `size` steps, `src` elements of
// Y apart and `mult` strides of output dim `dim` apart; it steps Y's axis `axis` (0 b, 1 m, 2 n;
// -1: none, a size-1 or repeated dim) by `step` units of that axis.
struct LayDim { int64_t size, src; int32_t dim; int64_t mult; int32_t axis; int64_t step; };

// One region output: the box of Y it covers (lo and extent along b, m, n) and its fine dims.
struct LayOut { int64_t base, lo[3], ext[3]; int32_t nfine; LayDim f[HTAM_MAX_DIMS]; };

// cuBLASLt's A (our B) and B (our A), its bias vector (length N, or nullptr) and alpha.
struct LtOperands { const char* A; const char* B; const char* bias; float alpha; };

// One cuBLASLt call for the box lo..lo+ext of Y (its b0 / m0 / n0 offsets folded into the operands
// and bias) into D (ld ldd, batch stride sd); with an outer batch, one call per outer index, D
// stepping d_outer elements.
template <class G>
static int lay_call(const LayGemm& g, const LtOperands& x, const int64_t* lo, const int64_t* ext, void* D,
                    int64_t ldd, int64_t sd, int64_t d_outer, cudaStream_t stream) {
  const int64_t es = sizeof(typename G::raw);
  LtCall c{};
  c.m = ext[2]; c.n = ext[1]; c.k = g.K; c.lda = g.lda; c.ldb = g.ldb; c.ldd = ldd;
  c.batch = g.outer > 1 ? g.batch / g.outer : ext[0]; c.sa = g.sa; c.sb = g.sb; c.sd = sd;
  c.ta = g.ta; c.tb = g.tb; c.epi = G::kEpi;
  const char* A = x.A + (lo[0] * g.sa + lo[2] * g.a_col) * es;
  const char* B = x.B + (lo[0] * g.sb + lo[1] * g.b_row) * es;
  const char* bias = x.bias ? x.bias + lo[2] * es : nullptr;
  for (int64_t zo = 0; zo < g.outer; ++zo) {
    const int rc = lt_call<8, 8>(c, G::kCompute, G::kType, G::kAlgo, G::kTile, x.alpha, A + zo * g.a_outer * es,
                                 B + zo * g.b_outer * es, (char*)D + zo * d_outer * es, bias, stream);
    if (rc) return rc;
  }
  return HTAM_OK;
}

// Where cuBLASLt can write output `out` of layout o as it is: a (batched) column-major matrix, one
// stride per axis, unit along n. Fills d: the strides of b (cuBLASLt's batch of `inner` matrices),
// m, n; dso, the outer batch loop's stride; ldd.
struct LayDst { int64_t ds[3], dso, ldd; };

static bool lay_direct_ok(const LayOut& o, const HtamTensor& out, int64_t inner, LayDst* d) {
  int64_t dst[HTAM_MAX_DIMS];
  d->ds[0] = d->ds[1] = d->ds[2] = 0;
  for (int f = 0; f < o.nfine; ++f) {
    dst[f] = out.strides[o.f[f].dim] * o.f[f].mult;
    if (o.f[f].axis >= 0 && o.f[f].step == 1) d->ds[o.f[f].axis] = dst[f];
  }
  d->dso = d->ds[0] * inner;
  for (int f = 0; f < o.nfine; ++f)
    if (o.f[f].axis == 0 && o.f[f].step == inner) d->dso = dst[f];
  bool ok = true;
  for (int f = 0; f < o.nfine; ++f) {
    const LayDim& x = o.f[f];
    if (x.axis == 0 && x.step % inner == 0) {
      ok = ok && dst[f] == d->dso * (x.step / inner);
    } else if (x.axis >= 0) {
      ok = ok && dst[f] == d->ds[x.axis] * x.step;
      if (x.axis == 0 && x.step * x.size > inner) ok = ok && d->dso == d->ds[0] * inner;   // across the loop
    }
  }
  if (o.ext[2] > 1 && d->ds[2] != 1) ok = false;
  d->ldd = o.ext[1] > 1 ? d->ds[1] : o.ext[2];
  return ok && d->ldd >= o.ext[2];
}

// Every output written by cuBLASLt straight into it; HTAM_ERR_SHAPE where one can't be (its strides,
// or no algorithm for them): the scratch path then writes every output, any written here included.
template <class G>
static int lay_direct(const LayGemm& g, const LtOperands& x, const LayOut* outs, HtamTensor* out, int n_out,
                      cudaStream_t stream) {
  const int64_t inner = g.batch / g.outer;
  LayDst d;
  for (int k = 0; k < n_out; ++k)
    if (!lay_direct_ok(outs[k], out[k], inner, &d)) return HTAM_ERR_SHAPE;
  for (int k = 0; k < n_out; ++k) {
    lay_direct_ok(outs[k], out[k], inner, &d);
    const int rc = lay_call<G>(g, x, outs[k].lo, outs[k].ext, out[k].data, d.ldd, d.ds[0], d.dso, stream);
    if (rc) return rc;
  }
  return HTAM_OK;
}

// A contiguous scratch tensor per device for the GEMM result when outputs need the store, sized
// once (the layout path's sizes are fixed). cudaMalloc: keep the first call outside graph capture.
static int lt_scratch(size_t bytes, void** p) {
  static void* bufs[64];
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) return (int)ce;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  if (!bufs[dev]) {
    ce = cudaMalloc(&bufs[dev], bytes);
    if (ce != cudaSuccess) { bufs[dev] = nullptr; return (int)ce; }
  }
  *p = bufs[dev];
  return 0;
}

// All of Y (contiguous [batch, M, N]) into scratch *scr.
template <class G>
static int lay_scratch(const LayGemm& g, const LtOperands& x, void** scr, cudaStream_t stream) {
  const int64_t y_numel = g.batch * g.M * g.N;
  const int rc = lt_scratch((size_t)y_numel * sizeof(typename G::raw), scr);
  if (rc) return rc;
  const int64_t lo[3] = {0, 0, 0}, ext[3] = {g.batch, g.M, g.N};
  return lay_call<G>(g, x, lo, ext, *scr, g.N, g.M * g.N, g.batch / g.outer * g.M * g.N, stream);
}

// Y in the region's dims (sizes[ndim], contiguous) at p, as the epilogue kernels read it.
static HtamTensor lay_y(void* p, int32_t dtype, const int64_t* sizes, int ndim) {
  HtamTensor y = {};
  y.data = p; y.dtype = dtype; y.ndim = ndim;
  int64_t acc = 1;
  for (int d = ndim - 1; d >= 0; --d) { y.sizes[d] = sizes[d]; y.strides[d] = acc; acc *= sizes[d]; }
  return y;
}

// One GEMM output written from the contiguous result y through its strided map: output element i
// (row-major over size[]) = y[base + sum_k i_k * src[k]], stored at sum_k i_k * dst[k] (the
// output's own strides). Consecutive threads take consecutive output elements, V at a time: V > 1
// only where the last fine dim steps by one on both sides and every offset is a multiple of V
// (store_layout checks), so each thread moves one 16-byte word.
struct StoreMap {
  int ndim; int64_t base;
  int64_t size[HTAM_MAX_DIMS], src[HTAM_MAX_DIMS], dst[HTAM_MAX_DIMS];
};

template <int BYTES> struct StoreWord { typedef uint4 T; };
template <> struct StoreWord<2> { typedef unsigned short T; };
template <> struct StoreWord<4> { typedef unsigned T; };
template <> struct StoreWord<8> { typedef uint2 T; };

// n: vectors of V elements (the last fine dim's size is counted in vectors; its strides are 1)
template <typename T, typename I, int V>
__global__ void __launch_bounds__(256) layout_store(const T* __restrict__ y, T* __restrict__ o, StoreMap mp, I n) {
  typedef typename StoreWord<(int)sizeof(T) * V>::T W;
  const int last = mp.ndim - 1;
  const I nl = (I)mp.size[last] / V;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I rem = i / nl, s = (I)mp.base, d = 0;
    const I jl = (i - rem * nl) * V;
    s += jl * (I)mp.src[last];
    d += jl * (I)mp.dst[last];
    for (int k = last - 1; k >= 0; --k) {
      const I sz = (I)mp.size[k], j = rem % sz;
      rem /= sz;
      s += j * (I)mp.src[k];
      d += j * (I)mp.dst[k];
    }
    if (V == 1) o[d] = y[s];
    else *reinterpret_cast<W*>(o + d) = *reinterpret_cast<const W*>(y + s);
  }
}

template <typename T, int V>
static void launch_layout_store(const void* y, const HtamTensor& out, const StoreMap& mp, int64_t n,
                                bool idx32, cudaStream_t stream) {
  const int64_t nv = n / V;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((nv + 255) / 256, (int64_t)htam_sm_count() * 16));
  if (idx32) layout_store<T, int32_t, V><<<blocks, 256, 0, stream>>>((const T*)y, (T*)out.data, mp, (int32_t)nv);
  else layout_store<T, int64_t, V><<<blocks, 256, 0, stream>>>((const T*)y, (T*)out.data, mp, nv);
}

template <typename T>
static int store_layout(const void* y, const HtamTensor& out, const StoreMap& mp, int64_t y_numel,
                        cudaStream_t stream) {
  int64_t n = 1, last = 0;
  for (int k = 0; k < mp.ndim; ++k) { n *= mp.size[k]; last += (mp.size[k] - 1) * mp.dst[k]; }   // fine dims
  if (n == 0) return HTAM_OK;
  if (mp.ndim == 0) {     // one element: a map of one dim of size 1
    StoreMap one = mp;
    one.ndim = 1; one.size[0] = 1; one.src[0] = 0; one.dst[0] = 0;
    return store_layout<T>(y, out, one, y_numel, stream);
  }
  const bool idx32 = n < (int64_t(1) << 31) && y_numel < (int64_t(1) << 31) && last < (int64_t(1) << 31);
  // NOTE: one element a thread, with a div/mod per dim, leaves this copy instruction-bound: with
  // it, GQA's repeated k/v heads (16.8M bf16 elements) took 0.185 ms against eager's 0.100 ms
  // for the whole region on an H100 (bench/results/kernelbench-20261124-010554.json).
  constexpr int V = 16 / (int)sizeof(T);
  const int l = mp.ndim - 1;
  bool vec = V > 1 && mp.src[l] == 1 && mp.dst[l] == 1 && mp.size[l] % V == 0 &&
             mp.base % V == 0 && htam_aligned(y, 16) && htam_aligned(out.data, 16);
  for (int k = 0; vec && k < l; ++k) vec = mp.src[k] % V == 0 && mp.dst[k] % V == 0;
  if (vec) launch_layout_store<T, V>(y, out, mp, n, idx32, stream);
  else launch_layout_store<T, 1>(y, out, mp, n, idx32, stream);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}

// A store map's fine dims in the output's memory order: dst strides non-increasing, outer to
// inner (htam_memory_order), as PyTorch's TensorIterator orders a copy by its output, so
// neighbouring threads write neighbouring elements. Any order stores the same elements. Left alone
// where a dim of size > 1 has dst stride 0. NOTE: ConvNeXt's pwconv2 * gamma stored permuted to
// [16, 96, 56, 56] channels-last walked w innermost, 96 elements apart on both sides: 0.30x of
// eager, H100, bench/results/anytime_table-*; in this order both sides step by one.
static inline void lay_order(StoreMap& mp) {
  int order[HTAM_MAX_DIMS];
  if (!htam_memory_order(mp.dst, mp.size, mp.ndim, order)) return;
  const StoreMap was = mp;
  for (int k = 0; k < mp.ndim; ++k) {
    mp.size[k] = was.size[order[k]]; mp.src[k] = was.src[order[k]]; mp.dst[k] = was.dst[order[k]];
  }
}

// The store map of output `out` of layout o (its own strides at run time), in its memory order.
static StoreMap lay_map(const LayOut& o, const HtamTensor& out) {
  StoreMap mp{};
  mp.ndim = o.nfine; mp.base = o.base;
  for (int f = 0; f < o.nfine; ++f) {
    mp.size[f] = o.f[f].size; mp.src[f] = o.f[f].src; mp.dst[f] = out.strides[o.f[f].dim] * o.f[f].mult;
  }
  lay_order(mp);
  return mp;
}

// Every output stored from Y in scratch through its layout (no epilogue left).
template <class G>
static int lay_store(const LayGemm& g, const LayOut* outs, const void* scr, HtamTensor* out, int n_out,
                     cudaStream_t stream) {
  for (int k = 0; k < n_out; ++k) {
    const int rc = store_layout<typename G::raw>(scr, out[k], lay_map(outs[k], out[k]), g.batch * g.M * g.N, stream);
    if (rc) return rc;
  }
  return HTAM_OK;
}

// The epilogue computed for each output element and stored through the output's layout (the
// permuted store is the epilogue's): output element i (row-major over mp's fine dims) is Y's element
// g, stored at d; g (over Y's dims in sp, not collapsed) gives each access's offset. Epi: the
// region's epilogue, Epi::at(off, p...) its value with its Epi::kAcc accesses (Y, from scratch,
// among them) read at p[a] + off[a]. The pointers are separate kernel parameters, not one struct:
// a struct parameter schedules this loop differently.
template <typename I, class T, int kSpace, class Epi, typename... P>
__global__ void __launch_bounds__(256) epi_store(Space<kSpace> sp, StoreMap mp, I n, typename T::raw* __restrict__ o,
                                                 const P*... p) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    I rem = i, g = (I)mp.base, d = 0;
    for (int k = mp.ndim - 1; k >= 0; --k) {
      const I sz = (I)mp.size[k], j = rem % sz;
      rem /= sz;
      g += j * (I)mp.src[k];
      d += j * (I)mp.dst[k];
    }
    I off[Epi::kAcc > 0 ? Epi::kAcc : 1] = {};
    for (int k = sp.ndim - 1; k >= 0; --k) {     // Y's index -> each access's offset
      const I sz = (I)sp.size[k], j = g % sz;
      g /= sz;
#pragma unroll
      for (int a = 0; a < Epi::kAcc; ++a) off[a] += j * (I)sp.st[a][k];
    }
    o[d] = T::from_f(Epi::at(off, p...));
  }
}

// epi_store into one output of layout o; 32-bit indices where Y, every access (max_off) and the
// output's last element fit. p: the accesses' pointers, in Epi's order.
template <class G, class Epi, int kSpace, typename... P>
static int lay_epi_store(const Space<kSpace>& sp, const LayGemm& g, const LayOut& o, int64_t max_off,
                         HtamTensor& out, cudaStream_t stream, const P*... p) {
  typedef typename G::raw raw;
  typedef typename G::Type T;
  const StoreMap mp = lay_map(o, out);
  int64_t n = 1, last = 0;
  for (int q = 0; q < mp.ndim; ++q) { n *= mp.size[q]; last += (mp.size[q] - 1) * mp.dst[q]; }
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, (int64_t)htam_sm_count() * 16));
  if (g.batch * g.M * g.N < (int64_t(1) << 31) && max_off < (int64_t(1) << 31) && last < (int64_t(1) << 31))
    epi_store<int32_t, T, kSpace, Epi><<<blocks, 256, 0, stream>>>(sp, mp, (int32_t)n, (raw*)out.data, p...);
  else
    epi_store<int64_t, T, kSpace, Epi><<<blocks, 256, 0, stream>>>(sp, mp, n, (raw*)out.data, p...);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
