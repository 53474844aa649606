// ---- torch_htam expert: NHWC copies around a conv (conv.py pastes it after cudnn.cuh) --------------
// cuDNN's tensor-core engines compute in NHWC; on NCHW tensors cuDNN transposes in and out itself,
// slower than these copies (conv.py's docstring has the timings).

// [B][C][L] -> [B][L][C] through a padded shared-memory tile, both global sides coalesced (x to NHWC:
// B images, C channels, L pixels; w to KRSC: B = K, L = R * S).
template <typename T>
__global__ void __launch_bounds__(256) to_nhwc(const T* __restrict__ in, T* __restrict__ out, int64_t C, int64_t L) {
  __shared__ T tile[32][33];
  const int64_t b = blockIdx.z, c0 = (int64_t)blockIdx.y * 32, l0 = (int64_t)blockIdx.x * 32;
  const T* src = in + b * C * L;
  T* dst = out + b * C * L;
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t c = c0 + i, l = l0 + threadIdx.x;
    if (c < C && l < L) tile[i][threadIdx.x] = src[c * L + l];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += 8) {
    const int64_t l = l0 + i, c = c0 + threadIdx.x;
    if (c < C && l < L) dst[l * C + c] = tile[threadIdx.x][i];
  }
}

template <typename T>
static int launch_to_nhwc(const void* in, void* out, int64_t B, int64_t C, int64_t L, cudaStream_t stream) {
  if (B > 65535 || (C + 31) / 32 > 65535 || (L + 31) / 32 > INT32_MAX) return HTAM_ERR_SHAPE;
  const dim3 grid((unsigned)((L + 31) / 32), (unsigned)((C + 31) / 32), (unsigned)B);
  to_nhwc<T><<<grid, dim3(32, 8), 0, stream>>>((const T*)in, (T*)out, C, L);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}

// x (d: conv_geom.py's problem key) to NHWC at *xl and w to KRSC at *wl in st->lay, with *yl after
// them for the conv's NHWC result; each starts 256-aligned. T: the raw element type.
template <typename T>
static int nhwc_copies(DnnState* st, const HtamTensor& X, const HtamTensor& Wt, const HtamTensor& Y, const int64_t* d,
                       int64_t K, cudaStream_t stream, void** xl, void** wl, void** yl) {
  const size_t xb = ((size_t)htam_numel(&X) * sizeof(T) + 255) / 256 * 256;
  const size_t wb = ((size_t)htam_numel(&Wt) * sizeof(T) + 255) / 256 * 256;
  int rc = grow(&st->lay, &st->lay_bytes, xb + wb + (size_t)htam_numel(&Y) * sizeof(T));
  if (rc) return rc;
  *xl = st->lay;
  *wl = (char*)st->lay + xb;
  *yl = (char*)st->lay + xb + wb;
  if ((rc = launch_to_nhwc<T>(X.data, *xl, d[0], d[1], d[2] * d[3], stream))) return rc;
  return launch_to_nhwc<T>(Wt.data, *wl, K, Wt.sizes[1], d[5] * d[6], stream);
}
