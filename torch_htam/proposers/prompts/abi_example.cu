#include "htam_abi.h"

// Contiguous tensors (the task lists strides); one thread per element with a grid-stride loop,
// so any numel works, including 0.
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = fmaxf(x[i], 0.0f);
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                    cudaStream_t stream) {
  if (n_in != 1 || n_out != 1 || in[0].dtype != HTAM_FLOAT32 || out[0].dtype != HTAM_FLOAT32)
    return HTAM_ERR_SHAPE;
  int64_t n = htam_numel(&in[0]);
  if (n != htam_numel(&out[0])) return HTAM_ERR_SHAPE;
  if (n == 0) return HTAM_OK;
  int threads = 256;
  int blocks = (int)((n + threads - 1) / threads < 65535 ? (n + threads - 1) / threads : 65535);
  relu_kernel<<<blocks, threads, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, n);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
