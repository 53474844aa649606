// ---- torch_htam expert: a channels-last conv site on the cutlass_conv library (conv_cutlass.py) ---
// After the prelude and #include "cutlass_conv.h". run_site checks every tensor as the library reads
// it (HTAM_ERR_SHAPE where one is not: the runtime then runs the original region), gives it the
// weight KRSC, and makes the one library call.
namespace ct {

struct Site { int sh, sw, ph, pw, dh, dw; float eps; int act, tile; };   // act: HTAM_CONV_ACT_*

// w [K, C, R, S] (KCRS, as a model holds it) copied to w2 [K, R, S, C], the layout CUTLASS's TMA
// loads read: one thread an element of w2, so the writes are coalesced (the reads stride by R*S).
__global__ void krsc_copy(const uint16_t* __restrict__ w, uint16_t* __restrict__ w2, int64_t K, int64_t C,
                          int64_t RS) {
  const int64_t n = K * C * RS;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i % C, rs = (i / C) % RS, k = i / (C * RS);
    w2[i] = w[(k * C + c) * RS + rs];
  }
}

// The KRSC copies' buffer, per device, grow-only. NOTE: an outgrown buffer is never freed: a
// captured CUDA graph may still read it. The first call at a weight's size (verification's, outside
// any capture) allocates it.
static int krsc_buffer(size_t bytes, void** out) {
  static void* bufs[64] = {};
  static size_t caps[64] = {};
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) return (int)ce;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  if (bytes > caps[dev]) {
    void* p = nullptr;
    if ((ce = cudaMalloc(&p, bytes)) != cudaSuccess) return (int)ce;
    bufs[dev] = p;
    caps[dev] = bytes;
  }
  *out = bufs[dev];
  return 0;
}

inline bool vector_ok(const HtamTensor* v, int64_t K) {
  return v != nullptr && v->ndim == 1 && v->sizes[0] == K && v->strides[0] == 1 && v->dtype == HTAM_BFLOAT16 &&
         v->data != nullptr;
}

// vecs: mean, gamma, var, beta [K] (bf16); res: [N, K, P, Q] channels-last, or nullptr.
inline int run_site(const HtamTensor& X, const HtamTensor& Wt, const HtamTensor& Y, const HtamTensor* const (&vecs)[4],
                    const HtamTensor* res, const Site& site, cudaStream_t stream) {
  if (X.dtype != HTAM_BFLOAT16 || Wt.dtype != HTAM_BFLOAT16 || Y.dtype != HTAM_BFLOAT16) return HTAM_ERR_SHAPE;
  const bool krsc = htam_channels_last(Wt);
  if (!htam_channels_last(X) || !htam_channels_last(Y) || Wt.ndim != 4 || !(krsc || htam_contiguous(Wt)))
    return HTAM_ERR_SHAPE;
  if (X.sizes[1] != Wt.sizes[1] || Y.sizes[0] != X.sizes[0] || Y.sizes[1] != Wt.sizes[0]) return HTAM_ERR_SHAPE;
  const HtamTensor* const ts[] = {&X, &Wt, &Y};
  for (const HtamTensor* t : ts)
    for (int i = 0; i < 4; ++i)
      if (t->sizes[i] > INT32_MAX / 4) return HTAM_ERR_SHAPE;
  const int64_t K = Wt.sizes[0], C = Wt.sizes[1], RS = Wt.sizes[2] * Wt.sizes[3];
  const int64_t P = (X.sizes[2] + 2 * site.ph - site.dh * (Wt.sizes[2] - 1) - 1) / site.sh + 1;
  const int64_t Q = (X.sizes[3] + 2 * site.pw - site.dw * (Wt.sizes[3] - 1) - 1) / site.sw + 1;
  if (Y.sizes[2] != P || Y.sizes[3] != Q) return HTAM_ERR_SHAPE;
  for (const HtamTensor* v : vecs)
    if (!vector_ok(v, K)) return HTAM_ERR_SHAPE;
  if (res != nullptr) {
    if (res->dtype != HTAM_BFLOAT16 || !htam_channels_last(*res) || res->data == nullptr) return HTAM_ERR_SHAPE;
    for (int i = 0; i < 4; ++i)
      if (res->sizes[i] != Y.sizes[i]) return HTAM_ERR_SHAPE;
  }
  if (htam_numel(&Y) == 0) return HTAM_OK;
  const void* w = Wt.data;
  if (!krsc && RS > 1) {    // a 1x1 KCRS weight is KRSC already
    void* w2 = nullptr;
    int rc = krsc_buffer((size_t)(K * C * RS) * 2, &w2);
    if (rc) return rc;
    const int blocks = (int)std::min<int64_t>((K * C * RS + 255) / 256, 4096);
    krsc_copy<<<blocks, 256, 0, stream>>>((const uint16_t*)Wt.data, (uint16_t*)w2, K, C, RS);
    HTAM_CHECK_LAUNCH();
    w = w2;
  }
  HtamConvBn p{X.data, w, vecs[0]->data, vecs[1]->data, vecs[2]->data, vecs[3]->data,
               res != nullptr ? res->data : nullptr, Y.data,
               (int)X.sizes[0], (int)X.sizes[2], (int)X.sizes[3], (int)C, (int)K, (int)Wt.sizes[2], (int)Wt.sizes[3],
               site.ph, site.pw, site.sh, site.sw, site.dh, site.dw, site.act, site.tile, site.eps};
  return htam_cutlass_conv_bn(&p, stream);
}

}  // namespace ct
