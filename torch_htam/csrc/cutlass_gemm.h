// htam_cutlass_gemm: a linear layer and its activation in ONE launch, on CUTLASS 3's Hopper GEMM
// (cutlass_gemm.cu). A library built once per arch (build.library; sm_90a only), which GEMM
// candidates link (gemm_cutlass.py): CUTLASS's templates take minutes to compile, the candidate
// that calls them a second.
//
//   y[m, n] = act(sum_k x[m, k] * w[n, k] + bias[n])        (torch: act(F.linear(x, w, bias)))
//   act: GELU with erf (torch's default; gelu_erf.h, within 4e-6 of it) or with tanh:
//   HTAM_GEMM_ACT_*. (cuBLASLt's own epilogues fuse ReLU and tanh GELU too, but not erf GELU: the
//   one Inductor leaves to a kernel of its own.)
//   or, a SwiGLU MLP's gate (HTAM_GEMM_ACT_SILU_MUL, no bias):
//   y[m, n] = silu(sum_k x[m, k] * w[n, k]) * mul[m, n]     (torch: F.silu(F.linear(x, w)) * up)
//   (Inductor runs the gate's GEMM, then a kernel for silu * mul that reads and writes [M, N] again.)
//
// x [M, K], w [N, K], y and mul [M, N] row-major (contiguous), bias [N] or none; all bf16, every pointer
// 16-byte aligned, K and N multiples of 8; fp32 accumulation and epilogue math. Sizes are run-time
// arguments: one build serves every shape.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// the activation after the bias (HtamGemmAct.act)
enum { HTAM_GEMM_ACT_GELU = 0, HTAM_GEMM_ACT_GELU_TANH = 1, HTAM_GEMM_ACT_SILU_MUL = 2 };

// One call. NOTE: 5 pointers, then 32-bit fields only: no padding, so a call hashes and compares as
// its bytes (the library's cache of initialized kernels is keyed by them).
typedef struct {
  const void *x, *w, *bias;     // bias: nullptr without one
  const void* mul;              // HTAM_GEMM_ACT_SILU_MUL's [M, N] factor; nullptr for the others
  void* y;
  int32_t m, n, k;
  int32_t act;                  // HTAM_GEMM_ACT_*
  int32_t tile;                 // M x N of y per tile and the schedule (1x1 clusters):
                                // 0: 128x128 cooperative, 1: 128x128 pingpong, 2: 128x192 cooperative,
                                // 3: 64x128 pingpong, 4: 128x256 cooperative
  int32_t reserved;             // 0
} HtamGemmAct;

// 0; HTAM_ERR_SHAPE (htam_abi.h) where the kernel cannot run the call (alignment, K or N not a
// multiple of 8, no such tile or activation, CUTLASS's can_implement); 4000 + a cutlass::Status where
// initializing or the launch failed (htam_library.h: htam_cutlass_rc). The first call of a set of pointers
// and sizes encodes its TMA descriptors (a few us of host time); later ones reuse them: one launch.
int htam_cutlass_gemm(const HtamGemmAct* p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
