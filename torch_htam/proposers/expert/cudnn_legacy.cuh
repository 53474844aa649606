// ---- torch_htam expert: a conv on cuDNN's legacy API, its cache entry (cudnn_conv.py pastes it) --
// plan_entry() (conv_legacy_plan.cuh, after legacy_entry's constants) fills an entry for one shape.
// Descriptors + the ranked algorithms for one problem, cached (a few shapes per kernel in practice).
struct ConvEntry {
  bool used = false; int dev = -1; int64_t dims[kConvDims] = {0};   // the problem key (conv_geom.py)
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  int n_algo = 0, pick = 0;
  cudnnConvolutionFwdAlgo_t algo[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  cudnnMathType_t math[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  size_t mem[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
};

static void release(ConvEntry* e) {
  if (e->x) cudnnDestroyTensorDescriptor(e->x);
  if (e->y) cudnnDestroyTensorDescriptor(e->y);
  if (e->b) cudnnDestroyTensorDescriptor(e->b);
  if (e->f) cudnnDestroyFilterDescriptor(e->f);
  if (e->conv) cudnnDestroyConvolutionDescriptor(e->conv);
  if (e->act) cudnnDestroyActivationDescriptor(e->act);
  *e = ConvEntry();
}

// Run with the entry's i-th ranked algorithm: set its math type, size the workspace.
static int use_algo(DnnState* st, ConvEntry* e, int i) {
  e->pick = i;
  CD(cudnnSetConvolutionMathType(e->conv, e->math[i]));
  size_t need = 0;
  CD(cudnnGetConvolutionForwardWorkspaceSize(st->handle, e->x, e->f, e->conv, e->y, e->algo[i], &need));
  e->mem[i] = std::max(e->mem[i], need);
  return grow(&st->ws, &st->ws_bytes, e->mem[i]);
}
