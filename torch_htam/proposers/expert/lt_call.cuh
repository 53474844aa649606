// ---- torch_htam expert: one cuBLASLt matmul described by value (gemm.py) -----------------------
// Needs cublaslt.cuh (LtState, lt_state, align_of, CK) before it.
// D (m x n, column-major, ld ldd, `batch` matrices sa/sb/sd apart) = op(A) op(B) [+ bias, act]:
// A is m x k (ta = N, ld lda) or stored k x m (ta = T); B is k x n (tb = N) or stored n x k.
struct LtCall {
  int64_t m, n, k, lda, ldb, ldd, batch, sa, sb, sd;
  int32_t ta, tb, epi, al[3];
};

struct LtCallEntry {
  bool used = false; int dev = -1; LtCall key;
  cublasLtMatmulDesc_t op = nullptr; cublasLtMatrixLayout_t A = nullptr, B = nullptr, D = nullptr;
  cublasLtMatmulAlgo_t algo;
};

static void lt_call_release(LtCallEntry& e) {
  if (e.op) cublasLtMatmulDescDestroy(e.op);
  if (e.A) cublasLtMatrixLayoutDestroy(e.A);
  if (e.B) cublasLtMatrixLayoutDestroy(e.B);
  if (e.D) cublasLtMatrixLayoutDestroy(e.D);
  e.op = nullptr; e.A = e.B = e.D = nullptr; e.used = false;
}

static int lt_layout(cublasLtMatrixLayout_t* l, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                     int64_t batch, int64_t stride) {
  CK(cublasLtMatrixLayoutCreate(l, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t bc = (int32_t)batch;
    CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof(bc)));
    CK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return 0;
}

// The entry's algorithm made to use `tile` (a cublasLtMatmulTile_t), split-K off, its other
// settings the heuristic's. HTAM_ERR_SHAPE where cuBLASLt rejects that for this problem or it needs
// more than the workspace: the original region runs.
static int lt_force_tile(LtState* st, LtCallEntry* e, int tile) {
  const uint32_t t = (uint32_t)tile, none = 0;
  const int32_t one = 1;
  CK(cublasLtMatmulAlgoConfigSetAttribute(&e->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof(t)));
  CK(cublasLtMatmulAlgoConfigSetAttribute(&e->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)));
  CK(cublasLtMatmulAlgoConfigSetAttribute(&e->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)));
  cublasLtMatmulHeuristicResult_t chk;
  if (cublasLtMatmulAlgoCheck(st->handle, e->op, e->A, e->B, e->D, e->D, &e->algo, &chk) != CUBLAS_STATUS_SUCCESS
      || chk.workspaceSize > kWorkspace)
    return HTAM_ERR_SHAPE;
  return 0;
}

// c: the problem (al[] is filled here from the pointers); rank: which of the heuristic's ranked
// algorithms (of the kRanks it is asked for; past the last found, the last); tile: the tile it is
// made to use (lt_force_tile; 0: its own); alpha: the product's scale; bias: the BIAS epilogues'
// vector (length m) or nullptr. The last kSlots problems keep their descriptors and algorithm.
template <int kRanks, int kSlots>
static int lt_call(LtCall c, cublasComputeType_t compute, cudaDataType_t type, int rank, int tile, float alpha,
                   const void* A, const void* B, void* D, const void* bias, cudaStream_t stream) {
  LtState* st = nullptr;
  int rc = lt_state(&st);
  if (rc) return rc;
  int dev = 0; cudaGetDevice(&dev);
  c.al[0] = align_of(A); c.al[1] = align_of(B); c.al[2] = align_of(D);
  static LtCallEntry cache[kSlots];
  static int next_slot = 0;
  LtCallEntry* e = nullptr;
  for (auto& x : cache)
    if (x.used && x.dev == dev && memcmp(&x.key, &c, sizeof(LtCall)) == 0) e = &x;
  if (!e) {
    e = &cache[next_slot]; next_slot = (next_slot + 1) % kSlots;
    lt_call_release(*e);
    CK(cublasLtMatmulDescCreate(&e->op, compute, CUDA_R_32F));
    cublasOperation_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)c.epi;
    CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if ((rc = lt_layout(&e->A, type, c.ta ? c.k : c.m, c.ta ? c.m : c.k, c.lda, c.batch, c.sa))) return rc;
    if ((rc = lt_layout(&e->B, type, c.tb ? c.n : c.k, c.tb ? c.k : c.n, c.ldb, c.batch, c.sb))) return rc;
    if ((rc = lt_layout(&e->D, type, c.m, c.n, c.ldd, c.batch, c.sd))) return rc;
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = kWorkspace;
    const uint32_t ua = c.al[0], ub = c.al[1], uc = c.al[2];
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ua, sizeof(ua));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ub, sizeof(ub));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &uc, sizeof(uc));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &uc, sizeof(uc));
    cublasLtMatmulHeuristicResult_t res[kRanks];
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(st->handle, e->op, e->A, e->B, e->D, e->D, pref, kRanks, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
      lt_call_release(*e);
      return HTAM_ERR_SHAPE;   // no algorithm for this problem: the original region runs
    }
    e->algo = res[rank < found ? rank : found - 1].algo;
    if (tile > 0 && (rc = lt_force_tile(st, e, tile))) {
      lt_call_release(*e);
      return rc;
    }
    e->key = c; e->dev = dev; e->used = true;
  }
  if (bias) CK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float beta = 0.f;
  CK(cublasLtMatmul(st->handle, e->op, &alpha, A, e->A, B, e->B, &beta, D, e->D, D, e->D, &e->algo,
                    st->ws, kWorkspace, stream));
  return 0;
}
