#pragma once

#include <functional>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/checkpoint.h"
#include "common/data.h"
#include "common/device.h"
#include "common/tensorboard.h"
#include "dtrain/config.h"
#include "dtrain/config_table.h"
#include "dtrain/fleet/elastic.h"
#include "dtrain/fleet/fleet.h"

namespace CLI {
class App;
}

namespace dtrain::apps {

// The app-neutral runtime every libtorch app shares: config helpers, progress
// lines, the learning-rate schedule, atomic checkpoints and the epoch/step
// loop skeleton. Everything distributed goes through dtrain/fleet/ (fleet).

// ---- job-file keys ----------------------------------------------------------
// The trainer's keys (an app adds its own [data], [augment], [model] tables),
// bound to TrainOptions' fields: each key is declared once, by trainer_table(),
// and its default is the field's initializer below. An app cannot declare a
// trainer key again (ConfigSchema::add refuses it); reading a job gives a
// typed TrainOptions (Trainer::opts_). Each app's own keys have the same
// form (ClsOptions and cls_table(), ...): nothing reads a key by its name.
struct TrainOptions {
  int64_t epochs = 10, batch_size = 128, eval_batch_size = 500;
  std::string optimizer = "momentum";  // momentum (SGD) | adam
  double lr = 0.1, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, weight_decay = 1e-4;
  double warmup_epochs = 0;
  std::string schedule = "cosine";  // cosine | piecewise
  std::vector<int64_t> milestones;
  double gamma = 0.1;
  double clip_grad_norm = 0;  // Paddle's ClipGradByGlobalNorm; 0: off
  int64_t seed = 42, threads = 1, max_steps = 0;
  std::string device = "auto";  // common/device.h
  bool bf16 = false, channels_last = false;
  int64_t prefetch = 4;           // [data]
  int64_t num_workers = 1;        // [data]: loader threads
  int64_t eval_every_epochs = 1;  // [eval] every_epochs
  bool eval_only = false;         // [eval] only
  int64_t checkpoint_every_epochs = 1, checkpoint_every_steps = 0;
  std::string resume = "false";  // [checkpoint] resume: false | true | a path
  int64_t log_every_steps = 50;
  std::string pretrained;   // [model]: a checkpoint to start from (fine-tuning)
  std::string tensorboard;  // [log]
  std::string dump_params;  // [debug]
  int64_t kill_at_step = 0;
  // [elastic] (an elastic job, `dtrain --nnodes MIN:MAX`; docs/elastic.md)
  std::string elastic_scale = "lr";  // lr: keep each worker's batch, scale the lr | batch: keep the global batch
  int64_t elastic_commit_every_steps = 1;
};
const ConfigTable<TrainOptions>& trainer_table();
// Declares trainer_table()'s keys and [checkpoint] dir (default_checkpoint_dir: the app's own).
void add_trainer_keys(ConfigSchema& schema, const std::string& default_checkpoint_dir);

// Loads a job file with its overrides and validates it against [job] +
// [strategy] + the trainer's keys + `add_app_keys`. `checkpoint.resume = true`
// is accepted as well as a path.
Config load_job_config(const std::string& path, const std::vector<std::string>& overrides,
                       void (*add_app_keys)(ConfigSchema&), const std::string& default_checkpoint_dir);

// ConfigError at the key's file:line.
[[noreturn]] void config_error(const Config& c, const std::string& key, const std::string& msg);
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
  // `dtrain-<app> export_model`: one process on the CPU builds the model,
  // loads the job's checkpoint (checkpoint.resume's path, else
  // <checkpoint.dir>/latest.pt, else the latest sharded one) and writes it as
  // TorchScript to `output` (common/export.h), traced on the first evaluation
  // batch, with the app's preprocessing as the extra file preprocessing.json.
  // With `verify_dir`, also writes that batch and the model's output there
  // (input.f32, output.f32: raw float32; shapes.txt) for checks outside dtrain.
  void export_model(const std::string& output, const std::string& verify_dir, int64_t batch);
  // `dtrain-<app> loader_bench`: one process builds the job's data and reads
  // `batches` training batches of the first epoch (all when 0) through the
  // loader alone (data.num_workers threads, data.prefetch, the job's
  // transforms; no model, no training), and prints one line
  // "loader: N images in S s: X images/s (data.num_workers W)".
  void loader_bench(int64_t batches);

 protected:
  // Creates train_set, eval_set, augment, model and the app's part of the
  // start-up line (e.g. "model resnet20 width 1").
  virtual void build() = 0;
  // Forward and loss of one training batch (the model is in train mode).
  virtual StepOutput train_step(const Batch& batch) = 0;
  // Evaluates on eval_set (every worker its share) and logs the result.
  // Called with the BatchNorm statistics averaged, the model in eval mode
  // and no autograd; the model goes back to train mode after.
  virtual void evaluate() = 0;
  virtual std::string describe_model() const = 0;
  // export_model: the inference forward on a preprocessed batch, and the
  // preprocessing as JSON. The defaults refuse: the app has no export yet.
  virtual torch::Tensor infer(const torch::Tensor& images);
  virtual std::string preprocessing_json() const;
  // The normalisation members of preprocessing.json ("input", "scale",
  // "mean", "std"): the eval transforms' per-channel Normalize, or [augment]
  // mean/std. `what` follows the shape in "input" (" grey text lines").
  std::string input_json(const std::string& what = "") const;

  // The trainer's keys as the job set them (read once, before build()).
  const TrainOptions& train_options() const { return opts_; }
  // Averages BatchNorm statistics across workers; every worker calls it.
  void sync_buffers() { dp_->average_buffers(); }
  // This worker's share of eval_set (indices rank, rank + world, ...), in order.
  std::vector<size_t> eval_indices() const;
  // The batch on the worker's device (itself on the CPU); run() passes
  // train_step its batches this way, and evaluate() should too.
  Batch to_device(const Batch& b) const;
  // A loader over eval_set's `indices` (data.num_workers, data.prefetch).
  std::unique_ptr<BatchLoader> eval_loader(const std::vector<size_t>& indices) const;

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
  void run_evaluation();  // evaluate() as its comment promises
  // steps_per_epoch_ and lr_ for batch_ per worker at world_.
  void plan_epochs();
  // The schedule's position: the epoch's progress in steps of the current global batch.
  int64_t lr_position() const;
  // Elastic jobs (trainer_elastic.cc): the state of the newest commit among
  // the machines, at this generation's world size; false when there is none.
  bool restore_elastic();
  void commit_elastic();
  // From the second generation: each worker's batch and the lr factor by elastic.scale.
  void apply_elastic_scale();
  // After a restore saved at another world size or batch: the rest of the
  // epoch is split at this one (RunState::epoch_offset).
  void split_rest_of_epoch();
  // state_ gets what a save keeps beside the counters: world, batch, the loss scaler's state.
  void stamp_state();

  std::shared_ptr<fleet::DataParallel> dp_;
  // The optimizer that steps (SGD with momentum or Adam, or LAMB/LARS by the strategy) is opt_->inner().
  std::shared_ptr<fleet::DistributedOptimizer> opt_;
  bool autocast_ = false;  // train.bf16 or strategy.amp where this libtorch can
  at::ScalarType autocast_dtype_ = at::kBFloat16;
  LrSchedule lr_;
  TrainOptions opts_;  // read once, in setup()
  std::string ckpt_dir_;
  int64_t steps_per_epoch_ = 0, k_merge_ = 1;
  int64_t batch_ = 0;    // per worker: train.batch_size, or the global batch / world (elastic.scale = "batch")
  double lr_scale_ = 1;  // world / the first generation's world (elastic.scale = "lr")
  fleet::ElasticState elastic_;
};

// Runs body; an exception becomes one line "<prefix><what>" on stderr (a
// c10::Error without its backtrace) and exit code 1.
int run_guarded(const std::string& prefix, const std::function<int()>& body);

// Reads a job file with `-o key=value` overrides applied (load_cls_config, ...).
using LoadJob = Config (*)(const std::string&, const std::vector<std::string>&);

// The job file and `-o key=value` (one pair each, repeatable) of an app's
// command (train, predict, render, ...). A command with positional arguments
// of its own makes this before adding them, so that the job comes first.
class JobCommand {
 public:
  JobCommand(CLI::App& cli, const std::string& job_doc, const std::string& override_doc);
  // Parses argv, then runs body on the job as load reads it; an error is one
  // line "<command>: error: ..." and exit code 1.
  int run(int argc, char** argv, const std::string& command, LoadJob load,
          const std::function<int(const Config&)>& body);

 private:
  CLI::App& cli_;
  std::string job_;
  std::vector<std::string> overrides_;
};

// A command of an app besides training (`dtrain-ocr render ...`): its name
// and its main(), which gets the arguments after the name.
using AppCommand = std::pair<const char*, int (*)(int, char**)>;

// main() of an app: parses `PROGRAM JOB.toml [-o key=value]...`, calls
// make(config) and runs the trainer; `PROGRAM export_model|loader_bench|<one
// of commands> ...` runs that command. Errors are printed as one clear line
// "<app>: error: ..." and give exit code 1.
int trainer_main(int argc, char** argv, const std::string& app, const std::string& description, LoadJob load,
                 std::unique_ptr<Trainer> (*make)(Config), const std::vector<AppCommand>& commands = {});

}  // namespace dtrain::apps
