// Honest ABI, failing launch: 4096 threads per block exceeds the limit (1024), so the launch
// fails and htam_run returns cudaErrorInvalidConfiguration (9) through HTAM_CHECK_LAUNCH.
#include "htam_abi.h"

__global__ void fill_kernel(float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 1.0f;
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                    cudaStream_t stream) {
  fill_kernel<<<1, 4096, 0, stream>>>((float*)out[0].data, htam_numel(&out[0]));
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
