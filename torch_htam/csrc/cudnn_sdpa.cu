// htam_cudnn_sdpa (cudnn_sdpa.h): cuDNN's fused attention through the frontend's graph API, one
// graph per problem (dtype, sizes, strides, scale, causal, device), planned on its first call and
// cached for the process. NOTE: a graph and its workspace stay alive for the process: a captured
// CUDA graph may replay them.
#include <cudnn_frontend.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cudnn_sdpa.h"
#include "htam_abi.h"

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

namespace {

struct Problem {
  std::shared_ptr<fe::graph::Graph> graph;
  TensorPtr q, k, v, o;
  int64_t workspace = 0;
  bool supported = false;
};

struct Device {
  cudnnHandle_t handle = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  std::unordered_map<std::string, Problem> problems;
};

std::mutex g_mutex;
std::unordered_map<int, Device> g_devices;

// The problem without its pointers: what a planned graph serves.
std::string key_of(const HtamSdpa& p) {
  int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &p.scale, sizeof scale_bits);
  std::vector<int64_t> k{p.dtype, p.b, p.h, p.h_kv, p.l, p.s, p.d, scale_bits, p.causal};
  for (const int64_t* st : {p.qs, p.ks, p.vs, p.os}) k.insert(k.end(), st, st + 4);
  return std::string(reinterpret_cast<const char*>(k.data()), k.size() * sizeof(int64_t));
}

// A stride of 0 (a broadcast dim of size 1) as the dense stride cuDNN accepts for it.
std::vector<int64_t> strides4(const int64_t* st, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out(st, st + 4);
  int64_t dense = 1;
  for (int j = 3; j >= 0; --j) {
    if (out[j] == 0 && dims[j] == 1) out[j] = dense;
    dense = std::max(dense, out[j] * dims[j]);
  }
  return out;
}

Problem plan(const HtamSdpa& p, cudnnHandle_t handle) {
  Problem pr;
  const auto io = p.dtype == HTAM_BFLOAT16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  pr.graph = std::make_shared<fe::graph::Graph>();
  pr.graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> qd{p.b, p.h, p.l, p.d}, kd{p.b, p.h_kv, p.s, p.d};
  auto tensor = [&](const char* name, const std::vector<int64_t>& dims, const int64_t* st) {
    return pr.graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims).set_stride(strides4(st, dims)));
  };
  pr.q = tensor("Q", qd, p.qs);
  pr.k = tensor("K", kd, p.ks);
  pr.v = tensor("V", kd, p.vs);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(false)
                     .set_attn_scale(p.scale).set_causal_mask(p.causal != 0);
  auto [o, stats] = pr.graph->sdpa(pr.q, pr.k, pr.v, options);
  (void)stats;
  o->set_output(true).set_dim(qd).set_stride(strides4(p.os, qd));
  pr.o = o;
  pr.supported = pr.graph->validate().is_good() && pr.graph->build_operation_graph(handle).is_good() &&
                 pr.graph->create_execution_plans({fe::HeurMode_t::A}).is_good() &&
                 pr.graph->check_support(handle).is_good() && pr.graph->build_plans(handle).is_good() &&
                 pr.graph->get_workspace_size(pr.workspace).is_good();
  return pr;
}

}  // namespace

extern "C" int htam_cudnn_sdpa(const HtamSdpa* p, cudaStream_t stream) {
  if ((p->dtype != HTAM_BFLOAT16 && p->dtype != HTAM_FLOAT16) || p->h_kv <= 0 || p->h % p->h_kv != 0)
    return HTAM_ERR_SHAPE;
  if (p->qs[3] != 1 || p->ks[3] != 1 || p->vs[3] != 1 || p->os[3] != 1) return HTAM_ERR_SHAPE;
  int dev = 0;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce != cudaSuccess) return (int)ce;
  std::lock_guard<std::mutex> lock(g_mutex);
  Device& d = g_devices[dev];
  if (!d.handle) {
    cudnnStatus_t s = cudnnCreate(&d.handle);
    if (s != CUDNN_STATUS_SUCCESS) return 3000 + (int)s;
  }
  cudnnStatus_t s = cudnnSetStream(d.handle, stream);
  if (s != CUDNN_STATUS_SUCCESS) return 3000 + (int)s;
  auto it = d.problems.find(key_of(*p));
  if (it == d.problems.end()) it = d.problems.emplace(key_of(*p), plan(*p, d.handle)).first;
  Problem& pr = it->second;
  if (!pr.supported) return HTAM_ERR_SHAPE;
  if ((size_t)pr.workspace > d.ws_bytes) {   // grow only: a captured graph may hold the old one
    void* ws = nullptr;
    ce = cudaMalloc(&ws, (size_t)pr.workspace);
    if (ce != cudaSuccess) return (int)ce;
    d.ws = ws;
    d.ws_bytes = (size_t)pr.workspace;
  }
  std::unordered_map<TensorPtr, void*> pack{{pr.q, const_cast<void*>(p->q)}, {pr.k, const_cast<void*>(p->k)},
                                            {pr.v, const_cast<void*>(p->v)}, {pr.o, p->o}};
  if (!pr.graph->execute(d.handle, pack, d.ws).is_good()) return HTAM_ERR_SHAPE;
  ce = cudaGetLastError();
  return ce == cudaSuccess ? 0 : (int)ce;
}
