// ---- torch_htam expert: cuBLASLt state shared by every GEMM kernel (gemm.py pastes it) ----------
// CK: a cuBLAS status as this kernel's error code (2000 + status).
#define CK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) return 2000 + (int)s_; } while (0)
static const size_t kWorkspace = 32u << 20;

struct LtState { cublasLtHandle_t handle = nullptr; void* ws = nullptr; };

// Lazily per device: handle + workspace (cudaMalloc: keep the first call outside graph capture).
static int lt_state(LtState** out) {
  static LtState states[64];
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) return (int)ce;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  LtState& s = states[dev];
  if (!s.handle) {
    CK(cublasLtCreate(&s.handle));
    ce = cudaMalloc(&s.ws, kWorkspace);
    if (ce != cudaSuccess) { cublasLtDestroy(s.handle); s.handle = nullptr; return (int)ce; }
  }
  *out = &s;
  return 0;
}

static int align_of(const void* p) {
  uintptr_t v = (uintptr_t)p; int a = 256;
  while (a > 1 && v % a) a >>= 1;
  return a;
}

// Descriptors + chosen algorithm for one problem, cached (a few shapes per kernel in practice).
struct LtEntry {
  bool used = false; int dev; int64_t M, N, K, batch; int al[3];
  cublasLtMatmulDesc_t op = nullptr; cublasLtMatrixLayout_t A = nullptr, B = nullptr, C = nullptr;
  cublasLtMatmulAlgo_t algo;
};
