// ---- torch_htam expert: a conv's per-channel batch-norm fold (conv.py pastes it) -------------------
// The bodies of conv.py's fold kernels. A region has any subset of the vectors gamma, beta, mean,
// var, bias (each fp32 or the data type), so conv.py emits each kernel's parameter list and calls
// these with functors over those parameters: Scale(k) = gamma * rsqrt(var + eps), and the rest as
// named below, all fp32.

// fold_kernel: per output channel k < K, scale[k] = Scale(k) (when scale != nullptr) and
// Shift(k, scale[k]), which stores shift[k] (in its type); with w2 != nullptr also w2 = w * Scale(k)
// over the weights of K channels of `per` (C/g * R * S) elements each. n: K, or the weights' count.
template <class WT, class Scale, class Shift>
__device__ __forceinline__ void fold_channels(int64_t K, int64_t per, int64_t n, float* scale,
                                              const typename WT::raw* w, typename WT::raw* w2,
                                              Scale scale_of, Shift store_shift) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i < K) {
      const float s = scale_of(i);
      if (scale != nullptr) scale[i] = s;
      store_shift(i, s);
    }
    if (w2 != nullptr) w2[i] = WT::from_f(WT::to_f(w[i]) * (scale_of(i / per)));
  }
}

// fold_cl_kernel (channels-last): the epilogue's vectors cen = Center(k) (mean - bias),
// scl = Scale(k), bet = Beta(k) [K] in VT (a null one is not written) and, when w2 != nullptr, w
// (KCRS: K, C, RS = R * S elements) copied to KRSC.
template <class VT, class T, class Center, class Scale, class Beta>
__device__ __forceinline__ void fold_cl_channels(int64_t K, int64_t C, int64_t RS, typename VT::raw* cen,
                                                 typename VT::raw* scl, typename VT::raw* bet,
                                                 const typename T::raw* w, typename T::raw* w2,
                                                 Center center_of, Scale scale_of, Beta beta_of) {
  const int64_t n = w2 != nullptr ? std::max(K * RS * C, K) : K;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i < K) {
      if (cen != nullptr) cen[i] = VT::from_f(center_of(i));
      if (scl != nullptr) scl[i] = VT::from_f(scale_of(i));
      if (bet != nullptr) bet[i] = VT::from_f(beta_of(i));
    }
    if (w2 != nullptr && i < K * RS * C) {
      const int64_t k = i / (RS * C), rem = i - k * RS * C, rs = rem / C, c = rem - rs * C;
      w2[i] = w[(k * C + c) * RS + rs];
    }
  }
}
