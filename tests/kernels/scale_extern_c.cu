// Honest sample (plain extern "C" form, dim3 launch config): out[0] = 2 * in[0], fp32.
// Mentions of cudaDeviceSynchronize() or <<<1, 1>>> in comments and strings must not trip the
// static check: "cudaDeviceSynchronize(); k<<<1, 1>>>();"
#include <cuda_runtime.h>
#include "htam_abi.h"

__global__ void scale_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}

static const char* kNote = "no std::thread, no getenv(\"X\"), no fopen(\"f\")";

extern "C" int htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                        cudaStream_t stream) {
  (void)kNote;
  if (n_in != 1 || n_out != 1 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  int64_t n = htam_numel(&in[0]);
  if (n == 0) return HTAM_OK;
  /* a block comment: cudaStreamCreate(&s); */
  dim3 grid((unsigned)((n + 127) / 128)), block(128);
  scale_kernel<<<grid, block, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, n);
  return (int)cudaGetLastError();
}
