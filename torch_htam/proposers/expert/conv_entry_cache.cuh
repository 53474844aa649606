// ---- torch_htam expert: the per-shape cuDNN entry cache of a conv kernel (conv.py pastes it) -----
// *out: the entry (descriptors + algorithms, or an execution plan) for this device and problem d[kConvDims]
// (N, C, H, W of x; K, R, S of the filter; alignment; depths, conv_geom.py), planned on first use and
// kept. Reads ConvEntry, release() and plan_entry() of the API path pasted before it.
// NOTE: one library serves every task whose source is the same, and the source holds the conv's
// geometry, not its sizes: ResNet-50's 1x1 conv + BN + ReLU regions, eight shapes, share one .so. A
// cache of four that replanned the oldest cost ~11 ms per call there (H100, bf16: cuDNN's
// runtime-fusion plans compile), and planning inside CUDA-graph capture invalidated the capture.
#include <deque>
static const size_t kMaxEntries = 256;   // past it the oldest is replanned (shapes beyond a model's few)

static bool same_problem(const ConvEntry& c, int dev, const int64_t* d) {
  return c.used && c.dev == dev && std::equal(d, d + kConvDims, c.dims);
}

static int conv_entry(DnnState* st, const int64_t* d, int64_t P, int64_t Q, ConvEntry** out) {
  int dev = 0;
  cudaGetDevice(&dev);
  static std::deque<ConvEntry> cache;   // NOTE: a deque's elements stay put as it grows
  static size_t last = 0, next_slot = 0;
  if (last < cache.size() && same_problem(cache[last], dev, d)) { *out = &cache[last]; return 0; }
  for (size_t i = 0; i < cache.size(); ++i)
    if (same_problem(cache[i], dev, d)) { last = i; *out = &cache[i]; return 0; }
  // A new problem. Planning allocates and loads modules, which would invalidate a CUDA-graph capture:
  // refuse there (a capture records shapes its warm-up call planned).
  cudaStream_t stream = nullptr;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudnnGetStream(st->handle, &stream) == CUDNN_STATUS_SUCCESS &&
      cudaStreamIsCapturing(stream, &capturing) != cudaSuccess)
    cudaGetLastError();   // the query failed: clear it so the launch check below does not see it
  if (capturing != cudaStreamCaptureStatusNone) return (int)cudaErrorStreamCaptureUnsupported;
  size_t i = cache.size();
  if (i < kMaxEntries) {
    cache.emplace_back();
  } else {
    i = next_slot;
    next_slot = (next_slot + 1) % kMaxEntries;
    release(&cache[i]);
    ++g_epoch;   // graphs the launcher captured may run the released plan
  }
  ConvEntry* e = &cache[i];
  const int rc = plan_entry(st, e, d, P, Q);
  if (rc) { release(e); if (i + 1 == cache.size()) cache.pop_back(); return rc; }
  e->used = true; e->dev = dev; std::copy(d, d + kConvDims, e->dims);
  last = i;
  *out = e;
  return 0;
}
