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

// The cuBLASLt data type and the kernel ABI's dtype code of a dtype trait (prelude.cuh).
template <class T> struct LtType;
template <> struct LtType<F32> { static constexpr cudaDataType_t kType = CUDA_R_32F; static constexpr int kCode = HTAM_FLOAT32; };
template <> struct LtType<BF16> { static constexpr cudaDataType_t kType = CUDA_R_16BF; static constexpr int kCode = HTAM_BFLOAT16; };
template <> struct LtType<F16> { static constexpr cudaDataType_t kType = CUDA_R_16F; static constexpr int kCode = HTAM_FLOAT16; };

// A kernel's GEMM as compile-time knobs: the A/B/D dtype trait, the compute type (fp32, or tf32
// tensor cores where the policy allows), cuBLASLt's fused epilogue, which of the heuristic's
// ranked algorithms runs, and the tile that algorithm is made to use (a cublasLtMatmulTile_t; 0:
// the heuristic's own).
template <class T, cublasComputeType_t kCompute_, cublasLtEpilogue_t kEpi_, int kAlgo_, int kTile_ = 0>
struct LtGemm {
  typedef T Type;
  typedef typename T::raw raw;
  static constexpr cudaDataType_t kType = LtType<T>::kType;
  static constexpr int kCode = LtType<T>::kCode;
  static constexpr cublasComputeType_t kCompute = kCompute_;
  static constexpr cublasLtEpilogue_t kEpi = kEpi_;
  static constexpr int kAlgo = kAlgo_;
  static constexpr int kTile = kTile_;
};
