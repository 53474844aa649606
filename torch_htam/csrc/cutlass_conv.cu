// htam_cutlass_conv (cutlass_conv.h): a conv site in ONE launch,
//   y = act((conv(x, w) - mean) * gamma * rsqrt(var + eps) + beta [+ res]), act none, ReLU or hardswish
//
// Why: a served ResNet's conv site on cuDNN is two launches on the host path (the batch-norm fold,
// then cuDNN's execute), and at batch 1-16 the host decides the call (bench/findings.md, #36).
// Here batch norm is computed per element in the epilogue from the raw statistics (four
// per-channel row broadcasts), so nothing is folded or cached across calls and a parameter written
// in place is always seen. CUTLASS 3's Hopper implicit-GEMM conv (TMA im2col loads, wgmma,
// warp-specialized) does the GEMM: M = N*P*Q output pixels, N = K output channels, K = R*S*C.
//
// Host cost: initialize() encodes the TMA descriptors (im2col for x, tiled for w, y and res); a
// call whose pointers and sizes were met before reuses them from a cache, so its host work is one
// launch (6.1-10.7 us against 9.8-13.4 us uncached, H200: docs/experiments/cutlass_conv).
// NOTE: NDEBUG before CUTLASS's headers: with device asserts, ptxas serializes wgmma across their
// calls (C7510 in every kernel, nvcc 13.0).
#ifndef NDEBUG
#define NDEBUG
#endif
#include <cstdint>
#include <cstring>
#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/convolution.h>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/conv/dispatch_policy.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>

#include "cutlass_conv.h"
#include "htam_library.h"
#include "htam_abi.h"

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// ---- the epilogue: batch norm from raw statistics, optional residual, an activation --------------
struct BnArgs { float eps = 1e-5f; int act = HTAM_CONV_ACT_RELU; };

// act (HTAM_CONV_ACT_*) on v, in fp32. hardswish as torch writes it: x * min(max(x + 3, 0), 6) / 6
CUTLASS_HOST_DEVICE static float activate(float v, int act) {
  if (act == HTAM_CONV_ACT_RELU) return fmaxf(v, 0.f);
  if (act == HTAM_CONV_ACT_HARDSWISH) return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) * (1.f / 6.f);
  return v;
}

template <class T>      // T: Array<float, N>, one fragment of the tile
struct BnAct {
  using Arguments = BnArgs;
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& mean, T const& gamma, T const& var, T const& beta,
                                   Arguments const& a) const {
    T out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < T::kElements; ++i) {
      const float v = (acc[i] - mean[i]) * gamma[i] * rsqrtf(var[i] + a.eps) + beta[i];
      out[i] = activate(v, a.act);
    }
    return out;
  }
};

template <class T>
struct BnAddAct {       // act(bn(acc) + res): a ResNet block's last conv
  using Arguments = BnArgs;
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& mean, T const& gamma, T const& var, T const& beta,
                                   T const& res, Arguments const& a) const {
    T out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < T::kElements; ++i) {
      const float v = (acc[i] - mean[i]) * gamma[i] * rsqrtf(var[i] + a.eps) + beta[i] + res[i];
      out[i] = activate(v, a.act);
    }
    return out;
  }
};

// ---- the kernel, per tile shape and whether a residual is read -----------------------------------
using Elt = cutlass::bfloat16_t;
constexpr int kAlign = 128 / cutlass::sizeof_bits<Elt>::value;    // 8 values: one 16-byte TMA row
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

template <class TileShape, bool Residual>
struct ConvBn {
  using Cluster = Shape<_1, _1, _1>;
  using Row = fusion::Sm90RowBroadcast<0, TileShape, Elt, float, Stride<_0, _1, _0>, kAlign>;
  using Acc = fusion::Sm90AccFetch;
  using EVT = std::conditional_t<Residual,
      fusion::Sm90EVT<fusion::Sm90Compute<BnAddAct, Elt, float, kRound>, Acc, Row, Row, Row, Row,
                      fusion::Sm90SrcFetch<Elt>>,
      fusion::Sm90EVT<fusion::Sm90Compute<BnAct, Elt, float, kRound>, Acc, Row, Row, Row, Row>>;
  using ElementC = std::conditional_t<Residual, Elt, void>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      ElementC, cutlass::layout::TensorNHWC, kAlign,
      Elt, cutlass::layout::TensorNHWC, kAlign,
      cutlass::epilogue::TmaWarpSpecialized, EVT>::CollectiveOp;

  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
      Elt, cutlass::layout::TensorNHWC, kAlign,
      Elt, cutlass::layout::TensorNHWC, kAlign,
      float, TileShape, Cluster,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using Problem = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop,
                                                  Mainloop::DispatchPolicy::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<Problem, Mainloop, Epilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// ---- the cache of initialized kernels, keyed by a call's bytes (cutlass_conv.h: no padding) ----
static_assert(sizeof(HtamConvBn) == 8 * sizeof(void*) + 16 * 4, "HtamConvBn must have no padding");

// A served model meets a set of pointers per site and batch size; past this many a call is
// initialized anew each time (correct, ~5 us more host time)
constexpr size_t kMaxCached = 4096;
static std::mutex g_mutex;      // the caches: verification and a model may call from two threads

template <class TileShape, bool Residual>
static int run_tile(const HtamConvBn& a, cudaStream_t stream, bool cached) {
  using K = ConvBn<TileShape, Residual>;
  using Conv = typename K::Conv;
  static std::unordered_map<HtamConvBn, std::unique_ptr<Conv>, BytesHash<HtamConvBn>, BytesEq<HtamConvBn>> made;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (cached) {
    auto it = made.find(a);
    if (it != made.end()) return htam_cutlass_rc(it->second->run(stream));
  }
  typename K::Problem problem(cutlass::conv::Mode::kCrossCorrelation,
                              {a.n, a.h, a.wd, a.c}, {a.k, a.r, a.s, a.c},
                              {a.pad_h, a.pad_w}, {a.pad_h, a.pad_w}, {a.stride_h, a.stride_w},
                              {a.dil_h, a.dil_w}, 1);
  using StrideC = typename Conv::ConvKernel::StrideC;
  using StrideD = typename Conv::ConvKernel::StrideD;
  StrideC dC;
  StrideD dD;
  cute::for_each(cute::make_seq<cute::rank<0>(StrideC{})>{}, [&](auto i) {
    cute::get<0, i>(dC) = problem.stride_C[K::Problem::RankT - 2 - i];
  });
  cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(dD) = problem.stride_C[K::Problem::RankT - 2 - i];
  });
  using ElementC = typename K::ElementC;
  typename Conv::Arguments args{
      problem,
      {static_cast<const Elt*>(a.x), static_cast<const Elt*>(a.w)},
      {{}, static_cast<const ElementC*>(Residual ? a.res : nullptr), dC, static_cast<Elt*>(a.y), dD}};
  using RowArgs = typename K::Row::Arguments;
  auto row = [](const void* p) { return RowArgs{static_cast<const Elt*>(p)}; };
  if constexpr (Residual)
    args.epilogue.thread = {{}, row(a.mean), row(a.gamma), row(a.var), row(a.beta), {}, BnArgs{a.eps, a.act}};
  else
    args.epilogue.thread = {{}, row(a.mean), row(a.gamma), row(a.var), row(a.beta), BnArgs{a.eps, a.act}};
  auto conv = std::make_unique<Conv>();
  // (this schedule needs no workspace; one that did would need a buffer kept for graphs' replays)
  if (Conv::get_workspace_size(args) != 0 || conv->can_implement(args) != cutlass::Status::kSuccess)
    return HTAM_ERR_SHAPE;
  if (const int rc = htam_cutlass_rc(conv->initialize(args, nullptr, stream))) return rc;
  if (const int rc = htam_cutlass_rc(conv->run(stream))) return rc;
  if (cached && made.size() < kMaxCached) made.emplace(a, std::move(conv));
  return 0;
}

// ---- the kernels, one function each (htam_library.h: a part of the build defines its share) ---

using Tile128x64 = Shape<_128, _64, Shape<_64>>;
using Tile128x128 = Shape<_128, _128, Shape<_64>>;
using Tile64x64 = Shape<_64, _64, Shape<_64>>;
using KernelFn = int (*)(const HtamConvBn&, cudaStream_t, bool);

// kernel i: [residual][tile] (cutlass_conv.h's tile field; res != nullptr)
HTAM_HIDDEN int conv_k0(const HtamConvBn& a, cudaStream_t s, bool cached);
HTAM_HIDDEN int conv_k1(const HtamConvBn& a, cudaStream_t s, bool cached);
HTAM_HIDDEN int conv_k2(const HtamConvBn& a, cudaStream_t s, bool cached);
HTAM_HIDDEN int conv_k3(const HtamConvBn& a, cudaStream_t s, bool cached);
HTAM_HIDDEN int conv_k4(const HtamConvBn& a, cudaStream_t s, bool cached);
HTAM_HIDDEN int conv_k5(const HtamConvBn& a, cudaStream_t s, bool cached);
#if HTAM_MINE(0)
int conv_k0(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile128x64, false>(a, s, c); }
#endif
#if HTAM_MINE(1)
int conv_k1(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile128x128, false>(a, s, c); }
#endif
#if HTAM_MINE(2)
int conv_k2(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile64x64, false>(a, s, c); }
#endif
#if HTAM_MINE(3)
int conv_k3(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile128x64, true>(a, s, c); }
#endif
#if HTAM_MINE(4)
int conv_k4(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile128x128, true>(a, s, c); }
#endif
#if HTAM_MINE(5)
int conv_k5(const HtamConvBn& a, cudaStream_t s, bool c) { return run_tile<Tile64x64, true>(a, s, c); }
#endif

#if HTAM_ENTRY_PART
static const KernelFn kKernels[2][3] = {{conv_k0, conv_k1, conv_k2}, {conv_k3, conv_k4, conv_k5}};

static int dispatch(const HtamConvBn& a, cudaStream_t stream, bool cached) {
  if (a.c % kAlign || a.k % kAlign) return HTAM_ERR_SHAPE;
  if (a.act < HTAM_CONV_ACT_NONE || a.act > HTAM_CONV_ACT_HARDSWISH || a.tile < 0 || a.tile > 2) return HTAM_ERR_SHAPE;
  const void* const ptrs[] = {a.x, a.w, a.mean, a.gamma, a.var, a.beta, a.y};
  for (const void* p : ptrs)
    if (p == nullptr || !htam_aligned16(p)) return HTAM_ERR_SHAPE;
  if (a.res != nullptr && !htam_aligned16(a.res)) return HTAM_ERR_SHAPE;
  return kKernels[a.res != nullptr][a.tile](a, stream, cached);
}

// ---- C entry points ------------------------------------------------------------------------------
extern "C" __attribute__((visibility("default"))) int htam_cutlass_conv_bn(const HtamConvBn* p, cudaStream_t stream) {
  return dispatch(*p, stream, true);
}

extern "C" __attribute__((visibility("default"))) double htam_cutlass_conv_bn_host_ns(
    const HtamConvBn* p, cudaStream_t stream, int calls, int cached) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i)
    if (dispatch(*p, stream, cached != 0) != 0) return -1.0;
  const auto dt = std::chrono::steady_clock::now() - t0;
  return std::chrono::duration<double, std::nano>(dt).count() / calls;
}
#endif
