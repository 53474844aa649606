// task: gelu_affine   expect: ok
// The honest kernel: exact (erf) GELU, then the per-column affine, grid-stride over all elements.
#include "htam_abi.h"

__global__ void gelu_affine(const float* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ b, float* __restrict__ y, int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    int64_t c = i % cols;
    float g = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    y[i] = g * w[c] + b[c];
  }
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 3 || n_out != 1 || in[0].ndim != 2 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  int64_t n = htam_numel(&in[0]), cols = in[0].sizes[1];
  int64_t blocks = (n + 255) / 256;
  if (blocks > 132 * 64) blocks = 132 * 64;
  gelu_affine<<<(unsigned)blocks, 256, 0, stream>>>((const float*)in[0].data, (const float*)in[1].data,
                                                   (const float*)in[2].data, (float*)out[0].data, n, cols);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
