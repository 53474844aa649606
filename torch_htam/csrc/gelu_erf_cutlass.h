// GeluErf: htam_gelu_erf (gelu_erf.h) as a CUTLASS epilogue activation, on one value or on a fragment
// of accumulators (cutlass::Array), for CUTLASS's LinCombPerColBiasEltAct<GeluErf, ...>. After
// CUTLASS's headers.
#pragma once
#include <cutlass/array.h>

#include "gelu_erf.h"

template <class T>
struct GeluErf {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE float operator()(float x) const { return htam_gelu_erf(x); }
};

template <int N>
struct GeluErf<cutlass::Array<float, N>> {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& v) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = htam_gelu_erf(v[i]);
    return y;
  }
};
