// ---- torch_htam expert: the in-place epilogue after a channels-last conv (conv.py pastes it) -------
// For render_cl's split form (params fused=False): cuDNN's conv alone writes y, then this kernel
// applies Epi, conv.py's per-region struct: Epi::kResidual (whether it reads z, the residual) and
//   float operator()(float v, int64_t k, T::raw z, const VT::raw* cen, const VT::raw* scl, const VT::raw* bet)
// the epilogue of one element v of channel k, in fp32 (cen, scl, bet: the [K] vectors, in VT).

// y = Epi(y) in place over a channels-last y (element i is channel i % K), V elements a thread
// (V = 16 bytes of them when V divides K and the pointers are 16-byte aligned, else 1).
template <class T, class VT, class Epi, int V>
__global__ void epi_cl_kernel(typename T::raw* __restrict__ y, const typename T::raw* __restrict__ z,
                              const typename VT::raw* __restrict__ cen, const typename VT::raw* __restrict__ scl,
                              const typename VT::raw* __restrict__ bet, int64_t n, int64_t K) {
  struct alignas(sizeof(typename T::raw) * V) Pack { typename T::raw r[V]; };
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n; i += (int64_t)gridDim.x * blockDim.x * V) {
    Pack p = *reinterpret_cast<const Pack*>(y + i);
    const Pack q = Epi::kResidual ? *reinterpret_cast<const Pack*>(z + i) : Pack{};
    const int64_t k0 = i % K;   // V divides K: the V elements are channels k0 .. k0 + V - 1 of one pixel
#pragma unroll
    for (int j = 0; j < V; ++j) p.r[j] = T::from_f(Epi()(T::to_f(p.r[j]), k0 + j, q.r[j], cen, scl, bet));
    *reinterpret_cast<Pack*>(y + i) = p;
  }
}

// Launches epi_cl_kernel over Y: 16 bytes a thread where they make whole channels of one pixel.
template <class T, class VT, class Epi>
static int launch_epi_cl(const HtamTensor& Y, const void* z, const void* cen, const void* scl, const void* bet,
                         int64_t K, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(typename T::raw);
  const int64_t n = htam_numel(&Y);
  const bool wide = K % V == 0 && (((uintptr_t)Y.data | (uintptr_t)z) & 15) == 0;
  const int blocks = (int)std::min<int64_t>((n / (wide ? V : 1) + 255) / 256, 1 << 16);
  auto run = wide ? epi_cl_kernel<T, VT, Epi, V> : epi_cl_kernel<T, VT, Epi, 1>;
  run<<<blocks, 256, 0, stream>>>((typename T::raw*)Y.data, (const typename T::raw*)z, (const typename VT::raw*)cen,
                                  (const typename VT::raw*)scl, (const typename VT::raw*)bet, n, K);
  HTAM_CHECK_LAUNCH();
  return HTAM_OK;
}
