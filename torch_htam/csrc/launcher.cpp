// The launcher: calls a kernel .so's htam_run from C++ with torch tensors, on the current stream.
//
// Built once per torch version (torch_htam/launcher.py). Three torch operators in the `htam`
// namespace, which torch.compile / torch.export / FakeTensor see like any other op:
//   htam::load(str path) -> int                                   dlopen + dlsym("htam_run")
//   htam::run(int handle, Tensor[] inputs, Tensor(a!)[] outputs) -> int   raw return code
//   htam::launch(int handle, Tensor[] inputs, int[] out_meta) -> Tensor[]  allocates outputs
//   htam::launch_o<N>(int handle, int m0, ..., Tensor? in0, ...) -> N Tensors   launch for
//     Inductor's C++ wrapper: out_meta in fixed int slots, the inputs in optional tensor slots
// out_meta encodes each output as [dtype_code, ndim, d0, ..., d(ndim-1)], concatenated; a dtype
// code plus kDimOrder (256) * an order code asks for a dense output whose dims lie in memory in that
// order (channels-last, a transpose's result; order_strides below). A size below 0
// is a reference to an input's size, k * inputs[i].size(d) (resolve_size; launcher.size_ref), so a
// graph with symbolic sizes allocates outputs that follow its inputs. A kernel's handle is a hash of
// its library's bytes, not a load counter (see load()).
//
// A kernel whose library exports htam_graph_epoch (htam_abi.h: the cuDNN conv kernels) has a
// launch it has seen before run as one CUDA graph launch ("graph launches", below).
//
// The same library is also a Python module whose launch(handle, inputs, out_meta) calls the same
// C++ launch() directly: the eager fast path (launcher.fast_launch). Measured on an H100, torch
// 2.11: torch.ops.htam.launch.default costs 25 us of host time per call, 15 us more than a native
// op like torch.relu; a pybind11 binding of launch() still cost 20 us. So the binding is a plain
// CPython METH_FASTCALL function (no pybind11 overload dispatch or std::vector conversions), and
// outputs come from at::detail::empty_cuda (the CUDA allocator without a dispatcher round trip).
// (Figures: docs/RESULTS_LOG.md.)
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/cuda/EmptyTensor.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/SmallVector.h>
#include <c10/util/strides.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include "htam_abi.h"

namespace {

using HtamFn = int (*)(const HtamTensor*, int, HtamTensor*, int, cudaStream_t);
using EpochFn = int (*)(void);

// The inputs a ranged kernel was kept for (fallback._Fit, the one definition; fallback.fits_code
// encodes it, tests check both agree): the dtypes, the static inputs' shapes, each dynamic input's
// ndim and static dims, the leading dynamic size within one of the spans, every other dynamic size
// scaled with it. launch_o<N> checks them before a launch, as fallback.run_or_fallback does in
// Python: the C++ wrapper runs no Python on a launch.
struct Fit {
  struct Dyn {
    int64_t input = 0, ndim = 0;
    std::vector<std::pair<int64_t, int64_t>> fixed;   // (dim, size)
  };
  std::vector<int64_t> dtypes;                                      // HtamDtype codes, one per input
  std::vector<std::pair<int64_t, std::vector<int64_t>>> shapes;     // (input, shape) of static inputs
  std::vector<Dyn> dyn;
  int64_t lead_slot = -1, lead_dim = -1, example = 0;               // lead_slot -1: a static task
  std::vector<std::pair<int64_t, int64_t>> spans;                   // (low, high) of the leading size
  std::vector<std::array<int64_t, 3>> scaled;                       // (slot in dyn, dim, n)
};

// A launch's work captured as a CUDA graph (graph launches, below); exec null: its capture failed,
// so the key runs plain. used: the kernel's graph_tick at its last launch.
struct GraphRecord {
  cudaGraphExec_t exec = nullptr;
  std::string shape;
  uint64_t used = 0;
};

// What a kernel's graph launches did (counts, and host nanoseconds from the key to the return):
// plain launches, graph launches (replays) of a key's graph, captures, and of those the graphs
// instantiated, the ones updated in place, and failures.
struct GraphStats {
  int64_t plain = 0, replays = 0, captures = 0, instantiations = 0, updates = 0, failures = 0;
  int64_t plain_ns = 0, replay_ns = 0, capture_ns = 0, instantiate_ns = 0, update_ns = 0;
};

struct Kernel {
  HtamFn fn = nullptr;
  EpochFn epoch = nullptr;   // the library's htam_graph_epoch, if it exports one: its launches replay
  std::string path;
  // its graph launches' state, under graph_mutex (launch_with's calls of one kernel take turns)
  mutable std::mutex graph_mutex;
  mutable std::unordered_map<std::string, GraphRecord> graphs;                 // by key
  mutable std::unordered_map<std::string, std::vector<std::string>> by_shape;  // keys with a graph
  mutable std::unordered_set<std::string> seen;                                // keys seen once
  mutable uint64_t graph_tick = 0;
  mutable GraphStats graph_stats;
  // successful launch_o<N> calls: the C++ wrapper's launches, which Python does not see
  mutable std::atomic<int64_t> stable_calls{0};
  // where a launch's host time goes (host_times): launch_with's whole (outputs allocated, tensors
  // described, the kernel's host work or its graph launch) and, of plain calls (call), the
  // kernel's own htam_run (a conv's fold launch and cuDNN's execute)
  mutable std::atomic<int64_t> launches{0}, launch_ns{0}, runs{0}, run_ns{0};
  // a ranged kernel's fits (set_fits; null: launched as it comes), read with std::atomic_load
  std::shared_ptr<const std::vector<Fit>> fits;
};

// Loaded kernels by handle, never unloaded: a captured CUDA graph may still point into the .so.
// NOTE: std::unordered_map is node-based: references stay valid while another thread inserts.
std::mutex g_mutex;
std::unordered_map<int64_t, Kernel> g_kernels;
std::unordered_map<std::string, int64_t> g_by_path;

// NOTE: numbers go into TORCH_CHECK messages as std::string. Measured on the H100 image (torch
// 2.11): streaming an int64_t through c10::str from this extension segfaulted inside the message
// builder (cuda-gdb: torchCheckMsgImpl<..., long, ...>), while string-only messages threw cleanly.
// std::to_string formats without the iostream locale machinery.
template <typename T>
std::string num(T v) { return std::to_string(v); }

const Kernel& kernel_at(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_kernels.find(handle);
  TORCH_CHECK(it != g_kernels.end(), "htam: no kernel with handle ", num(handle), " (",
              num(g_kernels.size()), " loaded); get one from htam::load(path)");
  return it->second;
}

// One fit from its code: [n, dtype x n, n_shapes, (input, ndim, sizes...) x n_shapes, n_dyn,
// (input, ndim, n_fixed, (dim, size) x n_fixed) x n_dyn, lead_slot, lead_dim, example, n_spans,
// (low, high) x n_spans, n_scaled, (slot, dim, n) x n_scaled] (fallback.fits_code).
Fit decode_fit(const std::vector<int64_t>& code) {
  size_t at = 0;
  auto next = [&]() -> int64_t {
    TORCH_CHECK(at < code.size(), "htam: a fit's code ends at position ", num(at), " of ", num(code.size()));
    return code[at++];
  };
  Fit f;
  for (int64_t n = next(); n > 0; --n) f.dtypes.push_back(next());
  for (int64_t n = next(); n > 0; --n) {
    const int64_t input = next();
    std::vector<int64_t> shape;
    for (int64_t d = next(); d > 0; --d) shape.push_back(next());
    f.shapes.emplace_back(input, std::move(shape));
  }
  for (int64_t n = next(); n > 0; --n) {
    Fit::Dyn d;
    d.input = next();
    d.ndim = next();
    for (int64_t k = next(); k > 0; --k) {
      const int64_t dim = next();
      d.fixed.emplace_back(dim, next());
    }
    f.dyn.push_back(std::move(d));
  }
  f.lead_slot = next();
  f.lead_dim = next();
  f.example = next();
  for (int64_t n = next(); n > 0; --n) {
    const int64_t low = next();
    f.spans.emplace_back(low, next());
  }
  for (int64_t n = next(); n > 0; --n) {
    const int64_t slot = next(), dim = next();
    f.scaled.push_back({slot, dim, next()});
  }
  TORCH_CHECK(at == code.size(), "htam: a fit's code has ", num(code.size() - at), " values past its end");
  return f;
}

int32_t dtype_code(at::ScalarType t);

// fallback._Fit.holds, line for line.
bool holds(const Fit& f, at::TensorList inputs) {
  if (inputs.size() != f.dtypes.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined() || dtype_code(inputs[i].scalar_type()) != f.dtypes[i]) return false;
  for (const auto& [i, shape] : f.shapes)
    if (inputs[i].sizes() != at::IntArrayRef(shape)) return false;
  if (f.lead_slot < 0) return true;
  for (const Fit::Dyn& d : f.dyn) {
    if (inputs[d.input].dim() != d.ndim) return false;
    for (const auto& [dim, size] : d.fixed)
      if (inputs[d.input].size(dim) != size) return false;
  }
  const auto size = [&](int64_t slot, int64_t dim) { return inputs[f.dyn[slot].input].size(dim); };
  const int64_t lead = size(f.lead_slot, f.lead_dim);
  bool within = false;
  for (const auto& [low, high] : f.spans) within = within || (low <= lead && lead <= high);
  if (!within) return false;
  for (const auto& [slot, dim, n] : f.scaled)
    if (size(slot, dim) * f.example != n * lead) return false;
  return true;
}

bool any_holds(const std::vector<Fit>& fits, at::TensorList inputs) {
  for (const Fit& f : fits)
    if (holds(f, inputs)) return true;
  return false;
}

std::shared_ptr<const std::vector<Fit>> decode_fits(const std::vector<std::vector<int64_t>>& codes) {
  auto fits = std::make_shared<std::vector<Fit>>();
  for (const auto& code : codes) fits->push_back(decode_fit(code));
  return fits;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TORCH_CHECK(f.good(), "htam: cannot read kernel library ", path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// FNV-1a over the library's bytes, as a non-negative int64.
int64_t content_key(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return (int64_t)(h & 0x7fffffffffffffffull);
}

// NOTE: the handle is the library's content hash so that a graph naming a kernel reads the same in
// every process: Inductor's caches key a compiled graph on its code, handles included, and a
// bundle's Inductor artifacts (bundle.py) must hit on a server that loads the bundle's copy of the
// library, in another order, among other kernels. A second library whose hash collides takes the
// next free number.
int64_t load(std::string path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_by_path.find(path);
  if (it != g_by_path.end()) return it->second;
  const std::string bytes = file_bytes(path);
  int64_t handle = content_key(bytes);
  for (auto k = g_kernels.find(handle); k != g_kernels.end(); k = g_kernels.find(handle)) {
    if (file_bytes(k->second.path) == bytes) {   // the same library from another path
      g_by_path.emplace(path, handle);
      return handle;
    }
    handle = (handle + 1) & 0x7fffffffffffffffll;
  }
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(lib, "htam: cannot load kernel library ", path, ": ", dlerror());
  dlerror();
  auto fn = reinterpret_cast<HtamFn>(dlsym(lib, "htam_run"));
  if (!fn) {
    const char* err = dlerror();
    std::string reason = err ? err : "null symbol";   // copied: dlclose may free dlerror's buffer
    dlclose(lib);
    TORCH_CHECK(false, "htam: ", path, " has no `htam_run` symbol (", reason,
                "); define it with HTAM_ENTRY htam_run(...) from htam_abi.h");
  }
  Kernel& k = g_kernels[handle];   // in place: a Kernel holds an atomic, which cannot move
  k.fn = fn;
  k.epoch = reinterpret_cast<EpochFn>(dlsym(lib, "htam_graph_epoch"));   // optional: null where absent
  dlerror();
  k.path = path;
  g_by_path.emplace(path, handle);
  return handle;
}

int32_t dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return HTAM_FLOAT32;
    case at::kHalf: return HTAM_FLOAT16;
    case at::kBFloat16: return HTAM_BFLOAT16;
    case at::kDouble: return HTAM_FLOAT64;
    case at::kLong: return HTAM_INT64;
    case at::kInt: return HTAM_INT32;
    case at::kBool: return HTAM_BOOL;
    case at::kChar: return HTAM_INT8;
    case at::kByte: return HTAM_UINT8;
    default: break;
  }
  TORCH_CHECK(false, "htam: dtype ", std::string(c10::toString(t)), " has no code in htam_abi.h");
  return -1;  // unreachable
}

// out_meta's dtype code carries the output's layout (launcher.DIM_ORDER, order_code):
//   code = dtype code + kDimOrder * order code; order code 0 is row-major, else dim order[i]
//   (outermost first) in bits [3i, 3i + 3).
const int64_t kDimOrder = 256, kOrderBits = 3;

at::ScalarType scalar_type(int64_t code) {
  static const at::ScalarType types[] = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble,
                                         at::kLong,  at::kInt,  at::kBool,     at::kChar, at::kByte};
  TORCH_CHECK(code >= 0 && code < (int64_t)(sizeof(types) / sizeof(types[0])), "htam: out_meta has dtype code ", num(code),
              "; valid codes are 0..8 (htam_abi.h HtamDtype)");
  return types[code];
}

// out_meta size references (launcher.py size_ref, the one definition; tests check both agree):
//   entry = -1 - ((k - 1) << 16 | d << 10 | i) < 0   means   k * inputs[i].size(d)
// input index i: 10 bits, dim d: 6 bits, factor k - 1: the bits above. Real sizes are >= 0.
const int kRefInputBits = 10, kRefDimBits = 6;

int64_t resolve_size(int64_t entry, at::TensorList inputs, size_t output) {
  if (entry >= 0) return entry;
  const int64_t ref = -1 - entry;
  const int64_t i = ref & ((int64_t(1) << kRefInputBits) - 1);
  const int64_t d = (ref >> kRefInputBits) & ((int64_t(1) << kRefDimBits) - 1);
  const int64_t k = (ref >> (kRefInputBits + kRefDimBits)) + 1;
  if (i < (int64_t)inputs.size() && inputs[i].defined() && d < inputs[i].dim()) return k * inputs[i].size(d);
  const std::string what = "htam: out_meta output " + num(output) + "'s size " + num(entry) + " is " + num(k) +
                           " * inputs[" + num(i) + "].shape[" + num(d) + "]";
  TORCH_CHECK(i < (int64_t)inputs.size(), what, ", but the launch has ", num(inputs.size()), " inputs");
  TORCH_CHECK(inputs[i].defined(), what, ", but that input is undefined");
  TORCH_CHECK(false, what, ", but that input has ", num(inputs[i].dim()), " dims");
  return -1;  // unreachable
}

// One output as out_meta describes it, its size references resolved. strides: empty for a
// row-major output, else dense strides in the order its layout code gives.
struct OutSpec {
  c10::SmallVector<int64_t, HTAM_MAX_DIMS> sizes;
  at::ScalarType dtype;
  c10::SmallVector<int64_t, HTAM_MAX_DIMS> strides;
};

// Dense strides of `sizes` with dims lying in memory as order code `code` says (launcher.order_code).
c10::SmallVector<int64_t, HTAM_MAX_DIMS> order_strides(int64_t code, at::IntArrayRef sizes) {
  const int64_t ndim = (int64_t)sizes.size();
  c10::SmallVector<int64_t, HTAM_MAX_DIMS> order, strides(ndim, 0);
  uint32_t seen = 0;
  for (int64_t i = 0; i < ndim; ++i) {
    const int64_t d = (code >> (kOrderBits * i)) & ((1 << kOrderBits) - 1);
    TORCH_CHECK(d < ndim && !(seen >> d & 1), "htam: out_meta layout code ", num(code), " is no order of ",
                num(ndim), " dims");
    seen |= 1u << d;
    order.push_back(d);
  }
  TORCH_CHECK((code >> (kOrderBits * ndim)) == 0, "htam: out_meta layout code ", num(code), " is no order of ",
              num(ndim), " dims");
  int64_t acc = 1;
  for (int64_t i = ndim - 1; i >= 0; --i) {
    strides[order[i]] = acc;
    acc *= std::max<int64_t>(sizes[order[i]], 1);
  }
  return strides;
}

c10::SmallVector<OutSpec, 4> out_specs(at::TensorList inputs, at::IntArrayRef out_meta) {
  c10::SmallVector<OutSpec, 4> specs;
  for (size_t i = 0; i < out_meta.size();) {
    TORCH_CHECK(i + 1 < out_meta.size() && out_meta[i + 1] >= 0 && i + 2 + out_meta[i + 1] <= out_meta.size(),
                "htam: out_meta is truncated at position ", num(i), "; expected [dtype, ndim, sizes...] per output");
    const int64_t ndim = out_meta[i + 1], code = out_meta[i];
    TORCH_CHECK(code >= 0 && ndim <= HTAM_MAX_DIMS, "htam: out_meta has dtype code ", num(code), " for a ",
                num(ndim), "-dim output");
    OutSpec spec{{}, scalar_type(code % kDimOrder), {}};
    for (int64_t j = 0; j < ndim; ++j) spec.sizes.push_back(resolve_size(out_meta[i + 2 + j], inputs, specs.size()));
    if (code / kDimOrder) spec.strides = order_strides(code / kDimOrder, spec.sizes);
    specs.push_back(std::move(spec));
    i += 2 + ndim;
  }
  return specs;
}

HtamTensor describe(const at::Tensor& t, c10::DeviceIndex device, const char* role, size_t i) {
  TORCH_CHECK(t.defined(), "htam: ", role, "[", num(i), "] is undefined");
  TORCH_CHECK(t.is_cuda() && t.get_device() == device, "htam: ", role, "[", num(i), "] is on ",
              t.device().str(), ", expected the current CUDA device cuda:", num((int)device));
  TORCH_CHECK(t.dim() <= HTAM_MAX_DIMS, "htam: ", role, "[", num(i), "] has ", num(t.dim()),
              " dims; the kernel ABI allows ", num(HTAM_MAX_DIMS));
  HtamTensor h{};
  h.data = const_cast<void*>(t.const_data_ptr());
  h.ndim = (int32_t)t.dim();
  h.dtype = dtype_code(t.scalar_type());
  for (int64_t d = 0; d < t.dim(); ++d) {
    h.sizes[d] = t.size(d);
    h.strides[d] = t.stride(d);
  }
  return h;
}

// What one launch hands htam_run: its tensors described, and the current stream.
struct Bound {
  c10::SmallVector<HtamTensor, 8> in, out;
  cudaStream_t stream;

  Bound(at::TensorList inputs, at::TensorList outputs, c10::DeviceIndex device)
      : stream(c10::cuda::getCurrentCUDAStream(device).stream()) {
    for (size_t i = 0; i < inputs.size(); ++i) in.push_back(describe(inputs[i], device, "inputs", i));
    for (size_t i = 0; i < outputs.size(); ++i) out.push_back(describe(outputs[i], device, "outputs", i));
  }

  // the kernel on these tensors, on stream s
  int run(const Kernel& k, cudaStream_t s) { return k.fn(in.data(), (int)in.size(), out.data(), (int)out.size(), s); }
};

int64_t ns_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

int64_t call(const Kernel& k, at::TensorList inputs, at::TensorList outputs, c10::DeviceIndex device) {
  Bound b(inputs, outputs, device);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rc = b.run(k, b.stream);
  k.run_ns.fetch_add(ns_since(t0), std::memory_order_relaxed);
  k.runs.fetch_add(1, std::memory_order_relaxed);
  return rc;
}

// ---- graph launches: a launch's host work paid once per key ------------------------------------
// A served model at a small batch is bound by its host, and a cuDNN conv kernel's call is mostly host
// work: cudnnBackendExecute and the batch-norm fold's launch. A kernel whose library exports
// htam_graph_epoch (htam_abi.h) says its launches depend only on what they bind (the tensors'
// pointers, sizes, strides and dtypes) while its epoch holds. So a launch whose key (graph_key)
// has a graph runs as one cudaGraphLaunch on the caller's stream, in its order.
//
// Why this policy: the served request that pays for a graph is slower, and the pointers a site
// binds change with the allocator's state, so keys keep coming. Captured, instantiated and first
// launched on a key's second call, a graph cost 48 + 59 us of host time a site and more for its
// upload (served vision bf16 at 1d6554b, H200): throughput rose to 1.21x of torch.compile and the
// kernel share to 92.5%, but p99 fell to 0.85x. A capture cannot move to another thread: a device
// synchronization anywhere in the process fails while a stream is capturing (9bfd97f). So:
// - A key's first launch runs plain (a new shape plans there, outside any capture).
// - Its second runs plain too, and where no capture ran on this device within kCaptureGapNs, is
//   recorded as well (a private stream; nothing runs twice): a request pays at most one capture
//   per window. The graph thread (GraphWorker) instantiates and uploads the graph off the
//   request path; the key's launches after that replay it.
// - The graphs of one shape (the same key but for the pointers) are kept up to kGraphsPerShape;
//   past that, a new key's graph updates the least recently used one (cudaGraphExecUpdate: the
//   same kernels with other arguments) instead of instantiating another graph.
// - A capture that fails (the kernel planned, allocated or refused inside it) leaves the key plain.
// Inside the caller's own capture (CUDA-graph modes) launches stay plain: that capture records them.
// The kernel's graph_mutex keeps its calls and its graphs' updates apart. GraphStats counts each
// path and its host time, for the serve bench's rows.
const size_t kMaxGraphs = 256;      // graphs per kernel; past it the least recently used is dropped
const size_t kGraphsPerShape = 8;   // graphs per shape; past it a capture updates one of them
const size_t kMaxSeen = 4096;       // keys seen once per kernel; past it the set starts over
const size_t kMaxJobs = 256;        // graphs waiting; past it a key is left to be seen again
const int64_t kCaptureGapNs = 2000000;   // one capture per 2 ms a device: a served forward's time

// A private stream per device and use: kCapture records the request path's captures, kUpload
// carries the graph thread's uploads. Apart, because a stream another thread is capturing on
// cannot take (or be synchronized for) the other's work.
enum class Side { kCapture = 0, kUpload = 1 };

cudaStream_t side_stream(c10::DeviceIndex device, Side side) {
  static std::mutex m;
  static cudaStream_t streams[2][64] = {};
  std::lock_guard<std::mutex> lock(m);
  TORCH_CHECK(device >= 0 && device < 64, "htam: device index ", num((int)device), " beyond 64");
  cudaStream_t& s = streams[(int)side][device];
  if (!s) C10_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// What a launch binds, as bytes (its key): the device, the kernel's epoch, every tensor's pointer,
// dtype, sizes and strides; without the pointers, its shape (built only where a key is captured).
std::string graph_key(int epoch, c10::DeviceIndex device, const Bound& b, bool pointers = true) {
  std::string key;
  key.reserve(64 + 144 * (b.in.size() + b.out.size()));
  const auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  const int head[4] = {(int)device, epoch, (int)b.in.size(), (int)b.out.size()};
  put(head, sizeof(head));
  for (const auto* ts : {&b.in, &b.out})
    for (const HtamTensor& t : *ts) {
      if (pointers) put(&t.data, sizeof(t.data));
      put(&t.ndim, sizeof(t.ndim));
      put(&t.dtype, sizeof(t.dtype));
      put(t.sizes, sizeof(int64_t) * t.ndim);
      put(t.strides, sizeof(int64_t) * t.ndim);
    }
  return key;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The kernel's launches for these tensors, recorded as a graph on stream cs (nothing runs);
// nullptr where the capture failed or the kernel refused inside it.
cudaGraph_t capture(const Kernel& k, Bound& b, cudaStream_t cs) {
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const int rc = b.run(k, cs);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(cs, &graph);
  cudaGetLastError();   // a failed capture's error is this capture's, not the next launch's
  if (rc == 0 && ended == cudaSuccess) return graph;
  if (graph != nullptr) cudaGraphDestroy(graph);
  return nullptr;
}

void forget_graph(const Kernel& k, const std::string& key) {
  auto it = k.graphs.find(key);
  if (it == k.graphs.end()) return;
  auto same = k.by_shape.find(it->second.shape);
  if (same != k.by_shape.end()) {
    auto& keys = same->second;
    keys.erase(std::remove(keys.begin(), keys.end(), key), keys.end());
    if (keys.empty()) k.by_shape.erase(same);
  }
  if (it->second.exec) cudaGraphExecDestroy(it->second.exec);   // one in flight is freed when it ends
  k.graphs.erase(it);
}

// A graph for `key` made by updating the least recently used of its shape's graphs, where the
// shape has kGraphsPerShape of them; false where it has fewer or the update failed (that graph is
// dropped then: it ran other kernels). Under the kernel's graph_mutex.
bool updated_in_place(const Kernel& k, const std::string& key, const std::string& shape, cudaGraph_t graph) {
  auto same = k.by_shape.find(shape);
  if (same == k.by_shape.end() || same->second.size() < kGraphsPerShape) return false;
  auto& keys = same->second;
  auto victim = std::min_element(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    return k.graphs.at(a).used < k.graphs.at(b).used;
  });
  const std::string old = *victim;
  GraphRecord rec = k.graphs.at(old);
  const auto t0 = std::chrono::steady_clock::now();
  cudaGraphExecUpdateResultInfo info{};
  const bool ok = cudaGraphExecUpdate(rec.exec, graph, &info) == cudaSuccess;
  cudaGetLastError();
  k.graph_stats.update_ns += ns_since(t0);
  if (!ok) {
    forget_graph(k, old);
    return false;
  }
  ++k.graph_stats.updates;
  *victim = key;
  k.graphs.erase(old);
  k.graphs[key] = GraphRecord{rec.exec, shape, k.graph_tick};
  return true;
}

// A key's captured graph, for the worker to make executable.
struct GraphJob {
  const Kernel* kernel = nullptr;
  c10::DeviceIndex device = 0;
  std::string key, shape;
  cudaGraph_t graph = nullptr;   // the job's to destroy
};

// The graph thread: makes the graphs the request path captured executable (an update in place or
// an instantiation and upload, GraphJob), one at a time, in order. Started on the first job;
// stopped (its current job finished) at process exit, before CUDA's own teardown.
class GraphWorker {
 public:
  static GraphWorker& get() {
    static GraphWorker* w = new GraphWorker();   // never destroyed: offer() has exit stop it
    return *w;
  }

  // false where the queue is full or the worker stopped: the key is left to be seen again
  bool offer(GraphJob&& job) {
    std::lock_guard<std::mutex> lock(m_);
    if (stopped_ || jobs_.size() >= kMaxJobs || (thread_.joinable() && getpid() != owner_)) return false;
    if (!thread_.joinable()) {
      owner_ = getpid();
      thread_ = std::thread([this] { loop(); });
      std::atexit([] { GraphWorker::get().stop(); });
    }
    jobs_.push_back(std::move(job));
    ready_.notify_one();
    return true;
  }

  // Wait until no graph is queued or being made (tests), at most `seconds`; whether it came to that.
  bool idle(double seconds) {
    std::unique_lock<std::mutex> lock(m_);
    return done_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return jobs_.empty() && !busy_; });
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stopped_ = true;
    }
    ready_.notify_all();
    // a forked child inherits this handler and the handle, not the thread
    if (thread_.joinable() && getpid() == owner_) thread_.join();
  }

  void loop() {
    // Other threads' CUDA-graph captures (a model in mode='reduce-overhead') do not bar this
    // thread's calls, nor do they see them: it only uploads on, and syncs, a stream of its own.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&mode);
    for (;;) {
      GraphJob job;
      {
        std::unique_lock<std::mutex> lock(m_);
        ready_.wait(lock, [this] { return stopped_ || !jobs_.empty(); });
        if (stopped_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        busy_ = true;
      }
      run(job);
      {
        std::lock_guard<std::mutex> lock(m_);
        busy_ = false;
      }
      done_.notify_all();
    }
  }

  static void run(GraphJob& job) {
    const Kernel& k = *job.kernel;
    if (cudaSetDevice(job.device) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphDestroy(job.graph);
      return;
    }
    cudaStream_t us = side_stream(job.device, Side::kUpload);
    {
      std::lock_guard<std::mutex> lock(k.graph_mutex);
      if (k.graphs.count(job.key) || updated_in_place(k, job.key, job.shape, job.graph)) {
        cudaGraphDestroy(job.graph);
        return;
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    cudaGraphExec_t exec = nullptr;
    const bool made = cudaGraphInstantiate(&exec, job.graph, 0) == cudaSuccess &&
                      cudaGraphUpload(exec, us) == cudaSuccess && cudaStreamSynchronize(us) == cudaSuccess;
    cudaGetLastError();
    cudaGraphDestroy(job.graph);
    const int64_t ns = ns_since(t0);
    std::lock_guard<std::mutex> lock(k.graph_mutex);
    k.graph_stats.instantiate_ns += ns;
    if (!made) {
      if (exec) cudaGraphExecDestroy(exec);
      ++k.graph_stats.failures;
      k.graphs[job.key] = GraphRecord{nullptr, job.shape, k.graph_tick};
      return;
    }
    ++k.graph_stats.instantiations;
    while (k.graphs.size() >= kMaxGraphs) {
      auto oldest = std::min_element(k.graphs.begin(), k.graphs.end(),
                                     [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      forget_graph(k, std::string(oldest->first));
    }
    k.graphs[job.key] = GraphRecord{exec, job.shape, k.graph_tick};
    k.by_shape[job.shape].push_back(job.key);
  }

  std::mutex m_;
  std::condition_variable ready_, done_;
  std::deque<GraphJob> jobs_;
  std::thread thread_;
  pid_t owner_ = 0;   // the process whose thread it is
  bool busy_ = false, stopped_ = false;
};

// Whether launches may run as graphs: off unless HTAM_GRAPH_LAUNCHES=1 in the environment;
// set_graph_launches switches them at run time (the serve bench's A/B). NOTE: off by default since
// served vision bf16 (H200), ours with and without them interleaved in one run, ran 0.964x the
// throughput and 0.859x the p99 with them: replays cut the median, captures of new keys (served
// sizes keep bringing new pointers) cost the tail (bench_serve-20261129-071829).
std::atomic<bool>& graph_launches_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("HTAM_GRAPH_LAUNCHES");
    return v != nullptr && std::string(v) == "1";
  }()};
  return on;
}

bool graph_launches_on() { return graph_launches_flag().load(std::memory_order_relaxed); }

// Whether the calling thread may capture now: no other thread launched our kernels within the
// last second, nor within kSharedHoldNs of a time two threads did. A capture fails any device-wide
// synchronization another thread makes meanwhile (torch.cuda.synchronize: "operation not permitted
// when stream is capturing", 9bfd97f), so threads that take turns at launching (a server's thread
// pool) capture nothing; graphs already made still replay (a replay is a plain launch). A model
// loaded on one thread and served from another captures once the first has been quiet a second.
const int64_t kOtherThreadNs = 1000000000, kSharedHoldNs = 10000000000;

bool may_capture_alone() {
  static std::atomic<std::thread::id> last{};
  static std::atomic<int64_t> last_ns{0}, shared_until{0};
  const int64_t now = now_ns();
  const std::thread::id me = std::this_thread::get_id(), before = last.exchange(me);
  const int64_t before_ns = last_ns.exchange(now);
  if (before != me && before != std::thread::id() && now - before_ns < kOtherThreadNs)
    shared_until.store(now + kSharedHoldNs, std::memory_order_relaxed);
  return now >= shared_until.load(std::memory_order_relaxed);
}

// call(), as a graph launch where the key has a graph (graph launches, above).
int64_t call_graphed(const Kernel& k, at::TensorList inputs, at::TensorList outputs, c10::DeviceIndex device) {
  Bound b(inputs, outputs, device);
  const cudaStream_t stream = b.stream;
  const auto plain = [&] { return (int64_t)b.run(k, stream); };
  cudaStreamCaptureStatus outer = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &outer) != cudaSuccess) {
    cudaGetLastError();
    return plain();
  }
  if (outer != cudaStreamCaptureStatusNone) return plain();
  const bool alone = may_capture_alone();   // on every launch: it watches which threads launch
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(k.graph_mutex);
  const int epoch = k.epoch();
  std::string key = graph_key(epoch, device, b);
  GraphStats& st = k.graph_stats;
  auto it = k.graphs.find(key);
  if (it != k.graphs.end() && it->second.exec) {
    it->second.used = ++k.graph_tick;
    const int64_t rc = cudaGraphLaunch(it->second.exec, stream);
    ++st.replays;
    st.replay_ns += ns_since(t0);
    return rc;
  }
  const int64_t rc = plain();
  ++st.plain;
  st.plain_ns += ns_since(t0);
  if (rc != 0 || it != k.graphs.end()) return rc;   // a failed capture's key stays plain
  if (!k.seen.count(key)) {
    if (k.seen.size() >= kMaxSeen) k.seen.clear();
    k.seen.insert(std::move(key));
    return rc;
  }
  // its second call or later: record it, where this device's window allows a capture
  static std::atomic<int64_t> last_capture[64] = {};
  if (device < 0 || device >= 64 || !alone) return rc;
  const int64_t now = now_ns();
  int64_t last = last_capture[device].load(std::memory_order_relaxed);
  if (now - last < kCaptureGapNs || !last_capture[device].compare_exchange_strong(last, now)) return rc;
  const auto c0 = std::chrono::steady_clock::now();
  cudaGraph_t graph = capture(k, b, side_stream(device, Side::kCapture));
  st.capture_ns += ns_since(c0);
  ++st.captures;
  k.seen.erase(key);
  std::string shape = graph_key(epoch, device, b, /*pointers=*/false);
  if (graph == nullptr) {
    ++st.failures;
    k.graphs[key] = GraphRecord{nullptr, shape, k.graph_tick};
    return rc;
  }
  GraphJob job{&k, device, std::move(key), std::move(shape), graph};
  if (!GraphWorker::get().offer(std::move(job))) cudaGraphDestroy(graph);   // refused: seen again later
  return rc;
}

int64_t run(int64_t handle, at::TensorList inputs, at::TensorList outputs) {
  return call(kernel_at(handle), inputs, outputs, c10::cuda::current_device());
}

// What a kernel's nonzero return code means (htam_abi.h), for the error a failed launch raises.
std::string reason(int64_t code) {
  if (code == HTAM_ERR_SHAPE)
    return "HTAM_ERR_SHAPE (the kernel does not support these shapes/dtypes; run the original region)";
  if (code == cudaErrorStreamCaptureUnsupported)
    return "cudaErrorStreamCaptureUnsupported (a shape first met inside CUDA-graph capture: the conv "
           "kernels plan each shape on its first call, which a capture cannot hold; call the model once "
           "with these shapes before capturing)";
  if (code > 0 && code < HTAM_ERR_SHAPE) return cudaGetErrorName((cudaError_t)code);
  if (code >= 3000) return "cuDNN status " + num(code - 3000) + " (the conv kernels return 3000 + a cudnnStatus_t)";
  return "an unknown code (expected 0, HTAM_ERR_SHAPE, a cudaError_t or 3000 + a cudnnStatus_t)";
}

std::vector<at::Tensor> launch_with(const Kernel& k, at::TensorList inputs, const c10::SmallVector<OutSpec, 4>& specs) {
  const auto t0 = std::chrono::steady_clock::now();
  const c10::DeviceIndex device = c10::cuda::current_device();
  const at::Device where(at::kCUDA, device);
  std::vector<at::Tensor> outputs;
  outputs.reserve(specs.size());
  for (const OutSpec& s : specs)
    outputs.emplace_back(s.strides.empty() ? at::detail::empty_cuda(s.sizes, s.dtype, where, std::nullopt)
                                           : at::detail::empty_strided_cuda(s.sizes, s.strides, s.dtype, where));
  int64_t code = k.epoch && graph_launches_on() ? call_graphed(k, inputs, outputs, device)
                                                : call(k, inputs, outputs, device);
  TORCH_CHECK(code == 0, "htam kernel ", k.path, " returned ", num(code), ": ", reason(code));
  k.launch_ns.fetch_add(ns_since(t0), std::memory_order_relaxed);
  k.launches.fetch_add(1, std::memory_order_relaxed);
  return outputs;
}

std::vector<at::Tensor> launch(int64_t handle, at::TensorList inputs, at::IntArrayRef out_meta) {
  // NOTE: out_meta first: a malformed one (or a size reference to a missing input) is reported
  // before anything touches the GPU.
  const c10::SmallVector<OutSpec, 4> specs = out_specs(inputs, out_meta);
  return launch_with(kernel_at(handle), inputs, specs);
}

// ---- launch_o<N>: launch for Inductor's C++ wrapper ---------------------------------------------
// Inductor's C++ wrapper calls an op it has no C shim for through aoti_torch_call_dispatcher, with
// no Python, only where every argument and return is an int, float, bool, Tensor or Tensor?
// (cpp_wrapper_cpu._compatible_with_stableivalue). htam::launch's Tensor[] and int[] send each call
// back through Python, which in torch 2.11 crashed on a one-tensor list (pytorch#190551). So
// launch_o<N> takes out_meta in kStableMetaSlots ints per output ([code, ndim, d0..d7], padded with
// zeros), the inputs in kStableInputs optional tensors (a prefix; the rest None), and returns N
// tensors. A failed launch calls Python's fallback.after_failed_launch (set_failure_hook), which
// runs the region instead, as the Python wrapper's fallback.checked_launch does; so do inputs
// outside a ranged kernel's fits (set_fits), with kOutsideBuckets for the message.
const int kStableInputs = 16, kStableOutputs = 4, kStableMetaSlots = 2 + HTAM_MAX_DIMS;
const char* const kOutsideBuckets = "htam: the inputs lie outside the kernel's buckets";

// a strong reference, never released: compiled graphs may call it until the process ends
std::atomic<PyObject*> g_failure_hook{nullptr};

// out_meta from its slots: each output's [code, ndim, sizes...] without the padding.
std::vector<int64_t> meta_of_slots(c10::ArrayRef<int64_t> slots) {
  TORCH_CHECK(slots.size() % kStableMetaSlots == 0, "htam: ", num(slots.size()), " out_meta slots, not a multiple of ",
              num(kStableMetaSlots));
  std::vector<int64_t> meta;
  for (size_t o = 0; o < slots.size(); o += kStableMetaSlots) {
    const int64_t ndim = slots[o + 1];
    TORCH_CHECK(ndim >= 0 && ndim <= HTAM_MAX_DIMS, "htam: out_meta slot ", num(o / kStableMetaSlots), " has ",
                num(ndim), " dims; the kernel ABI allows ", num(HTAM_MAX_DIMS));
    meta.insert(meta.end(), slots.begin() + o, slots.begin() + o + 2 + ndim);
  }
  return meta;
}

std::vector<at::Tensor> after_failure(int64_t handle, at::TensorList inputs, const std::vector<int64_t>& meta,
                                      const std::string& message) {
  PyObject* fn = g_failure_hook.load();
  TORCH_CHECK(fn != nullptr, message, " (kernel ", num(handle), "; no region to run instead: set_failure_hook)");
  pybind11::gil_scoped_acquire gil;
  try {
    pybind11::object hook = pybind11::reinterpret_borrow<pybind11::object>(fn);
    pybind11::object outs = hook(handle, inputs.vec(), meta, message);
    return outs.cast<std::vector<at::Tensor>>();
  } catch (pybind11::error_already_set& e) {
    TORCH_CHECK(false, "htam: kernel ", num(handle), " did not run (", message,
                "), and neither did its region: ", e.what());
  }
  return {};  // unreachable
}

// launch_o<N>'s work, whichever way it is called (the dispatcher's launch_stable, the C shim's
// shim_launch): slots holds N * kStableMetaSlots ints, inputs the defined prefix of the in slots.
template <int N>
std::vector<at::Tensor> launch_slots(int64_t handle, c10::ArrayRef<int64_t> slots, at::TensorList inputs) {
  const std::vector<int64_t> meta = meta_of_slots(slots);
  const Kernel& k = kernel_at(handle);
  const auto fits = std::atomic_load(&k.fits);
  std::vector<at::Tensor> outs;
  if (fits && !any_holds(*fits, inputs)) {
    outs = after_failure(handle, inputs, meta, kOutsideBuckets);
  } else {
    try {
      outs = launch_with(k, inputs, out_specs(inputs, meta));
      k.stable_calls.fetch_add(1, std::memory_order_relaxed);
    } catch (const c10::Error& e) {
      if (g_failure_hook.load() == nullptr) throw;
      outs = after_failure(handle, inputs, meta, e.what_without_backtrace());
    }
  }
  TORCH_CHECK(outs.size() == (size_t)N, "htam: launch_o", num(N), " got ", num(outs.size()), " outputs");
  return outs;
}

template <int N>
void launch_stable(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  const size_t n_args = 1 + N * kStableMetaSlots + kStableInputs;
  auto args = torch::jit::last(*stack, n_args);
  const int64_t handle = args[0].toInt();
  c10::SmallVector<int64_t, N * kStableMetaSlots> slots;
  for (size_t i = 1; i <= (size_t)N * kStableMetaSlots; ++i) slots.push_back(args[i].toInt());
  std::vector<at::Tensor> inputs;
  for (size_t i = 1 + N * kStableMetaSlots; i < n_args && !args[i].isNone(); ++i) inputs.push_back(args[i].toTensor());
  std::vector<at::Tensor> outs = launch_slots<N>(handle, slots, inputs);
  torch::jit::drop(*stack, n_args);
  for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
}

// ---- launch_o<N> as C functions: Inductor's C++ wrapper calls them as it calls aten's C shims ---
// Through the dispatcher (aoti_torch_call_dispatcher) a launch_o<N> call costs the op's lookup by
// name, a conversion of each of its 1 + 10N + 16 arguments to and from StableIValues (a heap
// handle per tensor) and the boxed dispatch with its autograd fallback. Inductor calls a custom op
// directly where config.aot_inductor.custom_ops_to_c_shims declares a C function for it, named
// aoti_torch_cuda_<op>, with aten's C shim conventions (launcher.export_shims registers them):
//   aoti_torch_cuda_launch_o<N>(int64_t handle, int64_t m0..m(10N-1),
//                               AtenTensorHandle* in0..in15 (nullptr: None), AtenTensorHandle* ret0..)
// An AtenTensorHandle is an at::Tensor*; each returned one is a new tensor the wrapper owns. A
// failure returns AOTI_TORCH_FAILURE (the wrapper raises) after logging why.
template <int N>
AOTITorchError shim_launch(int64_t handle, const int64_t* slots, AtenTensorHandle* const* ins,
                           AtenTensorHandle* const* rets) {
  try {
    RECORD_FUNCTION(N == 1 ? "htam::launch_o1" : N == 2 ? "htam::launch_o2" : N == 3 ? "htam::launch_o3"
                                                                                     : "htam::launch_o4",
                    std::vector<c10::IValue>());
    c10::SmallVector<at::Tensor, kStableInputs> inputs;
    for (int i = 0; i < kStableInputs && ins[i] != nullptr; ++i) inputs.push_back(*reinterpret_cast<at::Tensor*>(*ins[i]));
    std::vector<at::Tensor> outs = launch_slots<N>(handle, c10::ArrayRef<int64_t>(slots, N * kStableMetaSlots), inputs);
    for (int o = 0; o < N; ++o) *rets[o] = reinterpret_cast<AtenTensorHandle>(new at::Tensor(std::move(outs[o])));
    return AOTI_TORCH_SUCCESS;
  } catch (const c10::Error& e) {
    LOG(ERROR) << "htam::launch_o" << N << ": " << e.what_without_backtrace();
  } catch (const std::exception& e) {
    LOG(ERROR) << "htam::launch_o" << N << ": " << e.what();
  }
  return AOTI_TORCH_FAILURE;
}

// The C declaration of aoti_torch_cuda_launch_o<n>, as the wrapper's prefix declares it.
std::string shim_declaration(int n) {
  std::string s = "AOTITorchError aoti_torch_cuda_launch_o" + num(n) + "(int64_t handle";
  for (int i = 0; i < n * kStableMetaSlots; ++i) s += ", int64_t m" + num(i);
  for (int i = 0; i < kStableInputs; ++i) s += ", AtenTensorHandle* in" + num(i);
  for (int i = 0; i < n; ++i) s += ", AtenTensorHandle* ret" + num(i);
  return s + ")";
}

std::string stable_schema(int n) {
  std::string s = "launch_o" + num(n) + "(int handle";
  for (int i = 0; i < n * kStableMetaSlots; ++i) s += ", int m" + num(i);
  for (int i = 0; i < kStableInputs; ++i) s += ", Tensor? in" + num(i) + "=None";
  s += ") -> ";
  if (n == 1) return s + "Tensor";
  s += "(";
  for (int i = 0; i < n; ++i) s += i ? ", Tensor" : "Tensor";
  return s + ")";
}

// launch() for Python, without the dispatcher. It skips what the dispatcher adds around a call: no
// FakeTensor/functionalization/proxy handling, no TorchDispatchMode, no autograd key (the op has
// none either). So launcher.fast_launch calls it only for plain eager tensors outside any tracing;
// everything else goes through htam::launch.
// Python: launch(handle: int, inputs: list[Tensor] | tuple, out_meta: list[int] | tuple) -> list[Tensor]
PyObject* py_launch(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "launch(handle, inputs, out_meta) takes exactly 3 arguments");
    return nullptr;
  }
  const int64_t handle = PyLong_AsLongLong(args[0]);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  if (!PyList_Check(args[1]) && !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "launch: inputs must be a list or tuple of tensors");
    return nullptr;
  }
  if (!PyList_Check(args[2]) && !PyTuple_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "launch: out_meta must be a list or tuple of ints");
    return nullptr;
  }
  // NOTE: PySequence_Fast_* index lists and tuples alike without new references.
  c10::SmallVector<at::Tensor, 8> inputs;
  for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(args[1]); i < n; ++i) {
    PyObject* t = PySequence_Fast_GET_ITEM(args[1], i);
    if (!THPVariable_Check(t)) {
      PyErr_Format(PyExc_TypeError, "launch: inputs[%zd] is a %s, not a torch.Tensor", i, Py_TYPE(t)->tp_name);
      return nullptr;
    }
    inputs.push_back(THPVariable_Unpack(t));
  }
  c10::SmallVector<int64_t, 16> meta;
  for (Py_ssize_t i = 0, n = PySequence_Fast_GET_SIZE(args[2]); i < n; ++i) {
    meta.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(args[2], i)));
    if (meta.back() == -1 && PyErr_Occurred()) return nullptr;
  }
  // The profiler still sees a call by the op's name (the dispatcher records one per op call).
  RECORD_FUNCTION("htam::launch", std::vector<c10::IValue>());
  std::vector<at::Tensor> outs = launch(handle, inputs, meta);
  PyObject* list = PyList_New((Py_ssize_t)outs.size());
  if (!list) return nullptr;
  for (size_t i = 0; i < outs.size(); ++i) PyList_SET_ITEM(list, (Py_ssize_t)i, THPVariable_Wrap(std::move(outs[i])));
  return list;
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(py_launch)), METH_FASTCALL,
     "launch(handle, inputs, out_meta) -> list[Tensor], as htam::launch without the dispatcher"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// The C shims (above: shim_launch), their parameter lists spelled out by these macros.
#define HTAM_M10(p) int64_t p##0, int64_t p##1, int64_t p##2, int64_t p##3, int64_t p##4, int64_t p##5, \
                    int64_t p##6, int64_t p##7, int64_t p##8, int64_t p##9
#define HTAM_V10(p) p##0, p##1, p##2, p##3, p##4, p##5, p##6, p##7, p##8, p##9
#define HTAM_IN16                                                                                     \
  AtenTensorHandle *in0, AtenTensorHandle *in1, AtenTensorHandle *in2, AtenTensorHandle *in3,         \
      AtenTensorHandle *in4, AtenTensorHandle *in5, AtenTensorHandle *in6, AtenTensorHandle *in7,     \
      AtenTensorHandle *in8, AtenTensorHandle *in9, AtenTensorHandle *in10, AtenTensorHandle *in11,   \
      AtenTensorHandle *in12, AtenTensorHandle *in13, AtenTensorHandle *in14, AtenTensorHandle *in15
#define HTAM_INS {in0, in1, in2, in3, in4, in5, in6, in7, in8, in9, in10, in11, in12, in13, in14, in15}
static_assert(kStableMetaSlots == 10 && kStableInputs == 16 && kStableOutputs == 4,
              "the shims' parameter lists spell out 10 slots per output, 16 inputs and 4 outputs");

extern "C" {
__attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_launch_o1(int64_t handle, HTAM_M10(a),
                                                                                HTAM_IN16, AtenTensorHandle* ret0) {
  const int64_t slots[] = {HTAM_V10(a)};
  AtenTensorHandle* const ins[] = HTAM_INS;
  AtenTensorHandle* const rets[] = {ret0};
  return shim_launch<1>(handle, slots, ins, rets);
}

__attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_launch_o2(int64_t handle, HTAM_M10(a),
                                                                                HTAM_M10(b), HTAM_IN16,
                                                                                AtenTensorHandle* ret0,
                                                                                AtenTensorHandle* ret1) {
  const int64_t slots[] = {HTAM_V10(a), HTAM_V10(b)};
  AtenTensorHandle* const ins[] = HTAM_INS;
  AtenTensorHandle* const rets[] = {ret0, ret1};
  return shim_launch<2>(handle, slots, ins, rets);
}

__attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_launch_o3(
    int64_t handle, HTAM_M10(a), HTAM_M10(b), HTAM_M10(c), HTAM_IN16, AtenTensorHandle* ret0,
    AtenTensorHandle* ret1, AtenTensorHandle* ret2) {
  const int64_t slots[] = {HTAM_V10(a), HTAM_V10(b), HTAM_V10(c)};
  AtenTensorHandle* const ins[] = HTAM_INS;
  AtenTensorHandle* const rets[] = {ret0, ret1, ret2};
  return shim_launch<3>(handle, slots, ins, rets);
}

__attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_launch_o4(
    int64_t handle, HTAM_M10(a), HTAM_M10(b), HTAM_M10(c), HTAM_M10(d), HTAM_IN16, AtenTensorHandle* ret0,
    AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  const int64_t slots[] = {HTAM_V10(a), HTAM_V10(b), HTAM_V10(c), HTAM_V10(d)};
  AtenTensorHandle* const ins[] = HTAM_INS;
  AtenTensorHandle* const rets[] = {ret0, ret1, ret2, ret3};
  return shim_launch<4>(handle, slots, ins, rets);
}
}  // extern "C"

// NOTE: TORCH_EXTENSION_NAME is set by cpp_extension (htam_launcher, or htam_launcher_v<N> after a
// source change), and the module init function must carry that exact name.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "htam launcher: the eager fast path of htam::launch (see torch_htam/launcher.py)";
  // NOTE: the GIL stays held: the call enqueues a kernel and never waits on the GPU, and a
  // release + reacquire would be paid on every call.
  if (PyModule_AddFunctions(m.ptr(), g_methods) != 0) throw pybind11::error_already_set();
  // For tests (CPU tensors will do): the sizes and strides launch would allocate, so the C++ decoding
  // of out_meta is checked against launcher.decode_out_meta without a GPU.
  m.def("out_layouts", [](const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& out_meta) {
    std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> layouts;
    for (const OutSpec& s : out_specs(inputs, out_meta)) {
      const c10::DimVector strides = s.strides.empty() ? c10::contiguous_strides(s.sizes) : c10::DimVector(s.strides);
      layouts.emplace_back(std::vector<int64_t>(s.sizes.begin(), s.sizes.end()),
                           std::vector<int64_t>(strides.begin(), strides.end()));
    }
    return layouts;
  }, "out_layouts(inputs, out_meta) -> [(sizes, strides)]: the outputs launch allocates");
  m.def("meta_of_slots", [](const std::vector<int64_t>& slots) { return meta_of_slots(slots); },
        "meta_of_slots(slots) -> out_meta: what launch_o<N> reads out of its int slots (for tests)");
  m.def("set_failure_hook", [](pybind11::object fn) {
    fn.inc_ref();   // kept for the process: compiled graphs call it after this call returns
    g_failure_hook.store(fn.ptr());
  }, "set_failure_hook(fn): fn(handle, inputs, out_meta, message) -> outputs, called where a launch_o<N> fails");
  m.def("set_fits", [](int64_t handle, const std::vector<std::vector<int64_t>>& codes) {
    auto fits = decode_fits(codes);
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_kernels.find(handle);
    TORCH_CHECK(it != g_kernels.end(), "htam: set_fits for handle ", num(handle), ", which is not loaded");
    std::atomic_store(&it->second.fits, codes.empty() ? nullptr : std::shared_ptr<const std::vector<Fit>>(fits));
  }, "set_fits(handle, codes): the sizes a ranged kernel's launch_o<N> may launch at (fallback.fits_code); [] for any");
  m.def("fits_hold", [](const std::vector<std::vector<int64_t>>& codes, const std::vector<at::Tensor>& inputs) {
    return any_holds(*decode_fits(codes), inputs);
  }, "fits_hold(codes, inputs) -> bool: whether launch_o<N> would launch (for tests; CPU tensors will do)");
  m.def("stable_calls", [] {
    std::unordered_map<int64_t, int64_t> calls;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [handle, k] : g_kernels)
      if (int64_t n = k.stable_calls.load(std::memory_order_relaxed)) calls[handle] = n;
    return calls;
  }, "stable_calls() -> {handle: successful launch_o<N> calls}");
  m.def("graph_launches", [] {
    std::unordered_map<int64_t, std::unordered_map<std::string, int64_t>> out;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [handle, k] : g_kernels) {
      if (!k.epoch) continue;
      std::lock_guard<std::mutex> graph_lock(k.graph_mutex);
      const GraphStats& s = k.graph_stats;
      int64_t graphs = 0;
      for (const auto& [key, r] : k.graphs) graphs += r.exec != nullptr;
      out[handle] = {{"graphs", graphs}, {"plain", s.plain}, {"replays", s.replays}, {"captures", s.captures},
                     {"instantiations", s.instantiations}, {"updates", s.updates}, {"failures", s.failures},
                     {"plain_ns", s.plain_ns}, {"replay_ns", s.replay_ns}, {"capture_ns", s.capture_ns},
                     {"instantiate_ns", s.instantiate_ns}, {"update_ns", s.update_ns}};
    }
    return out;
  }, "graph_launches() -> {handle: {count or host ns: value}} of the kernels that export htam_graph_epoch "
     "(GraphStats: graphs held; plain, replays, captures, instantiations, updates, failures; *_ns)");
  m.def("host_times", [] {
    std::unordered_map<int64_t, std::unordered_map<std::string, int64_t>> out;
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [handle, k] : g_kernels)
      out[handle] = {{"launches", k.launches.load()}, {"launch_ns", k.launch_ns.load()},
                     {"runs", k.runs.load()}, {"run_ns", k.run_ns.load()}};
    return out;
  }, "host_times() -> {handle: {launches, launch_ns, runs, run_ns}}: host ns of each kernel's successful "
     "launches (outputs, tensors described, its host work or graph launch) and, of its plain calls, "
     "in its own htam_run");
  m.def("graph_launches_on", [] { return graph_launches_on(); },
        "graph_launches_on() -> bool: whether launches may run as graphs now");
  m.def("set_graph_launches", [](bool on) { return graph_launches_flag().exchange(on); },
        "set_graph_launches(on) -> bool: whether launches may run as graphs from now on; returns the last setting");
  m.def("graphs_idle", [](double seconds) {
    pybind11::gil_scoped_release no_gil;
    return GraphWorker::get().idle(seconds);
  }, "graphs_idle(seconds) -> bool: wait until the graph thread has no graph queued or in the making (tests)");
  m.def("shim_declarations", [] {
    std::vector<std::string> out;
    for (int n = 1; n <= kStableOutputs; ++n) out.push_back(shim_declaration(n));
    return out;
  }, "shim_declarations() -> [C declaration of aoti_torch_cuda_launch_o<n>, n = 1..4]");
  m.attr("STABLE_INPUTS") = kStableInputs;
  m.attr("STABLE_OUTPUTS") = kStableOutputs;
  m.attr("STABLE_META_SLOTS") = kStableMetaSlots;
  m.attr("OUTSIDE_BUCKETS") = kOutsideBuckets;
}

TORCH_LIBRARY(htam, m) {
  m.def("load(str path) -> int", &load);
  m.def("run(int handle, Tensor[] inputs, Tensor(a!)[] outputs) -> int");
  m.def("launch(int handle, Tensor[] inputs, int[] out_meta) -> Tensor[]");
  for (int n = 1; n <= kStableOutputs; ++n) m.def(stable_schema(n).c_str());
}

TORCH_LIBRARY_IMPL(htam, CUDA, m) {
  m.impl("run", &run);
  m.impl("launch", &launch);
  m.impl("launch_o1", torch::CppFunction::makeFromBoxedFunction<&launch_stable<1>>());
  m.impl("launch_o2", torch::CppFunction::makeFromBoxedFunction<&launch_stable<2>>());
  m.impl("launch_o3", torch::CppFunction::makeFromBoxedFunction<&launch_stable<3>>());
  m.impl("launch_o4", torch::CppFunction::makeFromBoxedFunction<&launch_stable<4>>());
  static_assert(kStableOutputs == 4, "one m.impl per launch_o<N>");
}
