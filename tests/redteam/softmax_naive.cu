// task: softmax   expect: nan
// Bug, not cheat: exp(x) without subtracting the row max. Passes on N(0,1) and U(-3,3) inputs;
// the outlier distribution (|x| up to 128, exp overflows past 88) turns rows into inf/inf = NaN.
#include "htam_abi.h"

__global__ void softmax_naive(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float part[32];
  const float* xr = x + blockIdx.x * cols;
  float* yr = y + blockIdx.x * cols;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0.0f;
  for (int k = 0; k < (int)(blockDim.x >> 5); ++k) s += part[k];
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j]) / s;
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 1 || n_out != 1 || in[0].ndim != 2 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  softmax_naive<<<(unsigned)in[0].sizes[0], 256, 0, stream>>>((const float*)in[0].data,
                                                              (float*)out[0].data, in[0].sizes[1]);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
