// ---- torch_htam expert: the inputs of a GEMM/conv epilogue kernel (host.py, pasted where used) ---
// An fp32 channel vector [K] at p, for epilogue programs that read per-channel values the kernel
// computed itself (conv.py's folded batch norm; pwconv.py binds it and never reads it).
static HtamTensor channel_vec(void* p, int64_t K) {
  HtamTensor t = {};
  t.data = p; t.ndim = 1; t.sizes[0] = K; t.strides[0] = 1; t.dtype = HTAM_FLOAT32;
  return t;
}

// ext = the task's n_in inputs, then y (the GEMM/conv result the epilogue reads) and, when scale is
// not null, the batch norm's scale and center [K] channel vectors: the inputs of the epilogue
// program, in its order. ext holds n_in + 1 (+ 2 with scale) tensors.
static void extend_inputs(HtamTensor* ext, const HtamTensor* in, int n_in, const HtamTensor& y, void* scale,
                          void* center, int64_t K) {
  for (int i = 0; i < n_in; ++i) ext[i] = in[i];
  ext[n_in] = y;
  if (scale != nullptr) {
    ext[n_in + 1] = channel_vec(scale, K);
    ext[n_in + 2] = channel_vec(center, K);
  }
}
