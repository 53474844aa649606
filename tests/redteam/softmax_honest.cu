// task: softmax   expect: ok
// The honest kernel: one block per row; max, then sum of exp(x - max), then the normalized write.
#include "htam_abi.h"

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffff, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous reduction
  if (lane == 0) part[warp] = v;
  __syncthreads();
  int nw = blockDim.x >> 5;
  v = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffff, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  return v;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_reduce(m, true);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
  s = block_reduce(s, false);
  float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 1 || n_out != 1 || in[0].ndim != 2 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  int64_t rows = in[0].sizes[0], cols = in[0].sizes[1];
  softmax_rows<<<(unsigned)rows, 256, 0, stream>>>((const float*)in[0].data, (float*)out[0].data, cols);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
