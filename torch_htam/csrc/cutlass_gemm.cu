// htam_cutlass_gemm (cutlass_gemm.h): y = act(x @ w^T + bias) in ONE launch.
//
// Why: Inductor runs a linear layer as cuBLAS's GEMM (bias in its epilogue) and then a Triton kernel
// for an activation cuBLAS cannot fuse (GELU with erf, SiLU), which reads and writes the [M, N]
// result once more. At a ViT-B MLP's first GEMM (M 6304, K 768, N 3072, bf16) under CUDA graphs that
// is 106 against 69 us for the GEMM alone (H200, docs/experiments/cutlass_gemm/headroom-h200.txt).
// Here the activation is computed on the accumulators in the epilogue: the result is stored once.
// GELU with erf (torch's default; gelu_erf.h: within 4e-6 of it) or tanh (GELU_taylor: CUTLASS's fast
// tanh, within bf16's rounding).
// CUTLASS 3's Hopper GEMM (TMA loads, wgmma, warp-specialized, persistent) does the GEMM as
// D[M, N] = A[M, K] (row-major) * B[K, N] (column-major: w [N, K] as the model holds it).
//
// Host cost: initialize() encodes the TMA descriptors; a call whose pointers and sizes were met
// before reuses them from a cache, so its host work is one launch.
// NOTE: NDEBUG before CUTLASS's headers: with device asserts, ptxas serializes wgmma across their
// calls (C7510 in every kernel, nvcc 13.0).
#ifndef NDEBUG
#define NDEBUG
#endif
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/util/packed_stride.hpp>

#include "cutlass_gemm.h"
#include "gelu_erf_cutlass.h"
#include "htam_library.h"
#include "htam_abi.h"

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// ---- the kernel, per epilogue, tile shape, cluster and schedule -----------------------------------
using Elt = cutlass::bfloat16_t;
constexpr int kAlign = 128 / cutlass::sizeof_bits<Elt>::value;    // 8 values: one 16-byte TMA row
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
namespace act = cutlass::epilogue::thread;

// The epilogues (cutlass_gemm.h's act field), each with the C operand it reads (void: none) and how a
// call fills its arguments.
// BiasAct: CUTLASS's own D = act(acc + bias[n]) (bias: a row vector broadcast over M; a null pointer
// reads as zeros), fp32 math. NOTE: not a visitor tree of ours: one with the same math (Sm90EVT of
// Sm90Compute over the accumulator and an Sm90RowBroadcast, the activation chosen at run time) ran
// 1.7-2.5x slower at the same tile (H200, docs/experiments/cutlass_gemm/variants-h200.txt).
template <template <class> class Act>
struct BiasAct {
  using ElementC = void;
  using Fusion = fusion::LinCombPerColBiasEltAct<Act, Elt, float, Elt, Elt, float>;
  template <class Thread>
  static void set(Thread& t, const HtamGemmAct& a) {
    t.alpha = 1.f;
    t.beta = 0.f;
    t.bias_ptr = static_cast<const Elt*>(a.bias);
  }
};

// SiluMul: D = silu(acc) * C, C = mul [M, N] (a SwiGLU MLP's up projection), loaded by the
// epilogue's producer warp through TMA as CUTLASS loads any source C (Sm90SrcFetch); fp32 math, one
// rounding to bf16 at the end. Compile-time nodes only (the tree above that chose at run time was
// the slow one).
struct SiluMul {
  using ElementC = Elt;
  using Fusion = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, Elt, float, kRound>,
                                 fusion::Sm90EVT<fusion::Sm90Compute<act::SiLu, float, float, kRound>,
                                                 fusion::Sm90AccFetch>,
                                 fusion::Sm90SrcFetch<Elt>>;
  template <class Thread>
  static void set(Thread&, const HtamGemmAct&) {}     // its nodes take no arguments
};

// Cooperative: two consumer warp groups share one tile (M >= 128); pingpong: each its own tile, one
// group's epilogue under the other's main loop.
template <class Epi, class TileShape, class Cluster, bool Cooperative>
struct GemmEpi {
  using KernelSchedule = std::conditional_t<Cooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiSchedule = std::conditional_t<Cooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                         cutlass::epilogue::TmaWarpSpecialized>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      typename Epi::ElementC, cutlass::layout::RowMajor, kAlign,
      Elt, cutlass::layout::RowMajor, kAlign,
      EpiSchedule, typename Epi::Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Elt, cutlass::layout::RowMajor, kAlign,
      Elt, cutlass::layout::ColumnMajor, kAlign,
      float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// ---- the cache of initialized kernels, keyed by a call's bytes (cutlass_gemm.h: no padding) ----
static_assert(sizeof(HtamGemmAct) == 5 * sizeof(void*) + 6 * 4, "HtamGemmAct must have no padding");

// A served model meets a set of pointers per site and batch size; past this many a call is
// initialized anew each time (correct, a few us more host time)
constexpr size_t kMaxCached = 4096;
static std::mutex g_mutex;      // the caches: verification and a model may call from two threads

// The SM count the persistent scheduler sizes its grid by, per device (queried once)
static int sm_count() {
  static int counts[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (counts[dev] == 0) counts[dev] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(dev);
  return counts[dev];
}

template <class Epi, class Tile>
static int run_tile(const HtamGemmAct& a, cudaStream_t stream) {
  using G = typename GemmEpi<Epi, typename Tile::Shape, typename Tile::Cluster, Tile::kCooperative>::Gemm;
  using K = typename G::GemmKernel;
  static std::unordered_map<HtamGemmAct, std::unique_ptr<G>, BytesHash<HtamGemmAct>, BytesEq<HtamGemmAct>> made;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = made.find(a);
  if (it != made.end()) return htam_cutlass_rc(it->second->run(stream));
  const auto sA = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(a.m, a.k, 1));
  const auto sB = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(a.n, a.k, 1));
  const auto sC = cutlass::make_cute_packed_stride(typename K::StrideC{}, make_shape(a.m, a.n, 1));
  const auto sD = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(a.m, a.n, 1));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm, {a.m, a.n, a.k, 1},
      {static_cast<const Elt*>(a.x), sA, static_cast<const Elt*>(a.w), sB},
      {{}, nullptr, sC, static_cast<Elt*>(a.y), sD}, hw};
  if constexpr (!std::is_void_v<typename Epi::ElementC>) args.epilogue.ptr_C = static_cast<const Elt*>(a.mul);
  Epi::set(args.epilogue.thread, a);
  auto gemm = std::make_unique<G>();
  // (these schedules need no workspace; one that did would need a buffer kept for graphs' replays)
  if (G::get_workspace_size(args) != 0 || gemm->can_implement(args) != cutlass::Status::kSuccess)
    return HTAM_ERR_SHAPE;
  if (const int rc = htam_cutlass_rc(gemm->initialize(args, nullptr, stream))) return rc;
  if (const int rc = htam_cutlass_rc(gemm->run(stream))) return rc;
  if (made.size() < kMaxCached) made.emplace(a, std::move(gemm));
  return 0;
}

// ---- the kernels, one function each (htam_library.h: a part of the build defines its share) ---

// The tiles (cutlass_gemm.h's tile field; gemm_cutlass.TILES says why these five): M x N of y per
// tile and K step, the cluster, cooperative or pingpong.
template <class S, class C, bool Coop>
struct TileCfg {
  using Shape = S;
  using Cluster = C;
  static constexpr bool kCooperative = Coop;
};
using One = Shape<_1, _1, _1>;
// NOTE: no 2x1 cluster: 128x256 on 2x1 clusters was slower than on one SM at all 9 shapes measured
// (docs/experiments/cutlass_gemm/configs-h200-ab507f2.txt), and its launches from the cache of
// initialized kernels failed (4007, cudaErrorInvalidResourceHandle; H200, nvcc 13.0, CUTLASS 4.2).
using Tiles = cute::tuple<TileCfg<Shape<_128, _128, _64>, One, true>, TileCfg<Shape<_128, _128, _64>, One, false>,
                          TileCfg<Shape<_128, _192, _64>, One, true>, TileCfg<Shape<_64, _128, _64>, One, false>,
                          TileCfg<Shape<_128, _256, _64>, One, true>>;
// The epilogues, by cutlass_gemm.h's act field
using Epis = cute::tuple<BiasAct<GeluErf>, BiasAct<act::GELU_taylor>, SiluMul>;
constexpr int kTiles = cute::tuple_size<Tiles>::value, kEpis = cute::tuple_size<Epis>::value;
static_assert(kEpis == HTAM_GEMM_ACT_SILU_MUL + 1, "one epilogue per cutlass_gemm.h act");
using KernelFn = int (*)(const HtamGemmAct&, cudaStream_t);

// kernel i = act * kTiles + tile, defined by the part that owns it (htam_library.h)
#define HTAM_GEMM_KERNEL(i)                                                                         \
  int gemm_k##i(const HtamGemmAct& a, cudaStream_t s) {                                             \
    return run_tile<cute::tuple_element_t<(i) / kTiles, Epis>, cute::tuple_element_t<(i) % kTiles, Tiles>>(a, s); \
  }
#define HTAM_GEMM_DECLARE(i) HTAM_HIDDEN int gemm_k##i(const HtamGemmAct& a, cudaStream_t s);
HTAM_GEMM_DECLARE(0) HTAM_GEMM_DECLARE(1) HTAM_GEMM_DECLARE(2) HTAM_GEMM_DECLARE(3) HTAM_GEMM_DECLARE(4)
HTAM_GEMM_DECLARE(5) HTAM_GEMM_DECLARE(6) HTAM_GEMM_DECLARE(7) HTAM_GEMM_DECLARE(8) HTAM_GEMM_DECLARE(9)
HTAM_GEMM_DECLARE(10) HTAM_GEMM_DECLARE(11) HTAM_GEMM_DECLARE(12) HTAM_GEMM_DECLARE(13) HTAM_GEMM_DECLARE(14)
#if HTAM_MINE(0)
HTAM_GEMM_KERNEL(0)
#endif
#if HTAM_MINE(1)
HTAM_GEMM_KERNEL(1)
#endif
#if HTAM_MINE(2)
HTAM_GEMM_KERNEL(2)
#endif
#if HTAM_MINE(3)
HTAM_GEMM_KERNEL(3)
#endif
#if HTAM_MINE(4)
HTAM_GEMM_KERNEL(4)
#endif
#if HTAM_MINE(5)
HTAM_GEMM_KERNEL(5)
#endif
#if HTAM_MINE(6)
HTAM_GEMM_KERNEL(6)
#endif
#if HTAM_MINE(7)
HTAM_GEMM_KERNEL(7)
#endif
#if HTAM_MINE(8)
HTAM_GEMM_KERNEL(8)
#endif
#if HTAM_MINE(9)
HTAM_GEMM_KERNEL(9)
#endif
#if HTAM_MINE(10)
HTAM_GEMM_KERNEL(10)
#endif
#if HTAM_MINE(11)
HTAM_GEMM_KERNEL(11)
#endif
#if HTAM_MINE(12)
HTAM_GEMM_KERNEL(12)
#endif
#if HTAM_MINE(13)
HTAM_GEMM_KERNEL(13)
#endif
#if HTAM_MINE(14)
HTAM_GEMM_KERNEL(14)
#endif

#if HTAM_ENTRY_PART
static const KernelFn kKernels[kEpis][kTiles] = {{gemm_k0, gemm_k1, gemm_k2, gemm_k3, gemm_k4},
                                                 {gemm_k5, gemm_k6, gemm_k7, gemm_k8, gemm_k9},
                                                 {gemm_k10, gemm_k11, gemm_k12, gemm_k13, gemm_k14}};

static int dispatch(const HtamGemmAct& a, cudaStream_t stream) {
  if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.k % kAlign || a.n % kAlign || a.reserved != 0) return HTAM_ERR_SHAPE;
  if (a.act < 0 || a.act >= kEpis || a.tile < 0 || a.tile >= kTiles) return HTAM_ERR_SHAPE;
  // SiluMul reads mul and takes no bias; the GELUs read no mul
  if ((a.act == HTAM_GEMM_ACT_SILU_MUL) != (a.mul != nullptr) || (a.act == HTAM_GEMM_ACT_SILU_MUL && a.bias))
    return HTAM_ERR_SHAPE;
  const void* const ptrs[] = {a.x, a.w, a.y};
  for (const void* p : ptrs)
    if (p == nullptr || !htam_aligned16(p)) return HTAM_ERR_SHAPE;
  for (const void* p : {a.bias, a.mul})
    if (p != nullptr && !htam_aligned16(p)) return HTAM_ERR_SHAPE;
  return kKernels[a.act][a.tile](a, stream);
}

// ---- C entry point -------------------------------------------------------------------------------
extern "C" __attribute__((visibility("default"))) int htam_cutlass_gemm(const HtamGemmAct* p, cudaStream_t stream) {
  return dispatch(*p, stream);
}
#endif
