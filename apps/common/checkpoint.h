#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "dtrain/strategy.h"
#include "dtrain/fleet/data_parallel.h"

namespace dtrain::apps {

// Checkpoints of the training runtime: whole (rank 0's latest.pt) and sharded
// (a sharded-<step> folder of one file per rank), fine-tuning from either,
// and the raw parameter dump of the tests.

// Where the run is: the next micro-step to run.
struct RunState {
  int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
  // Samples of the epoch (positions in its shuffled order) consumed before
  // batch_in_epoch started counting: after a change of the world size, the
  // rest of the epoch is split anew (shard_indices' offset).
  int64_t epoch_offset = 0;
  int64_t base_world = 0;        // the world size the run started with (elastic.scale = "lr")
  int64_t world = 0, batch = 0;  // when saved: the world size and each worker's batch (0: unknown)
  bool has_loss_scale = false;   // the checkpoint kept AMP's loss scaler
  LossScaler::State loss_scale;
};

// The run state and the CPU generator's state as bytes, in the checkpoints'
// form (an elastic commit's extra, fleet/elastic.h); reading sets the generator.
std::string run_state_bytes(const RunState& st);
RunState run_state_from_bytes(const std::string& bytes);

// <dir>/latest.pt, written atomically (temporary file, fsync, rename, fsync of
// the folder) by rank 0: model, optimizer, run state (with the loss scaler's
// state), world size and the CPU generator's state.
void save_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& opt,
                     const RunState& state, int world);
// Loads a checkpoint written by save_checkpoint into model and optimizer;
// returns the run state it saved.
RunState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& opt);

// Sharded checkpoints (strategy.sharding): every rank writes
// <dir>/sharded-<step>/rank-<r>.pt (its shards, their optimizer state, the
// model's buffers and the run state); once all have, rank 0 points
// <dir>/latest-sharded at the folder (written atomically) and removes older
// ones. Collective.
void save_sharded_checkpoint(const std::string& dir, fleet::DataParallel& dp, torch::optim::Optimizer& opt,
                             const RunState& state, int rank, int world);
// The model of a whole checkpoint (a latest.pt) loaded onto the CPU, for
// predict and export; "" means <checkpoint_dir>/latest.pt. IoError when the
// file does not exist.
void load_model_weights(std::string path, const std::string& checkpoint_dir, torch::nn::Module& model);
// The folder <dir>/latest-sharded names, or "" when there is none.
std::string latest_sharded_checkpoint(const std::string& dir);
// Loads a sharded checkpoint saved at any world size: into dp's shards (a
// sharded run, collective) or into the whole model (dp without sharding).
RunState load_sharded_checkpoint(const std::string& folder, fleet::DataParallel& dp, torch::optim::Optimizer& opt);

// Fine-tuning ([model] pretrained = PATH): copies into `model` every
// parameter and buffer of the checkpoint at PATH (a latest.pt, or a sharded
// checkpoint folder) whose name and shape match; the others keep their
// initial values and are listed in the returned line (a new head: "skipped
// fc.weight [10, 64] (checkpoint [5, 64]), ..."; a new decoder: "not in the
// checkpoint (initial values kept): ppm1.* (5), ..."), and so are the
// checkpoint's tensors this model has no place for ("not in this model:
// fc.* (2)"). A convolution saved for 1 input channel and wanted for N (a
// grey cls backbone into a colour seg model) is spread over the N channels
// and divided by N, as timm's adapt_input_conv (N to 1: summed), and named
// as adapted. IoError when PATH has none; InvalidUsage when not one tensor
// matched.
std::string load_pretrained(const std::string& path, torch::nn::Module& model);

// Writes the raw parameters to `path` ("{rank}" replaced) and returns their FNV-1a 64 hash.
uint64_t dump_parameters(std::string path, int rank, torch::nn::Module& model);

// The rank-<r>.pt archives of a sharded checkpoint folder, in rank order;
// IoError when it holds none.
std::vector<torch::serialize::InputArchive> read_shard_archives(const std::string& folder);
// A sharded checkpoint put together into a model without sharding: whole
// parameters, the optimizer state of `opt` (which steps the model's
// trainable parameters in order) and the buffers rank 0 saved.
void load_shards_whole(std::vector<torch::serialize::InputArchive>& archives, torch::nn::Module& model,
                       torch::optim::Optimizer& opt);

}  // namespace dtrain::apps
