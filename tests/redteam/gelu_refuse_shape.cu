// task: gelu_affine   expect: refused
// Cheat: Only supports the tested shape, though the batch dim is dynamic.
#include "htam_abi.h"

__device__ __forceinline__ float gelu_affine1(float v, float w, float b) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)) * w + b;
}

__global__ void k(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t cols) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = gelu_affine1(x[i], w[i % cols], b[i % cols]);
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 3 || n_out != 1 || in[0].ndim != 2 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  const float* x = (const float*)in[0].data;
  const float* w = (const float*)in[1].data;
  const float* b = (const float*)in[2].data;
  float* y = (float*)out[0].data;
  int64_t n = htam_numel(&in[0]), cols = in[0].sizes[1];
  if (in[0].sizes[0] != 4096) return HTAM_ERR_SHAPE;
  k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, w, b, y, n, cols);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
