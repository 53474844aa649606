// Rejected by the static check: the launch has no stream (legacy default stream).
#include "htam_abi.h"

__global__ void relu_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.0f);
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                    cudaStream_t stream) {
  int64_t n = htam_numel(&in[0]);
  relu_kernel<<<(unsigned)((n + 255) / 256), 256>>>((const float*)in[0].data, (float*)out[0].data, n);
  return HTAM_OK;
}
