#include "communicator.h"

#include <cstring>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "dtrain/sdk/gloo_glue.h"

namespace dtrain::gloo_backend {

namespace {

constexpr uint8_t kP2pSlotPrefix = 0x5d;
constexpr uint32_t kCollectiveTag = 0;

// Gloo's reduction callback for one (dtype, op): the SDK's kernels; f16/bf16
// travel as 16-bit and are reduced through float.
::gloo::AllreduceOptions::Func reduce_fn(int32_t dtype, int32_t op) { return sdk::reduce_fn(dtype, op); }

template <typename F>
void with_type(int32_t dtype, F&& f) {
  if (!sdk::gloo_glue::with_gloo_type(dtype, std::forward<F>(f)))
    sdk::fail(DT_ERR_NOT_SUPPORTED, std::string("gloo backend: dtype ") + sdk::dtype_name(dtype) + " is not supported");
}

// True when a send/recv op needs no peer: nothing to move, or a world of one
// (then send is copied to recv; they may overlap).
bool done_locally(const Mesh& m, const sdk::Communicator::Buf& send, const sdk::Communicator::Buf& recv, size_t bytes) {
  if (bytes != 0 && m.size == 1 && send.ptr != recv.ptr) std::memmove(recv.ptr, send.ptr, bytes);
  return bytes == 0 || m.size == 1;
}

std::string default_iface(const sdk::CommInit& init) {
  if (const char* e = std::getenv("DTRAIN_GLOO_IFNAME")) return e;
  if (const char* e = std::getenv("GLOO_SOCKET_IFNAME")) return e;
  return init.single_host() ? "lo" : "";
}

}  // namespace

GlooCommunicator::GlooCommunicator(const sdk::CommInit& init)
    : timeout_ms_(init.timeout_ms), mesh_(std::make_shared<Mesh>()) {
  auto& m = *mesh_;
  m.rank = init.rank;
  m.size = init.world_size;
  const GlooKeys k = gloo_keys().read(init.options);  // bounds checked there
  m.algorithm = sdk::parse_name<Algorithm>("gloo.algorithm", k.algorithm,
                                           {{"auto", Algorithm::Auto},
                                            {"ring", Algorithm::Ring},
                                            {"halving_doubling", Algorithm::HalvingDoubling},
                                            {"halving-doubling", Algorithm::HalvingDoubling},
                                            {"bcube", Algorithm::Bcube}});
  // Two ranks: bcube is one exchange of the whole buffer, the same bytes as a
  // ring in fewer steps; measured faster up to 16 MiB. More ranks: up to 1 MiB.
  const int64_t small = k.small_message_bytes;
  m.small_bytes = small > 0 ? static_cast<size_t>(small) : m.size == 2 ? size_t{16} << 20 : size_t{1} << 20;
  const int rank_ = m.rank, size_ = m.size;
  ::gloo::transport::tcp::attr attr;
  // iface not set: chosen here (the key table's "" stands for that choice).
  std::string iface = init.options.has("iface") ? k.iface : default_iface(init);
  const std::string& host = k.hostname;
  if (!host.empty()) {
    attr.hostname = host;
  } else if (!iface.empty()) {
    attr.iface = iface;
  } else if (const char* ip = std::getenv("DTRAIN_HOST_IP")) {
    attr.hostname = ip;  // this machine's address as the launcher knows it (--ips)
  } else {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
  }
  try {
    m.device = ::gloo::transport::tcp::CreateDevice(attr);
    m.context = std::make_shared<::gloo::rendezvous::Context>(rank_, size_, k.bcube_base);
    m.context->setTimeout(std::chrono::milliseconds(timeout_ms_));
    sdk::gloo_glue::connect_full_mesh(*m.context,
                                      std::make_shared<sdk::gloo_glue::RendezvousStore<sdk::Store>>(
                                          init.store, std::chrono::milliseconds(timeout_ms_)),
                                      m.device);
  } catch (const sdk::Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_gloo(e, "gloo: connecting rank " + std::to_string(rank_) + " to its " + std::to_string(size_ - 1) +
                        " peers over " + (iface.empty() ? "host " + attr.hostname : "interface " + iface) + " failed");
  }
  p2p_ = std::make_unique<sdk::P2pTracker>(sdk::P2pTracker::Mode::Thread);
  sdk::OpQueue::Settings q;
  q.interruptible = false;
  // Gloo's small ops take 150-300 us here: a drainer polling every 2 ms would
  // land a context switch on one op in seven.
  q.lazy = true;
  queue_ = sdk::OpQueue::create(std::move(q));
}

GlooCommunicator::~GlooCommunicator() {
  abort("communicator destroyed");
  if (queue_) queue_->shutdown("communicator destroyed");
  p2p_.reset();
}

void GlooCommunicator::abort(const std::string& reason) {
  if (aborted_.exchange(true)) return;
  if (queue_) queue_->abort(reason);
  if (p2p_) p2p_->abort(reason);
}

std::chrono::milliseconds Mesh::remaining(Clock::time_point deadline) {
  return sdk::remaining_ms(deadline, kGlooSlack);
}

template <typename F>
std::shared_ptr<sdk::Work> GlooCommunicator::enqueue(const Opts& o, F&& body) {
  return queue_->submit(
      [m = mesh_, body = std::forward<F>(body)](Clock::time_point deadline) mutable {
        // Some waits inside Gloo's ops use the context's timeout, not the op's.
        m->context->setTimeout(m->remaining(deadline));
        try {
          body(*m, deadline);
        } catch (const sdk::Error&) {
          throw;
        } catch (const std::exception& e) {
          rethrow_gloo(e, "gloo");
        }
      },
      sdk::deadline_after(o.timeout_ms, timeout_ms_),
      // Some of Gloo's waits use the timeout its pairs got at connection, the
      // communicator's: only an op with that deadline may run on the caller.
      o.timeout_ms <= 0 || o.timeout_ms >= timeout_ms_);
}

Algorithm Mesh::pick(size_t count, size_t bytes) const {
  if (algorithm != Algorithm::Auto) return algorithm;
  // At most one element a rank: the ring's steps carry one element or none
  // (measured in docs/python.md, "Benchmark").
  if (count <= static_cast<size_t>(size)) return Algorithm::Ring;
  return bytes <= small_bytes ? Algorithm::Bcube : Algorithm::Ring;
}

void Mesh::allreduce_inplace(void* ptr, size_t count, int32_t dtype, int32_t op, Clock::time_point deadline) {
  if (count == 0 || size == 1) return;
  size_t esz = sdk::dtype_size(dtype);
  Algorithm a = pick(count, count * esz);
  if (a == Algorithm::HalvingDoubling) {
    allreduce_halving_doubling(ptr, count, dtype, op);
  } else {
    ::gloo::AllreduceOptions opts(context);
    opts.setAlgorithm(a == Algorithm::Bcube ? ::gloo::AllreduceOptions::Algorithm::BCUBE
                                            : ::gloo::AllreduceOptions::Algorithm::RING);
    with_type(dtype, [&](auto t) { opts.setOutput(static_cast<decltype(t)*>(ptr), count); });
    opts.setReduceFunction(reduce_fn(dtype, op));
    opts.setTag(kCollectiveTag);
    opts.setTimeout(remaining(deadline));
    ::gloo::allreduce(opts);
  }
  if (op == DT_OP_AVG) sdk::scale_avg(dtype, ptr, count, size);
}

void Mesh::allreduce_halving_doubling(void* ptr, size_t count, int32_t dtype, int32_t op) {
  bool wide = dtype == DT_DTYPE_F16 || dtype == DT_DTYPE_BF16;  // reduced in f32 staging
  int32_t stype = wide ? DT_DTYPE_F32 : dtype;
  auto key = std::make_tuple(count, stype, op);
  auto it = hd_cache.find(key);
  if (it == hd_cache.end()) {
    // Bounded, evicting in creation order: every rank makes the same calls,
    // so every rank evicts the same entry.
    if (hd_order.size() >= 8) {
      hd_cache.erase(hd_order.front());
      hd_order.erase(hd_order.begin());
    }
    HdEntry e;
    e.staging.resize(count * sdk::dtype_size(stype));
    with_type(stype, [&](auto t) {
      using T = decltype(t);
      const ::gloo::ReductionFunction<T>* fn = ::gloo::ReductionFunction<T>::sum;
      if (op == DT_OP_PROD) fn = ::gloo::ReductionFunction<T>::product;
      if (op == DT_OP_MAX) fn = ::gloo::ReductionFunction<T>::max;
      if (op == DT_OP_MIN) fn = ::gloo::ReductionFunction<T>::min;
      std::vector<T*> ptrs{reinterpret_cast<T*>(e.staging.data())};
      e.algorithm = std::make_unique<::gloo::AllreduceHalvingDoubling<T>>(context, ptrs, static_cast<int>(count), fn);
    });
    it = hd_cache.emplace(key, std::move(e)).first;
    hd_order.push_back(key);
  }
  auto& e = it->second;
  auto* src = static_cast<uint16_t*>(ptr);
  auto* f = reinterpret_cast<float*>(e.staging.data());
  if (dtype == DT_DTYPE_F16)
    sdk::half_to_float_n(src, f, count);
  else if (dtype == DT_DTYPE_BF16)
    sdk::bf16_to_float_n(src, f, count);
  else
    std::memcpy(e.staging.data(), ptr, e.staging.size());
  e.algorithm->run();
  if (dtype == DT_DTYPE_F16)
    sdk::float_to_half_n(f, src, count);
  else if (dtype == DT_DTYPE_BF16)
    sdk::float_to_bf16_n(f, src, count);
  else
    std::memcpy(ptr, e.staging.data(), e.staging.size());
}

std::shared_ptr<sdk::Work> GlooCommunicator::allreduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  sdk::require_cpu(send, recv, "gloo");
  return enqueue(o, [send, recv, op](Mesh& m, Clock::time_point deadline) {
    if (send.ptr != recv.ptr && send.count) std::memcpy(recv.ptr, send.ptr, sdk::bytes_of(send));
    m.allreduce_inplace(recv.ptr, recv.count, recv.dtype, op, deadline);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::broadcast(const Buf& buf, const Opts& o) {
  sdk::require_cpu(buf, "gloo");
  int root = o.root;
  return enqueue(o, [buf, root](Mesh& m, Clock::time_point deadline) {
    if (buf.count == 0 || m.size == 1) return;
    ::gloo::BroadcastOptions opts(m.context);
    opts.setOutput(static_cast<uint8_t*>(buf.ptr), sdk::bytes_of(buf));
    opts.setRoot(root);
    opts.setTag(kCollectiveTag);
    opts.setTimeout(m.remaining(deadline));
    ::gloo::broadcast(opts);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::allgather(const Buf& send, const Buf& recv, const Opts& o) {
  sdk::require_cpu(send, recv, "gloo");
  return enqueue(o, [send, recv](Mesh& m, Clock::time_point deadline) {
    size_t bytes = sdk::bytes_of(send);
    if (done_locally(m, send, recv, bytes)) return;
    ::gloo::AllgatherOptions opts(m.context);
    auto* out = static_cast<uint8_t*>(recv.ptr);
    if (send.ptr != out + m.rank * bytes) opts.setInput(static_cast<uint8_t*>(send.ptr), bytes);
    opts.setOutput(out, bytes * m.size);
    opts.setTag(kCollectiveTag);
    opts.setTimeout(m.remaining(deadline));
    ::gloo::allgather(opts);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::reduce_scatter(const Buf& send, const Buf& recv, int32_t op,
                                                            const Opts& o) {
  sdk::require_cpu(send, recv, "gloo");
  // Gloo has no unbound-buffer reduce-scatter: all-reduce a copy, keep our block.
  return enqueue(o, [send, recv, op](Mesh& m, Clock::time_point deadline) {
    size_t block = sdk::bytes_of(recv);
    if (block == 0) return;
    std::vector<char> tmp(static_cast<const char*>(send.ptr), static_cast<const char*>(send.ptr) + block * m.size);
    m.allreduce_inplace(tmp.data(), send.count, send.dtype, op, deadline);
    std::memcpy(recv.ptr, tmp.data() + m.rank * block, block);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::reduce(const Buf& send, const Buf& recv, int32_t op, const Opts& o) {
  sdk::require_cpu(send, "gloo");
  int root = o.root;
  return enqueue(o, [send, recv, op, root](Mesh& m, Clock::time_point deadline) {
    size_t bytes = sdk::bytes_of(send);
    if (bytes == 0) return;
    bool is_root = m.rank == root;
    if (m.size == 1) {
      if (send.ptr != recv.ptr) std::memcpy(recv.ptr, send.ptr, bytes);
      if (op == DT_OP_AVG) sdk::scale_avg(send.dtype, recv.ptr, recv.count, m.size);
      return;
    }
    std::vector<char> scratch;
    void* out = recv.ptr;
    if (!is_root) {
      scratch.resize(bytes);
      out = scratch.data();
    }
    ::gloo::ReduceOptions opts(m.context);
    with_type(send.dtype, [&](auto t) {
      using T = decltype(t);
      if (send.ptr != out) opts.setInput(static_cast<T*>(send.ptr), send.count);
      opts.setOutput(static_cast<T*>(out), send.count);
    });
    opts.setRoot(root);
    opts.setReduceFunction(reduce_fn(send.dtype, op));
    opts.setTag(kCollectiveTag);
    opts.setTimeout(m.remaining(deadline));
    ::gloo::reduce(opts);
    if (is_root && op == DT_OP_AVG) sdk::scale_avg(send.dtype, recv.ptr, recv.count, m.size);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::alltoall(const Buf& send, const Buf& recv, const Opts& o) {
  sdk::require_cpu(send, recv, "gloo");
  return enqueue(o, [send, recv](Mesh& m, Clock::time_point deadline) {
    size_t bytes = sdk::bytes_of(send);
    if (done_locally(m, send, recv, bytes)) return;
    std::vector<char> copy;
    void* in = send.ptr;
    if (send.ptr == recv.ptr) {
      copy.assign(static_cast<char*>(send.ptr), static_cast<char*>(send.ptr) + bytes);
      in = copy.data();
    }
    ::gloo::AlltoallOptions opts(m.context);
    opts.setInput(static_cast<uint8_t*>(in), bytes);
    opts.setOutput(static_cast<uint8_t*>(recv.ptr), bytes);
    opts.setTag(kCollectiveTag);
    opts.setTimeout(m.remaining(deadline));
    ::gloo::alltoall(opts);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::barrier(const Opts& o) {
  return enqueue(o, [](Mesh& m, Clock::time_point deadline) {
    if (m.size == 1) return;
    ::gloo::BarrierOptions opts(m.context);
    opts.setTag(kCollectiveTag);
    opts.setTimeout(m.remaining(deadline));
    ::gloo::barrier(opts);
  });
}

std::shared_ptr<sdk::Work> GlooCommunicator::post(const Buf& buf, int32_t peer, const Opts& o, bool is_send) {
  sdk::require_cpu(buf, "gloo");
  if (aborted_.load()) sdk::fail(DT_ERR_ABORTED, "communicator aborted");
  auto slot = ::gloo::Slot::build(kP2pSlotPrefix, static_cast<uint32_t>(o.tag));
  std::string what = std::string(is_send ? "send to" : "recv from") + " rank " + std::to_string(peer);
  try {
    // Zero-byte transfers still need a real buffer address in Gloo.
    static char dummy;
    auto ub = mesh_->context->createUnboundBuffer(buf.count ? buf.ptr : &dummy, sdk::bytes_of(buf));
    if (is_send)
      ub->send(peer, slot);
    else
      ub->recv(peer, slot);
    auto w = std::make_shared<P2pWork>(std::move(ub), is_send, peer, sdk::deadline_after(o.timeout_ms, timeout_ms_));
    p2p_->add(w);
    return w;
  } catch (const sdk::Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_gloo(e, what);
  }
}

std::shared_ptr<sdk::Work> GlooCommunicator::send(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, true);
}

std::shared_ptr<sdk::Work> GlooCommunicator::recv(const Buf& buf, int32_t peer, const Opts& o) {
  return post(buf, peer, o, false);
}

}  // namespace dtrain::gloo_backend
