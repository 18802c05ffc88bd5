#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/bucketer.h"
#include "dtrain/buffer.h"
#include "dtrain/config.h"
#include "dtrain/ps.h"

namespace dtrain {

class Communicator;
class Work;

// How a step's gradients are synchronised, from the job file's [strategy]
// table. Keys follow Paddle's DistributedStrategy names:
//
//   [strategy]
//   fuse_all_reduce_ops = true     group gradients into buckets (false: one all-reduce per tensor)
//   fuse_grad_size_in_MB = 32      bucket capacity
//   fp16_allreduce = false         gradients travel as 16-bit floats
//   fp16_allreduce_dtype = "f16"   "f16" or "bf16" (dtrain extension)
//   [strategy.gradient_merge]  k_steps = 1   avg = true        accumulate k steps, sync once
//   [strategy.localsgd]        k_steps = 1   begin_step = 1    no gradient sync; average the
//                                                               parameters every k steps
//   a_sync = false                 parameter-server mode (Paddle's names, see dtrain/ps.h):
//   [strategy.a_sync_configs]      a_sync = false -> sync; a_sync = true and k_steps = 0 -> async;
//   k_steps = 0                    k_steps > 0 (with a_sync = true) -> GEO, sync every k steps
//   send_queue_size = 1            async: pushes in flight per table while training goes on,
//                                  and the next batch's rows pulled ahead (0: neither)
//
// The large-model strategies (docs/training.md), with Paddle's names:
//
//   sharding = false               ZeRO: optimizer state (stage 1), + gradients (2),
//   [strategy.sharding_configs]    + parameters (3) split evenly over the workers
//   stage = 1
//   amp = false                    autocast + (fp16) dynamic loss scaling
//   [strategy.amp_configs]         init_loss_scaling = 32768, incr_every_n_steps = 1000,
//                                  decr_every_n_nan_or_inf = 2, incr_ratio = 2, decr_ratio = 0.8,
//                                  use_dynamic_loss_scaling = true, dtype = "float16" | "bfloat16"
//   recompute = false              activation checkpointing of the blocks named in
//   [strategy.recompute_configs]   checkpoints = [] (empty: every block the model declares)
//   lamb = false                   the Adam optimizer becomes LAMB
//   [strategy.lamb_configs]        lamb_weight_decay = 0.01, exclude_from_weight_decay = []
//   lars = false                   the Momentum optimizer becomes LARS
//   [strategy.lars_configs]        lars_coeff = 0.001, lars_weight_decay = 0.0005, epsilon = 0,
//                                  exclude_from_weight_decay = []
//   sync_batch_norm = false        BatchNorm statistics over all workers' batches
//
// A collective job ignores the PS mode except where it would change training:
// GradientBuckets (the gradient all-reduce) refuses a_sync = true with an error
// saying that asynchronous / GEO training needs a parameter-server job ([ps]).
// a_sync = true cannot be combined with gradient_merge or localsgd (ConfigError).
//
// Framework-neutral: it sees gradients and parameters only as Buffers.
struct StrategyOptions {
  bool fuse_all_reduce_ops = true;
  double fuse_grad_size_in_MB = 32.0;
  bool fp16_allreduce = false;
  DType wire_dtype = DType::F16;  // used when fp16_allreduce
  int gradient_merge_k_steps = 1;
  bool gradient_merge_avg = true;
  int localsgd_k_steps = 1;  // > 1 enables local SGD
  int localsgd_begin_step = 1;
  // Parameter-server mode from a_sync and a_sync_configs.k_steps.
  bool a_sync = false;
  ps::ModeOptions ps_mode;

  bool sharding = false;
  int sharding_stage = 1;  // 1, 2 or 3

  bool amp = false;
  double amp_init_loss_scaling = 32768.0;
  int amp_incr_every_n_steps = 1000;
  int amp_decr_every_n_nan_or_inf = 2;
  double amp_incr_ratio = 2.0;
  double amp_decr_ratio = 0.8;
  bool amp_use_dynamic_loss_scaling = true;
  DType amp_dtype = DType::F16;  // F16 (with loss scaling) or BF16 (no scaler)

  bool recompute = false;
  std::vector<std::string> recompute_checkpoints;  // module names; empty: every declared block

  bool lamb = false;
  double lamb_weight_decay = 0.01;
  std::vector<std::string> lamb_exclude_from_weight_decay;
  bool lars = false;
  double lars_coeff = 0.001;
  double lars_weight_decay = 0.0005;
  double lars_epsilon = 0.0;
  std::vector<std::string> lars_exclude_from_weight_decay;

  bool sync_batch_norm = false;

  // amp with float16: the loss is scaled and the scale adapts (bf16 needs none).
  bool loss_scaling() const { return amp && amp_dtype == DType::F16; }

  bool localsgd() const { return localsgd_k_steps > 1; }
  size_t bucket_bytes() const;
  // ps_mode with its mode as a_sync and a_sync_configs.k_steps select it
  // (from_config sets it so; a strategy filled in code may not have), after
  // the checks from_config makes of the file's keys: InvalidUsage for k_steps
  // < 0, k_steps > 0 without a_sync, send_queue_size outside [0, 1024].
  ps::ModeOptions resolved_ps_mode() const;
  // The gradient buckets' capacity (assign_buckets, bucketer.h): bucket_bytes(),
  // or 0 (one tensor per bucket) without fuse_all_reduce_ops.
  size_t gradient_bucket_bytes() const { return fuse_all_reduce_ops ? bucket_bytes() : 0; }
  // Reads and checks the [strategy] table; ConfigError names the key and its
  // file/line for a bad value (k_steps < 1, unknown dtype, k_steps > 0
  // without a_sync, ...).
  static StrategyOptions from_config(const Config& config);
  std::string describe() const;
};

// Declares every [strategy] key above in a schema.
void add_strategy_keys(ConfigSchema& schema);

// The per-step policy of a strategy. Steps count micro-batches from 0.
class Strategy {
 public:
  explicit Strategy(StrategyOptions options = {}) : options_(options) {}
  const StrategyOptions& options() const { return options_; }
  // Whether the gradients of micro-step `step` are all-reduced (the last of
  // each gradient-merge group; never under local SGD).
  bool sync_gradients_at(int64_t step) const;
  // Whether the optimizer steps after micro-step `step`.
  bool optimizer_step_at(int64_t step) const;
  // Factor the merged gradients are scaled by before the optimizer step.
  double gradient_scale() const;
  // Whether the parameters are averaged after optimizer step `step` (local SGD).
  bool average_parameters_at(int64_t step) const;

 private:
  StrategyOptions options_;
};

// Dynamic loss scaling (Paddle's update_loss_scaling, PyTorch's GradScaler),
// framework-neutral: the caller unscales the gradients, finds whether any is
// inf/NaN, makes that flag the same on every rank (a Max all-reduce), skips
// the optimizer step when it is set, and calls update() with it. The state is
// plain numbers so a checkpoint can keep it.
class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    int64_t good_steps = 0;  // finite steps since the scale last changed
    int64_t bad_steps = 0;   // inf/NaN steps since the scale last changed
  };
  LossScaler() = default;
  explicit LossScaler(const StrategyOptions& options);
  // Whether the scale is applied at all (amp with float16).
  bool enabled() const { return enabled_; }
  double scale() const { return state_.scale; }
  // Grows the scale by incr_ratio after incr_every_n_steps finite steps in a
  // row, shrinks it by decr_ratio after decr_every_n_nan_or_inf overflowing
  // ones (never below 1); a fixed scale (use_dynamic_loss_scaling = false)
  // never changes. Returns whether the step must be skipped (found_inf).
  bool update(bool found_inf);
  const State& state() const { return state_; }
  void set_state(const State& s) { state_ = s; }

 private:
  bool enabled_ = false;
  bool dynamic_ = true;
  double incr_ratio_ = 2.0, decr_ratio_ = 0.8;
  int64_t incr_every_ = 1000, decr_every_ = 2;
  State state_;
};

// Counters of the communication a GradientBuckets or collective helper did.
struct SyncStats {
  double wait_seconds = 0;  // time the caller blocked waiting for all-reduces
  int64_t allreduces = 0;
  int64_t bytes_on_wire = 0;  // per rank, payload bytes handed to the backend
};

// Gradient bucketing (c10d Reducer-style) over plain f32 buffers.
//
// The tensors are given once, by element count, in registration order (the
// order of the model's parameters), and bucketed by assign_buckets
// (bucketer.h) up to gradient_bucket_bytes(). Every rank must build the same
// layout (same counts), which the caller should check first.
//
// Per step: begin(); mark_ready(i, grad) once per tensor as its gradient is
// final, from any thread; finish(). A bucket is all-reduced (average over
// ranks) as soon as all its tensors are ready and every earlier bucket has been
// launched, so every rank submits buckets in the same order while backward
// still runs. finish() launches what is left (tensors never marked count as
// zero gradients and are skipped on write-back), waits, and writes the
// averaged values back into the buffers given to mark_ready, which must stay
// valid until then. With fp16_allreduce the bucket is pre-divided by the world
// size, converted to f16/bf16, summed on the wire and converted back.
//
// slot(i) is tensor i's place in its bucket (fixed for the object's life). A
// framework may keep the gradient itself there (c10d's
// gradient_as_bucket_view): mark_ready of that address copies nothing and
// finish() leaves the average in place, so a step moves no gradient bytes
// but the all-reduce's. Slot values are kept from step to step (gradients
// accumulate there); the slots of tensors not marked by finish() are zeroed.
class GradientBuckets : private BucketReduction {
 public:
  GradientBuckets(std::shared_ptr<Communicator> comm, std::vector<size_t> counts, const StrategyOptions& options);
  ~GradientBuckets() override;
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  void begin();
  void mark_ready(size_t index, const Buffer& grad);
  void finish();
  float* slot(size_t index);

  size_t num_buckets() const { return buckets_.size(); }
  // Tensor indices of bucket b, in the order they sit in it.
  const std::vector<size_t>& bucket_members(size_t b) const { return bucketer_.members(b); }
  const SyncStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Bucket {
    std::vector<size_t> offsets;  // element offset of each member in data
    size_t count = 0;
    std::vector<float> data;
    std::vector<uint16_t> wire;  // 16-bit copy when compressing
    std::shared_ptr<Work> work;
  };
  void launch(size_t bucket) override;

  std::shared_ptr<Communicator> comm_;
  StrategyOptions options_;
  std::vector<size_t> counts_;
  Bucketer bucketer_;
  std::vector<Bucket> buckets_;
  std::vector<Buffer> targets_;  // where results go back
  bool active_ = false;
  std::mutex mu_;
  SyncStats stats_;
};

// Averages buffers (f32) across ranks in place, packed into buckets of
// bucket_bytes (local SGD's parameter averaging, BatchNorm statistics).
void average_buffers(Communicator& comm, const std::vector<Buffer>& buffers, size_t bucket_bytes,
                     SyncStats* stats = nullptr);
// Broadcasts buffers (any dtype each) from root, packed per dtype into buckets.
void broadcast_buffers(Communicator& comm, const std::vector<Buffer>& buffers, int root, size_t bucket_bytes);

// Checks that every rank has the same tensor layout before parameters are
// broadcast: `names` and `shapes` describe the tensors in order. On a
// mismatch every rank throws InvalidUsage naming the first differing tensor
// (index, name and shape on this rank and on rank 0), instead of hanging in a
// mismatched collective later.
void check_same_layout(Communicator& comm, const std::vector<std::string>& names,
                       const std::vector<std::vector<int64_t>>& shapes);

// 16-bit float conversions (round to nearest even).
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace dtrain
