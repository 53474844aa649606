// ---- torch_htam expert: cuDNN state shared by every conv kernel's cuDNN path (conv.py pastes it) -
// CD: a cuDNN status as this kernel's error code (3000 + status).
#define CD(x) do { cudnnStatus_t s_ = (x); if (s_ != CUDNN_STATUS_SUCCESS) return 3000 + (int)s_; } while (0)
// a conv problem's key (conv_geom.py): N, C, H, W of x; K, R, S; alignment; D of x, T of w, O of y
static const int kConvDims = 11;
static const size_t kMaxWorkspace = size_t(1) << 30;   // skip algorithms wanting more than 1 GiB

struct DnnState { cudnnHandle_t handle = nullptr; void* ws = nullptr; size_t ws_bytes = 0;
                  void* scratch = nullptr; size_t scratch_bytes = 0;
                  void* lay = nullptr; size_t lay_bytes = 0; };   // lay: NHWC copies (nhwc)

// The launcher replays a call's launches as a CUDA graph while this stays the same (htam_abi.h):
// the graphs run the kernels of this library's cuDNN plans, so releasing a plan moves it. Buffers
// only grow (grow(): an outgrown one is never freed), so a graph's pointers into them stay valid.
static int g_epoch = 0;
HTAM_ENTRY htam_graph_epoch(void) { return g_epoch; }

// Lazily per device: the handle (cudnnSetStream is called on every run).
static int dnn_state(DnnState** out) {
  static DnnState states[64];
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) return (int)ce;
  if (dev < 0 || dev >= 64) return HTAM_ERR_SHAPE;
  DnnState& s = states[dev];
  if (!s.handle) CD(cudnnCreate(&s.handle));
  *out = &s;
  return 0;
}

// Grow-only device buffer. NOTE: an outgrown buffer is never freed: a captured CUDA graph may use it.
static int grow(void** buf, size_t* cap, size_t need) {
  if (need <= *cap) return 0;
  const size_t bytes = std::max(need, std::max(2 * *cap, size_t(1) << 20));
  void* p = nullptr;
  cudaError_t ce = cudaMalloc(&p, bytes);
  if (ce != cudaSuccess) return (int)ce;
  *buf = p; *cap = bytes;
  return 0;
}

static int64_t out_size(int64_t in, int64_t pad, int64_t dil, int64_t k, int64_t stride) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

static bool not_supported(cudnnStatus_t s) {
  return s == CUDNN_STATUS_NOT_SUPPORTED || ((int)s >= 3000 && (int)s < 4000);   // cuDNN 9 codes
}
