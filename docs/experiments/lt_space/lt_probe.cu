// What cuBLASLt's configuration space holds beyond its heuristic's ranking, per GEMM shape (#35).
// For Y[M, N] = X[M, K] W[N, K]^T in bf16 (fp32 accumulate), as a linear layer runs it:
//   heur   every result of cublasLtMatmulAlgoGetHeuristic (up to 64), timed;
//   grid   from the first result of each of the first 3 algo ids: every tile id it lists
//          (CAP_TILE_IDS) x split-K {1, 2, 4, 8} x CTA swizzle {0, 1}, kept where
//          cublasLtMatmulAlgoCheck accepts it, timed.
// Each timed config is checked against the heuristic's first (max |d| / (|ref| + 1) <= 2e-2).
// Prints one JSON line per config: shape, source, idx, algo, tile, stages, splitk, red, swz,
// custom, cluster, us (GPU time: the lowest of 3 replays of a CUDA graph of 20 launches, per launch),
// err, ti (the tile's index in the algo's CAP_TILE_IDS, -1: a heuristic result), nt (that list's length).
//   nvcc -O2 -std=c++17 -arch=sm_90a lt_probe.cu -lcublasLt -o lt_probe && ./lt_probe M N K ...
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>

#define CK(x) do { auto s_ = (x); if ((int)s_ != 0) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)s_); exit(1); } } while (0)

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f));
  }
}
__global__ void diff(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n, unsigned* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    float d = fabsf(x - y) / (fabsf(y) + 1.f);
    m = fmaxf(m, d != d ? 1e30f : d);
  }
  atomicMax(out, __float_as_uint(m));
}

struct Cfg { int algo, tile, stages, splitk, red, swz, custom, cluster; };
static Cfg read(const cublasLtMatmulAlgo_t& a) {
  Cfg c{}; size_t w;
  uint32_t u32; uint16_t u16; int32_t i32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &i32, 4, &w); c.algo = i32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &u32, 4, &w); c.tile = u32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &u32, 4, &w); c.stages = u32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &i32, 4, &w); c.splitk = i32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &u32, 4, &w); c.red = u32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &u32, 4, &w); c.swz = u32;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &u32, 4, &w); c.custom = u32;
  u16 = 0; cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &u16, 2, &w); c.cluster = u16;
  return c;
}

int main(int argc, char** argv) {
  cublasLtHandle_t h; CK(cublasLtCreate(&h));
  const size_t kWs = 32u << 20;
  void* ws; CK(cudaMalloc(&ws, kWs));
  unsigned* dev_err; CK(cudaMalloc(&dev_err, 4));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaStream_t stream; cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (int s = 1; s + 2 < argc; s += 3) {
    const int64_t M = atoll(argv[s]), N = atoll(argv[s + 1]), K = atoll(argv[s + 2]);
    __nv_bfloat16 *X, *W, *D, *R;
    CK(cudaMalloc(&X, M * K * 2)); CK(cudaMalloc(&W, N * K * 2)); CK(cudaMalloc(&D, M * N * 2)); CK(cudaMalloc(&R, M * N * 2));
    fill<<<1024, 256>>>(X, M * K, 1); fill<<<1024, 256>>>(W, N * K, 2);
    // column-major: D (N x M) = W^T-as-stored (op T on K x N) * X (K x M)
    cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t T = CUBLAS_OP_T, Nn = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &T, sizeof(T)));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &Nn, sizeof(Nn)));
    cublasLtMatrixLayout_t A, B, C;
    CK(cublasLtMatrixLayoutCreate(&A, CUDA_R_16BF, K, N, K));
    CK(cublasLtMatrixLayoutCreate(&B, CUDA_R_16BF, K, M, K));
    CK(cublasLtMatrixLayoutCreate(&C, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = kWs;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    std::vector<cublasLtMatmulHeuristicResult_t> res(64); int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, A, B, C, C, pref, 64, res.data(), &found));
    const float alpha = 1.f, beta = 0.f;
    auto run = [&](const cublasLtMatmulAlgo_t* a, __nv_bfloat16* out, cudaStream_t st) {
      return cublasLtMatmul(h, op, &alpha, W, A, X, B, &beta, out, C, out, C, a, ws, kWs, st);
    };
    // GPU time: 20 launches captured in a CUDA graph, replayed 3 times, the lowest mean (a loop of
    // launches would time cuBLASLt's host call too, about 7 us, above many of these GEMMs)
    auto time_us = [&](const cublasLtMatmulAlgo_t* a) -> float {
      for (int i = 0; i < 3; ++i) if (run(a, D, stream) != CUBLAS_STATUS_SUCCESS) return -1.f;
      cudaGraph_t g; cudaGraphExec_t ge;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1.f;
      for (int i = 0; i < 20; ++i) run(a, D, stream);
      if (cudaStreamEndCapture(stream, &g) != cudaSuccess) { cudaGetLastError(); return -1.f; }
      if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) { cudaGraphDestroy(g); cudaGetLastError(); return -1.f; }
      cudaGraphLaunch(ge, stream);
      float best = 1e30f;
      for (int r = 0; r < 3; ++r) {
        cudaEventRecord(e0, stream);
        cudaGraphLaunch(ge, stream);
        cudaEventRecord(e1, stream); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1); best = std::min(best, ms * 1000.f / 20);
      }
      cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
      return cudaGetLastError() == cudaSuccess ? best : -1.f;
    };
    auto err_of = [&]() -> float {
      cudaStreamSynchronize(stream); cudaMemset(dev_err, 0, 4); diff<<<512, 256>>>(D, R, M * N, dev_err);
      unsigned u; cudaMemcpy(&u, dev_err, 4, cudaMemcpyDeviceToHost); float f; memcpy(&f, &u, 4); return f;
    };
    auto emit = [&](const char* src, int idx, const cublasLtMatmulAlgo_t& a, float us, float err, int ti = -1, int nt = 0) {
      Cfg c = read(a);
      printf("{\"M\":%lld,\"N\":%lld,\"K\":%lld,\"src\":\"%s\",\"idx\":%d,\"algo\":%d,\"tile\":%d,\"stages\":%d,"
             "\"splitk\":%d,\"red\":%d,\"swz\":%d,\"custom\":%d,\"cluster\":%d,\"us\":%.3f,\"err\":%.3g,\"ti\":%d,\"nt\":%d}\n",
             (long long)M, (long long)N, (long long)K, src, idx, c.algo, c.tile, c.stages, c.splitk, c.red, c.swz,
             c.custom, c.cluster, us, err, ti, nt);
    };
    if (found == 0) { fprintf(stderr, "no algo for %lld %lld %lld\n", (long long)M, (long long)N, (long long)K); continue; }
    CK(run(&res[0].algo, R, stream)); CK(cudaDeviceSynchronize());
    for (int i = 0; i < found; ++i) {
      float us = time_us(&res[i].algo);
      emit("heur", i, res[i].algo, us, us > 0 ? err_of() : -1.f);
    }
    std::vector<int> ids;
    for (int i = 0; i < found && ids.size() < 3; ++i) {
      int id = read(res[i].algo).algo;
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) continue;
      ids.push_back(id);
      size_t nb = 0; cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &nb);
      std::vector<uint32_t> tiles(nb / 4 + 1);
      if (nb) cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), nb, &nb);
      tiles.resize(nb / 4);
      int n = 0;
      for (size_t ti = 0; ti < tiles.size(); ++ti) for (int sk : {1, 2, 4, 8}) for (uint32_t swz : {0u, 1u}) {
        const uint32_t tile = tiles[ti];
        cublasLtMatmulAlgo_t a = res[i].algo;
        uint32_t red = sk > 1 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : 0u;
        int32_t k32 = sk;
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, 4);
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k32, 4);
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, 4);
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, 4);
        cublasLtMatmulHeuristicResult_t chk;
        if (cublasLtMatmulAlgoCheck(h, op, A, B, C, C, &a, &chk) != CUBLAS_STATUS_SUCCESS) continue;
        if (chk.workspaceSize > kWs || ++n > 400) continue;
        float us = time_us(&a);
        emit("grid", (int)(&res[i] - &res[0]), a, us, us > 0 ? err_of() : -1.f, (int)ti, (int)tiles.size());
      }
    }
    fflush(stdout);
    cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(A); cublasLtMatrixLayoutDestroy(B);
    cublasLtMatrixLayoutDestroy(C); cublasLtMatmulDescDestroy(op);
    cudaFree(X); cudaFree(W); cudaFree(D); cudaFree(R);
  }
  return 0;
}
