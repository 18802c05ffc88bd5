#include "gloo_reference.h"

#include <map>

#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "dtrain/error.h"
// The SDK's Gloo glue (store adapter, dtype dispatch), which the gloo plugin
// uses too: the reference reaches Gloo as the plugin does.
#include "dtrain/sdk/gloo_glue.h"

namespace dtrain::bench {

namespace {

enum class Algo { Auto, Ring, Bcube, HalvingDoubling };

Algo parse_algo(const std::string& s) {
  if (s == "auto") return Algo::Auto;
  if (s == "ring") return Algo::Ring;
  if (s == "bcube") return Algo::Bcube;
  if (s == "halving_doubling" || s == "halving-doubling") return Algo::HalvingDoubling;
  throw InvalidUsage("algorithm \"" + s + "\" is not known; use auto, ring, bcube or halving_doubling");
}

// Calls f(T{}) with the C++ type Gloo uses for a dtype, as the gloo plugin
// does; bf16 has no Gloo reduction.
template <typename F>
void with_type(DType t, F&& f) {
  if (t == DType::BF16 || !sdk::gloo_glue::with_gloo_type(static_cast<int32_t>(t), std::forward<F>(f)))
    throw NotSupported(std::string("raw Gloo has no ") + dtype_name(t) + " reduction");
}

}  // namespace

struct GlooReference::Impl {
  int rank = 0;
  int size = 1;
  GlooRefConfig cfg;
  Algo algo = Algo::Auto;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  // Halving-doubling objects are bound to their buffer at construction (a
  // rendezvous with every peer), so a Gloo user builds one per buffer and
  // reruns it; so does the reference, outside the timed loop.
  std::map<std::tuple<void*, size_t, int>, std::unique_ptr<::gloo::Algorithm>> hd;

  Algo pick(size_t count, size_t bytes) const {
    if (algo != Algo::Auto) return algo;
    return gloo_allreduce_algorithm(cfg, size, count, bytes) == "bcube" ? Algo::Bcube : Algo::Ring;
  }
};

GlooReference::GlooReference(int rank, int size, std::shared_ptr<Store> store, const GlooRefConfig& cfg,
                             std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.rank = rank;
  m.size = size;
  m.cfg = cfg;
  m.algo = parse_algo(cfg.algorithm);
  m.timeout = timeout;
  ::gloo::transport::tcp::attr attr;
  attr.iface = cfg.iface;
  m.device = ::gloo::transport::tcp::CreateDevice(attr);
  m.context = std::make_shared<::gloo::rendezvous::Context>(rank, size, cfg.bcube_base);
  m.context->setTimeout(timeout);
  sdk::gloo_glue::connect_full_mesh(
      *m.context, std::make_shared<sdk::gloo_glue::RendezvousStore<std::shared_ptr<Store>>>(std::move(store), timeout),
      m.device);
}

GlooReference::~GlooReference() = default;

std::string GlooReference::unsupported_reason(DType t) {
  if (t == DType::BF16) return "Gloo has no bf16 type";
  return "";
}

void GlooReference::allreduce(void* ptr, size_t count, DType t) {
  auto& m = *impl_;
  if (count == 0 || m.size == 1) return;
  Algo a = m.pick(count, count * dtype_size(t));
  if (a == Algo::HalvingDoubling) {
    auto key = std::make_tuple(ptr, count, static_cast<int>(t));
    auto it = m.hd.find(key);
    if (it == m.hd.end()) {
      with_type(t, [&](auto z) {
        using T = decltype(z);
        std::vector<T*> ptrs{static_cast<T*>(ptr)};
        auto alg = std::make_unique<::gloo::AllreduceHalvingDoubling<T>>(m.context, ptrs, static_cast<int>(count),
                                                                         ::gloo::ReductionFunction<T>::sum);
        it = m.hd.emplace(key, std::move(alg)).first;
      });
    }
    it->second->run();
    return;
  }
  ::gloo::AllreduceOptions opts(m.context);
  opts.setAlgorithm(a == Algo::Bcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                     : ::gloo::AllreduceOptions::Algorithm::RING);
  with_type(t, [&](auto z) {
    using T = decltype(z);
    opts.setOutput(static_cast<T*>(ptr), count);
    // As PyTorch's ProcessGroupGloo does: Gloo's own typed sum.
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&::gloo::sum<T>));
  });
  opts.setTag(0);
  opts.setTimeout(m.timeout);
  ::gloo::allreduce(opts);
}

void GlooReference::broadcast(void* ptr, size_t bytes, int root) {
  auto& m = *impl_;
  if (bytes == 0 || m.size == 1) return;
  ::gloo::BroadcastOptions opts(m.context);
  opts.setOutput(static_cast<uint8_t*>(ptr), bytes);
  opts.setRoot(root);
  opts.setTag(0);
  opts.setTimeout(m.timeout);
  ::gloo::broadcast(opts);
}

void GlooReference::allgather(const void* send, void* recv, size_t bytes_per_rank) {
  auto& m = *impl_;
  if (bytes_per_rank == 0) return;
  ::gloo::AllgatherOptions opts(m.context);
  opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes_per_rank);
  opts.setOutput(static_cast<uint8_t*>(recv), bytes_per_rank * m.size);
  opts.setTag(0);
  opts.setTimeout(m.timeout);
  ::gloo::allgather(opts);
}

void GlooReference::barrier() {
  auto& m = *impl_;
  if (m.size == 1) return;
  ::gloo::BarrierOptions opts(m.context);
  opts.setTag(0);
  opts.setTimeout(m.timeout);
  ::gloo::barrier(opts);
}

}  // namespace dtrain::bench
