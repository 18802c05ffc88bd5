#include "common/trainer.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "dtrain/communicator.h"
#include "dtrain/error.h"
#include "dtrain/job.h"

namespace fs = std::filesystem;

namespace dtrain::apps {

using Clock = std::chrono::steady_clock;

const ConfigTable<TrainOptions>& trainer_table() {
  static const ConfigTable<TrainOptions> table = [] {
    using T = TrainOptions;
    ConfigTable<T> t;
    t.add("train.epochs", &T::epochs, "").at_least(1);
    t.add("train.batch_size", &T::batch_size, "per worker").at_least(1);
    t.add("train.eval_batch_size", &T::eval_batch_size, "per worker").at_least(1);
    t.add("train.lr", &T::lr, "peak learning rate");
    t.add("train.optimizer", &T::optimizer, "momentum (SGD) | adam");
    t.add("train.momentum", &T::momentum, "momentum: its coefficient");
    t.add("train.beta1", &T::beta1, "adam");
    t.add("train.beta2", &T::beta2, "adam");
    t.add("train.weight_decay", &T::weight_decay, "L2 decay");
    t.add("train.warmup_epochs", &T::warmup_epochs, "linear warm-up length").at_least(0);
    t.add("train.schedule", &T::schedule, "cosine | piecewise");
    t.add("train.milestones", &T::milestones, "piecewise: epochs where lr is multiplied by gamma");
    t.add("train.gamma", &T::gamma, "piecewise decay factor");
    t.add("train.clip_grad_norm", &T::clip_grad_norm,
          "clip gradients by their global norm over the whole model (Paddle's ClipGradByGlobalNorm); 0: off")
        .at_least(0);
    t.add("train.seed", &T::seed, "shared by all workers");
    t.add("train.threads", &T::threads, "intra-op threads per worker").at_least(1);
    t.add("train.max_steps", &T::max_steps, "stop after this many micro-steps (0: no limit)").at_least(0);
    t.add("train.device", &T::device, "auto (the launcher's --gpus device, else cpu) | cpu | cuda | cuda:N");
    t.add("train.bf16", &T::bf16, "forward under bf16 autocast (CUDA, or CPU with oneDNN)");
    t.add("train.channels_last", &T::channels_last, "batches and 4-D weights in channels-last layout");
    t.add("data.prefetch", &T::prefetch, "batches prepared ahead by the loader").at_least(1);
    t.add("data.num_workers", &T::num_workers,
          "loader threads, each making whole batches (decode and transforms); batches are the same for any number")
        .in_range(1, 64);
    t.add("eval.every_epochs", &T::eval_every_epochs, "evaluate every N epochs (0: only at the end)").at_least(0);
    t.add("eval.only", &T::eval_only,
          "evaluate the checkpoint checkpoint.resume names (or the latest in checkpoint.dir) and stop");
    t.add("checkpoint.every_epochs", &T::checkpoint_every_epochs, "0: only at the end").at_least(0);
    t.add("checkpoint.every_steps", &T::checkpoint_every_steps, "also every N micro-steps (0: off)").at_least(0);
    t.add("checkpoint.resume", &T::resume, "false | true (latest in dir) | a checkpoint path");
    t.add("log.every_steps", &T::log_every_steps, "progress line every N steps").at_least(1);
    t.add("log.tensorboard", &T::tensorboard, "folder for TensorBoard event files");
    t.add("model.pretrained", &T::pretrained,
          "start from this checkpoint's matching tensors (latest.pt or a sharded-<step> folder); \"\": none");
    t.add("debug.dump_params", &T::dump_params, "write raw parameters at the end; {rank} is replaced");
    t.add("debug.kill_at_step", &T::kill_at_step,
          "SIGKILL every worker after this micro-step, first attempt only (tests)");
    t.add("elastic.scale", &T::elastic_scale,
          "when an elastic job's world size changes: lr (keep each worker's batch, scale the learning rate by the "
          "world size over the first one's) | batch (keep the global batch: each worker's is the global / world)");
    t.add("elastic.commit_every_steps", &T::elastic_commit_every_steps,
          "keep the state in memory (/dev/shm) every N optimizer steps; a lost machine costs at most N steps")
        .at_least(1);
    return t;
  }();
  return table;
}

void add_trainer_keys(ConfigSchema& s, const std::string& default_checkpoint_dir) {
  trainer_table().declare(s);
  s.add("checkpoint.dir", ConfigType::String, "\"" + default_checkpoint_dir + "\"", "");
}

Config load_job_config(const std::string& path, const std::vector<std::string>& overrides,
                       void (*add_app_keys)(ConfigSchema&), const std::string& default_checkpoint_dir) {
  Config cfg = Config::from_file(path, overrides);
  if (cfg.has("checkpoint.resume")) {
    try {
      bool b = cfg.get_bool("checkpoint.resume");
      cfg.set_literal("checkpoint.resume", b ? "\"true\"" : "\"false\"");
    } catch (const ConfigError&) {
    }
  }
  ConfigSchema schema;
  add_job_keys(schema);
  add_strategy_keys(schema);
  add_trainer_keys(schema, default_checkpoint_dir);
  add_app_keys(schema);
  cfg.validate(schema);
  return cfg;
}

void config_error(const Config& c, const std::string& key, const std::string& msg) {
  auto loc = c.location_of(key);
  throw ConfigError(loc.file, loc.line, loc.column, key, msg);
}

std::string hms(double s) {
  if (!(s >= 0) || s > 1e7) return "-";
  int64_t t = static_cast<int64_t>(s + 0.5);
  return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
}

void log_line(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

LrSchedule LrSchedule::from_config(const Config& cfg, int64_t epochs, int64_t steps_per_epoch, int64_t k_merge) {
  LrSchedule l;
  const TrainOptions o = trainer_table().read(cfg);
  l.base_lr = o.lr;
  l.warmup_epochs = o.warmup_epochs;
  l.schedule = o.schedule;
  if (l.schedule != "cosine" && l.schedule != "piecewise")
    config_error(cfg, "train.schedule", "must be \"cosine\" or \"piecewise\", got \"" + l.schedule + "\"");
  l.milestones = o.milestones;
  l.gamma = o.gamma;
  l.epochs = epochs;
  l.steps_per_epoch = steps_per_epoch;
  l.k_merge = k_merge;
  return l;
}

double LrSchedule::at(int64_t micro_step) const {
  double opt_steps_per_epoch = double(steps_per_epoch) / k_merge;
  double t = double(micro_step / k_merge);
  double total = opt_steps_per_epoch * epochs;
  double warm = warmup_epochs * opt_steps_per_epoch;
  if (t < warm) return base_lr * (t + 1) / warm;
  if (schedule == "piecewise") {
    double e = t / opt_steps_per_epoch, lr = base_lr;
    for (int64_t m : milestones)
      if (e >= double(m)) lr *= gamma;
    return lr;
  }
  double p = total > warm ? (t - warm) / (total - warm) : 1.0;
  return 0.5 * base_lr * (1.0 + std::cos(M_PI * std::min(1.0, p)));
}

Trainer::Trainer(Config cfg, std::string app_name) : cfg_(std::move(cfg)), app_(std::move(app_name)) {}

Trainer::~Trainer() {
  // The fleet's models and optimizer refer to this trainer's model: leave the job first.
  opt_.reset();
  dp_.reset();
  fleet::shutdown();
}

Batch Trainer::to_device(const Batch& b) const {
  if (!device_.cuda() && !device_.channels_last) return b;
  Batch d = b;
  d.images = b.images.to(device_.device, /*non_blocking=*/true);
  if (device_.channels_last && d.images.dim() == 4) d.images = d.images.contiguous(torch::MemoryFormat::ChannelsLast);
  d.labels = b.labels.to(device_.device, /*non_blocking=*/true);
  return d;
}

std::vector<size_t> Trainer::eval_indices() const {
  std::vector<size_t> idx;
  for (size_t i = static_cast<size_t>(rank_); i < eval_set_->size(); i += static_cast<size_t>(world_)) idx.push_back(i);
  return idx;
}

std::unique_ptr<BatchLoader> Trainer::eval_loader(const std::vector<size_t>& indices) const {
  return std::make_unique<BatchLoader>(eval_set_, indices, eval_batch_, false, augment_, false, seed_, 0, 0,
                                       static_cast<int>(opts_.prefetch), static_cast<int>(opts_.num_workers));
}

void Trainer::loader_bench(int64_t batches) {
  opts_ = trainer_table().read(cfg_);
  set_worker_threads(static_cast<int>(opts_.threads));
  seed_ = static_cast<uint64_t>(opts_.seed);
  build();
  auto idx = shard_indices(train_set_->size(), 0, 1, seed_, 0, true);
  auto t0 = Clock::now();
  BatchLoader loader(train_set_, idx, opts_.batch_size, true, augment_, true, seed_, 0, 0,
                     static_cast<int>(opts_.prefetch), static_cast<int>(opts_.num_workers));
  const int64_t n = batches > 0 ? std::min(batches, loader.num_batches()) : loader.num_batches();
  int64_t images = 0;
  Batch b;
  for (int64_t k = 0; k < n && loader.next(&b); ++k) images += b.images.size(0);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  log_line(fmt::format(
      "loader: {} images ({} batches of {}, {}x{}x{}) in {:.2f} s: {:.1f} images/s "
      "(data.num_workers {}, no model)",
      images, n, opts_.batch_size, b.images.defined() ? b.images.size(1) : 0, b.images.defined() ? b.images.size(2) : 0,
      b.images.defined() ? b.images.size(3) : 0, secs, double(images) / std::max(secs, 1e-9), opts_.num_workers));
}

void Trainer::run_evaluation() {
  sync_buffers();
  model_->eval();
  {
    torch::NoGradGuard ng;
    evaluate();
  }
  model_->train();
}

void Trainer::run() {
  setup();
  if (opts_.eval_only) {
    run_evaluation();
  } else {
    train();
  }
  const std::string& dump = opts_.dump_params;
  if (!dump.empty()) {
    if (dp_->sharding()) dp_->sharding()->gather_all();
    uint64_t h = dump_parameters(dump, rank_, *model_);
    if (dp_->sharding()) dp_->sharding()->release_all();
    std::string path = dump;
    for (size_t p; (p = path.find("{rank}")) != std::string::npos;) path.replace(p, 6, std::to_string(rank_));
    log_line(fmt::format("params: {} fnv1a64 {:016x}", path, h));
  }
}

void Trainer::setup() {
  fleet::InitOptions io;
  io.config = std::make_shared<Config>(cfg_);
  fleet::init(io);
  rank_ = fleet::worker_index();
  world_ = fleet::worker_num();
  opts_ = trainer_table().read(cfg_);
  set_worker_threads(static_cast<int>(opts_.threads));
  seed_ = static_cast<uint64_t>(opts_.seed);
  torch::manual_seed(seed_);
  device_ = choose_device(cfg_, config_error);

  build();
  if (!opts_.pretrained.empty()) {
    if (!fs::exists(opts_.pretrained))
      config_error(cfg_, "model.pretrained", "'" + opts_.pretrained + "' does not exist");
    log_line(load_pretrained(opts_.pretrained, *model_));
  }
  model_->to(device_.device);
  if (device_.channels_last) {
    // Weights in the batches' layout too: oneDNN's bf16 convolutions are ~1.4x faster than with contiguous weights.
    torch::NoGradGuard ng;
    for (auto& p : model_->parameters())
      if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }

  const auto& so = fleet::strategy();
  if (so.sharding && so.sharding_stage == 3 && device_.channels_last)
    config_error(cfg_, "train.channels_last",
                 "makes the 4-D weights channels-last, and sharding stage 3 frees and gathers each parameter as one "
                 "contiguous block; set train.channels_last = false, or use sharding_configs.stage = 2");
  dp_ = fleet::distributed_model(model_);
  const TrainOptions& o = opts_;
  std::shared_ptr<torch::optim::Optimizer> inner;
  if (o.optimizer == "momentum") {
    inner = std::make_shared<torch::optim::SGD>(
        model_->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  } else if (o.optimizer == "adam") {
    inner = std::make_shared<torch::optim::Adam>(
        model_->parameters(), torch::optim::AdamOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay));
  } else {
    config_error(cfg_, "train.optimizer", "must be \"momentum\" or \"adam\", got \"" + o.optimizer + "\"");
  }
  if (so.lamb && o.optimizer != "adam")
    config_error(cfg_, "strategy.lamb",
                 "LAMB replaces the Adam optimizer (Paddle's rule); set train.optimizer = \"adam\"");
  if (so.lars && o.optimizer != "momentum")
    config_error(cfg_, "strategy.lars",
                 "LARS replaces the Momentum optimizer (Paddle's rule); set train.optimizer = \"momentum\"");
  opt_ = fleet::distributed_optimizer(inner);
  opt_->set_clip_grad_norm(o.clip_grad_norm);
  k_merge_ = so.gradient_merge_k_steps;
  autocast_ = device_.bf16;
  if (so.amp) {
    if (device_.bf16 && so.amp_dtype != DType::BF16)
      config_error(cfg_, "train.bf16", "asks for bfloat16 autocast, strategy.amp_configs.dtype for float16; set one");
    autocast_dtype_ = fleet::amp_dtype(so);
    std::string why = fleet::autocast_unsupported(device_.device, autocast_dtype_);
    autocast_ = why.empty();
    if (!autocast_) log_line("amp: " + why + "; the forward stays float32 here, and dynamic loss scaling still runs");
  }

  eval_batch_ = opts_.eval_batch_size;
  ckpt_dir_ = cfg_.get_string("checkpoint.dir");
  if (opts_.elastic_scale != "lr" && opts_.elastic_scale != "batch")
    config_error(cfg_, "elastic.scale", "must be \"lr\" or \"batch\", got \"" + opts_.elastic_scale + "\"");
  batch_ = opts_.batch_size;
  plan_epochs();

  std::string tbdir = opts_.tensorboard, no_tb;
  if (!tbdir.empty() && !event_files_supported(&no_tb)) config_error(cfg_, "log.tensorboard", no_tb);
  if (!tbdir.empty() && rank_ == 0) tb_ = std::make_unique<EventWriter>(tbdir);

  int64_t params = 0;
  for (auto& p : model_->parameters()) params += p.numel();
  auto comm = fleet::communicator();
  log_line(
      fmt::format("dtrain-{}: rank {}/{} ({}), backend {}, {} ({} parameters), {} train / {} eval images, batch {} "
                  "per worker ({} global), {} steps per epoch, {} threads, device {}{}, strategy: {}",
                  app_, rank_, world_, fleet::role().source, comm ? comm->backend_name() : std::string("none"),
                  describe_model(), params, train_set_->size(), eval_set_->size(), batch_, batch_ * world_,
                  steps_per_epoch_, torch::get_num_threads(), device_.device.str(),
                  device_.cuda() || device_.bf16 || device_.channels_last
                      ? fmt::format(" ({}{}{})", device_.source, device_.bf16 ? ", bf16 autocast" : "",
                                    device_.channels_last ? ", channels_last" : "")
                      : std::string(),
                  so.describe()));
  if (!device_.note.empty()) log_line(device_.note);
  if (!restore_elastic()) resume();
  if (state_.base_world == 0) state_.base_world = world_;
  apply_elastic_scale();
  split_rest_of_epoch();
}

void Trainer::split_rest_of_epoch() {
  RunState& st = state_;
  if (st.world <= 0 || (st.world == world_ && st.batch == batch_)) return;
  st.epoch_offset += st.batch_in_epoch * st.batch * st.world;
  st.batch_in_epoch = 0;  // a rest too small for a step makes none
  log_line(
      fmt::format("data: saved at world {} x batch {}: the rest of epoch {} ({} samples done) is split over {} x {}",
                  st.world, st.batch, st.epoch + 1, st.epoch_offset, world_, batch_));
}

void Trainer::plan_epochs() {
  size_t per_rank = (train_set_->size() + world_ - 1) / world_;
  steps_per_epoch_ = static_cast<int64_t>(per_rank) / batch_;
  if (steps_per_epoch_ < 1)
    config_error(
        cfg_, "train.batch_size",
        fmt::format("is larger than a worker's share of the data ({} images): no full batch per epoch", per_rank));
  steps_per_epoch_ = steps_per_epoch_ / k_merge_ * k_merge_;
  if (steps_per_epoch_ < 1)
    config_error(cfg_, "strategy.gradient_merge.k_steps", "is larger than the steps of an epoch");
  lr_ = LrSchedule::from_config(cfg_, opts_.epochs, steps_per_epoch_, k_merge_);
}

int64_t Trainer::lr_position() const {
  return state_.epoch * steps_per_epoch_ + state_.epoch_offset / (batch_ * world_) + state_.batch_in_epoch;
}

void Trainer::stamp_state() {
  state_.world = world_;
  state_.batch = batch_;
  if (opt_->loss_scaler().enabled()) {
    state_.has_loss_scale = true;
    state_.loss_scale = opt_->loss_scaler().state();
  }
}

void Trainer::checkpoint() {
  sync_buffers();  // every rank, so the saved statistics are everyone's
  stamp_state();
  if (dp_->sharding()) {
    save_sharded_checkpoint(ckpt_dir_, *dp_, opt_->inner(), state_, rank_, world_);
    if (rank_ == 0)
      log_line(fmt::format("checkpoint: {} ({} shards; epoch {}, step {})", latest_sharded_checkpoint(ckpt_dir_),
                           world_, state_.epoch, state_.global_step));
    return;
  }
  if (rank_ != 0) return;
  save_checkpoint(ckpt_dir_, *model_, opt_->inner(), state_, world_);
  log_line(fmt::format("checkpoint: {} (epoch {}, step {})", (fs::path(ckpt_dir_) / "latest.pt").string(), state_.epoch,
                       state_.global_step));
}

void Trainer::resume() {
  const bool eval_only = opts_.eval_only;
  std::string r = opts_.resume;
  if (eval_only && (r == "false" || r.empty())) r = "true";
  if (r == "false" || r.empty()) return;
  std::string path = r == "true" ? (fs::path(ckpt_dir_) / "latest.pt").string() : r;
  // A sharded run resumes from sharded checkpoints; a plain one from latest.pt,
  // else from the sharded ones (put together whole).
  if (r == "true" && (dp_->sharding() || !fs::exists(path))) {
    const std::string sharded = latest_sharded_checkpoint(ckpt_dir_);
    if (!sharded.empty()) path = sharded;
  }
  if (!fs::exists(path)) {
    if (eval_only)
      config_error(
          cfg_, "eval.only",
          "no checkpoint to evaluate: '" + path + "' does not exist (train first, or name one with checkpoint.resume)");
    if (r == "true") {
      log_line("resume: no checkpoint at " + path + " yet; starting from scratch");
      return;
    }
    config_error(cfg_, "checkpoint.resume", "checkpoint '" + path + "' does not exist");
  }
  if (fs::is_directory(path))
    state_ = load_sharded_checkpoint(path, *dp_, opt_->inner());
  else if (dp_->sharding())
    config_error(cfg_, "checkpoint.resume",
                 "'" + path +
                     "' is a whole-model checkpoint; a sharded run (strategy.sharding) resumes from a "
                     "sharded one (a sharded-<step> folder)");
  else
    state_ = load_checkpoint(path, *model_, opt_->inner());
  if (state_.has_loss_scale) opt_->loss_scaler().set_state(state_.loss_scale);
  if (state_.batch_in_epoch >= steps_per_epoch_ && state_.epoch_offset == 0 && !eval_only) {
    ++state_.epoch;
    state_.batch_in_epoch = 0;
  }
  opt_->set_next_step(state_.global_step);
  log_line(fmt::format("resume: {} -> epoch {}, step {} of the epoch, global step {}{}", path, state_.epoch,
                       state_.batch_in_epoch, state_.global_step,
                       state_.has_loss_scale ? fmt::format(", loss scale {}", state_.loss_scale.scale) : ""));
}

void Trainer::train() {
  const int64_t max_steps = opts_.max_steps;
  const int64_t kill_at = opts_.kill_at_step;
  const int64_t ckpt_epochs = opts_.checkpoint_every_epochs;
  const int64_t ckpt_steps = opts_.checkpoint_every_steps;
  const int64_t eval_epochs = opts_.eval_every_epochs;
  const int64_t total_steps = steps_per_epoch_ * opts_.epochs;
  auto& st = state_;
  model_->train();
  auto run_start = Clock::now();
  int64_t run_start_step = st.global_step, skipped = 0;
  bool stopped = false;
  for (; st.epoch < opts_.epochs && !stopped; ++st.epoch, st.batch_in_epoch = 0, st.epoch_offset = 0) {
    auto idx = shard_indices(train_set_->size(), rank_, world_, seed_, st.epoch, true, st.epoch_offset);
    const int64_t epoch_steps =
        st.epoch_offset == 0 ? steps_per_epoch_ : static_cast<int64_t>(idx.size()) / batch_ / k_merge_ * k_merge_;
    BatchLoader loader(train_set_, idx, batch_, true, augment_, true, seed_, st.epoch, st.batch_in_epoch,
                       static_cast<int>(opts_.prefetch), static_cast<int>(opts_.num_workers));
    double win_loss = 0, win_correct = 0, win_count = 0, win_data = loader.wait_seconds();
    auto win_start = Clock::now();
    opt_->reset_stats();
    Batch b;
    while (st.batch_in_epoch < epoch_steps && loader.next(&b)) {
      double lr = lr_.at(lr_position()) * lr_scale_;
      for (auto& g : opt_->inner().param_groups()) g.options().set_lr(lr);
      StepOutput out;
      {
        fleet::AutoCast autocast(autocast_, device_.device, autocast_dtype_);
        out = train_step(to_device(b));
      }
      opt_->scale(out.loss).backward();
      if (opt_->step()) opt_->zero_grad();
      if (opt_->last_step_skipped()) ++skipped;
      win_loss += out.loss.item<double>() * double(b.labels.size(0));
      win_correct += out.correct;
      win_count += double(b.labels.size(0));
      ++st.global_step;
      ++st.batch_in_epoch;
      bool at_boundary = st.global_step % k_merge_ == 0;
      if (at_boundary && st.global_step % opts_.elastic_commit_every_steps == 0) commit_elastic();

      if (st.global_step % opts_.log_every_steps == 0 || st.batch_in_epoch == epoch_steps) {
        double secs = std::chrono::duration<double>(Clock::now() - win_start).count();
        double run_secs = std::chrono::duration<double>(Clock::now() - run_start).count();
        double ips = win_count * world_ / std::max(secs, 1e-9);
        double per_step = run_secs / double(std::max<int64_t>(1, st.global_step - run_start_step));
        int64_t left = (max_steps > 0 ? std::min(total_steps, max_steps) : total_steps) - st.global_step;
        auto sync = opt_->stats();
        std::string amp;
        if (opt_->loss_scaler().enabled())
          amp = fmt::format(" loss_scale {} skipped {}", opt_->loss_scaler().scale(), skipped);
        log_line(fmt::format(
            "epoch {}/{} step {}/{} loss {:.6f} acc {:.4f} lr {:.6f} images/s {:.1f} eta {} "
            "comm_wait {:.1f} ms/step data_wait {:.1f} ms/step{}",
            st.epoch + 1, opts_.epochs, st.batch_in_epoch, epoch_steps, win_loss / win_count, win_correct / win_count,
            lr, ips, hms(per_step * double(left)), 1e3 * sync.wait_seconds / std::max(1.0, win_count / double(batch_)),
            1e3 * (loader.wait_seconds() - win_data) / std::max(1.0, win_count / double(batch_)), amp));
        if (tb_) {
          tb_->add_scalar("train/loss", float(win_loss / win_count), st.global_step);
          tb_->add_scalar("train/acc", float(win_correct / win_count), st.global_step);
          tb_->add_scalar("train/lr", float(lr), st.global_step);
          tb_->add_scalar("train/images_per_s", float(ips), st.global_step);
          tb_->flush();
        }
        win_loss = win_correct = win_count = 0;
        win_data = loader.wait_seconds();
        win_start = Clock::now();
        opt_->reset_stats();
      }
      if (ckpt_steps > 0 && at_boundary && st.global_step % ckpt_steps == 0 && st.batch_in_epoch < epoch_steps)
        checkpoint();
      if (kill_at > 0 && st.global_step == kill_at && fleet::role().restart_count == 0) {
        log_line(fmt::format("debug.kill_at_step: killing this worker after step {}", st.global_step));
        std::raise(SIGKILL);
      }
      if (max_steps > 0 && st.global_step >= max_steps) {
        stopped = true;
        break;
      }
    }
    bool last = st.epoch + 1 == opts_.epochs || stopped;
    if (st.batch_in_epoch == epoch_steps && !last && ckpt_epochs > 0 && (st.epoch + 1) % ckpt_epochs == 0) checkpoint();
    if (last || (eval_epochs > 0 && (st.epoch + 1) % eval_epochs == 0)) {
      run_evaluation();
    }
    if (last) {
      checkpoint();
      if (stopped) break;
    }
  }
  double total = std::chrono::duration<double>(Clock::now() - run_start).count();
  log_line(fmt::format("done: {} steps in {} ({:.1f} s)", st.global_step - run_start_step, hms(total), total));
}

int run_guarded(const std::string& prefix, const std::function<int()>& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%sunknown exception\n", prefix.c_str());
  }
  std::fflush(stderr);
  return 1;
}

JobCommand::JobCommand(CLI::App& cli, const std::string& job_doc, const std::string& override_doc) : cli_(cli) {
  cli.add_option("job", job_, job_doc)->required();
  cli.add_option("-o,--override", overrides_, override_doc)->allow_extra_args(false);
}

int JobCommand::run(int argc, char** argv, const std::string& command, LoadJob load,
                    const std::function<int(const Config&)>& body) {
  try {
    cli_.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli_.exit(e);
  }
  return run_guarded(command + ": error: ", [&] { return body(load(job_, overrides_)); });
}

namespace {

using MakeTrainer = std::unique_ptr<Trainer> (*)(Config);

// `command` JOB [-o key=value ...] plus cli's own options on the job's trainer.
int run_command(CLI::App& cli, int argc, char** argv, const std::string& app, const std::string& command,
                const std::string& example, LoadJob load, MakeTrainer make, const std::function<void(Trainer&)>& body) {
  JobCommand jc(cli, "job file (TOML), e.g. apps/" + app + ".toml", "override a key: -o " + example + " (repeatable)");
  return jc.run(argc, argv, command, load, [&](const Config& job) {
    body(*make(job));
    return 0;
  });
}

}  // namespace

int trainer_main(int argc, char** argv, const std::string& app, const std::string& description, LoadJob load,
                 MakeTrainer make, const std::vector<AppCommand>& commands) {
  const std::string sub = argc > 1 ? argv[1] : "";
  for (const auto& [name, command_main] : commands)
    if (sub == name) return command_main(argc - 1, argv + 1);
  if (sub == "export_model") {
    CLI::App ex{"dtrain-" + app + " export_model: the trained model as TorchScript (Paddle's tools/export_model.py)"};
    std::string output, verify;
    int64_t batch = 8;
    ex.add_option("--output", output, "the TorchScript file to write")->required();
    ex.add_option("--verify", verify, "also write the traced batch and the model's output there (raw float32)");
    ex.add_option("--batch", batch, "images in the traced batch (the first of the evaluation set)");
    return run_command(ex, argc - 1, argv + 1, app, "dtrain-" + app + " export_model", "checkpoint.dir=DIR", load, make,
                       [&](Trainer& t) { t.export_model(output, verify, batch); });
  }
  if (sub == "loader_bench") {
    CLI::App lb{"dtrain-" + app + " loader_bench: the data loader's images/s alone (no model, no training)"};
    int64_t batches = 0;
    lb.add_option("--batches", batches, "training batches to read (0: the whole first epoch)");
    return run_command(lb, argc - 1, argv + 1, app, "dtrain-" + app + " loader_bench", "data.num_workers=4", load, make,
                       [&](Trainer& t) { t.loader_bench(batches); });
  }
  CLI::App cli{description};
  return run_command(cli, argc, argv, app, "dtrain-" + app, "train.epochs=2", load, make, [](Trainer& t) { t.run(); });
}

}  // namespace dtrain::apps
