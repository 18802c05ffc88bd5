#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <gloo/algorithm.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include "dtrain/sdk/backend.h"
#include "dtrain/sdk/p2p.h"
#include "work.h"

namespace dtrain::gloo_backend {

enum class Algorithm { Auto, Ring, HalvingDoubling, Bcube };

// The [gloo] keys as the job file sets them; the initializers are the
// defaults. Each key is declared once, with its bound and doc, in gloo_keys()
// (plugin.cc), which reads them all, bounds checked.
struct GlooKeys {
  std::string algorithm = "auto";
  int64_t small_message_bytes = 0;
  int bcube_base = 2;
  std::string iface;
  std::string hostname;
};
const sdk::ConfigTable<GlooKeys>& gloo_keys();

// The Gloo side of one communicator: a full TCP mesh and what runs on it. Held
// by shared_ptr by every queued op, so an op left blocked in Gloo after an
// abort can finish on its own after the communicator is gone.
struct Mesh {
  using Clock = sdk::Clock;
  int rank = 0;
  int size = 1;
  Algorithm algorithm = Algorithm::Auto;
  size_t small_bytes = 0;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;

  // Halving-doubling is one of Gloo's algorithm objects, bound to fixed memory
  // at construction (a rendezvous with every peer), so instances are cached by
  // a key every rank computes alike, each with its own staging buffer.
  struct HdEntry {
    std::vector<char> staging;
    std::unique_ptr<::gloo::Algorithm> algorithm;
  };
  std::map<std::tuple<size_t, int32_t, int32_t>, HdEntry> hd_cache;
  std::vector<std::tuple<size_t, int32_t, int32_t>> hd_order;

  // What Gloo's timeouts get: the time left to deadline plus a slack, so the
  // core's watchdog normally reports first (naming the missing ranks).
  static std::chrono::milliseconds remaining(Clock::time_point deadline);
  Algorithm pick(size_t count, size_t bytes) const;
  void allreduce_inplace(void* ptr, size_t count, int32_t dtype, int32_t op, Clock::time_point deadline);
  void allreduce_halving_doubling(void* ptr, size_t count, int32_t dtype, int32_t op);
};

// One Gloo mesh per communicator. Collectives run in order on the SDK's
// OpQueue, inline on the thread that waits for them when that thread waits
// until the op's deadline (the core's waits do), else on the queue's drainer:
// Gloo's waits end only at the timeout they are given and an abort cannot
// reach a thread blocked inside, so the queue is not interruptible.
// Point-to-point ops are posted on Gloo unbound buffers at submission and
// completed by the SDK's P2pTracker on its own thread.
class GlooCommunicator : public sdk::Communicator {
 public:
  explicit GlooCommunicator(const sdk::CommInit& init);
  ~GlooCommunicator() override;

  DTRAIN_SDK_COMMUNICATOR_OPS;

 private:
  using Clock = sdk::Clock;
  template <typename F>
  std::shared_ptr<sdk::Work> enqueue(const Opts& o, F&& body);
  std::shared_ptr<sdk::Work> post(const Buf& buf, int32_t peer, const Opts& o, bool is_send);

  int64_t timeout_ms_;
  std::shared_ptr<Mesh> mesh_;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<sdk::P2pTracker> p2p_;
  std::shared_ptr<sdk::OpQueue> queue_;
};

}  // namespace dtrain::gloo_backend
