// ---- row kernels (rowwise.py): reductions, a thread's running states, row offsets, host launch shapes ----
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

// online softmax: running max m and sum s of exp(v - m), rescaled when the max grows
template <bool FAST>
__device__ __forceinline__ void softmax_add(SoftmaxState& st, float v) {
  if (v > st.m) { st.s = st.s * (FAST ? __expf(st.m - v) : expf(st.m - v)) + 1.f; st.m = v; }
  else if (v > -INFINITY) st.s += FAST ? __expf(v - st.m) : expf(v - st.m);
}

// Sums over rows (rowwise.py, ExprProgram.outer): sum J's partials, one 8-byte slot per thread
// group of the row kernel, added in a fixed order by one block of 1024 threads (a strided pass per
// thread, then a tree). Every thread gets the total. (J: a shared buffer per sum.)
template <class T, int J>
__device__ __forceinline__ T outer_total(const void* ows, int64_t slots) {
  __shared__ T sm[1024];
  T acc = 0;
  for (int64_t s = threadIdx.x; s < slots; s += 1024) acc += ((const T*)((const char*)ows + J * slots * 8))[s];
  __syncthreads();
  sm[threadIdx.x] = acc;
  __syncthreads();
  for (int h = 512; h > 0; h >>= 1) {
    if ((int)threadIdx.x < h) sm[threadIdx.x] += sm[threadIdx.x + h];
    __syncthreads();
  }
  return sm[0];
}

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

// ---- host: which mapping a launch takes, from the real sizes and strides ----
// Access m steps along the row by more than one element and by one between rows: the column
// mapping. The row is the last row_nd dims of sp (row_nd 2: a two-dim row, inner its last size).
template <int N>
static inline bool htam_col_strided(const Space<N>& sp, int m, int row_nd, int64_t inner) {
  const int d = sp.ndim - 1;
  return sp.ndim - row_nd >= 1 && !(sp.st[m][d] == 1 && (row_nd == 1 || sp.st[m][d - 1] == inner))
         && sp.st[m][d - row_nd] == 1;
}
// The column mapping's launch: blocks of 32 rows x ck lanes along the row (a power of two) until
// 2048 resident threads per SM are busy. staged: full-row outputs go through a [steps * ck][33]
// float tile, at most 128 columns (17 KB): with col_reduce's static buffers (4-12 KB per state
// type) a block stays within 48 KB.
struct HtamColLaunch { int64_t blocks; int threads; size_t smem; };
static inline HtamColLaunch htam_col_launch(int64_t rows, int64_t ncol, bool staged, int steps) {
  int64_t cblocks = (rows + 31) / 32;
  const int64_t target = (int64_t)htam_sm_count() * 2048;    // resident threads to fill
  int ck = 1;
  while (ck < 32 && cblocks * 32 * ck * 2 <= target && ck * 2 <= ncol) ck *= 2;
  cblocks = std::max<int64_t>(1, std::min<int64_t>(cblocks, (int64_t)1 << 30));
  while (staged && ck > 1 && steps * ck > 128) ck /= 2;
  const size_t smem = staged ? (size_t)steps * ck * 33 * sizeof(float) : 0;
  return HtamColLaunch{cblocks, 32 * ck, smem};
}
// Split rows: blocks per row (8 blocks per SM over all rows, >= 4096 columns each, the partials
// of every row within the workspace); < 2: the one-block-per-row path
static inline int htam_split_count(int64_t rows, int64_t ncol, size_t state_bytes) {
  if (rows > 65535) return 0;
  const int64_t sms = htam_sm_count();
  return (int)std::min<int64_t>(std::min<int64_t>(sms * 8 / rows, ncol / 4096),
                                (int64_t)(kSplitWs / state_bytes) / rows);
}
// The row mapping: thread groups of TPR threads, rows_per_trip rows a block per grid-stride trip;
// waves > 0 caps the grid at waves blocks per SM.
static inline int64_t htam_row_blocks(int64_t rows, int64_t rows_per_trip, int waves) {
  int64_t blocks = (rows + rows_per_trip - 1) / rows_per_trip;
  if (waves > 0) blocks = std::min<int64_t>(blocks, (int64_t)htam_sm_count() * waves);
  return std::max<int64_t>(1, std::min<int64_t>(blocks, (int64_t)1 << 30));
}
