// htam_cudnn_sdpa: scaled-dot-product attention on cuDNN's fused flash-attention engine, through
// the cuDNN frontend's graph API (cudnn_sdpa.cu). A library built once per arch (build.library),
// which attention candidates link (attention.py's cuDNN variant): the frontend's headers take
// minutes to compile, the candidate that calls them a second.
#pragma once
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// One attention call: O[b, h, i] = softmax(scale * Q[b, h, i] . K[b, h / group, j]) V[b, h / group, j],
// over keys j <= i where causal (top-left aligned, as torch's is_causal). Strides in elements;
// the last (head-dim) stride of each operand must be 1.
typedef struct {
  int32_t dtype;                       // HTAM_FLOAT16 or HTAM_BFLOAT16 (htam_abi.h)
  const void* q; const void* k; const void* v; void* o;
  int64_t b, h, h_kv, l, s, d;        // batch, query heads, kv heads, query rows, keys, head dim
  int64_t qs[4], ks[4], vs[4], os[4];  // strides of (batch, head, row, col)
  float scale;
  int32_t causal;
} HtamSdpa;

// 0, HTAM_ERR_SHAPE where cuDNN has no engine for the problem, a cudaError_t, or 3000 + a
// cudnnStatus_t. The first call of a problem plans it (milliseconds); later calls execute.
int htam_cudnn_sdpa(const HtamSdpa* p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
