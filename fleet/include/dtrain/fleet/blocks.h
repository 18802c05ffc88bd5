#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

// Blocks: where a model tells the strategies that act per block (sharding
// stage 3 gathers a block's parameters just before it runs and frees them
// after; recompute keeps no activations inside a block) where each block's
// forward starts and ends. libtorch modules have no forward hooks, so a model
// that wants per-block strategies runs its blocks through run_block:
//
//   for (auto& b : *blocks)
//     x = dtrain::fleet::run_block(*b.ptr(), [&](const torch::Tensor& t) { return b.forward(t); }, x);
//
// A model that declares no block still trains under every strategy: sharding
// stage 3 then treats the whole model as one block, and recompute has
// nothing to checkpoint (the recompute observer refuses, with InvalidUsage,
// checkpoint names that are not modules of the model).
//
// With recompute, fn is copied and called again in backward: what it
// captures must outlive backward (capture the block's holder or a pointer
// into the model, not a loop variable's copy).
//
// Threads: run_block is called from the thread that runs forward; observers
// are called on that thread (forward) and on autograd's thread (backward).
namespace dtrain::fleet {

using BlockFn = std::function<::torch::Tensor(const ::torch::Tensor&)>;

// Watches run_block. An observer registers itself for a model's modules and
// is asked about every block run in the process (several models, or ranks as
// threads in one process, each have their own).
class BlockObserver {
 public:
  virtual ~BlockObserver() = default;
  // Whether `block` belongs to the model this observer serves.
  virtual bool owns(const ::torch::nn::Module& block) const = 0;
  // Just before the block's forward (sharding stage 3: gather its parameters).
  virtual void before_forward(::torch::nn::Module& /*block*/) {}
  // Just after it (stage 3: free them again).
  virtual void after_forward(::torch::nn::Module& /*block*/) {}
  // In backward, before the block's own backward (and before its recompute)
  // runs: stage 3 gathers the parameters again. Called only when the block's
  // output requires grad.
  virtual void before_backward(::torch::nn::Module& /*block*/) {}
  // Whether the block's forward is checkpointed (recompute).
  virtual bool recompute(const ::torch::nn::Module& /*block*/) const { return false; }
};

// Registers / removes an observer (not owned). Thread-safe.
void add_block_observer(BlockObserver* observer);
void remove_block_observer(BlockObserver* observer);

// Runs fn(x) as the forward of `block`, telling the observers that own it.
// With recompute, fn runs without keeping activations and again in backward
// (the block's BatchNorm running statistics are updated once, not twice).
::torch::Tensor run_block(::torch::nn::Module& block, const BlockFn& fn, const ::torch::Tensor& x);

// Activation checkpointing by hand: y = fn(x) without keeping fn's
// activations; backward recomputes fn(x) under grad mode and backpropagates
// through it. Buffers of `block` (BatchNorm running statistics) are restored
// after the recomputation so they move once per step.
::torch::Tensor checkpoint(::torch::nn::Module& block, const BlockFn& fn, const ::torch::Tensor& x);

// The observer DataParallel installs for strategy.recompute: checkpoints the
// blocks of `model` named in `checkpoints` (names as model.named_modules()
// gives them, e.g. "blocks.3"), or every block run through run_block when the
// list is empty. A name that is not a module of the model is an
// InvalidUsage naming it and listing the model's top-level modules.
std::unique_ptr<BlockObserver> make_recompute_observer(const std::shared_ptr<::torch::nn::Module>& model,
                                                       const std::vector<std::string>& checkpoints);

}  // namespace dtrain::fleet
