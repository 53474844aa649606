// ---- torch_htam expert: the per-shape cuDNN entry cache of a conv kernel (conv.py pastes it) -----
// *out: the entry (descriptors + algorithms, or an execution plan) for this device and problem d[kConvDims]
// (N, C, H, W of x; K, R, S of the filter; alignment; depths, conv_geom.py), planned on first use. Four shapes per kernel,
// the oldest replaced. Reads ConvEntry, release() and plan_entry() of the API path pasted before it.
static int conv_entry(DnnState* st, const int64_t* d, int64_t P, int64_t Q, ConvEntry** out) {
  int dev = 0;
  cudaGetDevice(&dev);
  static ConvEntry cache[4];
  static int next_slot = 0;
  ConvEntry* e = nullptr;
  for (auto& c : cache)
    if (c.used && c.dev == dev && std::equal(d, d + kConvDims, c.dims)) e = &c;
  if (!e) {
    e = &cache[next_slot];
    next_slot = (next_slot + 1) % 4;
    release(e);
    const int rc = plan_entry(st, e, d, P, Q);
    if (rc) { release(e); return rc; }
    e->used = true; e->dev = dev; std::copy(d, d + kConvDims, e->dims);
  }
  *out = e;
  return 0;
}
