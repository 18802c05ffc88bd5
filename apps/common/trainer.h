#pragma once

#include <functional>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/data.h"
#include "common/device.h"
#include "common/tensorboard.h"
#include "dtrain/config.h"
#include "dtrain/torch/fleet.h"

namespace dtrain::apps {

// Inside namespace dtrain, `torch` would name dtrain::torch; the apps mean libtorch.
namespace torch = ::torch;
// The C++ Fleet API, by the name Paddle's users know it.
namespace fleet = ::dtrain::torch;

// The app-neutral runtime every libtorch app shares: config helpers, progress
// lines, the learning-rate schedule, atomic checkpoints and the epoch/step
// loop skeleton. Everything distributed goes through dtrain/torch/ (fleet).

// ---- job-file keys ----------------------------------------------------------
// The trainer's keys (an app adds its own [data], [augment], [model] tables).
// Each key is declared once, with its default: an app cannot declare a
// trainer key again (ConfigSchema::add refuses it), and read sites call the
// getters without a fallback.
//
//   [train]      epochs, batch_size (per worker), eval_batch_size, optimizer
//                ("momentum" | "adam"), lr, momentum, beta1, beta2, weight_decay,
//                warmup_epochs, schedule ("cosine" | "piecewise"), milestones
//                (epochs), gamma, seed, threads (intra-op), max_steps,
//                device ("auto" | "cpu" | "cuda" | "cuda:N"), bf16, channels_last
//                (common/device.h)
//   [data]       prefetch (batches prepared ahead by the loader thread)
//   [eval]       every_epochs (0: only at the end), only (evaluate the checkpoint
//                checkpoint.resume names, else the latest in checkpoint.dir, and
//                stop: PaddleSeg's val.py, PaddleClas's eval.py)
//   [checkpoint] dir, every_epochs, every_steps, resume (false | true | "path")
//   [log]        every_steps, tensorboard ("" or a folder)
//   [debug]      dump_params ("" or a path; "{rank}" is replaced), kill_at_step
void add_trainer_keys(ConfigSchema& schema, const std::string& default_checkpoint_dir);

// Loads a job file with its overrides and validates it against [job] +
// [strategy] + the trainer's keys + `add_app_keys`. `checkpoint.resume = true`
// is accepted as well as a path.
Config load_job_config(const std::string& path, const std::vector<std::string>& overrides,
                       void (*add_app_keys)(ConfigSchema&), const std::string& default_checkpoint_dir);

// ConfigError at the key's file:line.
[[noreturn]] void config_error(const Config& c, const std::string& key, const std::string& msg);
// An integer key that must be >= 1 (its default comes from the schema).
int64_t positive(const Config& c, const std::string& key);
// "h:mm:ss", or "-" for an unknown duration.
std::string hms(double seconds);
// One line to stdout, flushed (the launcher's workerlog.N).
void log_line(const std::string& line);

// ---- learning rate -----------------------------------------------------------
// Linear warm-up, then cosine decay to 0 or piecewise decay by gamma at the
// milestones; constant within a gradient-merge group.
struct LrSchedule {
  double base_lr = 0.1, warmup_epochs = 0, gamma = 0.1;
  std::string schedule = "cosine";
  std::vector<int64_t> milestones;
  int64_t epochs = 1, steps_per_epoch = 1, k_merge = 1;
  // From [train]; a bad schedule name is a ConfigError.
  static LrSchedule from_config(const Config& cfg, int64_t epochs, int64_t steps_per_epoch, int64_t k_merge);
  double at(int64_t micro_step) const;
};

// ---- progress and checkpoints ------------------------------------------------
// Where the run is: the next micro-step to run.
struct RunState {
  int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
};

// <dir>/latest.pt, written atomically (temporary file, fsync, rename, fsync of
// the folder) by rank 0: model, optimizer, run state, world size and the CPU
// generator's state.
void save_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& opt,
                     const RunState& state, int world);
// Loads a checkpoint written by save_checkpoint into model and optimizer;
// returns the run state it saved.
RunState load_checkpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& opt);

// Writes the raw parameters to `path` ("{rank}" replaced) and returns their FNV-1a 64 hash.
uint64_t dump_parameters(std::string path, int rank, torch::nn::Module& model);

// ---- the loop ---------------------------------------------------------------
// What one training micro-step reports.
struct StepOutput {
  torch::Tensor loss;  // the mean loss of the batch (backward is run on it)
  double correct = 0;  // for the progress line's accuracy
};

// The epoch/step loop skeleton. An app derives from it and provides its data,
// its model and its evaluation; run() does the rest on every worker:
// fleet::init (the role and the store from the environment), build(), the
// data-parallel model and the optimizer (SGD or Adam) through fleet, resume, the epochs
// (progress lines, TensorBoard scalars, checkpoints, evaluation), parameter dump.
class Trainer {
 public:
  Trainer(Config cfg, std::string app_name);
  virtual ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  void run();

 protected:
  // Creates train_set, eval_set, augment, model and the app's part of the
  // start-up line (e.g. "model resnet20 width 1").
  virtual void build() = 0;
  // Forward and loss of one training batch (the model is in train mode).
  virtual StepOutput train_step(const Batch& batch) = 0;
  // Evaluates on eval_set (every worker its share) and logs the result.
  virtual void evaluate() = 0;
  virtual std::string describe_model() const = 0;

  // Averages BatchNorm statistics across workers; every worker calls it.
  void sync_buffers() { dp_->average_buffers(); }
  // This worker's share of eval_set (indices rank, rank + world, ...), in order.
  std::vector<size_t> eval_indices() const;
  // The batch on the worker's device (itself on the CPU); run() passes
  // train_step its batches this way, and evaluate() should too.
  Batch to_device(const Batch& b) const;

  Config cfg_;
  std::string app_;
  int rank_ = 0, world_ = 1;
  uint64_t seed_ = 0;
  std::shared_ptr<Dataset> train_set_, eval_set_;
  AugmentOptions augment_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<EventWriter> tb_;
  int64_t eval_batch_ = 0;
  RunState state_;
  DeviceChoice device_;  // from [train] device and the launcher, before build(); the model moves there after it

 private:
  void setup();
  void resume();
  void checkpoint();
  void train();

  std::shared_ptr<fleet::DataParallel> dp_;
  std::shared_ptr<torch::optim::Optimizer> sgd_;  // SGD with momentum or Adam
  std::shared_ptr<fleet::DistributedOptimizer> opt_;
  LrSchedule lr_;
  std::string ckpt_dir_;
  int64_t epochs_ = 0, batch_ = 0, log_every_ = 0, steps_per_epoch_ = 0, k_merge_ = 1;
};

// Runs body; an exception becomes one line "<prefix><what>" on stderr (a
// c10::Error without its backtrace) and exit code 1.
int run_guarded(const std::string& prefix, const std::function<int()>& body);

// main() of an app: parses `PROGRAM JOB.toml [-o key=value]...`, calls
// make(config) and runs the trainer. Errors are printed as one clear line
// "<app>: error: ..." and give exit code 1.
int trainer_main(int argc, char** argv, const std::string& app, const std::string& description,
                 Config (*load)(const std::string&, const std::vector<std::string>&),
                 std::unique_ptr<Trainer> (*make)(Config));

}  // namespace dtrain::apps
