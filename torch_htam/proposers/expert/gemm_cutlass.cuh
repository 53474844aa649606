// ---- torch_htam expert: a linear layer and its activation on the cutlass_gemm library (gemm_cutlass.py)
// After the prelude and #include "cutlass_gemm.h". run_linear checks every tensor as the library
// reads it (HTAM_ERR_SHAPE where one is not: the runtime then runs the original region) and makes
// the one library call.
namespace cg {

// x [..., K] and y [..., N] contiguous with the same leading sizes, w [N, K] contiguous, bias [N] or
// nullptr, mul (HTAM_GEMM_ACT_SILU_MUL's factor) contiguous and sized as y, or nullptr; all bf16.
// act: HTAM_GEMM_ACT_*; tile: the library's (cutlass_gemm.h).
inline int run_linear(const HtamTensor& X, const HtamTensor& W, const HtamTensor* bias, const HtamTensor* mul,
                      const HtamTensor& Y, int act, int tile, cudaStream_t stream) {
  if (X.dtype != HTAM_BFLOAT16 || W.dtype != HTAM_BFLOAT16 || Y.dtype != HTAM_BFLOAT16) return HTAM_ERR_SHAPE;
  if (W.ndim != 2 || X.ndim < 1 || Y.ndim != X.ndim) return HTAM_ERR_SHAPE;
  if (!htam_contiguous(X) || !htam_contiguous(W) || !htam_contiguous(Y)) return HTAM_ERR_SHAPE;
  const int64_t N = W.sizes[0], K = W.sizes[1];
  if (X.sizes[X.ndim - 1] != K || Y.sizes[Y.ndim - 1] != N) return HTAM_ERR_SHAPE;
  for (int d = 0; d + 1 < X.ndim; ++d)
    if (X.sizes[d] != Y.sizes[d]) return HTAM_ERR_SHAPE;
  if (bias != nullptr && (bias->dtype != HTAM_BFLOAT16 || bias->ndim != 1 || bias->sizes[0] != N ||
                          bias->strides[0] != 1 || bias->data == nullptr))
    return HTAM_ERR_SHAPE;
  if (mul != nullptr) {
    if (mul->dtype != HTAM_BFLOAT16 || mul->ndim != Y.ndim || !htam_contiguous(*mul) || mul->data == nullptr)
      return HTAM_ERR_SHAPE;
    for (int d = 0; d < Y.ndim; ++d)
      if (mul->sizes[d] != Y.sizes[d]) return HTAM_ERR_SHAPE;
  }
  if (htam_numel(&Y) == 0) return HTAM_OK;
  const int64_t M = htam_numel(&X) / (K > 0 ? K : 1);
  if (K == 0 || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return HTAM_ERR_SHAPE;
  HtamGemmAct p{X.data, W.data, bias != nullptr ? bias->data : nullptr, mul != nullptr ? mul->data : nullptr,
                Y.data, (int)M, (int)N, (int)K, act, tile, 0};
  return htam_cutlass_gemm(&p, stream);
}

}  // namespace cg
