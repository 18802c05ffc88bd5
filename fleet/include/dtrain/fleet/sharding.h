#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"
#include "dtrain/fleet/blocks.h"

namespace dtrain {
class Communicator;
class Work;
}  // namespace dtrain

namespace dtrain::fleet {

// ZeRO sharding of one model over the ranks of a communicator (Paddle's
// sharding stages 1-3, DeepSpeed ZeRO, FSDP's SHARD_GRAD_OP / FULL_SHARD).
// DataParallel owns one when strategy.sharding is set; the
// DistributedOptimizer steps the shards instead of the parameters.
//
// Every parameter of n elements is split into N slices of ceil(n / N)
// (the last zero-padded on the wire); rank r keeps slice r of every parameter
// as a 1-D shard tensor, and the optimizer (and its state) sees only the shards,
// so per rank it holds 1/N of the optimizer state in every stage. The
// optimizers dtrain ships are element-wise (SGD, Adam) or reduce their
// per-parameter norms across ranks (LAMB, LARS), so a sharded step equals
// the unsharded one.
//
//   stage 1  gradients are all-reduced whole (DataParallel's buckets); each
//            rank copies its slices into the shards' gradients.
//   stage 2  each gradient goes into a bucket as soon as backward produces it
//            and the whole gradient is dropped; a full bucket is
//            reduce-scattered (average) while backward goes on, straight to
//            the slices' owners. Gradient memory: 1/N plus buckets in flight.
//   stage 3  stage 2, and the parameters themselves are freed outside use:
//            a block run through run_block (blocks.h) is all-gathered just
//            before its forward, freed after it, gathered again just before
//            its backward and freed when its gradients are in. Parameters
//            outside every declared block stay whole (a model that declares
//            no block keeps them all). Stage 3 needs contiguous parameters
//            that own their storage (no channels-last, no tied weights).
//
// After the optimizer step every rank's full parameters are rebuilt from the
// shards by an all-gather (stage 3: only those that are whole).
//
// Threads: the gradient hooks run on the thread that runs backward (libtorch
// runs CPU backward on the caller's thread); everything else on the training
// thread. All collective methods are called in the same order on every rank.
class ShardedParameters : public BlockObserver, private BucketReduction {
 public:
  // params: the model's trainable parameters in registration order (names
  // beside them). comm null or of one rank: one shard holds everything.
  ShardedParameters(std::shared_ptr<::torch::nn::Module> model, std::vector<::torch::Tensor> params,
                    std::vector<std::string> names, std::shared_ptr<Communicator> comm, const StrategyOptions& options);
  ~ShardedParameters() override;
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  int stage() const { return stage_; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  size_t size() const { return params_.size(); }
  // This rank's slice of parameter i with its gradient set; what the
  // optimizer steps. 1-D: under stages 1 and 2 a view of the (whole,
  // contiguous) parameter's own elements, so ranks past the end hold fewer;
  // under stage 3 a tensor of its own, slice_numel(i) elements with the
  // padding.
  const ::torch::Tensor& shard(size_t i) const { return params_[i].shard; }
  const ::torch::Tensor& parameter(size_t i) const { return params_[i].p; }
  const std::string& name(size_t i) const { return params_[i].name; }
  int64_t numel(size_t i) const { return params_[i].numel; }
  int64_t slice_numel(size_t i) const { return params_[i].per; }
  // The index of a model parameter, or -1.
  int64_t index_of(const ::torch::Tensor& parameter) const;

  // Stage 1, after the gradient all-reduce: this rank's slices of the whole
  // gradients become the shards' gradients; the whole ones are zeroed.
  void take_full_gradients();
  // Stage 2/3, before a step's backward: every bucket waits for its gradients.
  void begin_step();
  // Stage 2/3, from the gradient hook, once per parameter per step.
  void on_grad_ready(size_t i);
  // Stage 2/3, after backward: parameters that got no gradient count as
  // zero; waits for the reduce-scatters and writes the shards' gradients.
  void finish_gradients();
  // After the optimizer step (and after loading shards): rebuilds the whole
  // parameters from the shards (stage 3: those that are whole).
  void after_step();
  // Stage 3: makes every parameter whole (to save or export the full model,
  // or to read it), and frees the declared blocks' parameters again.
  void gather_all();
  void release_all();

  // Sums values over the ranks in place (squared norms of shards).
  void allreduce_sum(std::vector<double>& values);
  // Whether any rank passes true.
  bool any(bool flag);

  // What this rank holds now, in bytes: parameters (whole ones and shards)
  // and gradients (whole ones, the shards' and buckets in flight).
  struct Memory {
    int64_t parameter_bytes = 0, gradient_bytes = 0;
  };
  Memory memory() const;
  const SyncStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // BlockObserver (stage 3 gathers and frees around declared blocks).
  bool owns(const ::torch::nn::Module& block) const override;
  void before_forward(::torch::nn::Module& block) override;
  void after_forward(::torch::nn::Module& block) override;
  void before_backward(::torch::nn::Module& block) override;

 private:
  struct Param {
    ::torch::Tensor p, shard;
    std::string name;
    int64_t numel = 0, per = 0, len = 0, shard_offset = 0;  // len: this rank's real elements
    bool view = false;                                      // shard is a view of p (stages 1-2)
    int64_t bucket_offset = 0;                              // in the bucket's per-rank block
    int refs = 0;                                           // stage 3: gathers in use
    bool in_block = false, released = false;
  };
  struct Bucket {
    int64_t block = 0;  // elements per rank
    ::torch::Tensor send, recv;
    std::shared_ptr<Work> work;
  };
  const std::vector<size_t>& block_params(const ::torch::nn::Module& block);
  void gather(const std::vector<size_t>& indices);
  void refresh(const std::vector<size_t>& indices);
  void release(size_t i);
  void launch(size_t bucket) override;
  ::torch::Tensor allgather(const std::vector<size_t>& indices, int64_t* block);

  std::shared_ptr<::torch::nn::Module> model_;
  std::shared_ptr<Communicator> comm_;
  int stage_ = 1, world_ = 1, rank_ = 0;
  size_t bucket_bytes_ = 0;
  std::vector<Param> params_;
  ::torch::Tensor shard_flat_;
  std::optional<Bucketer> bucketer_;  // stages 2-3: the reduce-scatter buckets
  std::vector<Bucket> buckets_;
  std::unordered_map<const void*, size_t> index_;  // TensorImpl* -> parameter
  std::unordered_set<const ::torch::nn::Module*> modules_;
  std::unordered_map<const ::torch::nn::Module*, std::vector<size_t>> blocks_;
  std::mutex mu_;
  SyncStats stats_;
};

// Sharded checkpoints. Every rank writes its own archive (its slice of every
// parameter and the optimizer state of its shards); the files of a run at N
// ranks load at any number of ranks M, with sharding (each rank reads the N
// files and keeps its new slices) or without it (whole parameters and state).
//
// save_shard writes into `archive` (the caller adds its own entries and
// writes the file atomically). The optimizer must be the one stepping the
// shards (DistributedOptimizer's inner()).
void save_shard(::torch::serialize::OutputArchive& archive, const ShardedParameters& sharding,
                ::torch::optim::Optimizer& optimizer);
// Reads the N archives of one sharded checkpoint (in rank order) into this
// rank's shards and optimizer state, then rebuilds the whole parameters
// (collective). InvalidUsage when the archives are not the N ranks of one
// save, or the model's parameters differ (names, element counts).
void load_shards(std::vector<::torch::serialize::InputArchive>& archives, ShardedParameters& sharding,
                 ::torch::optim::Optimizer& optimizer);
// The same into a model without sharding: whole parameters, and the optimizer
// state of `optimizer`, which steps model.parameters() with trainable ones in order.
void load_shards_unsharded(std::vector<::torch::serialize::InputArchive>& archives, ::torch::nn::Module& model,
                           ::torch::optim::Optimizer& optimizer);

// The whole parameters of a sharded checkpoint's N archives, by name (as
// the saving model named them), without a model: what fine-tuning reads.
std::vector<std::pair<std::string, ::torch::Tensor>> whole_parameters(
    std::vector<::torch::serialize::InputArchive>& archives);

// Bytes of optimizer state held for the parameters `optimizer` steps.
int64_t optimizer_state_bytes(::torch::optim::Optimizer& optimizer);

}  // namespace dtrain::fleet
