// ---- torch_htam expert: planning a conv on cuDNN's legacy API (cudnn_conv.py pastes it) ----------
// Reads cudnn_legacy.cuh's ConvEntry and use_algo(), and what legacy_entry() writes before it:
// kStrictFp32 (fp32 without TF32), kIdentityOnly (fused without ReLU), kMath (the math type planned
// with), kAlgo and set_descriptors() (this conv's tensor, filter, conv [and fused] descriptors).

// Fills e for problem d (conv_geom.py) with output P x Q: descriptors, then cuDNN's ranking of the
// algorithms usable under kMath, and runs the kAlgo-th (the last one when fewer).
static int plan_entry(DnnState* st, ConvEntry* e, const int64_t* d, int64_t P, int64_t Q) {
  CD(cudnnCreateTensorDescriptor(&e->x));
  CD(cudnnCreateTensorDescriptor(&e->y));
  CD(cudnnCreateFilterDescriptor(&e->f));
  CD(cudnnCreateConvolutionDescriptor(&e->conv));
  const int rc = set_descriptors(e, d, P, Q);
  if (rc) return rc;
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int found = 0;
  CD(cudnnGetConvolutionForwardAlgorithm_v7(st->handle, e->x, e->f, e->conv, e->y,
                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
  for (int i = 0; i < found; ++i) {
    const cudnnConvolutionFwdAlgoPerf_t& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
    // cuDNN: the fused call takes an IDENTITY activation only with IMPLICIT_PRECOMP_GEMM
    if (kIdentityOnly && p.algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) continue;
    bool dup = false;
    for (int j = 0; j < e->n_algo; ++j) dup |= e->algo[j] == p.algo;
    if (dup && kStrictFp32) continue;
    e->algo[e->n_algo] = p.algo;
    e->math[e->n_algo] = kStrictFp32 ? CUDNN_FMA_MATH : p.mathType;   // strict fp32: never TF32
    e->mem[e->n_algo] = p.memory;
    ++e->n_algo;
  }
  if (e->n_algo == 0 && kIdentityOnly) {
    e->algo[0] = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM; e->math[0] = kMath; e->mem[0] = 0;
    e->n_algo = 1;
  }
  if (e->n_algo == 0) return HTAM_ERR_SHAPE;   // no algorithm under this precision: the original region runs
  return use_algo(st, e, std::min(kAlgo, e->n_algo - 1));
}
