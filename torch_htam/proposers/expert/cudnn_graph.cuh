// ---- torch_htam expert: a conv on cuDNN's backend ("graph") API (cudnn_conv.py pastes it) -------
// Reads the constants graph_entry() writes before it: kStrictFp32, kNhwc, kDataType, kSpatial,
// kTransposed, kPad, kStride, kDilation (pixels, [D,] H, W), kGroups, kAlgo and the fused epilogue
// kEpiOps, kEpiMode, kEpiArg, kVecType; and cudnn.cuh's
// DnnState, grow(), not_supported(), kConvDims. Attribute names and value types follow
// cudnn_graph.h (cuDNN 9).
// ---- cuDNN backend ("graph") API: plan once per shape, one cudnnBackendExecute per call ----------
// Why: the legacy calls cost host time in cuDNN 9: 383 us per conv+BN+ReLU kernel call against
// 53 us on this path (bf16, H100; see conv.py).
// NOTE: cudnn_graph.h marks CUDNN_ATTR_OPERATIONGRAPH_HANDLE / _EXECUTION_PLAN_HANDLE deprecated
// (warns only with CUDNN_WARN_DEPRECATED) yet still documents them as required: both are set.
#define SET(d, name, type, n, values) CD(cudnnBackendSetAttribute(d, name, type, n, values))
static const int kMaxConfigs = 16;            // engine configs taken from one heuristics query

// One problem's backend descriptors, cached (a few shapes per kernel in practice). NOTE: all stay
// alive until release(): cuDNN does not document whether a plan copies what it was built from.
static const bool kEpilogue = kEpiOps > 0;   // pointwise ops after the conv
static const int kMaxEpi = 5;                  // center, scale, beta, residual, ReLU
static const int kPacks = 8;                   // variant packs kept per problem

struct ConvEntry {
  bool used = false; int dev = -1; int64_t dims[kConvDims] = {0};   // the problem key (conv_geom.py)
  cudnnBackendDescriptor_t x = nullptr, w = nullptr, y = nullptr;   // tensors 'x', 'w', 'y'
  // the epilogue's op i: its operand (a [1, K, 1, 1] vector or the residual), the fp32 virtual tensor
  // it reads (v[0]: the conv result), its pointwise descriptor and operation
  cudnnBackendDescriptor_t arg[kMaxEpi] = {}, v[kMaxEpi] = {}, pw[kMaxEpi] = {}, pwop[kMaxEpi] = {};
  cudnnBackendDescriptor_t conv = nullptr, op = nullptr, graph = nullptr, heur = nullptr;
  cudnnBackendDescriptor_t cfg[kMaxConfigs] = {};   // engine configs, heuristic rank order
  int n_cfg = 0, pick = -1;                         // the plan runs cfg[pick]
  cudnnBackendDescriptor_t plan = nullptr;
  // variant packs by the pointers they bind (x, w, y, workspace, the epilogue's operands): every
  // site of a model that runs this shape keeps its own, where one pack was rebuilt on every call
  cudnnBackendDescriptor_t pack[kPacks] = {};
  const void* ptrs[kPacks][4 + kMaxEpi] = {};
  int next_pack = 0;
};

static void drop(cudnnBackendDescriptor_t* d) {
  if (*d) cudnnBackendDestroyDescriptor(*d);
  *d = nullptr;
}

static void drop_configs(ConvEntry* e) {
  for (auto& c : e->cfg) drop(&c);
  drop(&e->heur);
  e->n_cfg = 0;
}

static void release(ConvEntry* e) {
  for (auto& pk : e->pack) drop(&pk);
  drop(&e->plan);
  drop_configs(e);
  for (int i = 0; i < kMaxEpi; ++i) { drop(&e->pwop[i]); drop(&e->pw[i]); drop(&e->v[i]); drop(&e->arg[i]); }
  for (cudnnBackendDescriptor_t* d : {&e->graph, &e->op, &e->conv, &e->y, &e->w, &e->x}) drop(d);
  *e = ConvEntry();
}

// A packed tensor of kSpatial + 2 dims [n, c, (d,) h, w] (sizes and strides in elements), NCHW /
// NCDHW or (kNhwc, 2-D only) NHWC in memory, data aligned to `align` bytes; a virtual one (an
// intermediate of the fused epilogue, never in memory) when is_virtual.
static int make_tensor(cudnnBackendDescriptor_t* t, int64_t uid, const int64_t* dims, int64_t align,
                       cudnnDataType_t type = kDataType, bool is_virtual = false) {
  const int64_t nd = kSpatial + 2;
  int64_t strides[5];
  strides[nd - 1] = 1;
  for (int64_t i = nd - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  if (kNhwc) {   // [n, c, h, w] stored n, h, w, c
    const int64_t c = dims[1], h = dims[2], w = dims[3];
    strides[0] = c * h * w; strides[1] = 1; strides[2] = w * c; strides[3] = c;
  }
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
  SET(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  SET(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  SET(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  SET(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims);
  SET(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides);
  if (is_virtual) SET(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  CD(cudnnBackendFinalize(*t));
  return 0;
}

// The kSpatial-D cross-correlation with fp32 accumulation (pads/strides/dilations in pixels).
// NOTE: groups are implied by the tensors: w is [K, C/groups, ...] against x's C channels (for a
// transposed conv, [C, K/groups, ...] against dy = x's C).
static int make_conv(ConvEntry* e) {
  const int64_t spatial = kSpatial;
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &e->conv));
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, kSpatial, kPad);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, kSpatial, kPad);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, kSpatial, kStride);
  SET(e->conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, kSpatial, kDilation);
  CD(cudnnBackendFinalize(e->conv));
  return 0;
}

// One pointwise operation y = mode(x[, b]) in fp32 (b: nullptr for a unary mode).
static int make_pointwise(cudnnBackendDescriptor_t* pw, cudnnBackendDescriptor_t* op, cudnnPointwiseMode_t mode,
                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw));
  SET(*pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  SET(*pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  CD(cudnnBackendFinalize(*pw));
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
  SET(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, pw);
  SET(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b) SET(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  SET(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  CD(cudnnBackendFinalize(*op));
  return 0;
}

// The fused epilogue after the conv (kEpilogue): v[0] = conv(x, w), then op i computes
// kEpiMode[i](v[i], its operand) in fp32 over virtual tensors, the last op writing y. cuDNN compiles
// the chain into the conv's own kernel (its runtime-fusion engines): the conv result is never
// stored. ydims: y's [N, K, H, W]; a vector operand is [1, K, 1, 1] of kVecType, the residual y's.
static int make_epilogue(ConvEntry* e, const int64_t* ydims, int64_t align) {
  int rc = 0;
  const int64_t vdims[4] = {1, ydims[1], 1, 1};
  if ((rc = make_tensor(&e->v[0], 1000, ydims, align, CUDNN_DATA_FLOAT, true))) return rc;
  for (int i = 0; i < kEpiOps; ++i) {
    const bool last = i + 1 == kEpiOps;
    if (!last && (rc = make_tensor(&e->v[i + 1], 1001 + i, ydims, align, CUDNN_DATA_FLOAT, true))) return rc;
    if (kEpiArg[i] == 'z' && (rc = make_tensor(&e->arg[i], 'z', ydims, align))) return rc;
    if (kEpiArg[i] && kEpiArg[i] != 'z' && (rc = make_tensor(&e->arg[i], kEpiArg[i], vdims, align, kVecType))) return rc;
    if ((rc = make_pointwise(&e->pw[i], &e->pwop[i], kEpiMode[i], e->v[i], e->arg[i], last ? e->y : e->v[i + 1])))
      return rc;
  }
  return 0;
}

// The one-operation graph y = 1 * conv(x, w) + 0 * y (with kEpilogue: the conv writes v[0] and the
// epilogue's ops follow); for a transposed conv (kTransposed) the backward-data pass of the conv it
// transposes, y = dx = conv^T(dy = x, w), as PyTorch runs it.
static int make_graph(cudnnHandle_t handle, ConvEntry* e) {
  const float alpha = 1.f, beta = 0.f;
  cudnnBackendDescriptor_t conv_y = kEpilogue ? e->v[0] : e->y;
  if (kTransposed) {
    CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, &e->op));
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->x);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->w);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->y);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->conv);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  } else {
    CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &e->op));
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->x);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->w);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_y);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->conv);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    SET(e->op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  }
  CD(cudnnBackendFinalize(e->op));
  cudnnBackendDescriptor_t ops[1 + kMaxEpi] = {e->op};
  std::copy(e->pwop, e->pwop + kEpiOps, ops + 1);
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &e->graph));
  SET(e->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1 + kEpiOps, ops);
  SET(e->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  const cudnnStatus_t s = cudnnBackendFinalize(e->graph);
  if (s != CUDNN_STATUS_SUCCESS) return not_supported(s) ? HTAM_ERR_SHAPE : 3000 + (int)s;
  return 0;
}

// The heuristic's engine configs for the graph, best first (at most kMaxConfigs).
// NOTE: the results are copied into descriptors the caller created (CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).
static int rank_engines(ConvEntry* e, cudnnBackendHeurMode_t mode) {
  drop_configs(e);
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &e->heur));
  SET(e->heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->graph);
  SET(e->heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  CD(cudnnBackendFinalize(e->heur));
  for (auto& c : e->cfg) CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
  int64_t n = 0;
  CD(cudnnBackendGetAttribute(e->heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                              kMaxConfigs, &n, e->cfg));
  e->n_cfg = (int)std::min<int64_t>(n, kMaxConfigs);
  return 0;
}

// Whether a config's engine may run here, from its numerical notes (as ATen's Conv_v8.cpp filters):
// never nondeterministic (verification wants two calls bitwise equal) nor down-converting inputs;
// for strict fp32 no tensor cores (that would be TF32).
static bool usable(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t eng = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS) return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  bool ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                     &eng) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                     CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS;
  for (int64_t i = 0; ok && i < std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT); ++i)
    ok = notes[i] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && notes[i] != CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS &&
         !(kStrictFp32 && notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
  cudnnBackendDestroyDescriptor(eng);
  return ok;
}

// An execution plan for the config, or nullptr when it does not finalize or its workspace (bytes,
// *ws) exceeds kMaxWorkspace.
static cudnnBackendDescriptor_t make_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, int64_t* ws) {
  cudnnBackendDescriptor_t plan = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  int64_t n = 0;
  *ws = -1;
  const bool ok =
      cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle) == CUDNN_STATUS_SUCCESS &&
      cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) == CUDNN_STATUS_SUCCESS &&
      cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS &&
      cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, ws) == CUDNN_STATUS_SUCCESS &&
      *ws >= 0 && (size_t)*ws <= kMaxWorkspace;
  if (!ok) drop(&plan);
  return plan;
}

// Plans the usable configs from cfg[from] on, in rank order, and keeps the skip-th that plans (the
// last that plans when fewer do); grows the shared workspace for it. HTAM_ERR_SHAPE when none plans.
static int next_plan(DnnState* st, ConvEntry* e, int from, int skip) {
  cudnnBackendDescriptor_t best = nullptr;
  int64_t best_ws = 0;
  int best_i = -1;
  for (int i = from, found = 0; i < e->n_cfg && found <= skip; ++i) {
    int64_t ws = 0;
    cudnnBackendDescriptor_t p = usable(e->cfg[i]) ? make_plan(st->handle, e->cfg[i], &ws) : nullptr;
    if (!p) continue;
    drop(&best);
    best = p; best_ws = ws; best_i = i; ++found;
  }
  if (!best) return HTAM_ERR_SHAPE;
  if (e->plan) ++g_epoch;   // a replaced plan: graphs the launcher captured may run it
  drop(&e->plan);
  e->plan = best; e->pick = best_i;
  return grow(&st->ws, &st->ws_bytes, std::max<size_t>((size_t)best_ws, 1));   // never a null workspace
}

// d: the problem key (conv_geom.py: N, C, H, W of x; K, R, S; alignment; D, T, O); P, Q: y's H, W.
static int plan_entry(DnnState* st, ConvEntry* e, const int64_t* d, int64_t P, int64_t Q) {
  int rc = 0;
  const int s = kSpatial == 3 ? 0 : 1;   // 2-D: the depth entries are left out
  // w is [K, C/g, ...] forward, [C, K/g, ...] transposed (the layout of the conv it transposes)
  const int64_t wk = kTransposed ? d[1] : d[4], wc = kTransposed ? d[4] / kGroups : d[1] / kGroups;
  const int64_t xd[5] = {d[0], d[1], d[8], d[2], d[3]}, wd[5] = {wk, wc, d[9], d[5], d[6]},
                yd[5] = {d[0], d[4], d[10], P, Q};
  const int64_t x2[4] = {xd[0], xd[1], xd[3], xd[4]}, w2[4] = {wd[0], wd[1], wd[3], wd[4]},
                y2[4] = {yd[0], yd[1], yd[3], yd[4]};
  if ((rc = make_tensor(&e->x, 'x', s ? x2 : xd, d[7])) || (rc = make_tensor(&e->w, 'w', s ? w2 : wd, d[7])) ||
      (rc = make_tensor(&e->y, 'y', s ? y2 : yd, d[7])) || (rc = make_conv(e)))
    return rc;
  if (kEpilogue && (rc = make_epilogue(e, y2, d[7]))) return rc;   // 2-D only (conv.py)
  if ((rc = make_graph(st->handle, e))) return rc;
  // PyTorch's order: the heuristic's ranking, then cuDNN's fallback list when nothing in it is usable
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (rank_engines(e, mode)) continue;   // this mode cannot rank the graph
    if ((rc = next_plan(st, e, 0, kAlgo)) != HTAM_ERR_SHAPE) return rc;
  }
  return HTAM_ERR_SHAPE;   // no usable engine under this precision: the original region runs
}

// The variant pack binding the call's pointers (args: the epilogue's operands, kEpiOps of them,
// nullptr for a unary op) into *pack: a cached one with these pointers, else a new one in the oldest
// slot. A pack holds pointers, never results.
static int bind(ConvEntry* e, const void* x, const void* w, const void* y, const void* ws,
                const void* const* args, cudnnBackendDescriptor_t* pack) {
  const void* ptrs[4 + kMaxEpi] = {x, w, y, ws};
  for (int i = 0; i < kEpiOps; ++i) ptrs[4 + i] = args[i];
  for (int k = 0; k < kPacks; ++k)
    if (e->pack[k] && std::equal(ptrs, ptrs + 4 + kMaxEpi, e->ptrs[k])) { *pack = e->pack[k]; return 0; }
  const int k = e->next_pack;
  e->next_pack = (k + 1) % kPacks;
  void* data[3 + kMaxEpi] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  int64_t uids[3 + kMaxEpi] = {'x', 'w', 'y'};
  int n = 3;
  for (int i = 0; i < kEpiOps; ++i)
    if (kEpiArg[i]) { data[n] = const_cast<void*>(args[i]); uids[n++] = kEpiArg[i]; }
  drop(&e->pack[k]);
  std::fill(e->ptrs[k], e->ptrs[k] + 4 + kMaxEpi, nullptr);
  void* wsp = const_cast<void*>(ws);
  CD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &e->pack[k]));
  SET(e->pack[k], CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data);
  SET(e->pack[k], CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  SET(e->pack[k], CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
  CD(cudnnBackendFinalize(e->pack[k]));
  std::copy(ptrs, ptrs + 4 + kMaxEpi, e->ptrs[k]);
  *pack = e->pack[k];
  return 0;
}

// The conv x * w -> y on this entry's plan (args: the fused epilogue's operands, as bind() takes
// them); an engine cuDNN declines only at run time gives way to the next usable one.
static int graph_conv(DnnState* st, ConvEntry* e, const void* x, const void* w, const void* y,
                      const void* const* args) {
  for (;;) {
    cudnnBackendDescriptor_t pack = nullptr;
    const int rc = bind(e, x, w, y, st->ws, args, &pack);
    if (rc) return rc;
    const cudnnStatus_t s = cudnnBackendExecute(st->handle, e->plan, pack);
    if (s == CUDNN_STATUS_SUCCESS) return 0;
    if (!not_supported(s) || next_plan(st, e, e->pick + 1, 0)) return 3000 + (int)s;
  }
}
