// Honest cuBLAS sample: out[0] = in[0] @ in[1]^T (x: [M, K], w: [N, K], fp32, contiguous), i.e.
// torch.nn.functional.linear(x, w). Row-major y = x w^T is column-major y^T = w x^T.
#include <cublas_v2.h>
#include "htam_abi.h"

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                    cudaStream_t stream) {
  if (n_in != 2 || n_out != 1 || in[0].ndim != 2 || in[1].ndim != 2) return HTAM_ERR_SHAPE;
  int M = (int)in[0].sizes[0], K = (int)in[0].sizes[1], N = (int)in[1].sizes[0];
  if (in[1].sizes[1] != K) return HTAM_ERR_SHAPE;
  static cublasHandle_t handle = nullptr;   // created once; cuBLAS handles are reusable
  if (!handle && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return HTAM_ERR_SHAPE + 1;
  cublasSetStream(handle, stream);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha,
                                  (const float*)in[1].data, K, (const float*)in[0].data, K, &beta,
                                  (float*)out[0].data, N);
  return st == CUBLAS_STATUS_SUCCESS ? HTAM_OK : HTAM_ERR_SHAPE + 2;
}
