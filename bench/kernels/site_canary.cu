// A conv site's host floor, for bench/launch_cost.py: y = x (bf16, channels-last) from the inputs
// a conv + batch-norm site of ours takes (x, w, gamma, beta, mean, var: described, the last five
// unread), in SITE_LAUNCHES launches a call. 1: one kernel, as a conv of our own whose epilogue
// folds batch norm itself would run; 2: a per-channel kernel first (it writes y's first K values,
// which the copy then overwrites), as our cuDNN conv kernels launch their batch-norm fold before
// cudnnBackendExecute. The GPU work is a copy of x: a chain of these calls is bound by its host.
#include "htam_abi.h"

#ifndef SITE_LAUNCHES
#define SITE_LAUNCHES 1
#endif

__global__ void per_channel_kernel(const unsigned short* __restrict__ gamma, unsigned short* __restrict__ y, int64_t k) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = gamma[i];
}

__global__ void copy_kernel(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i];
}

static int blocks_for(int64_t n) { return (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024); }

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  // in: x [N, C, H, W] channels-last, w [K, C, R, S], gamma, beta, mean, var [K]; out: y like x (K == C)
  if (n_in != 6 || n_out != 1) return HTAM_ERR_SHAPE;
  for (int i = 0; i < n_in; ++i)
    if (in[i].dtype != HTAM_BFLOAT16) return HTAM_ERR_SHAPE;
  const int64_t n = htam_numel(&in[0]), k = htam_numel(&in[2]);
  if (out[0].dtype != HTAM_BFLOAT16 || htam_numel(&out[0]) != n || k > n) return HTAM_ERR_SHAPE;
  if (n == 0) return HTAM_OK;
  unsigned short* y = (unsigned short*)out[0].data;
  if (SITE_LAUNCHES == 2) {
    per_channel_kernel<<<blocks_for(k), 256, 0, stream>>>((const unsigned short*)in[2].data, y, k);
    HTAM_CHECK_LAUNCH();
  }
  copy_kernel<<<blocks_for(n), 256, 0, stream>>>((const unsigned short*)in[0].data, y, n);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
