// ---- row kernels' extra reductions: product, arg max / min, and the column mapping's reduce ----
struct ProdOp { __device__ __forceinline__ float operator()(float a, float b) const { return a * b; } };

// value and the column it came from; i < 0: empty (no column seen yet)
struct ArgState { float v; int i; };
__device__ __forceinline__ ArgState shfl_x(ArgState v, int o) {
  ArgState r; r.v = shfl_x(v.v, o); r.i = __shfl_xor_sync(0xffffffffu, v.i, o); return r;
}
// torch.argmax / max.dim: NaN is the largest value; ties keep the first column
template <bool MAX>
__device__ __forceinline__ ArgState arg_merge(ArgState a, ArgState b) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  const bool an = a.v != a.v, bn = b.v != b.v;
  if (an || bn) return (an && bn) ? (a.i < b.i ? a : b) : (an ? a : b);
  if (MAX ? a.v > b.v : a.v < b.v) return a;
  if (MAX ? b.v > a.v : b.v < a.v) return b;
  return a.i < b.i ? a : b;
}
struct ArgMaxOp { __device__ __forceinline__ ArgState operator()(ArgState a, ArgState b) const { return arg_merge<true>(a, b); } };
struct ArgMinOp { __device__ __forceinline__ ArgState operator()(ArgState a, ArgState b) const { return arg_merge<false>(a, b); } };

// Column mapping: a block is 32 rows (threadIdx.x % 32) x CK column lanes (threadIdx.x / 32, CK a
// power of two); combine the CK partial values of each row in a fixed tree order (deterministic).
// All threads get their row's result. NOTE: every thread of the block must call it equally often.
template <class T, class Op>
__device__ __forceinline__ T col_reduce(T v, Op op) {
  __shared__ T sm[1024];
  const int ck = blockDim.x >> 5, ty = threadIdx.x >> 5;
  __syncthreads();                  // the previous reduction has finished reading sm
  sm[threadIdx.x] = v;
  __syncthreads();
  for (int h = ck >> 1; h > 0; h >>= 1) {
    if (ty < h) sm[threadIdx.x] = op(sm[threadIdx.x], sm[threadIdx.x + h * 32]);
    __syncthreads();
  }
  return sm[threadIdx.x & 31];
}
// "span": a contiguous tensor whose elements run in order over iteration dims lo..hi (a
// GroupNorm's weight [C] over (group, channel in group)); still a stride of 0 elsewhere.
static inline bool htam_bind_span(const HtamTensor& t, const int64_t* it_sizes, int it_nd, int lo, int hi,
                                  int64_t* st) {
  if (!htam_contiguous(t)) return false;
  int64_t acc = 1;
  for (int d = it_nd - 1; d >= 0; --d) {
    st[d] = (d >= lo && d <= hi) ? acc : 0;
    if (d >= lo && d <= hi) acc *= it_sizes[d];
  }
  return acc == htam_numel(&t);
}
// ---- end rows ----

// ---- split rows: a few very long rows (a full reduction) over many blocks, two launches ----
// Partial results of (row, split) go to a workspace, combined by a second kernel in a fixed order
// (deterministic, no atomics). One workspace per (device, stream) so that two streams running this
// kernel never share one; allocated on first use (keep that call outside CUDA graph capture).
static const size_t kSplitWs = 64u << 10;
static void* htam_split_ws(cudaStream_t stream) {
  struct Entry { int dev; cudaStream_t stream; void* ws; };
  static Entry entries[16];
  static int used = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  for (int i = 0; i < used; ++i)
    if (entries[i].dev == dev && entries[i].stream == stream) return entries[i].ws;
  if (used == 16) return nullptr;     // the caller takes the one-block-per-row path instead
  void* ws = nullptr;
  if (cudaMalloc(&ws, kSplitWs) != cudaSuccess) { cudaGetLastError(); return nullptr; }
  entries[used++] = Entry{dev, stream, ws};
  return ws;
}
