#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"

namespace dtrain {
class Communicator;
}

namespace dtrain::fleet {

// Data parallelism for a libtorch module through the core's Strategy (what
// distributed_model() returns; apps that count steps themselves drive it
// directly).
//
// Construction checks that every rank built the same model (names and shapes
// of parameters and buffers; a mismatch throws InvalidUsage on every rank
// naming the first differing one) and broadcasts parameters and buffers from
// rank 0. The model must outlive this object; its parameters must be
// dense float32 (contiguous or channels-last), all on the CPU or all on one CUDA device. On CUDA the
// gradient buckets are CUDA memory handed to the backend as CUDA buffers on
// the current stream (NCCL takes them natively, Gloo and UCX through pinned
// host staging); fp16_allreduce is CPU-only for now.
//
// Per micro-step `step` (counted from 0 over the whole run), on the thread
// that runs backward:
//   begin_step(step); loss.backward(); end_backward(step);
//   if (optimizer_step_at(step)) { opt.step(); after_optimizer_step(step); }
// When the strategy syncs at `step`, a post-hook on each parameter's gradient
// accumulator hands the gradient to the buckets as soon as backward has
// produced it, so all-reduces overlap the rest of backward; end_backward waits
// for them and scales merged gradients. The gradients (p.grad()) are views of
// the gradient buckets from construction on, so no gradient is copied (zero
// them in place, as Optimizer::zero_grad() does; a gradient replaced by a new
// tensor still works, through a copy); on destruction they get memory of
// their own again. A second backward in the same step (gradient accumulation
// by hand) would add into gradients the all-reduce is reading: the hook throws
// InvalidUsage naming the parameter instead (use the gradient_merge strategy),
// as c10d does. After the optimizer step, local SGD
// averages the parameters every k steps. With comm == null or one rank it only
// applies the gradient-merge policy. begin_step may be called again for
// another step before any backward (re-arming for a resumed step).
//
// The large-model strategies of `options`: sharding makes a
// ShardedParameters (sharding.h; stage 1 keeps these all-reduce buckets,
// stages 2-3 hand each gradient to its reduce-scatter buckets instead, and
// after_optimizer_step all-gathers the parameters); recompute installs a
// recompute observer over the model's declared blocks (blocks.h);
// sync_batch_norm connects the model's dtrain::fleet::BatchNorm2d layers to
// `comm` (sync_batch_norm.h; a plain torch::nn::BatchNorm is refused).
class BlockObserver;
class GradientSync;
class ShardedParameters;

class DataParallel {
 public:
  DataParallel(std::shared_ptr<::torch::nn::Module> model, std::shared_ptr<Communicator> comm,
               const StrategyOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void begin_step(int64_t step);
  void end_backward(int64_t step);
  bool optimizer_step_at(int64_t step) const { return strategy_.optimizer_step_at(step); }
  void after_optimizer_step(int64_t step);
  // Averages floating-point buffers (BatchNorm running statistics) across
  // ranks; every rank must call it.
  void average_buffers();
  // Sums values across ranks in place (metrics); every rank must call it.
  void allreduce_sum(std::vector<double>& values);

  const std::shared_ptr<::torch::nn::Module>& module() const { return model_; }
  // The ZeRO sharding of this model (strategy.sharding), else null.
  ShardedParameters* sharding() const { return sharded_.get(); }
  const Strategy& strategy() const { return strategy_; }
  // Time spent blocked on gradient/parameter communication, and counts.
  SyncStats stats() const;
  void reset_stats();
  int world_size() const;

 private:
  struct Hook;
  void collect_parameters();
  void broadcast_state();
  void register_hooks();
  void on_grad_ready(size_t index);
  void average_on_device(const std::vector<::torch::Tensor>& tensors);

  std::shared_ptr<::torch::nn::Module> model_;
  std::shared_ptr<Communicator> comm_;
  Strategy strategy_;
  std::vector<::torch::Tensor> params_;
  std::vector<std::string> param_names_;
  bool cuda_ = false;                         // the parameters are on a CUDA device
  bool on_device_ = false;                    // cuda_, or the CUDA path forced for tests (DTRAIN_TORCH_DEVICE_BUCKETS)
  std::unique_ptr<BlockObserver> recompute_;  // strategy.recompute
  std::unique_ptr<ShardedParameters> sharded_;  // strategy.sharding: the parameters' layout
  std::unique_ptr<GradientSync> sync_;          // the gradient reduction; null with one rank and no ZeRO 2/3
  // libtorch's own pointer type (std::shared_ptr in 1.13, c10::intrusive_ptr in 2.x).
  std::vector<decltype(::torch::autograd::impl::grad_accumulator(std::declval<const ::torch::Tensor&>()))>
      accumulators_;
  std::vector<char> marked_;  // this step's backward has produced the gradient
  bool armed_ = false;        // gradients of this step go to sync_
  bool begun_ = false;        // sync_->begin() called, finish() not yet
  SyncStats extra_;
};

}  // namespace dtrain::fleet
