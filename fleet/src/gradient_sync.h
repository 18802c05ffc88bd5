#pragma once

// DataParallel's gradient reductions (comm hooks, as c10d's Reducer takes):
// each one pairs the core's Bucketer (bucketer.h: the one bucketing rule and
// the in-order launch) with where the buckets live and how they are reduced.
//  - host_buckets: the core's GradientBuckets (host memory, all-reduce or
//    16-bit compressed all-reduce); the gradients are views of their slots.
//  - device_buckets: buckets in the parameters' CUDA memory, reduced as CUDA
//    buffers on the current stream (or, forced for tests, CPU tensors on the
//    same path); the gradients are views of the buckets.
//  - sharded_gradients: ZeRO stages 2 and 3, each gradient reduce-scattered
//    into this rank's shard (ShardedParameters, sharding.h).
// All calls come from the thread that runs backward (its hooks included).

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain::fleet {

class ShardedParameters;

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Whether the gradients of micro-step `step` are synchronized.
  virtual bool syncs_at(const Strategy& s, int64_t step) const { return s.sync_gradients_at(step); }
  // A synchronized step starts.
  virtual void begin() = 0;
  // Parameter i's gradient is final for this step (its accumulator's hook).
  virtual void ready(size_t i) = 0;
  // After backward: reduces what is left (parameters without a gradient count
  // as zeros), waits, and leaves the reduced gradients in place.
  virtual void finish() = 0;
  // Gradients were averaged into the shards, not the parameters (the caller
  // then neither scales the parameters' gradients nor slices them).
  virtual bool into_shards() const { return false; }
  virtual SyncStats stats() const = 0;
  virtual void reset_stats() = 0;
};

// Waits for every bucket's op in flight (a `work` member each) and adds the
// time blocked to stats.wait_seconds; device_buckets and ZeRO's finish share it.
template <typename Buckets>
void wait_buckets(Buckets& buckets, SyncStats& stats) {
  auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets)
    if (b.work) {
      b.work->wait();
      b.work.reset();
    }
  stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<GradientSync> host_buckets(const std::vector<::torch::Tensor>& params,
                                           std::shared_ptr<Communicator> comm, const StrategyOptions& options);
std::unique_ptr<GradientSync> device_buckets(const std::vector<::torch::Tensor>& params,
                                             std::shared_ptr<Communicator> comm, const StrategyOptions& options);
std::unique_ptr<GradientSync> sharded_gradients(ShardedParameters& sharded);

}  // namespace dtrain::fleet
