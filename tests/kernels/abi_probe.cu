// ABI probe: writes what htam_run received about each input into out[0] (int64, >= 20 * n_in
// elements): per input [ndim, dtype, sizes[0..7], strides[0..7], data != nullptr, 0].
// Lets a test check that the launcher fills HtamTensor exactly as htam_abi.h says.
#include "htam_abi.h"

__global__ void probe_kernel(HtamTensor t, int64_t* y) {
  y[0] = t.ndim;
  y[1] = t.dtype;
  for (int d = 0; d < HTAM_MAX_DIMS; ++d) {
    y[2 + d] = d < t.ndim ? t.sizes[d] : -1;
    y[10 + d] = d < t.ndim ? t.strides[d] : -1;
  }
  y[18] = t.data != nullptr;
  y[19] = 0;
}

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
                    cudaStream_t stream) {
  if (n_out != 1 || out[0].dtype != HTAM_INT64 || htam_numel(&out[0]) < 20 * n_in) return HTAM_ERR_SHAPE;
  for (int i = 0; i < n_in; ++i) {
    probe_kernel<<<1, 1, 0, stream>>>(in[i], (int64_t*)out[0].data + 20 * i);
    HTAM_CHECK_LAUNCH();
  }
  return HTAM_OK;
}
