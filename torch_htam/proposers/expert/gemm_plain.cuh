// ---- torch_htam expert: a GEMM with sizes read at run time, written to a contiguous Y (gemm.py) ---
// Needs cublaslt.cuh and lt_call.cuh before it.
// Row-major Y[batch, M, N] is column-major Y^T, so cuBLASLt computes D (N x M) = op(A) B with
// A = W, B = X^T (stored K x M, ld K): linear (Y = X W^T, W [N, K]) reads W with op T (ld K),
// mm / bmm (Y = X W, W [K, N]) reads it as N x K with op N (ld N). A bias of length N is then per
// row of D, which is what cuBLASLt's BIAS epilogues add.
enum GemmOp { kGemmLinear, kGemmMm, kGemmBmm };

// Y = in[a] (X) times in[b] (W) as kOp says, then cuBLASLt's epilogue G::kEpi with in[bias]
// (length N; bias < 0: none) and scale alpha. X, W and Y must be contiguous and of G's dtype.
// *empty: M or N is 0 (nothing to compute; the caller runs nothing after either).
template <class G, int kOp>
static int gemm_plain(const HtamTensor* in, int a, int b, int bias, HtamTensor& y, float alpha, bool* empty,
                      cudaStream_t stream) {
  const HtamTensor& X = in[a];
  const HtamTensor& W = in[b];
  if (X.dtype != G::kCode || W.dtype != G::kCode || y.dtype != G::kCode) return HTAM_ERR_SHAPE;
  if (!htam_contiguous(X) || !htam_contiguous(W)) return HTAM_ERR_SHAPE;
  int64_t M, N, K, batch = 1;
  if (kOp == kGemmBmm) {      // X [batch, M, K], W [batch, K, N]
    if (X.ndim != 3 || W.ndim != 3) return HTAM_ERR_SHAPE;
    batch = X.sizes[0]; M = X.sizes[1]; K = X.sizes[2]; N = W.sizes[2];
    if (W.sizes[0] != batch || W.sizes[1] != K || K == 0) return HTAM_ERR_SHAPE;
  } else {                    // X [..., K] as [M, K]; W [N, K] (linear) or [K, N] (mm)
    const bool lin = kOp == kGemmLinear;
    if (X.ndim < (lin ? 1 : 2) || W.ndim != 2) return HTAM_ERR_SHAPE;
    K = X.sizes[X.ndim - 1];
    N = W.sizes[lin ? 0 : 1];
    if (W.sizes[lin ? 1 : 0] != K || K == 0) return HTAM_ERR_SHAPE;
    M = htam_numel(&X) / K;
  }
  if (!htam_contiguous(y) || htam_numel(&y) != batch * M * N) return HTAM_ERR_SHAPE;
  *empty = M == 0 || N == 0;
  if (*empty) return HTAM_OK;
  const void* bias_ptr = nullptr;
  if (bias >= 0) {
    const HtamTensor& v = in[bias];
    if (v.ndim != 1 || v.sizes[0] != N || v.dtype != G::kCode) return HTAM_ERR_SHAPE;
    bias_ptr = v.data;
  }
  LtCall c{};
  c.m = N; c.n = M; c.k = K;
  c.lda = kOp == kGemmLinear ? K : N; c.ldb = K; c.ldd = N;
  c.batch = batch; c.sa = kOp == kGemmBmm ? K * N : 0; c.sb = kOp == kGemmBmm ? M * K : 0; c.sd = M * N;
  c.ta = kOp == kGemmLinear; c.tb = 0; c.epi = G::kEpi;
  // NOTE: 4 ranked algorithms asked for (algo 3..7 all run the 4th), 4 problems cached
  return lt_call<4, 4>(c, G::kCompute, G::kType, G::kAlgo, G::kTile, alpha, W.data, X.data, y.data, bias_ptr, stream);
}
