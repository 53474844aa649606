// htam_cutlass_conv: a ResNet conv site in ONE launch, on CUTLASS 3's Hopper implicit-GEMM conv
// (cutlass_conv.cu). A library built once per arch (build.library; sm_90a only), which conv
// candidates link (conv_cutlass.py): CUTLASS's templates take a minute and a half to compile, the
// candidate that calls them a second.
//
//   y = act((conv(x, w) - mean[k]) * gamma[k] * rsqrt(var[k] + eps) + beta[k] [+ res])
//   act: none, ReLU or hardswish (x * min(max(x + 3, 0), 6) / 6), HTAM_CONV_ACT_*
//
// x [N, H, W, C], res and y [N, P, Q, K] (channels-last), w [K, R, S, C]; mean, gamma, var, beta
// [K]; all bf16, every pointer 16-byte aligned, C and K multiples of 8; fp32 accumulation and
// epilogue math. Sizes are run-time arguments: one build serves every shape.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// the activation last in the epilogue (HtamConvBn.act)
enum { HTAM_CONV_ACT_NONE = 0, HTAM_CONV_ACT_RELU = 1, HTAM_CONV_ACT_HARDSWISH = 2 };

// One call. NOTE: 8 pointers, then 32-bit fields only: no padding, so a call hashes and compares
// as its bytes (the library's cache of initialized kernels is keyed by them).
typedef struct {
  const void *x, *w, *mean, *gamma, *var, *beta, *res;   // res: nullptr without a residual
  void* y;
  int32_t n, h, wd, c, k, r, s;                          // x's N, H, W, C; w's K, R, S
  int32_t pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
  int32_t act;                                           // HTAM_CONV_ACT_*: the activation last
  int32_t tile;                                          // 0: 128x64, 1: 128x128, 2: 64x64 (M x N)
  float eps;
} HtamConvBn;

// 0; HTAM_ERR_SHAPE (htam_abi.h) where the kernel cannot run the call (alignment, C or K not a
// multiple of 8, no such tile or activation, CUTLASS's can_implement); 4000 + a cutlass::Status where
// initializing or the launch failed (htam_library.h: htam_cutlass_rc). The first call of a set of pointers and
// sizes encodes its TMA descriptors (~5 us of host time); later ones reuse them: one launch.
int htam_cutlass_conv_bn(const HtamConvBn* p, cudaStream_t stream);

// The host ns one call takes, over `calls` calls of p (issue time, no sync); cached 0: the TMA
// descriptors encoded on every call. A probe's measure (docs/experiments/cutlass_conv); -1 on error.
double htam_cutlass_conv_bn_host_ns(const HtamConvBn* p, cudaStream_t stream, int calls, int cached);

#ifdef __cplusplus
}
#endif
