#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain::fleet {

class DataParallel;
class ShardedParameters;

// The distributed models of a job and the micro-step they are armed for,
// shared by the fleet context and every DistributedOptimizer, so a model made
// distributed after the optimizer is wrapped is stepped too. add() records
// what the optimizer needs of a model once: its parameters' names and, for a
// sharded model, the shard that stands for each parameter (the model's
// ShardedParameters stays their owner). Not thread-safe: the training thread's.
class ModelSet {
 public:
  // Registers a model and arms it for next_step; add() is the one way in.
  void add(std::shared_ptr<DataParallel> model);
  const std::vector<std::shared_ptr<DataParallel>>& models() const { return models_; }
  // The shard a sharded model steps in place of parameter p; else undefined.
  ::torch::Tensor shard_of(const ::torch::Tensor& p) const;
  // p's dotted name in its model ("" for a tensor of no registered model).
  std::string name_of(const ::torch::Tensor& p) const;
  // Sums values over the ranks (the first sharded model's shard group, else
  // the first model's communicator; nothing without a model). Collective.
  void sum_over_ranks(std::vector<double>& values) const;
  // Whether a registered model is sharded (its ranks then hold 1/N state).
  bool sharded() const { return sharding_ != nullptr; }

  int64_t next_step = 0;  // the micro-step the next backward belongs to

 private:
  std::vector<std::shared_ptr<DataParallel>> models_;
  std::unordered_map<const void*, ::torch::Tensor> shards_;
  std::unordered_map<const void*, std::string> names_;
  ShardedParameters* sharding_ = nullptr;  // the first sharded model's, owned by it
};

// What distributed_optimizer() returns: the user's optimizer, stepped the way
// the job's strategy says (Paddle's fleet.distributed_optimizer).
//
// With strategy.lamb (lars) the user's Adam (Momentum) is replaced by LAMB
// (LARS) over the same parameters, as Paddle does; inner() is the optimizer
// that steps. With strategy.sharding the optimizer steps each sharded model's
// shards (ShardedParameters::shard) in place of its parameters, so its state
// is 1/N per rank; LAMB/LARS sum their per-parameter norms across ranks.
//
// One call of step() per micro-batch, after loss.backward():
//   - waits for the gradient all-reduces of the distributed models (started
//     during backward), scales merged gradients;
//   - steps the wrapped optimizer only at the end of a gradient-merge group
//     (gradient_merge.k_steps) and returns whether it did;
//   - averages the parameters every localsgd.k_steps (local SGD);
//   - with AMP float16: unscales, and skips the step on every rank when
//     any rank's gradients hold an inf/NaN (see scale());
//   - clips the gradients by global norm (set_clip_grad_norm);
//   - arms the models' gradient hooks for the next micro-step.
// zero_grad() clears gradients only after a step() that stepped, so merged
// gradients accumulate. Not thread-safe: call from the training thread.
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::shared_ptr<::torch::optim::Optimizer> inner, StrategyOptions strategy,
                       std::shared_ptr<ModelSet> models);

  bool step();
  void zero_grad();

  // AMP with float16 (strategy.amp, amp_configs.dtype = "float16"): the loss
  // times the current loss scale, to call backward on (Paddle's
  // scaler.scale(loss)); without loss scaling the loss itself. step() then
  // unscales the gradients, all-reduces whether any rank found an inf or NaN,
  // and on every rank either skips the step (zeroing the gradients; step()
  // returns false) or steps; the scale adapts the same way everywhere.
  ::torch::Tensor scale(const ::torch::Tensor& loss) const;
  LossScaler& loss_scaler() { return scaler_; }
  // Whether the last step() skipped the update because of inf/NaN gradients.
  bool last_step_skipped() const { return skipped_; }
  // Gradient clipping by global norm (Paddle's ClipGradByGlobalNorm,
  // [train] clip_grad_norm): before each update the gradients are scaled so
  // that their norm over the whole model (over every rank's shard under
  // sharding) is at most max_norm. 0: off.
  void set_clip_grad_norm(double max_norm) { clip_ = max_norm; }
  // The global gradient norm of the last update (before clipping), when clipping.
  double last_grad_norm() const { return last_norm_; }

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
  void use_shards();
  bool found_inf_anywhere(const std::vector<::torch::Tensor>& params);

  std::shared_ptr<::torch::optim::Optimizer> inner_;
  Strategy strategy_;
  std::shared_ptr<ModelSet> models_;
  bool stepped_ = false;
  LossScaler scaler_;
  bool skipped_ = false;
  double clip_ = 0, last_norm_ = 0;
};

}  // namespace dtrain::fleet
