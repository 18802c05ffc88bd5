#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain::torch {

class DataParallel;

// The distributed models of a job and the micro-step they are armed for,
// shared by the fleet context and every DistributedOptimizer, so a model made
// distributed after the optimizer is wrapped is stepped too.
struct ModelSet {
  std::vector<std::shared_ptr<DataParallel>> models;
  int64_t next_step = 0;  // the micro-step the next backward belongs to
  // Registers a model and arms it for next_step.
  void add(std::shared_ptr<DataParallel> model);
};

// What distributed_optimizer() returns: the user's optimizer, stepped the way
// the job's strategy says (Paddle's fleet.distributed_optimizer).
//
// One call of step() per micro-batch, after loss.backward():
//   - waits for the gradient all-reduces of the distributed models (started
//     during backward), scales merged gradients;
//   - steps the wrapped optimizer only at the end of a gradient-merge group
//     (gradient_merge.k_steps) and returns whether it did;
//   - averages the parameters every localsgd.k_steps (local SGD);
//   - arms the models' gradient hooks for the next micro-step.
// zero_grad() clears gradients only after a step() that stepped, so merged
// gradients accumulate. Not thread-safe: call from the training thread.
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::shared_ptr<::torch::optim::Optimizer> inner, StrategyOptions strategy,
                       std::shared_ptr<ModelSet> models);

  bool step();
  void zero_grad();

  // The micro-step the next step() completes (0 at start). A resumed run sets
  // it before its first backward so merge groups line up with the saved run.
  int64_t next_step() const { return models_->next_step; }
  void set_next_step(int64_t step);

  ::torch::optim::Optimizer& inner() { return *inner_; }
  const std::shared_ptr<::torch::optim::Optimizer>& inner_ptr() const { return inner_; }
  const Strategy& strategy() const { return strategy_; }
  // Communication time summed over the models (since reset_stats).
  SyncStats stats() const;
  void reset_stats();

 private:
  std::shared_ptr<::torch::optim::Optimizer> inner_;
  Strategy strategy_;
  std::shared_ptr<ModelSet> models_;
  bool stepped_ = false;
};

}  // namespace dtrain::torch
