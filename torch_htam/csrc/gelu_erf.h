// htam_gelu_erf: torch's GELU with erf, gelu(x) = x * Phi(x) (Phi the normal CDF), in fp32 at the
// cost of two MUFU ops, for epilogues that compute it on a GEMM's accumulators (cutlass_gemm.cu).
//
// Written x / (1 + 2^(x * q(x^2))): a logistic in an odd polynomial, q of degree 4 in x^2 fitted
// (minimax) to the exact GELU with x clamped to [-6, 6], where Phi is within 1e-9 of 0 or 1
// (docs/experiments/cutlass_gemm/gelu_fit.py prints these coefficients).
// Max |error| 4.0e-6 over [-20, 20] (fp32 math; tests/test_gemm_cutlass.py checks it on the host):
// under half of bf16's ulp of the output wherever |gelu(x)| is above 2e-3.
// Why not erff: about 30 instructions with a branch, computed by the warps that issue the main
// loop's wgmma; in CUTLASS's epilogue it cost as much as the separate pass Inductor spends on the
// activation: 76.6 against 52.9 us for the GEMM alone at ViT-B b32's fc1 (M 6304, K 768, N 3072,
// H200; docs/experiments/cutlass_gemm/variants-h200.txt). Here: a clamp, 6 FMAs, ex2, a reciprocal.
// NaN in, NaN out (the last division takes x itself); +inf -> +inf.
#pragma once
#include <math.h>

#if defined(__CUDACC__)
#define HTAM_GELU_HD __host__ __device__ __forceinline__
#else
#define HTAM_GELU_HD inline
#endif

HTAM_GELU_HD float htam_gelu_erf(float x) {
  const float xc = fminf(fmaxf(x, -6.f), 6.f);
  const float z = xc * xc;
  float q = -2.959838639e-06f;
  q = fmaf(q, z, 8.342233195e-05f);
  q = fmaf(q, z, 3.865749168e-04f);
  q = fmaf(q, z, -1.052759439e-01f);
  q = fmaf(q, z, -2.302021027e+00f);      // q(z) = -log2(e) * (1.5957 + 0.0730 z + ...)
#if defined(__CUDA_ARCH__)
  return __fdividef(x, 1.f + exp2f(xc * q));
#else
  return x / (1.f + exp2f(xc * q));
#endif
}
