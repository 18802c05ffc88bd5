#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain {
class Communicator;
}

namespace dtrain::apps {

// Data parallelism for a libtorch module through the core's Strategy.
//
// Construction checks that every rank built the same model (names and shapes
// of parameters and buffers; a mismatch throws naming the first differing
// one) and broadcasts parameters and buffers from rank 0.
//
// Per micro-step `step` (counted from 0 over the whole run):
//   begin_step(step); loss.backward(); end_backward(step); if (optimizer_step_at(step)) { opt.step(); after_optimizer_step(step); }
// When the strategy syncs at `step`, a post-hook on each parameter's gradient
// accumulator hands the gradient to the buckets as soon as backward has
// produced it, so all-reduces overlap the rest of backward; end_backward waits
// for them and scales merged gradients. After the optimizer step, local SGD
// averages the parameters every k steps. With comm == null or one rank it only
// applies the gradient-merge policy.
class DataParallel {
 public:
  DataParallel(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<Communicator> comm,
               const StrategyOptions& options);
  ~DataParallel();

  void begin_step(int64_t step);
  void end_backward(int64_t step);
  bool optimizer_step_at(int64_t step) const { return strategy_.optimizer_step_at(step); }
  void after_optimizer_step(int64_t step);
  // Averages floating-point buffers (BatchNorm running statistics) across ranks.
  void average_buffers();
  // Collective helpers for metrics.
  void allreduce_sum(std::vector<double>& values);

  const Strategy& strategy() const { return strategy_; }
  // Time spent blocked on gradient/parameter communication, and counts.
  SyncStats stats() const;
  void reset_stats();
  int world_size() const;

 private:
  struct Hook;
  void on_grad_ready(size_t index);

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<Communicator> comm_;
  Strategy strategy_;
  std::vector<torch::Tensor> params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::unique_ptr<GradientBuckets> buckets_;
  bool armed_ = false;
  SyncStats extra_;
};

}  // namespace dtrain::apps
