// Variants of the cutlass_gemm library's kernel, to find what its speed depends on (probe_variants.py):
// the library's own (runtime act, EVT), CUTLASS's built-in bias + GELU fusion, the plain GEMM, at
// two tiles, cooperative and pingpong. Built as one .so; htam_variant(v, ...) runs variant v.
#include "../../../torch_htam/csrc/cutlass_gemm.cu"

template <class TileShape, class Cluster, bool Cooperative, class Fusion>
struct Builtin {
  using KS = std::conditional_t<Cooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using ES = std::conditional_t<Cooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                cutlass::epilogue::TmaWarpSpecialized>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlign, Elt, cutlass::layout::RowMajor, kAlign, ES, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elt, cutlass::layout::RowMajor, kAlign,
      Elt, cutlass::layout::ColumnMajor, kAlign, float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KS>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using BiasGelu = fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, Elt, float, Elt, Elt, float>;
using Plain = fusion::LinearCombination<Elt, float, void, float>;

template <class B, bool HasBias>
static int run_builtin(const HtamGemmAct& a, cudaStream_t stream) {
  using G = typename B::Gemm;
  using K = typename G::GemmKernel;
  static std::unordered_map<HtamGemmAct, std::unique_ptr<G>, BytesHash<HtamGemmAct>, BytesEq<HtamGemmAct>> made;
  auto it = made.find(a);
  if (it != made.end()) return it->second->run(stream) == cutlass::Status::kSuccess ? 0 : (int)cudaGetLastError();
  const auto sA = cutlass::make_cute_packed_stride(typename K::StrideA{}, make_shape(a.m, a.k, 1));
  const auto sB = cutlass::make_cute_packed_stride(typename K::StrideB{}, make_shape(a.n, a.k, 1));
  const auto sD = cutlass::make_cute_packed_stride(typename K::StrideD{}, make_shape(a.m, a.n, 1));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename G::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {a.m, a.n, a.k, 1},
                             {static_cast<const Elt*>(a.x), sA, static_cast<const Elt*>(a.w), sB},
                             {{}, nullptr, sD, static_cast<Elt*>(a.y), sD}, hw};
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  if constexpr (HasBias) args.epilogue.thread.bias_ptr = static_cast<const Elt*>(a.bias);
  auto gemm = std::make_unique<G>();
  if (G::get_workspace_size(args) != 0 || gemm->can_implement(args) != cutlass::Status::kSuccess) return HTAM_ERR_SHAPE;
  if (gemm->initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return 4000;
  if (gemm->run(stream) != cutlass::Status::kSuccess) return (int)cudaGetLastError();
  made.emplace(a, std::move(gemm));
  return 0;
}

using T128 = Shape<_128, _128, _64>;
using T256 = Shape<_128, _256, _64>;
using C1 = Shape<_1, _1, _1>;
using C2 = Shape<_2, _1, _1>;

extern "C" __attribute__((visibility("default"))) int htam_variant(int v, const HtamGemmAct* p, cudaStream_t s) {
  switch (v) {
    case 0: return dispatch(*p, s);                                             // the library's, p->tile
    case 1: return run_builtin<Builtin<T128, C1, true, BiasGelu>, true>(*p, s);
    case 2: return run_builtin<Builtin<T128, C1, true, Plain>, false>(*p, s);
    case 3: return run_builtin<Builtin<T256, C2, true, BiasGelu>, true>(*p, s);
    case 4: return run_builtin<Builtin<T128, C1, false, BiasGelu>, true>(*p, s);
    case 5: return run_builtin<Builtin<T256, C2, true, Plain>, false>(*p, s);
    default: return HTAM_ERR_SHAPE;
  }
}
