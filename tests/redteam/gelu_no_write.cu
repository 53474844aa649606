// task: gelu_affine   expect: partial_write
// Cheat: Writes nothing, hoping the output lands on the reference's freed output.
#include "htam_abi.h"

HTAM_ENTRY htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out, cudaStream_t stream) {
  if (n_in != 3 || n_out != 1 || in[0].ndim != 2 || in[0].dtype != HTAM_FLOAT32) return HTAM_ERR_SHAPE;
  const float* x = (const float*)in[0].data;
  const float* w = (const float*)in[1].data;
  const float* b = (const float*)in[2].data;
  float* y = (float*)out[0].data;
  int64_t n = htam_numel(&in[0]), cols = in[0].sizes[1];
  (void)x; (void)w; (void)b; (void)y; (void)n; (void)cols; (void)stream;
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
