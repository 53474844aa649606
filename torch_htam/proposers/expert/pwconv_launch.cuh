// ---- torch_htam expert: host side of the tiled pointwise-conv kernel (after pwconv_kernel.cuh) ----
// Strides of one epilogue input over (image, channel, pixel): height and width must step as one
// pixel index p = h * W + w (true for contiguous and per-channel inputs).
static bool pixel_strides(const int64_t* st, const int64_t* it, int64_t* out) {
  out[0] = st[0]; out[1] = st[1];
  if (it[3] == 1) out[2] = st[2];
  else if (it[2] == 1 || st[2] == st[3] * it[3]) out[2] = st[3];
  else return false;
  return true;
}

// Binds epilogue input `data` (T elements, access strides st over the iteration sizes it) to *p and
// its (image, channel, pixel) strides to out; false when its pixels do not step as one index.
// Clears ev_ok where the fast instantiation cannot read it: EV-element vectors along pixels, and
// for a pixel-varying input (PV: prefetched) 16-byte chunks with pixel stride 1.
template <class T, bool PV>
static bool pw_bind(const void* data, const int64_t* st, const int64_t* it, int EV, const pw::Dims& d,
                    const typename T::raw** p, int64_t* out, bool& ev_ok) {
  constexpr int E = (int)sizeof(typename T::raw), V = 16 / E;
  *p = (const typename T::raw*)data;
  if (!pixel_strides(st, it, out)) return false;
  if (out[2] != 0 && out[2] != 1) ev_ok = false;
  if (out[2] == 1 && (!htam_aligned(*p, EV * E) || out[0] % EV || out[1] % EV)) ev_ok = false;
  if (PV && (out[2] != 1 || d.P % V || out[0] % V || out[1] % V || !htam_aligned(*p, 16))) ev_ok = false;
  return true;
}

// Once per kernel and device: allow its dynamic shared memory (above 48 KB needs it) and find how
// many blocks fit on the device at once (the persistent grid).
template <int WHICH>       // one cache per instantiation (0 scalar, 1 fast 32-bit, 2 fast 64-bit)
static int prepare(const void* kernel, size_t bytes, int64_t* resident) {
  static int64_t fits[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return (int)e;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  if (!fits[dev]) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return (int)e;
    int per_sm = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (void (*)())kernel, pw::THREADS, bytes);
    if (e != cudaSuccess) return (int)e;
    if (per_sm < 1) return HTAM_ERR_SHAPE;
    fits[dev] = (int64_t)per_sm * htam_sm_count();
  }
  *resident = fits[dev];
  return 0;
}

// Launches one of a configuration's three instantiations of pw_kernel over d's tiles: scalar, or
// when fast fast32 / fast64 (16-byte vectors, PRE, 32- / 64-bit epilogue offsets: idx32).
// xs, ws: the main loop's X and W, or (NHWC) the conv result in NHWC and nullptr.
template <class R, bool PERSIST, bool NHWC, int BM, int BN, int STAGES, bool PRE, class Kernel>
static int pw_run(Kernel scalar, Kernel fast32, Kernel fast64, bool fast, bool idx32, const typename R::DT::raw* xs,
                  const typename R::DT::raw* ws, typename R::OT::raw* y, pw::Dims d, const typename R::Args& ea,
                  cudaStream_t stream) {
  const int64_t MT = (d.K + BM - 1) / BM, tiles = MT * ((d.NQ + BN - 1) / BN);
  d.dp = pw::make_div(d.P);
  d.dmt = pw::make_div(MT);
  const size_t smem = fast ? pw::smem_bytes<R, PERSIST, NHWC, BM, BN, STAGES, PRE>()
                           : pw::smem_bytes<R, PERSIST, NHWC, BM, BN, STAGES, false>();
  int64_t resident = 0;
  int rc = !fast ? prepare<0>((const void*)scalar, smem, &resident)
                 : idx32 ? prepare<1>((const void*)fast32, smem, &resident)
                         : prepare<2>((const void*)fast64, smem, &resident);
  if (rc) return rc;
  // persistent: as many blocks as fit at once, each looping over tiles; else one tile per block
  const int64_t grid = PERSIST && resident < tiles ? resident : tiles;
  if (grid > INT32_MAX) return HTAM_ERR_SHAPE;
  const Kernel k = !fast ? scalar : idx32 ? fast32 : fast64;
  k<<<(unsigned)grid, pw::THREADS, smem, stream>>>(ws, xs, y, d, ea, tiles);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}

// The 1x1 conv's own tensors: X [N, C, H, W], Wt [K, C, 1, 1] and Y [N, K, H, W], contiguous, of dtype.
static bool pw_conv_shapes(const HtamTensor& X, const HtamTensor& Wt, const HtamTensor& Y, int dtype) {
  for (const HtamTensor* t : {&X, &Wt, &Y})
    if (t->dtype != dtype || t->ndim != 4 || !htam_contiguous(*t) || t->data == nullptr) return false;
  if (Wt.sizes[1] != X.sizes[1] || Wt.sizes[2] != 1 || Wt.sizes[3] != 1 || X.sizes[1] == 0) return false;
  return Y.sizes[0] == X.sizes[0] && Y.sizes[1] == Wt.sizes[0] && Y.sizes[2] == X.sizes[2] &&
         Y.sizes[3] == X.sizes[3];
}
// X [N, C, P] and W [K, C] of DT take 16-byte vector loads: C and P whole vectors, 16-byte aligned.
template <class DT>
static bool pw_src_vec(const HtamTensor& X, const HtamTensor& Wt, int64_t C, int64_t P) {
  constexpr int V = 16 / (int)sizeof(typename DT::raw);
  return C % V == 0 && htam_aligned(Wt.data, 16) && P % V == 0 && htam_aligned(X.data, 16);
}
// ---- end tiled pointwise-conv host side ----
