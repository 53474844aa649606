// The canary kernel (inductor.warm_cpp_wrapper): out[0] = a + b and, given a second output,
// out[1] = a * b; fp32, contiguous, one shape. Launched as htam::launch_o1 and launch_o2 from a
// graph compiled with Inductor's C++ wrapper, in a process of its own, before any graph of the
// user's calls our kernels through that wrapper.
#include "htam_abi.h"

__global__ void canary_kernel(const float* __restrict__ a, const float* __restrict__ b,
                              float* __restrict__ sum, float* __restrict__ prod, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    sum[i] = a[i] + b[i];
    if (prod) prod[i] = a[i] * b[i];
  }
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 2 || n_out < 1 || n_out > 2) return HTAM_ERR_SHAPE;
  const int64_t n = htam_numel(&out[0]);
  for (int i = 0; i < n_in; ++i)
    if (in[i].dtype != HTAM_FLOAT32 || htam_numel(&in[i]) != n) return HTAM_ERR_SHAPE;
  for (int i = 0; i < n_out; ++i)
    if (out[i].dtype != HTAM_FLOAT32 || htam_numel(&out[i]) != n) return HTAM_ERR_SHAPE;
  if (n == 0) return HTAM_OK;
  canary_kernel<<<(int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(
      (const float*)in[0].data, (const float*)in[1].data, (float*)out[0].data,
      n_out == 2 ? (float*)out[1].data : nullptr, n);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
