// ---- torch_htam expert: one cuBLASLt matmul described by value, and the layout store (gemm.py) ---
// Needs cublaslt.cuh (LtState, lt_state, align_of, CK) before it.
// D (m x n, column-major, ld ldd, `batch` matrices sa/sb/sd apart) = op(A) op(B) [+ bias, act]:
// A is m x k (ta = N, ld lda) or stored k x m (ta = T); B is k x n (tb = N) or stored n x k.
struct LtCall {
  int64_t m, n, k, lda, ldb, ldd, batch, sa, sb, sd;
  int32_t ta, tb, epi, al[3];
};

struct LtCallEntry {
  bool used = false; int dev = -1; LtCall key;
  cublasLtMatmulDesc_t op = nullptr; cublasLtMatrixLayout_t A = nullptr, B = nullptr, D = nullptr;
  cublasLtMatmulAlgo_t algo;
};

static void lt_call_release(LtCallEntry& e) {
  if (e.op) cublasLtMatmulDescDestroy(e.op);
  if (e.A) cublasLtMatrixLayoutDestroy(e.A);
  if (e.B) cublasLtMatrixLayoutDestroy(e.B);
  if (e.D) cublasLtMatrixLayoutDestroy(e.D);
  e.op = nullptr; e.A = e.B = e.D = nullptr; e.used = false;
}

static int lt_layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                     int64_t batch, int64_t stride) {
  CK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t bc = (int32_t)batch;
    CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
    CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return 0;
}

// c: the problem (al[] is filled here from the pointers); rank: which of the heuristic's ranked
// algorithms; alpha: the product's scale; bias: the BIAS epilogues' vector (length m) or nullptr.
static int lt_call(LtCall c, cublasComputeType_t compute, cudaDataType_t type, int rank, float alpha,
                   const void* A, const void* B, void* D, const void* bias, cudaStream_t stream) {
  LtState* st = nullptr;
  int rc = lt_state(&st);
  if (rc) return rc;
  int dev = 0; cudaGetDevice(&dev);
  c.al[0] = align_of(A); c.al[1] = align_of(B); c.al[2] = align_of(D);
  static LtCallEntry cache[8];
  static int next_slot = 0;
  LtCallEntry* e = nullptr;
  for (auto& x : cache)
    if (x.used && x.dev == dev && memcmp(&x.key, &c, sizeof(LtCall)) == 0) e = &x;
  if (!e) {
    e = &cache[next_slot]; next_slot = (next_slot + 1) % 8;
    lt_call_release(*e);
    CK(cublasLtMatmulDescCreate(&e->op, compute, CUDA_R_32F));
    cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)c.epi;
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if ((rc = lt_layout(&e->A, type, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda, c.batch, c.sa))) return rc;
    if ((rc = lt_layout(&e->B, type, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb, c.batch, c.sb))) return rc;
    if ((rc = lt_layout(&e->D, type, c.m, c.n, c.ldd, c.batch, c.sd))) return rc;
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = kWorkspace;
    const uint32_t ua = c.al[0], ub = c.al[1], uc = c.al[2];
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof(ua));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof(ub));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &uc, sizeof(uc));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &uc, sizeof(uc));
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->handle, e->op, e->A, e->B, e->D, e->D, pref, 8, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      lt_call_release(*e);
      return HTAM_ERR_SHAPE;   // no algorithm for this problem: the original region runs
    }
    e->algo = res[rank < found ? rank : found - 1].algo;
    e->key = c; e->dev = dev; e->used = true;
  }
  if (bias) CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float beta = 0.f;
  CK(cublasLtMatmul(st->handle, e->op, &alpha, A, e->A, B, e->B, &beta, D, e->D, D, e->D, &e->algo,
                    st->ws, kWorkspace, stream));
  return 0;
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
