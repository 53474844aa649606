// torch_htam kernel ABI. A candidate is ONE CUDA C++ source that includes this header (and no torch
// headers) and defines exactly one entry point:
//
//   extern "C" int htam_run(const HtamTensor* in, int n_in, HtamTensor* out, int n_out,
//                           cudaStream_t stream);
//
// - in[i] / out[i] follow the task's input / output order. Outputs are preallocated by the caller
//   (verification poisons them first); the kernel must write every element of every output.
// - sizes/strides are in elements (strides may be non-contiguous only if the task says so).
// - Every launch and every async call goes on `stream` (kernel<<<grid, block, smem, stream>>>).
//   No other streams, no device/stream synchronization, no host threads: the static check rejects them.
// - Return 0 on success; HTAM_ERR_SHAPE if the given shapes are not supported (the runtime then
//   runs the original region); a cudaError_t value if a CUDA call failed.
// - Optional: `extern "C" int htam_graph_epoch(void)` (HTAM_ENTRY) says that a launch's work depends
//   only on what htam_run is given (each tensor's pointer, sizes, strides and dtype) while the value
//   it returns stays the same. With graph launches on (HTAM_GRAPH_LAUNCHES=1), the launcher then
//   runs a launch that binds the same tensors as an earlier one as a CUDA graph captured from the
//   kernel (csrc/launcher.cpp, graph launches): one cudaGraphLaunch of host time in place of the
//   kernel's own (cuDNN's execute, several launches).
//   Change the value whenever something a past launch ran or read is freed or replaced (a plan).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#define HTAM_MAX_DIMS 8

enum HtamDtype {
  HTAM_FLOAT32 = 0, HTAM_FLOAT16 = 1, HTAM_BFLOAT16 = 2, HTAM_FLOAT64 = 3,
  HTAM_INT64 = 4, HTAM_INT32 = 5, HTAM_BOOL = 6, HTAM_INT8 = 7, HTAM_UINT8 = 8,
};

typedef struct {
  void* data;                       // device pointer
  int64_t sizes[HTAM_MAX_DIMS];
  int64_t strides[HTAM_MAX_DIMS];   // in elements
  int32_t ndim;
  int32_t dtype;                    // HtamDtype
} HtamTensor;

#define HTAM_OK 0
#define HTAM_ERR_SHAPE 1000         // shapes/dtypes not handled by this kernel

static inline int64_t htam_numel(const HtamTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->sizes[i];
  return n;
}

// Returns HTAM_OK or the launch error; use after each launch: HTAM_CHECK_LAUNCH();
#define HTAM_CHECK_LAUNCH()                               \
  do {                                                    \
    cudaError_t e_ = cudaGetLastError();                  \
    if (e_ != cudaSuccess) return (int)e_;                \
  } while (0)

#define HTAM_ENTRY extern "C" __attribute__((visibility("default"))) int
