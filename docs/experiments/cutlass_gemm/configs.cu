// One CUTLASS sm90 configuration of csrc/cutlass_gemm.cu's kernel (y = gelu_erf(x @ w^T + bias),
// bf16, fp32 accumulation) per build: -DCFG=<row of the table below>. configs.py builds every row
// in parallel and times them against cuBLAS and Inductor at the zoo's MLP shapes, each row also at
// every raster order and swizzle its persistent scheduler takes at run time.
//
//   extern "C" int cfg_run(const HtamGemmAct*, cudaStream_t, int raster, int swizzle)
//   extern "C" const char* cfg_name()
#ifndef NDEBUG
#define NDEBUG
#endif
#include <cstdint>
#include <memory>
#include <unordered_map>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/util/packed_stride.hpp>

#include "cutlass_gemm.h"
#include "gelu_erf_cutlass.h"
#include "htam_library.h"

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

using Elt = cutlass::bfloat16_t;
constexpr int kAlign = 8;
namespace act = cutlass::epilogue::thread;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Auto = cutlass::epilogue::collective::EpilogueTileAuto;
using Persistent = cutlass::gemm::PersistentScheduler;
using StreamK = cutlass::gemm::StreamKScheduler;

template <template <class> class Act, class TileShape, class Cluster, class Schedule, class EpiTile, class Sched>
struct Cfg {
  static constexpr bool kCoop = std::is_same_v<Schedule, Coop>;
  using EpiSchedule = std::conditional_t<kCoop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                         cutlass::epilogue::TmaWarpSpecialized>;
  using Fusion = fusion::LinCombPerColBiasEltAct<Act, Elt, float, Elt, Elt, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster, EpiTile, float, float,
      void, cutlass::layout::RowMajor, kAlign, Elt, cutlass::layout::RowMajor, kAlign,
      EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Elt, cutlass::layout::RowMajor, kAlign, Elt, cutlass::layout::ColumnMajor, kAlign,
      float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Sched>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// the table: activation, tile (M x N x K), cluster, schedule, epilogue subtile, tile scheduler
#if CFG == 0
#define NAME "128x128 coop 1x1"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 1
#define NAME "128x256 coop 2x1"
using Chosen = Cfg<GeluErf, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 2
#define NAME "128x128 ping 1x1"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Ping, Auto, Persistent>;
#elif CFG == 3
#define NAME "128x256 coop 2x1 epi128x64"
using Chosen = Cfg<GeluErf, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, Shape<_128, _64>, Persistent>;
#elif CFG == 4
#define NAME "256x128 coop 1x1"
using Chosen = Cfg<GeluErf, Shape<_256, _128, _64>, Shape<_1, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 5
#define NAME "256x128 coop 1x2"
using Chosen = Cfg<GeluErf, Shape<_256, _128, _64>, Shape<_1, _2, _1>, Coop, Auto, Persistent>;
#elif CFG == 6
#define NAME "128x128 ping 2x1"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Ping, Auto, Persistent>;
#elif CFG == 7
#define NAME "64x256 ping 1x1"
using Chosen = Cfg<GeluErf, Shape<_64, _256, _64>, Shape<_1, _1, _1>, Ping, Auto, Persistent>;
#elif CFG == 8
#define NAME "128x256 coop 2x1 streamk"
using Chosen = Cfg<GeluErf, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, Auto, StreamK>;
#elif CFG == 9
#define NAME "128x256 coop 2x1 bias only"
using Chosen = Cfg<act::Identity, Shape<_128, _256, _64>, Shape<_2, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 10
#define NAME "128x128 coop 2x1"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _64>, Shape<_2, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 11
#define NAME "128x192 coop 1x1"
using Chosen = Cfg<GeluErf, Shape<_128, _192, _64>, Shape<_1, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 12
#define NAME "128x128 coop 1x1 streamk"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _64>, Shape<_1, _1, _1>, Coop, Auto, StreamK>;
#elif CFG == 13
#define NAME "128x128x128 coop 1x1"
using Chosen = Cfg<GeluErf, Shape<_128, _128, _128>, Shape<_1, _1, _1>, Coop, Auto, Persistent>;
#elif CFG == 14
#define NAME "64x128 ping 1x1"
using Chosen = Cfg<GeluErf, Shape<_64, _128, _64>, Shape<_1, _1, _1>, Ping, Auto, Persistent>;
#elif CFG == 15
#define NAME "128x256 coop 1x1"
using Chosen = Cfg<GeluErf, Shape<_128, _256, _64>, Shape<_1, _1, _1>, Coop, Auto, Persistent>;
#else
#error "CFG: a row of the table"
#endif

using G = Chosen::Gemm;
using K = G::GemmKernel;

struct Made {
  std::unique_ptr<G> gemm;
  void* workspace = nullptr;
};

// keyed by the call's bytes plus the scheduler's two run-time settings (no padding: 40 + 8 bytes)
struct Key {
  HtamGemmAct a;
  int raster, swizzle;
};
static_assert(sizeof(Key) == sizeof(HtamGemmAct) + 2 * sizeof(int), "Key must have no padding");

extern "C" const char* cfg_name() { return NAME; }

// 0, 1: can_implement refused; 2: initialize failed; 3: run failed
extern "C" int cfg_run(const HtamGemmAct* p, cudaStream_t stream, int raster, int swizzle) {
  static std::unordered_map<Key, Made, BytesHash<Key>, BytesEq<Key>> made;
  Key key{*p, raster, swizzle};
  auto it = made.find(key);
  if (it != made.end()) return it->second.gemm->run(stream) == cutlass::Status::kSuccess ? 0 : 3;
  const HtamGemmAct& a = *p;
  const auto sA = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(a.m, a.k, 1));
  const auto sB = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(a.n, a.k, 1));
  const auto sD = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(a.m, a.n, 1));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  typename G::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm, {a.m, a.n, a.k, 1},
      {static_cast<const Elt*>(a.x), sA, static_cast<const Elt*>(a.w), sB},
      {{}, nullptr, sD, static_cast<Elt*>(a.y), sD}, hw};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.bias_ptr = static_cast<const Elt*>(a.bias);
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = static_cast<Raster>(raster);
  args.scheduler.max_swizzle_size = swizzle;
  Made m;
  m.gemm = std::make_unique<G>();
  if (m.gemm->can_implement(args) != cutlass::Status::kSuccess) return 1;
  size_t ws = G::get_workspace_size(args);
  if (ws && cudaMalloc(&m.workspace, ws) != cudaSuccess) return 2;
  if (m.gemm->initialize(args, m.workspace, stream) != cutlass::Status::kSuccess) return 2;
  if (m.gemm->run(stream) != cutlass::Status::kSuccess) return 3;
  made.emplace(key, std::move(m));
  return 0;
}
